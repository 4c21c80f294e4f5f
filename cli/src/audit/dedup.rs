//! Records counted once: a collector receives at least once (a forwarder resends
//! what it cannot prove delivered), so the same record can be in its files twice.
//! Every record carries `"id": "<run>-<seq>"` (`metalift_daemon::audit::stamp`):
//! 128 random bits per daemon run and a sequence counted from 1.
//!
//! Memory: per daemon run, the sequence numbers seen are kept as ranges
//! (`start..=end`), so a run whose records arrive in order costs one range
//! (about 80 bytes with its run key) however many records it wrote; each hole
//! (a record not seen, e.g. lost before forwarding) costs one more range. Ranges
//! are bounded by [`MAX_RANGES`] in total: past it, a run's oldest ranges are
//! forgotten first, and a copy of a record that old would be counted again
//! ([`Dedup::forgotten`] says how many ranges were). Ids of another shape (not
//! written by metaliftd) are kept as strings, at most [`MAX_OTHER_IDS`].

use std::collections::{BTreeMap, HashMap, HashSet};

/// Ranges of sequence numbers kept across all runs, at most (about 8 MiB).
pub const MAX_RANGES: usize = 100_000;

/// Ids not of the `<run>-<seq>` form remembered, at most.
pub const MAX_OTHER_IDS: usize = 100_000;

/// The ids seen so far.
#[derive(Debug, Default)]
pub struct Dedup {
    /// Per run: ranges of sequence numbers seen, by start (`start -> end`, inclusive).
    runs: HashMap<u128, BTreeMap<u64, u64>>,
    ranges: usize,
    other: HashSet<String>,
    /// Ranges dropped to stay under [`MAX_RANGES`].
    pub forgotten: u64,
    /// Copies skipped.
    pub duplicates: u64,
}

/// The run (its 128 random bits) and sequence number of a record id, when it has
/// metaliftd's shape.
#[must_use]
pub fn split_id(id: &str) -> Option<(u128, u64)> {
    let (run, seq) = id.rsplit_once('-')?;
    if run.len() != 32 {
        return None;
    }
    Some((u128::from_str_radix(run, 16).ok()?, seq.parse().ok()?))
}

impl Dedup {
    /// Whether `id` is seen for the first time (an empty id, from a daemon older
    /// than ids, always is).
    pub fn first_time(&mut self, id: &str) -> bool {
        if id.is_empty() {
            return true;
        }
        let fresh = match split_id(id) {
            Some((run, seq)) => self.insert(run, seq),
            None => {
                if self.other.len() >= MAX_OTHER_IDS {
                    self.other.clear();
                    self.forgotten += 1;
                }
                self.other.insert(id.to_owned())
            }
        };
        if !fresh {
            self.duplicates += 1;
        }
        fresh
    }

    fn insert(&mut self, run: u128, seq: u64) -> bool {
        let ranges = self.runs.entry(run).or_default();
        // The range starting at or before seq.
        if let Some((&start, &end)) = ranges.range(..=seq).next_back() {
            if seq <= end {
                return false;
            }
            if seq == end + 1 {
                // Extend it, and join the next range when this fills the hole.
                let next = ranges.range(seq + 1..).next().map(|(&s, &e)| (s, e));
                match next {
                    Some((next_start, next_end)) if next_start == seq + 1 => {
                        ranges.remove(&next_start);
                        ranges.insert(start, next_end);
                        self.ranges -= 1;
                    }
                    _ => {
                        ranges.insert(start, seq);
                    }
                }
                return true;
            }
        }
        // Before the next range: join it, or a range of its own.
        match ranges.range(seq + 1..).next().map(|(&s, &e)| (s, e)) {
            Some((next_start, next_end)) if next_start == seq + 1 => {
                ranges.remove(&next_start);
                ranges.insert(seq, next_end);
            }
            _ => {
                ranges.insert(seq, seq);
                self.ranges += 1;
            }
        }
        if self.ranges > MAX_RANGES {
            self.forget_one();
        }
        true
    }

    /// Forgets the oldest range of the run with the most.
    fn forget_one(&mut self) {
        let Some((_, ranges)) = self.runs.iter_mut().max_by_key(|(_, r)| r.len()) else {
            return;
        };
        if ranges.len() > 1 && ranges.pop_first().is_some() {
            self.ranges -= 1;
            self.forgotten += 1;
        }
    }

    /// Ranges kept now (for the benchmark's memory figure).
    #[must_use]
    pub fn ranges(&self) -> usize {
        self.ranges
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(run: u128, seq: u64) -> String {
        format!("{run:032x}-{seq}")
    }

    #[test]
    fn a_copy_counts_once_in_any_order_and_in_order_costs_one_range() {
        let mut d = Dedup::default();
        for seq in 1..=1000 {
            assert!(d.first_time(&id(7, seq)));
        }
        assert_eq!(d.ranges(), 1);
        assert!(!d.first_time(&id(7, 500)), "a copy");
        assert!(d.first_time(&id(8, 500)), "the same seq of another run");
        // Out of order, with holes filled later.
        assert!(d.first_time(&id(9, 5)));
        assert!(d.first_time(&id(9, 3)));
        assert!(d.first_time(&id(9, 4)));
        assert!(!d.first_time(&id(9, 4)));
        assert!(!d.first_time(&id(9, 3)));
        assert!(d.first_time(&id(9, 6)));
        assert_eq!(d.ranges(), 3, "7: 1..=1000, 8: 500, 9: 3..=6");
        assert_eq!(d.duplicates, 3);
        assert!(d.first_time(""), "no id: never a duplicate");
        assert!(d.first_time(""));
        assert!(d.first_time("vector-1") && !d.first_time("vector-1"));
    }

    #[test]
    fn the_ranges_stay_bounded_when_every_other_record_is_missing() {
        let mut d = Dedup::default();
        for seq in (1..=(2 * MAX_RANGES as u64 + 10)).step_by(2) {
            d.first_time(&id(1, seq));
        }
        assert!(d.ranges() <= MAX_RANGES);
        assert!(d.forgotten > 0);
    }
}
