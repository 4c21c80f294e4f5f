//! Refusals: a check-in or an outcome the daemon would not accept, each an audit
//! record of its own kind (`"kind": "refused"`), and the budget that keeps a flood
//! of them from filling the disk.
//!
//! Why a record and not a log line: an outcome sent for another process's
//! decision, or a check-in whose uid changed since `connect`, is an attempt to
//! make the audit log say something false. The admin reads the audit log, so
//! that is where the attempt must show (`metalift audit --kind refused`).
//!
//! The budget: at most [`RefusalBudget::BURST`] records at once, refilled at
//! [`RefusalBudget::PER_MINUTE`] a minute. A refusal past it is counted, and the
//! next record written says how many were not (`suppressed`), so the log is
//! complete in number if not in detail. A flood costs at most about one short
//! line a second.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

use serde::{Deserialize, Serialize};

use super::rfc3339;

/// A message the daemon refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct RefusedRecord {
    /// When it was refused.
    #[serde(with = "rfc3339")]
    #[schemars(with = "String", description = "RFC 3339, UTC, microseconds")]
    pub time: SystemTime,
    /// What was refused: `check_in` or `outcome`.
    pub message: String,
    /// Why, one word: `other_process`, `wrong_decision`, `malformed`,
    /// `unexpected`, `no_audit_token`, `uid_changed`.
    pub reason: String,
    /// The same in words, with the facts (pids, decision ids, uids).
    pub detail: String,
    /// The sender's pid, from the kernel; `null` when the kernel named none.
    pub pid: Option<i32>,
    /// The sender's uid, from the kernel, when known.
    pub uid: Option<u32>,
    /// The executable of the process that checked in on this connection, when
    /// known (for an outcome: the decision's process, not necessarily the sender).
    pub exe: Option<String>,
    /// The decision given on this connection, for a refused outcome.
    pub decision_id: Option<u64>,
    /// `unix` or `xpc`.
    pub transport: String,
    /// Refusals not recorded since the previous `refused` record (over budget).
    #[serde(default)]
    pub suppressed: u64,
}

/// How many refusal records may be written: a token bucket.
#[derive(Debug)]
pub struct RefusalBudget {
    state: Mutex<Bucket>,
}

#[derive(Debug)]
struct Bucket {
    /// Records that may be written now (fractional while refilling).
    tokens: f64,
    /// When `tokens` was last brought up to date.
    at: Option<Instant>,
    /// Refusals not recorded since the last record.
    suppressed: u64,
}

impl Default for RefusalBudget {
    fn default() -> Self {
        RefusalBudget {
            state: Mutex::new(Bucket {
                tokens: Self::BURST,
                at: None,
                suppressed: 0,
            }),
        }
    }
}

impl RefusalBudget {
    /// Records written back to back before the budget bites.
    pub const BURST: f64 = 20.0;
    /// Records a minute once it does.
    pub const PER_MINUTE: f64 = 60.0;

    /// Whether a refusal at `now` may be recorded: `Some(n)` with the number of
    /// refusals suppressed since the last record (to write in this one), or
    /// `None`: over budget, counted.
    pub fn take(&self, now: Instant) -> Option<u64> {
        let mut b = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let elapsed =
            b.at.map_or(Duration::ZERO, |at| now.saturating_duration_since(at));
        b.tokens = (b.tokens + elapsed.as_secs_f64() * Self::PER_MINUTE / 60.0).min(Self::BURST);
        b.at = Some(now);
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            Some(std::mem::take(&mut b.suppressed))
        } else {
            b.suppressed += 1;
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_writes_the_burst_then_one_a_second_and_counts_the_rest() {
        let budget = RefusalBudget::default();
        let t0 = Instant::now();
        let written = (0..1000).filter(|_| budget.take(t0).is_some()).count();
        assert_eq!(written, RefusalBudget::BURST as usize);
        // One second later one more may be written, carrying the count of the
        // 980 that were not.
        assert_eq!(budget.take(t0 + Duration::from_secs(1)), Some(980));
        assert_eq!(budget.take(t0 + Duration::from_secs(1)), None);
        assert_eq!(budget.take(t0 + Duration::from_secs(2)), Some(1));
    }

    #[test]
    fn after_a_quiet_minute_the_burst_is_back_and_nothing_was_suppressed() {
        let budget = RefusalBudget::default();
        let t0 = Instant::now();
        for _ in 0..RefusalBudget::BURST as usize {
            assert_eq!(budget.take(t0), Some(0));
        }
        let later = t0 + Duration::from_secs(60);
        for _ in 0..RefusalBudget::BURST as usize {
            assert_eq!(budget.take(later), Some(0));
        }
        assert_eq!(budget.take(later), None);
    }
}
