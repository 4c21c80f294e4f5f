//! How long the oldest record not yet sent has waited: what the `forward_behind`
//! health cause compares with `[audit.forward] max_delay_seconds`.
//!
//! The forwarder knows, each round, how many bytes of the log are not yet sent
//! ([`super::source::Source::bytes_behind`]) and how many it has sent. Counting
//! both from the forwarder's start gives every byte a place in one stream: the
//! bytes not sent are those past `sent`, up to `sent + behind`. [`Lag`] keeps a
//! mark each time that end grows (the end, and when it was first seen), and drops
//! the marks a send has passed: the first mark left dates the oldest byte not
//! sent, to within a round ([`super::POLL`]). Dating by first sight, not by the
//! record's own time, keeps a wrong clock in a record from making health lie.
//!
//! A forwarder that keeps up but is never idle (records arrive every round)
//! reads as fresh; one that falls further behind under load reads as old, as it
//! is; a collector that takes nothing stops the marks from being dropped.

use std::collections::VecDeque;
use std::time::SystemTime;

/// At most this many marks: past it, new bytes share the newest mark's time, so
/// they read as older than they are (never younger): health errs towards saying.
const MAX_MARKS: usize = 1024;

/// When the oldest byte not yet sent was first seen.
#[derive(Debug, Default)]
pub struct Lag {
    /// Bytes sent since the forwarder started (of the log, before framing).
    sent: u64,
    /// `(end, first seen)`: the stream had reached `end` by that time; increasing ends.
    marks: VecDeque<(u64, SystemTime)>,
}

impl Lag {
    /// The forwarder sees `behind` bytes waiting at `now`.
    pub fn seen(&mut self, behind: u64, now: SystemTime) {
        if behind == 0 {
            self.marks.clear();
            return;
        }
        let end = self.sent.saturating_add(behind);
        let full = self.marks.len() >= MAX_MARKS;
        match self.marks.back_mut() {
            Some((last, _)) if *last >= end => {}
            Some((last, _)) if full => *last = end,
            _ => self.marks.push_back((end, now)),
        }
    }

    /// `bytes` of the log were sent.
    pub fn sent(&mut self, bytes: u64) {
        self.sent = self.sent.saturating_add(bytes);
        while self.marks.front().is_some_and(|(end, _)| *end <= self.sent) {
            self.marks.pop_front();
        }
    }

    /// When the oldest byte not yet sent was first seen; `None` when all are sent.
    #[must_use]
    pub fn since(&self) -> Option<SystemTime> {
        self.marks.front().map(|(_, at)| *at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn t(s: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(s)
    }

    #[test]
    fn a_stalled_forwarder_is_dated_by_its_oldest_waiting_byte() {
        let mut lag = Lag::default();
        lag.seen(100, t(10));
        lag.seen(100, t(11));
        lag.seen(250, t(12));
        assert_eq!(lag.since(), Some(t(10)));
        // The first 100 bytes go out: the oldest waiting byte came at 12.
        lag.sent(100);
        lag.seen(150, t(13));
        assert_eq!(lag.since(), Some(t(12)));
        lag.sent(150);
        lag.seen(0, t(14));
        assert_eq!(lag.since(), None);
    }

    #[test]
    fn a_forwarder_that_keeps_up_under_steady_load_reads_as_fresh() {
        let mut lag = Lag::default();
        for round in 0..100 {
            // 50 new bytes each round, the previous round's 50 sent.
            lag.seen(50, t(round));
            lag.sent(50);
        }
        lag.seen(50, t(100));
        assert_eq!(lag.since(), Some(t(100)));
    }

    #[test]
    fn past_the_mark_limit_new_bytes_read_older_never_younger() {
        let mut lag = Lag::default();
        for i in 0..(MAX_MARKS as u64 + 10) {
            lag.seen(i + 1, t(i));
        }
        lag.sent(MAX_MARKS as u64 - 1);
        // Bytes first seen at MAX_MARKS.. share the last kept mark's time.
        assert_eq!(lag.since(), Some(t(MAX_MARKS as u64 - 1)));
    }
}
