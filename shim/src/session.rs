//! The process's one conversation with metaliftd: started by the constructor,
//! consulted at the first Metal device init, closed by the outcome report.
//!
//! The verdict is turned into a [`Plan`] here, and only here: an unlock needs an
//! enforce-mode verdict that says unlock and carries capabilities, read from the
//! daemon in this process before the deadline. Anything else — no daemon, no
//! answer in time, a malformed frame, monitor mode, a forked child reusing its
//! parent's check-in — is a stock plan with the reason kept for the outcome.
#![forbid(unsafe_code)]

use std::sync::Mutex;
use std::time::{Duration, Instant};

use metalift_policy::profile::Capabilities;
use metalift_policy::verdict::Mode;
use metalift_policy::wire::{Outcome, VerdictMsg, WireAction};

use crate::config::Config;
use crate::log;
use crate::transport::{self, CheckIn};

/// What the first device init will do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Plan {
    /// Install the capability hooks.
    Unlock {
        /// Echoed in the outcome.
        decision_id: u64,
        /// What to answer.
        capabilities: Capabilities,
        /// The rule that unlocked (for the log line).
        rule: Option<String>,
    },
    /// Leave Metal alone.
    Stock {
        /// Echoed in the outcome (0: no verdict was read).
        decision_id: u64,
        /// Why, in words an admin reads in the audit log.
        reason: String,
    },
}

/// Where the conversation stands.
#[derive(Default)]
enum State {
    /// The constructor has not run (or the shim is disabled).
    #[default]
    Idle,
    /// The check-in is sent; the verdict is unread.
    Sent {
        connection: Box<dyn CheckIn>,
        /// The process that checked in: a forked child must not take its parent's verdict.
        pid: u32,
        timeout: Duration,
    },
    /// No verdict will come; the reason is kept for the outcome.
    Unreachable { reason: String },
    /// The verdict is read; the outcome is still to be sent on this connection.
    Decided { connection: Box<dyn CheckIn> },
    /// The outcome has been reported (or there is nowhere to report it).
    Closed,
}

/// One per process. A std `Mutex`: it is held only by the constructor and by the
/// first device init (which waits for the verdict *while holding it*, so a second
/// device created meanwhile on another thread waits for the same answer instead of
/// racing the hooks).
static SESSION: Mutex<State> = Mutex::new(State::Idle);

fn lock() -> std::sync::MutexGuard<'static, State> {
    SESSION
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Sends the check-in (constructor time; never blocks).
pub(crate) fn begin(config: &Config) {
    let state = match transport::start_check_in(config) {
        Ok(connection) => {
            log::debug(&format!("checked in at {}", config.socket.display()));
            State::Sent {
                connection,
                pid: std::process::id(),
                timeout: config.timeout,
            }
        }
        Err(reason) => {
            log::debug(&reason);
            State::Unreachable { reason }
        }
    };
    *lock() = state;
}

/// Waits for the verdict (first device init), at most the configured timeout.
pub(crate) fn plan() -> Plan {
    take_plan(|timeout| Instant::now() + timeout)
}

/// Takes the verdict only if it has already arrived (used when Metal cannot be
/// hooked at all, to attach the decision id to the failure without waiting).
pub(crate) fn plan_without_waiting() -> Plan {
    take_plan(|_| Instant::now())
}

fn take_plan(deadline: impl FnOnce(Duration) -> Instant) -> Plan {
    let mut state = lock();
    match std::mem::take(&mut *state) {
        State::Sent {
            mut connection,
            pid,
            timeout,
        } => {
            if pid != std::process::id() {
                *state = State::Closed;
                return stock(
                    0,
                    "forked child: the check-in belongs to the parent process",
                );
            }
            let result = connection.await_verdict(deadline(timeout));
            *state = State::Decided { connection };
            match result {
                Ok(verdict) => plan_from_verdict(&verdict),
                Err(reason) if reason.starts_with("no verdict") => {
                    stock(0, &format!("{reason} ({} ms)", timeout.as_millis()))
                }
                Err(reason) => stock(0, &reason),
            }
        }
        State::Unreachable { reason } => {
            *state = State::Closed;
            stock(0, &reason)
        }
        State::Idle => {
            *state = State::Closed;
            stock(0, "no check-in was made")
        }
        other @ (State::Decided { .. } | State::Closed) => {
            *state = other;
            stock(0, "the verdict was already used by an earlier device")
        }
    }
}

/// Sends the outcome on the check-in's connection, if there still is one.
pub(crate) fn report(outcome: &Outcome) {
    let mut state = lock();
    if let State::Decided { connection } = std::mem::replace(&mut *state, State::Closed) {
        connection.report(outcome);
    }
}

fn stock(decision_id: u64, reason: &str) -> Plan {
    Plan::Stock {
        decision_id,
        reason: reason.to_owned(),
    }
}

/// The only place a verdict becomes an unlock.
pub(crate) fn plan_from_verdict(verdict: &VerdictMsg) -> Plan {
    let rule = verdict.rule.as_deref().unwrap_or("no rule matched");
    match (verdict.action, verdict.mode, verdict.capabilities) {
        (WireAction::Unlock, Mode::Enforce, Some(capabilities)) => Plan::Unlock {
            decision_id: verdict.decision_id,
            capabilities,
            rule: verdict.rule.clone(),
        },
        (WireAction::Unlock, Mode::Enforce, None) => stock(
            verdict.decision_id,
            "malformed verdict: unlock without capabilities",
        ),
        (_, Mode::Monitor, _) if verdict.would_unlock || verdict.action == WireAction::Unlock => {
            stock(
                verdict.decision_id,
                &format!("monitor mode: would unlock ({rule})"),
            )
        }
        (_, Mode::Monitor, _) => stock(
            verdict.decision_id,
            &format!("monitor mode: stock ({rule})"),
        ),
        (WireAction::Stock, Mode::Enforce, _) => {
            stock(verdict.decision_id, &format!("verdict: stock ({rule})"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const APPLE7: Capabilities = Capabilities {
        apple_family_max: 7,
        max_threadgroup_memory: 32768,
        recommended_working_set: None,
    };

    fn verdict(action: WireAction, mode: Mode, would_unlock: bool) -> VerdictMsg {
        VerdictMsg {
            decision_id: 9,
            action,
            capabilities: (action == WireAction::Unlock).then_some(APPLE7),
            profile: Some("apple7".into()),
            rule: Some("llama".into()),
            mode,
            would_unlock,
        }
    }

    #[test]
    fn only_an_enforced_unlock_with_capabilities_unlocks() {
        assert_eq!(
            plan_from_verdict(&verdict(WireAction::Unlock, Mode::Enforce, false)),
            Plan::Unlock {
                decision_id: 9,
                capabilities: APPLE7,
                rule: Some("llama".into())
            }
        );
    }

    #[test]
    fn monitor_mode_stays_stock_and_says_it_would_unlock() {
        let plan = plan_from_verdict(&verdict(WireAction::Stock, Mode::Monitor, true));
        assert_eq!(plan, stock(9, "monitor mode: would unlock (llama)"));
        // Even a daemon that says "unlock" in monitor mode is not obeyed.
        let plan = plan_from_verdict(&verdict(WireAction::Unlock, Mode::Monitor, false));
        assert!(matches!(plan, Plan::Stock { .. }));
    }

    #[test]
    fn a_stock_verdict_names_its_rule() {
        let mut v = verdict(WireAction::Stock, Mode::Enforce, false);
        assert_eq!(plan_from_verdict(&v), stock(9, "verdict: stock (llama)"));
        v.rule = None;
        assert_eq!(
            plan_from_verdict(&v),
            stock(9, "verdict: stock (no rule matched)")
        );
    }
}
