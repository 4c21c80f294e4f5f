//! When the forwarder may try the collector again: a back-off from
//! [`Backoff::FIRST`] doubling up to [`MAX_BACKOFF`] while attempts fail, back to
//! the start once records are delivered again.
//!
//! It resets on a delivery, not on a connect: a collector that accepts and hangs
//! up at once (a crash loop, a full disk, a load balancer without a backend)
//! would otherwise be connected to ten times a second.

use std::time::{Duration, Instant};

/// Longest wait between reconnection attempts.
pub const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// The next attempt's time and the wait after it.
#[derive(Debug, Clone, Copy)]
pub struct Backoff {
    next: Duration,
    retry_at: Instant,
}

impl Backoff {
    /// The first wait after a failure.
    pub const FIRST: Duration = Duration::from_millis(100);

    /// May try at once.
    #[must_use]
    pub fn new(now: Instant) -> Backoff {
        Backoff {
            next: Backoff::FIRST,
            retry_at: now,
        }
    }

    /// Whether an attempt may be made at `now`.
    #[must_use]
    pub fn ready(&self, now: Instant) -> bool {
        now >= self.retry_at
    }

    /// An attempt failed (a refused connect, a connection that ended): the next
    /// waits the current back-off, and the one after twice as long.
    pub fn failed(&mut self, now: Instant) {
        self.retry_at = now + self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
    }

    /// Records were delivered: the next failure waits [`Backoff::FIRST`] again.
    pub fn delivered(&mut self) {
        self.next = Backoff::FIRST;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_up_to_the_maximum_and_starts_over_after_a_delivery() {
        let t0 = Instant::now();
        let mut b = Backoff::new(t0);
        assert!(b.ready(t0));
        let mut waits = Vec::new();
        let mut now = t0;
        for _ in 0..8 {
            b.failed(now);
            let mut at = now;
            while !b.ready(at) {
                at += Duration::from_millis(1);
            }
            waits.push((at - now).as_millis());
            now = at;
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        b.delivered();
        b.failed(now);
        assert!(!b.ready(now + Duration::from_millis(99)));
        assert!(
            b.ready(now + Duration::from_millis(100)),
            "back to the start"
        );
    }
}
