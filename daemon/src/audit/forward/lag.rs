//! How long the oldest record not yet *delivered* has waited: what the
//! `forward_behind` health cause compares with `[audit.forward] max_delay_seconds`.
//!
//! Each round the forwarder notes where the log ends ([`Lag::seen`]: the newest
//! file and its length) and when that end was first seen; a mark is dropped once
//! the delivered position has passed it ([`Lag::passed`]: the collector is known
//! to have everything up to it, or rotation deleted it as a gap). The first mark
//! left dates the oldest byte not delivered, to within a round ([`super::POLL`]).
//! Dating by first sight, not by the record's own time, keeps a wrong clock in a
//! record from making health lie.
//!
//! Marks are positions in the log's files, not counts of bytes sent: a connection
//! that is lost before its bytes were known delivered sends them again, and they
//! keep the date they were first seen. So a collector that accepts connections
//! and drops each before acknowledging (or, over TCP, within
//! [`super::window::TCP_SETTLE`]) degrades health like one that is down; dated by
//! what was *sent*, every resend made the records look new and health never said
//! so (review of issue 43).
//!
//! A forwarder that keeps up but is never idle reads as fresh (to within the
//! delivery window: an acknowledgement, over TCP and TLS then `TCP_SETTLE`); one
//! that falls further behind under load reads as old, as it is.

use std::collections::VecDeque;
use std::time::SystemTime;

use super::cursor::Cursor;

/// At most this many marks: past it, the newest mark's end moves on and keeps its
/// time, so new bytes read as older than they are (never younger): health errs
/// towards saying.
const MAX_MARKS: usize = 1024;

/// When the oldest byte not yet delivered was first seen.
#[derive(Debug, Default)]
pub struct Lag {
    /// `(end, first seen)`: the log had reached `end` by that time; oldest first.
    marks: VecDeque<(Cursor, SystemTime)>,
}

impl Lag {
    /// The log ends at `end` at `now`.
    pub fn seen(&mut self, end: Cursor, now: SystemTime) {
        let full = self.marks.len() >= MAX_MARKS;
        match self.marks.back_mut() {
            Some((last, _)) if *last == end => {}
            Some((last, _)) if full => *last = end,
            _ => self.marks.push_back((end, now)),
        }
    }

    /// Drops the marks `delivered` says are passed (oldest first: the first one
    /// not passed stops it, as the log is delivered in order).
    pub fn passed(&mut self, delivered: impl Fn(&Cursor) -> bool) {
        while self.marks.front().is_some_and(|(end, _)| delivered(end)) {
            self.marks.pop_front();
        }
    }

    /// When the oldest byte not yet delivered was first seen; `None` when all are.
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

    fn at(ino: u64, offset: u64) -> Cursor {
        Cursor {
            dev: 1,
            ino,
            offset,
        }
    }

    /// Delivered up to `offset` of file `ino`; files below `ino` are let go.
    fn delivered(ino: u64, offset: u64) -> impl Fn(&Cursor) -> bool {
        move |c| c.ino < ino || (c.ino == ino && c.offset <= offset)
    }

    #[test]
    fn a_stalled_forwarder_is_dated_by_its_oldest_undelivered_byte() {
        let mut lag = Lag::default();
        lag.seen(at(1, 100), t(10));
        lag.seen(at(1, 100), t(11));
        lag.seen(at(1, 250), t(12));
        lag.passed(delivered(1, 0));
        assert_eq!(lag.since(), Some(t(10)));
        // The first 100 bytes are delivered: the oldest waiting byte came at 12.
        lag.passed(delivered(1, 100));
        assert_eq!(lag.since(), Some(t(12)));
        lag.passed(delivered(1, 250));
        assert_eq!(lag.since(), None);
    }

    #[test]
    fn bytes_sent_again_after_a_lost_connection_keep_their_first_date() {
        let mut lag = Lag::default();
        // Sent at 10, the connection lost before they were known delivered, sent
        // again at 20, 30, ...: nothing changes the log's end or the delivered
        // position, so the mark keeps 10.
        lag.seen(at(1, 100), t(10));
        for round in 2..6 {
            lag.seen(at(1, 100), t(round * 10));
            lag.passed(delivered(1, 0));
        }
        assert_eq!(lag.since(), Some(t(10)));
    }

    #[test]
    fn a_forwarder_that_keeps_up_under_steady_load_reads_as_fresh() {
        let mut lag = Lag::default();
        for round in 0..100 {
            // 50 new bytes each round, the previous round's delivered.
            lag.seen(at(1, 50 * (round + 1)), t(round));
            lag.passed(delivered(1, 50 * round));
        }
        assert_eq!(lag.since(), Some(t(99)));
    }

    #[test]
    fn a_rotated_file_delivered_or_deleted_passes_its_marks() {
        let mut lag = Lag::default();
        lag.seen(at(1, 100), t(10));
        lag.seen(at(2, 30), t(11));
        lag.passed(delivered(2, 0));
        assert_eq!(lag.since(), Some(t(11)), "file 1 let go");
        lag.passed(delivered(3, 0));
        assert_eq!(lag.since(), None);
    }

    #[test]
    fn past_the_mark_limit_new_bytes_read_older_never_younger() {
        let mut lag = Lag::default();
        for i in 0..(MAX_MARKS as u64 + 10) {
            lag.seen(at(1, i + 1), t(i));
        }
        lag.passed(delivered(1, MAX_MARKS as u64 - 1));
        // Bytes first seen at MAX_MARKS.. share the last kept mark's time.
        assert_eq!(lag.since(), Some(t(MAX_MARKS as u64 - 1)));
    }
}
