//! What was written to the current connection and is not yet known delivered: the
//! forwarder's window. The durable cursor moves only past what left the window.
//!
//! The window holds positions in the log ([`Mark`]s), never bytes: the log is the
//! queue, so sending again is rewinding the source to the delivered position.
//!
//! When an entry counts as delivered depends on what the transport can tell:
//!
//! - **TCP and TLS** (key: the connection's bytes written to the kernel up to the
//!   batch's end): once the collector's TCP stack acknowledged those bytes (the
//!   socket's send queue, `SIOCOUTQ` / `SO_NWRITE`, is below them) *and* the
//!   connection then stayed up for [`TCP_SETTLE`]. A TCP acknowledgement says only
//!   that the peer's kernel has the bytes: a collector that stops (a restart, a
//!   crash, a load balancer's cut) drops what sat unread in its socket and in its
//!   own memory, and closing with unread data resets the connection. Records that
//!   were acknowledged less than [`TCP_SETTLE`] before the connection ended are
//!   therefore sent again. That covers a collector that reads and writes out what
//!   it receives within a second of its arrival; one that holds records longer and
//!   then dies loses them, and plain TCP has no way to know: that is what RELP's
//!   acknowledgements are for.
//! - **RELP** (key: the message's transaction number): once the collector answered
//!   it with `rsp 200`; no settling (the collector says it has the record).
//!
//! A connection we close ourselves (a stop, a new collector) delivers what the
//! collector's TCP stack acknowledged; a connection that ends otherwise (end of
//! stream, a reset, a failed or timed-out write) delivers nothing more: the rest is
//! sent again on the next connection.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use super::source::Mark;

/// How long a connection must stay up after the collector's TCP stack
/// acknowledged a batch before the batch counts as delivered (see the module doc).
pub const TCP_SETTLE: Duration = Duration::from_secs(1);

/// One send: its key (bytes written, or a RELP transaction number) and where the
/// log stands after it.
#[derive(Debug)]
struct Entry {
    key: u64,
    mark: Mark,
    /// Bytes it put on the connection.
    bytes: u64,
    /// When the transport acknowledged it.
    acked_at: Option<Instant>,
}

/// Sends not yet known delivered, oldest first.
#[derive(Debug, Default)]
pub struct Window {
    entries: VecDeque<Entry>,
    /// How many entries have no `acked_at` (RELP asks before every message).
    unanswered: usize,
}

impl Window {
    /// Notes a send of `bytes` with `key` after which the log stands at `mark`.
    pub fn push(&mut self, key: u64, mark: Mark, bytes: u64) {
        self.entries.push_back(Entry {
            key,
            mark,
            bytes,
            acked_at: None,
        });
        self.unanswered += 1;
    }

    /// How many sends are not acknowledged yet (RELP: messages not answered).
    #[must_use]
    pub fn unanswered(&self) -> usize {
        self.unanswered
    }

    /// Bytes of the sends not acknowledged yet.
    #[must_use]
    pub fn unacknowledged_bytes(&self) -> u64 {
        self.entries
            .iter()
            .filter(|e| e.acked_at.is_none())
            .map(|e| e.bytes)
            .sum()
    }

    /// Every send with a key up to `key` is acknowledged (TCP: bytes the
    /// collector's TCP stack has).
    pub fn acked_through(&mut self, key: u64, now: Instant) {
        for e in self.entries.iter_mut().take_while(|e| e.key <= key) {
            if e.acked_at.is_none() {
                e.acked_at = Some(now);
                self.unanswered -= 1;
            }
        }
    }

    /// The send with `key` is acknowledged (RELP: one transaction number);
    /// `false` when no such send waits (an answer to nothing we sent).
    pub fn acked(&mut self, key: u64, now: Instant) -> bool {
        match self.entries.iter_mut().find(|e| e.key == key) {
            Some(e) => {
                if e.acked_at.is_none() {
                    e.acked_at = Some(now);
                    self.unanswered -= 1;
                }
                true
            }
            None => false,
        }
    }

    /// Takes the sends acknowledged at least `settle` before `now`, oldest first
    /// and without skipping one that is not; returns the position after the last
    /// of them (what is delivered now).
    pub fn settled(&mut self, now: Instant, settle: Duration) -> Option<Mark> {
        let mut last = None;
        while let Some(e) = self.entries.front() {
            match e.acked_at {
                Some(at) if now.saturating_duration_since(at) >= settle => {
                    last = self.entries.pop_front().map(|e| e.mark);
                }
                _ => break,
            }
        }
        last
    }

    /// Forgets every send (the connection ended: they are sent again).
    pub fn clear(&mut self) {
        self.entries.clear();
        self.unanswered = 0;
    }

    /// How many sends wait.
    #[must_use]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing waits.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::forward::source::Source;

    /// Marks 1, 2, 3 records into a one-file log.
    fn marks() -> (tempfile::TempDir, Vec<Mark>) {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.jsonl");
        std::fs::write(&log, "{\"kind\":\"x\"}\n".repeat(3)).unwrap();
        let gaps = std::sync::Arc::new(crate::audit::forward::gaps::Gaps::open(&log, 1));
        let (source, _) = Source::open(&log, 1, None, gaps).unwrap();
        let start = source.sent_mark().unwrap();
        let marks = (1..=3)
            .map(|n| start.after("{\"kind\":\"x\"}\n".repeat(n).as_bytes()))
            .collect();
        (dir, marks)
    }

    /// RELP asks before every message how many are unanswered: the count is kept,
    /// and an answer given twice, or to a send already acknowledged, counts once.
    #[test]
    fn unanswered_counts_each_send_until_its_first_acknowledgement() {
        let (_dir, m) = marks();
        let t0 = Instant::now();
        let mut w = Window::default();
        w.push(1, m[0], 10);
        w.push(2, m[1], 10);
        w.push(3, m[2], 10);
        assert_eq!(w.unanswered(), 3);
        assert!(w.acked(2, t0));
        assert!(w.acked(2, t0));
        assert!(!w.acked(9, t0), "an answer to nothing sent");
        assert_eq!(w.unanswered(), 2);
        w.acked_through(2, t0);
        assert_eq!(w.unanswered(), 1, "1 newly, 2 already");
        assert_eq!(w.settled(t0, Duration::ZERO), Some(m[1]));
        assert_eq!(w.unanswered(), 1, "taking settled sends changes nothing");
        assert_eq!(w.unacknowledged_bytes(), 10);
        w.clear();
        assert_eq!(w.unanswered(), 0);
    }

    #[test]
    fn a_tcp_acknowledgement_delivers_only_after_the_connection_stayed_up_for_the_settle_time() {
        let (_dir, m) = marks();
        let t0 = Instant::now();
        let mut w = Window::default();
        w.push(100, m[0], 100);
        w.push(200, m[1], 100);
        w.push(300, m[2], 100);
        assert_eq!(w.settled(t0, TCP_SETTLE), None, "nothing acknowledged");
        w.acked_through(250, t0);
        assert_eq!(
            w.settled(t0 + TCP_SETTLE / 2, TCP_SETTLE),
            None,
            "acknowledged, not settled"
        );
        w.acked_through(300, t0 + TCP_SETTLE / 2);
        assert_eq!(
            w.settled(t0 + TCP_SETTLE, TCP_SETTLE),
            Some(m[1]),
            "the first two settled; the third was acknowledged later"
        );
        assert_eq!(w.len(), 1);
        w.clear();
        assert!(w.is_empty());
    }

    #[test]
    fn relp_answers_deliver_in_order_without_skipping_an_unanswered_message() {
        let (_dir, m) = marks();
        let t0 = Instant::now();
        let mut w = Window::default();
        for (txnr, mark) in (1..).zip(&m) {
            w.push(txnr, *mark, 10);
        }
        assert!(w.acked(2, t0));
        assert!(!w.acked(9, t0), "an answer to nothing sent");
        assert_eq!((w.unanswered(), w.unacknowledged_bytes()), (2, 20));
        assert_eq!(w.settled(t0, Duration::ZERO), None, "1 unanswered");
        assert!(w.acked(1, t0));
        assert_eq!(w.settled(t0, Duration::ZERO), Some(m[1]));
        assert_eq!(w.len(), 1);
    }
}
