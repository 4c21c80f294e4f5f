//! Whether metaliftd can do what its policy says, as the daemon itself experiences it.
//!
//! A daemon can answer every check-in and still unlock nothing: when the audit log
//! refuses a record, the decision is answered stock (no unlock the log does not
//! hold). Counters alone leave an admin to infer that; this module names it. The
//! daemon's [`Health`] is part of its status document (`"health"`), so
//! `metalift status`, `metalift doctor` and `metalift exec --require-unlock` all
//! read the same verdict, cause first:
//!
//! ```json
//! "health": {"state": "degraded", "causes": [{"code": "audit_write_failed", "message": "...", "effect": "unlocks_nothing"}]}
//! ```
//!
//! Each cause carries its `effect` on unlocks ([`Effect`], the last column below),
//! decided here once ([`Effect::of`]): clients render it, they do not re-derive it
//! from the code (a cause a newer daemon adds then reads right in an older CLI).
//!
//! Causes, in the order they are listed (the first is the one to fix first):
//!
//! | code                 | what the daemon sees                                  | unlocks        |
//! |----------------------|-------------------------------------------------------|----------------|
//! | `audit_write_failed` | its last audit append failed (full, unwritable, I/O)  | none           |
//! | `audit_disk_full`    | under [`LOW_SPACE_BYTES`] free where the log is       | none, or soon  |
//! | `audit_unwritable`   | its log cannot be opened for appending (before a write fails) | none   |
//! | `audit_log_removed`  | its log's path is gone: records go to a deleted file  | all, unseen    |
//! | `nothing_live`       | no policy was good since start (the empty fallback)   | none           |
//! | `policy_missing`     | `policy.toml` does not exist                          | last good only |
//! | `policy_rejected`    | the last load was refused                             | last good only |
//! | `verification_refused` | the verification file is refused (owner, size, unreadable) | not the `require_verified` profiles |
//! | `unverified`         | a `require_verified` profile has no pass for this host | not that profile |
//! | `forward_behind`     | with `[audit.forward]`: a record has waited unsent longer than `max_delay_seconds` | all, unseen by the collector |
//!
//! `nothing_live` comes before the policy cause it explains: the daemon runs on
//! the empty fallback and every check-in is answered stock.
//!
//! A report without `health` (a daemon older than this field) reads as
//! [`State::Unknown`] with the `health_unknown` cause: never as healthy.
//!
//! `forward_behind` says how many records (counted at most once a second while
//! behind) and bytes wait (the bytes are exact: the forwarder's cursor against the
//! files), since when the oldest waits, and the forwarder's last error; it clears
//! at the first status after the forwarder has caught up.
//!
//! `audit_write_failed` clears with the next record written (space came back),
//! and a status request tries the log again first (writing the pending
//! `records_lost` record), so it clears at the first status after the fix;
//! free space is measured when asked, on the open log file (`fstatvfs`), so it
//! describes the file records actually go to.

use serde::{Deserialize, Serialize};

use std::time::SystemTime;

use crate::audit::forward::ForwarderStatus;
use crate::audit::AuditLog;
use crate::audit::LoadReason;
use crate::live_policy::store::Published;

/// Below this much free space on the audit log's file system the daemon is
/// degraded: room for a few dozen decision records (each well under 1 KiB), so the
/// next burst of check-ins would be answered stock.
pub const LOW_SPACE_BYTES: u64 = 64 * 1024;

/// The cause codes, stable for scripts (`metalift exec --require-unlock` names them).
pub mod code {
    /// The last audit append failed: every decision is answered stock.
    pub const AUDIT_WRITE_FAILED: &str = "audit_write_failed";
    /// The audit log's file system is (nearly) full.
    pub const AUDIT_DISK_FULL: &str = "audit_disk_full";
    /// The audit log cannot be opened for appending (immutable, read-only file
    /// system): the next write fails, so it is said before it does.
    pub const AUDIT_UNWRITABLE: &str = "audit_unwritable";
    /// The audit log's path no longer exists: records go to a deleted file.
    pub const AUDIT_LOG_REMOVED: &str = "audit_log_removed";
    /// `policy.toml` does not exist; the last good policy stays live.
    pub const POLICY_MISSING: &str = "policy_missing";
    /// The last policy load was refused; the last good policy stays live.
    pub const POLICY_REJECTED: &str = "policy_rejected";
    /// No policy has been live since start: every check-in is answered stock.
    pub const NOTHING_LIVE: &str = "nothing_live";
    /// The verification file is refused: `require_verified` profiles answer stock.
    pub const VERIFICATION_REFUSED: &str = "verification_refused";
    /// A `require_verified` profile has no passing verification for this host.
    pub const UNVERIFIED: &str = "unverified";
    /// `[audit.forward]`: a record has waited unsent longer than `max_delay_seconds`.
    pub const FORWARD_BEHIND: &str = "forward_behind";
    /// The report has no health (an older daemon): whether it unlocks is unknown.
    pub const HEALTH_UNKNOWN: &str = "health_unknown";
}

/// `ok` or `degraded`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    /// Nothing stands between the policy and the verdicts.
    #[default]
    Ok,
    /// Running, but not able to unlock as the policy says: see the causes.
    Degraded,
    /// The daemon sent no health (older than the field): nobody knows. Never `ok`.
    Unknown,
}

/// What a cause does to unlocks, mildest first (`"effect"` of each cause in the
/// status document). "Unlocks nothing" is never milder than "degraded".
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Effect {
    /// It unlocks with the last good policy; the file on disk is not what is live.
    DiskNotLive,
    /// It unlocks, but not all the policy says (or nobody can tell).
    Degraded,
    /// Every check-in is answered stock.
    UnlocksNothing,
}

impl Effect {
    /// The effect of the cause `code` (the table in this module's documentation).
    /// A code this build does not know is never read as milder than degraded.
    #[must_use]
    pub fn of(cause_code: &str) -> Effect {
        match cause_code {
            code::AUDIT_WRITE_FAILED
            | code::AUDIT_DISK_FULL
            | code::AUDIT_UNWRITABLE
            | code::NOTHING_LIVE => Effect::UnlocksNothing,
            code::POLICY_REJECTED => Effect::DiskNotLive,
            // policy_missing, audit_log_removed, verification_refused, unverified,
            // forward_behind, health_unknown, and any code added later.
            _ => Effect::Degraded,
        }
    }

    /// The word sent as `"effect"`.
    #[must_use]
    pub fn word(self) -> &'static str {
        match self {
            Effect::DiskNotLive => "disk_not_live",
            Effect::Degraded => "degraded",
            Effect::UnlocksNothing => "unlocks_nothing",
        }
    }
}

/// One reason the daemon is degraded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Cause {
    /// A stable code from [`code`].
    pub code: String,
    /// What is wrong and what it does to verdicts, for an admin.
    pub message: String,
    /// What it does to unlocks, as this daemon decided ([`Effect::of`]). `None`
    /// only when read from a daemon older than the field (it never sends it).
    /// A word this build does not know fails the status document, as any
    /// unknown enum value there does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<Effect>,
}

impl Cause {
    /// The cause `code` with its effect on unlocks.
    #[must_use]
    pub fn new(code: &str, message: String) -> Cause {
        Cause {
            code: code.to_owned(),
            message,
            effect: Some(Effect::of(code)),
        }
    }

    /// Whether this cause turns every unlock off (the audit log cannot hold decisions).
    #[must_use]
    pub fn stops_unlocks(&self) -> bool {
        self.effect.unwrap_or_else(|| Effect::of(&self.code)) == Effect::UnlocksNothing
    }
}

/// The daemon's health: its state and every cause, most severe first.
/// An older daemon sends none: the status report reads it as [`Health::unknown`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `degraded` exactly when there is a cause.
    pub state: State,
    /// Why, most severe first; empty when `ok`.
    pub causes: Vec<Cause>,
}

impl Health {
    /// The health with these causes (degraded when there is any).
    #[must_use]
    pub fn from_causes(causes: Vec<Cause>) -> Health {
        Health {
            state: if causes.is_empty() {
                State::Ok
            } else {
                State::Degraded
            },
            causes,
        }
    }

    /// Whether the daemon is degraded.
    #[must_use]
    pub fn is_degraded(&self) -> bool {
        self.state == State::Degraded
    }

    /// What a report without `health` means: a daemon too old to say, so unknown
    /// (never healthy), with the `health_unknown` cause.
    #[must_use]
    pub fn unknown() -> Health {
        Health {
            state: State::Unknown,
            causes: vec![Cause::new(
                code::HEALTH_UNKNOWN,
                "metaliftd sends no health report (it is older than this metalift): \
                          whether it can unlock is unknown; upgrade it"
                    .to_owned(),
            )],
        }
    }
}

/// Bytes this daemon may still write on the file system holding `file`: the
/// blocks reserved for root count when it runs as root (as its writes may use them).
pub fn free_bytes(file: &std::fs::File) -> std::io::Result<u64> {
    let vfs = rustix::fs::fstatvfs(file)?;
    let blocks = if rustix::process::geteuid().is_root() {
        vfs.f_bfree
    } else {
        vfs.f_bavail
    };
    Ok(blocks.saturating_mul(vfs.f_frsize))
}

/// What the audit log tells about health: its last append's result and the free
/// space where it writes (`None`: could not be measured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuditFacts {
    /// The log file.
    pub path: String,
    /// The last append's failure, if it failed.
    pub last_failure: Option<crate::audit::writer::WriteFailure>,
    /// Free bytes on its file system.
    pub free_bytes: Option<u64>,
    /// Why the log's path cannot be opened for appending now (`None`: it can),
    /// `NotFound` apart: see `removed`.
    pub unwritable: Option<String>,
    /// The log's path does not exist (removed or renamed by someone else).
    pub removed: bool,
}

impl AuditFacts {
    /// Reads them from the live log.
    #[must_use]
    pub fn of(audit: &AuditLog) -> AuditFacts {
        // Opening for append writes nothing, and fails where the next write
        // would (an immutable file, a read-only file system), before it does.
        let reopen = std::fs::OpenOptions::new().append(true).open(audit.path());
        let (unwritable, removed) = match reopen {
            Ok(_) => (None, false),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => (None, true),
            Err(e) => (Some(e.to_string()), false),
        };
        AuditFacts {
            path: audit.path().display().to_string(),
            last_failure: audit.last_failure(),
            free_bytes: audit.with_file(free_bytes).ok(),
            unwritable,
            removed,
        }
    }
}

/// The daemon's health from the published policy state and the audit log's facts.
#[must_use]
pub fn assess(published: &Published, audit: &AuditFacts) -> Health {
    let mut causes = Vec::new();
    if let Some(failure) = &audit.last_failure {
        causes.push(Cause::new(
            code::AUDIT_WRITE_FAILED,
            format!(
                "the last audit write failed ({}): {}; every decision is answered stock \
                 until a record can be written",
                crate::audit::record::rfc3339::format(failure.at),
                failure.error
            ),
        ));
    }
    if let Some(why) = &audit.unwritable {
        causes.push(Cause::new(
            code::AUDIT_UNWRITABLE,
            format!(
                "the audit log {} cannot be opened for appending ({why}): its next write \
                 fails, and every decision it cannot record is answered stock",
                audit.path
            ),
        ));
    }
    if audit.removed {
        causes.push(Cause::new(
            code::AUDIT_LOG_REMOVED,
            format!(
                "the audit log {} no longer exists: records go to a deleted file nobody \
                 can read; restart metaliftd to open a new one",
                audit.path
            ),
        ));
    }
    if let Some(free) = audit.free_bytes.filter(|f| *f < LOW_SPACE_BYTES) {
        causes.push(Cause::new(
            code::AUDIT_DISK_FULL,
            format!(
                "{free} bytes free on the file system of the audit log {} (under {} KiB): \
                 decisions it cannot record are answered stock; free space there",
                audit.path,
                LOW_SPACE_BYTES / 1024
            ),
        ));
    }
    if let Some(refusal) = &published.refusal {
        let live = &published.live;
        let nothing_live = matches!(
            live.reason,
            LoadReason::Missing | LoadReason::RejectedAtStart
        );
        if nothing_live {
            causes.push(Cause::new(
                code::NOTHING_LIVE,
                "no policy has been live since metaliftd started: every check-in \
                          is answered stock until a valid policy is installed"
                    .to_owned(),
            ));
        }
        let kept = match live.reason {
            // The fallback the daemon started with, not a policy that once was good.
            LoadReason::Missing | LoadReason::RejectedAtStart => {
                "no policy has been live since metaliftd started: every check-in is \
                 answered stock"
                    .to_owned()
            }
            _ => format!(
                "the last good policy stays live (sha256 {}, {} rules)",
                live.sha256, live.rule_count
            ),
        };
        let first = refusal
            .errors
            .first()
            .and_then(|e| e.lines().next())
            .unwrap_or("refused");
        let (code, message) = if refusal.missing {
            (code::POLICY_MISSING, format!("{first}; {kept}"))
        } else {
            let more = refusal.errors.len().saturating_sub(1);
            (
                code::POLICY_REJECTED,
                format!(
                    "the last policy load was refused: {first}{}; {kept}",
                    match more {
                        0 => String::new(),
                        1 => " (and 1 more error)".to_owned(),
                        n => format!(" (and {n} more errors)"),
                    }
                ),
            )
        };
        causes.push(Cause::new(code, message));
    }
    Health::from_causes(causes)
}

/// `forward_behind` when `forwarder` (configured) has had a record waiting
/// undelivered longer than its `max_delay_seconds` at `now`; none otherwise.
#[must_use]
pub fn forward_behind(forwarder: Option<&ForwarderStatus>, now: SystemTime) -> Vec<Cause> {
    let Some(f) = forwarder.filter(|f| f.configured) else {
        return Vec::new();
    };
    let (Some(since), Some(max)) = (f.behind_since_at, f.max_delay_seconds) else {
        return Vec::new();
    };
    let waited = now.duration_since(since).unwrap_or_default();
    if waited <= std::time::Duration::from_secs(max) {
        return Vec::new();
    }
    let address = f.address.as_deref().unwrap_or("the collector");
    let connection = if f.connected {
        "connected, not taking them".to_owned()
    } else {
        "not connected".to_owned()
    };
    let error = f.last_error.as_deref().map_or_else(
        || "no error seen".to_owned(),
        |e| {
            format!(
                "last error {}: {e}",
                f.last_error_at.as_deref().unwrap_or("(time unknown)")
            )
        },
    );
    // Sent and not known delivered: a collector that takes connections and drops
    // them before acknowledging has nothing "not yet sent" and everything in flight.
    let in_flight = f.undelivered_bytes.saturating_sub(f.bytes_behind);
    let in_flight = if in_flight == 0 {
        String::new()
    } else {
        format!(", {in_flight} bytes sent and not known delivered")
    };
    vec![Cause::new(
        code::FORWARD_BEHIND,
        format!(
            "{} bytes not delivered to {address} ({connection}): {} records ({} bytes) not \
             yet sent{in_flight}; the oldest waiting since {} ({}s, over max_delay_seconds = \
             {max}); {error}; they wait in the local log and go out once the collector takes them",
            f.undelivered_bytes.max(f.bytes_behind),
            f.records_behind,
            f.bytes_behind,
            f.behind_since.as_deref().unwrap_or("?"),
            waited.as_secs(),
        ),
    )]
}

impl Health {
    /// This health with `more` causes after its own (they are less severe).
    #[must_use]
    pub fn and(self, more: Vec<Cause>) -> Health {
        let mut causes = self.causes;
        causes.extend(more);
        Health::from_causes(causes)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::SystemTime;

    use metalift_policy::Policy;

    use super::*;
    use crate::audit::writer::WriteFailure;
    use crate::audit::LoadReason;
    use crate::live_policy::store::{LastRefusal, LivePolicy};

    fn published(refusal: Option<LastRefusal>) -> Published {
        Published {
            live: Arc::new(LivePolicy {
                policy: Arc::new(Policy::empty()),
                path: "/etc/metalift/policy.toml".into(),
                sha256: "ab".repeat(32),
                loaded_at: SystemTime::now(),
                rule_count: 3,
                warnings: Vec::new(),
                reason: LoadReason::Start,
            }),
            refusal,
        }
    }

    fn facts(failed: bool, free: Option<u64>) -> AuditFacts {
        AuditFacts {
            path: "/var/log/metalift/audit.jsonl".into(),
            last_failure: failed.then(|| WriteFailure {
                at: SystemTime::now(),
                error: "cannot write audit log: No space left on device (os error 28)".into(),
            }),
            free_bytes: free,
            unwritable: None,
            removed: false,
        }
    }

    #[test]
    fn nothing_wrong_is_ok_and_room_for_records_is_not_a_cause() {
        let health = assess(&published(None), &facts(false, Some(LOW_SPACE_BYTES)));
        assert_eq!(health, Health::default());
        assert!(!health.is_degraded());
    }

    #[test]
    fn the_causes_come_most_severe_first() {
        let refusal = LastRefusal {
            errors: vec!["/etc/metalift/policy.toml: no such policy file".into()],
            sha256: None,
            at: SystemTime::now(),
            missing: true,
        };
        let health = assess(&published(Some(refusal)), &facts(true, Some(100)));
        assert!(health.is_degraded());
        let codes: Vec<&str> = health.causes.iter().map(|c| c.code.as_str()).collect();
        assert_eq!(
            codes,
            [
                code::AUDIT_WRITE_FAILED,
                code::AUDIT_DISK_FULL,
                code::POLICY_MISSING
            ]
        );
        assert!(health.causes[0].message.contains("No space left on device"));
        assert!(health.causes[0].stops_unlocks() && health.causes[1].stops_unlocks());
        assert!(!health.causes[2].stops_unlocks());
        assert!(
            health.causes[2]
                .message
                .contains("the last good policy stays live"),
            "{:?}",
            health.causes[2]
        );
    }

    #[test]
    fn each_cause_is_sent_with_its_effect_and_unlocking_nothing_is_never_milder() {
        assert!(Effect::UnlocksNothing > Effect::Degraded);
        assert!(Effect::Degraded > Effect::DiskNotLive);
        assert!(Effect::of(code::NOTHING_LIVE) > Effect::of(code::POLICY_MISSING));
        assert!(Effect::of(code::AUDIT_WRITE_FAILED) > Effect::of(code::UNVERIFIED));
        assert_eq!(Effect::of("a_cause_from_a_newer_daemon"), Effect::Degraded);
        // An older daemon's cause has no effect: read as None, not guessed here.
        let old: Cause =
            serde_json::from_value(serde_json::json!({"code": "unverified", "message": "m"}))
                .unwrap();
        assert_eq!(old.effect, None);
    }

    #[test]
    fn a_daemon_that_never_had_a_good_policy_does_not_claim_one_stays_live() {
        let refusal = LastRefusal {
            errors: vec!["/etc/metalift/policy.toml: no such policy file".into()],
            sha256: None,
            at: SystemTime::now(),
            missing: true,
        };
        let mut fallback = published(Some(refusal));
        if let Some(live) = Arc::get_mut(&mut fallback.live) {
            live.reason = LoadReason::Missing;
        }
        let health = assess(&fallback, &facts(false, None));
        let message = &health.causes[0].message;
        assert!(
            message.contains("no policy has been live since metaliftd started"),
            "{message}"
        );
        assert!(!message.contains("last good"), "{message}");
    }

    #[test]
    fn a_refused_load_names_its_first_error_and_how_many_more() {
        let refusal = LastRefusal {
            errors: vec![
                "p.toml:3:1: error: unknown key\n  | x = 1".into(),
                "p.toml:4:1: error: unknown key".into(),
            ],
            sha256: Some("cd".repeat(32)),
            at: SystemTime::now(),
            missing: false,
        };
        let health = assess(&published(Some(refusal)), &facts(false, None));
        assert_eq!(health.causes.len(), 1);
        assert_eq!(health.causes[0].code, code::POLICY_REJECTED);
        assert!(
            health.causes[0]
                .message
                .starts_with("the last policy load was refused: p.toml:3:1: error: unknown key (and 1 more error)"),
            "{:?}",
            health.causes[0]
        );
        assert!(
            !health.causes[0].message.contains("x = 1"),
            "no source lines"
        );
    }

    #[test]
    fn records_waiting_past_the_threshold_are_forward_behind_and_clear_when_sent() {
        use std::time::Duration;
        let config: metalift_policy::forward::Forward =
            metalift_policy::compile_sources(vec![metalift_policy::Source {
                name: "p.toml".into(),
                text:
                    "version = 1\n[audit.forward]\naddress = \"logs:514\"\nmax_delay_seconds = 2\n"
                        .into(),
            }])
            .expect("policy")
            .policy
            .forward()
            .cloned()
            .expect("forward");
        let mut f = ForwarderStatus::configured(Some(&config));
        let t0 = SystemTime::now();
        f.records_behind = 8;
        f.set_behind(900, 1000, Some(t0));
        f.last_error = Some("connecting to logs:514: Connection refused".into());
        assert!(forward_behind(Some(&f), t0 + Duration::from_secs(2)).is_empty());
        let causes = forward_behind(Some(&f), t0 + Duration::from_secs(3));
        assert_eq!(causes.len(), 1);
        assert_eq!(causes[0].code, code::FORWARD_BEHIND);
        assert_eq!(causes[0].effect, Some(Effect::Degraded));
        let m = &causes[0].message;
        assert!(
            m.starts_with(
                "1000 bytes not delivered to logs:514 (not connected): 8 records (900 bytes) \
                 not yet sent, 100 bytes sent and not known delivered; the oldest waiting since"
            ),
            "{m}"
        );
        assert!(
            m.contains("Connection refused") && m.contains("max_delay_seconds = 2"),
            "{m}"
        );
        f.set_behind(0, 0, None);
        assert!(forward_behind(Some(&f), t0 + Duration::from_secs(60)).is_empty());
        assert!(forward_behind(None, t0).is_empty());
    }

    #[test]
    fn the_health_document_has_the_shape_status_readers_rely_on() {
        let json = serde_json::to_value(Health::from_causes(vec![Cause::new(
            code::AUDIT_DISK_FULL,
            "m".into(),
        )]))
        .unwrap();
        assert_eq!(
            json,
            serde_json::json!({"state": "degraded", "causes": [
                {"code": "audit_disk_full", "message": "m", "effect": "unlocks_nothing"}
            ]})
        );
        let ok: Health = serde_json::from_str(r#"{"state": "ok", "causes": []}"#).unwrap();
        assert_eq!(ok, Health::default());
    }
}
