//! The audit log's records: one JSON object per line, tagged by `"kind"`.
//!
//! Every record carries `"time"` (RFC 3339, UTC, microseconds). Optional identity
//! fields of a decision are always present in the JSON (as `null` when unknown), so
//! `jq '.rule'` means the same thing on every decision line.

use std::collections::BTreeMap;
use std::time::SystemTime;

use metalift_policy::wire::{Answers, OtherShimPatched, Outcome};
use serde::{Deserialize, Serialize};

/// One line of the audit log. The writer writes every field; the reader
/// (`metalift audit`) deserialises these same types, ignoring fields it does not
/// know (a newer daemon's) and defaulting descriptive fields an older one lacked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
// The daemon builds one record per event, borrows it to write it and drops it, and
// readers stream them (`LogReader::read_to_end_each`), so the enum's size is never
// multiplied, while boxing the decision would add an allocation to every check-in.
// The decision outgrew clippy's 200-byte margin with the never-above-the-host fields.
#[allow(clippy::large_enum_variant)]
pub enum Record {
    /// A verdict the daemon decided, written before the verdict is sent.
    Decision(DecisionRecord),
    /// What the shim reported it actually did with a verdict.
    Outcome(OutcomeRecord),
    /// A check-in or outcome the daemon refused (rate-limited: `super::refused`).
    Refused(super::refused::RefusedRecord),
    /// A policy became live (at start, after an edit or a SIGHUP; a deleted file is
    /// refused instead, and older daemons recorded `deleted`).
    PolicyLoaded {
        /// When it became live.
        #[serde(with = "rfc3339")]
        #[schemars(with = "String", description = "RFC 3339, UTC, microseconds")]
        time: SystemTime,
        /// The policy file (`policy.toml`) the policy was loaded from.
        path: String,
        /// SHA-256 of the merged policy text now live (hex).
        sha256: String,
        /// Number of rules now live.
        rules: usize,
        /// `enforce` or `monitor`.
        mode: String,
        /// Rendered warnings (`file:line:col: warning: ...`); the policy was accepted anyway.
        warnings: Vec<String>,
        /// Why it was loaded: one of the [`LoadReason`] words.
        reason: LoadReason,
    },
    /// A policy was refused; the previous one (`kept_sha256`) stays live.
    PolicyRejected {
        /// When it was refused.
        #[serde(with = "rfc3339")]
        #[schemars(with = "String", description = "RFC 3339, UTC, microseconds")]
        time: SystemTime,
        /// The policy file (`policy.toml`) whose load failed.
        path: String,
        /// SHA-256 of the refused input, when it could be read.
        sha256: Option<String>,
        /// Every error, rendered `file:line:col: error: message` (first line only).
        errors: Vec<String>,
        /// SHA-256 of the policy that stays live.
        kept_sha256: String,
    },
    /// metaliftd started serving.
    DaemonStart {
        /// When it started.
        #[serde(with = "rfc3339")]
        #[schemars(with = "String", description = "RFC 3339, UTC, microseconds")]
        time: SystemTime,
        /// The daemon's version.
        version: String,
        /// The daemon's pid.
        pid: u32,
        /// The policy file it watches.
        policy: String,
        /// Where it listens (socket path or XPC service name).
        listen: String,
    },
    /// `metalift verify` ran the kernels of a profile (verified unlock): the same
    /// record the verification file holds.
    Verification(super::verification::VerificationRecord),
    /// metaliftd stopped.
    DaemonStop {
        /// When it stopped.
        #[serde(with = "rfc3339")]
        #[schemars(with = "String", description = "RFC 3339, UTC, microseconds")]
        time: SystemTime,
        /// Why (`SIGTERM`, `SIGINT`, ...).
        reason: String,
        /// Check-ins answered since start.
        checkins: u64,
        /// Unlock verdicts given since start.
        unlocks: u64,
        /// The daemon's pid (0 in records of older daemons, which had none).
        #[serde(default)]
        pid: u32,
    },
    /// Records the log could not take: the first record written after a gap
    /// says how many were lost, over which time and decision ids. The daemon
    /// answered each of their decisions stock.
    RecordsLost {
        /// When the log took records again.
        #[serde(with = "rfc3339")]
        #[schemars(with = "String", description = "RFC 3339, UTC, microseconds")]
        time: SystemTime,
        /// How many records were not written.
        count: u64,
        /// When the first lost record failed.
        #[serde(with = "rfc3339")]
        #[schemars(with = "String", description = "RFC 3339, UTC, microseconds")]
        first_at: SystemTime,
        /// When the last lost record failed.
        #[serde(with = "rfc3339")]
        #[schemars(with = "String", description = "RFC 3339, UTC, microseconds")]
        last_at: SystemTime,
        /// The lowest decision id among the lost records (`None`: no decision lost).
        first_decision_id: Option<u64>,
        /// The highest decision id among them.
        last_decision_id: Option<u64>,
        /// The first failure's error.
        error: String,
        /// The daemon's pid.
        pid: u32,
    },
    /// Records rotated away before the forwarder sent them (`[audit.forward]`):
    /// a gap in what the collector has, never silent. Written by the log itself
    /// as the first record of the fresh file, right after the rotation that
    /// deleted them (`forward/gaps.rs`).
    ForwardGap {
        /// When the records were deleted.
        #[serde(with = "rfc3339")]
        #[schemars(with = "String", description = "RFC 3339, UTC, microseconds")]
        time: SystemTime,
        /// The deleted file's name (the oldest rotated file, `audit.jsonl.<keep>`;
        /// with `keep = 0` the live file's name). From older daemons also
        /// `device:inode`.
        file: String,
        /// Whole records in it never sent; `null` only from older daemons (a file
        /// gone before it could be counted).
        records: Option<u64>,
        /// Every record rotated away unsent since the log began, this gap's
        /// included (`forward_gap` records rotated away unsent too): records a
        /// collector has + the latest `total` = records written. Absent from
        /// older daemons' records.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        total: Option<u64>,
    },
}

/// Why a policy was loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum LoadReason {
    /// The daemon started with this policy.
    Start,
    /// The policy file (or `policy.d/`) changed.
    Change,
    /// The file came back to the content that is live, after a refused edit.
    Restored,
    /// `policy.toml` does not exist at start: no rules, everything stock.
    Missing,
    /// `policy.toml` was deleted: written by older daemons only (a deleted file is
    /// now refused and the last good policy stays live).
    Deleted,
    /// The policy was refused at start: the daemon runs with no rules, everything stock.
    RejectedAtStart,
    /// An admin sent SIGHUP (`launchctl kill HUP ...`, `kill -HUP`): re-read on request.
    Sighup,
}

impl LoadReason {
    /// The word the audit log uses.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            LoadReason::Start => "start",
            LoadReason::Change => "change",
            LoadReason::Restored => "restored",
            LoadReason::Missing => "missing",
            LoadReason::Deleted => "deleted",
            LoadReason::RejectedAtStart => "rejected_at_start",
            LoadReason::Sighup => "sighup",
        }
    }
}

/// A decision: who asked, what the policy said, and how long deciding took.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DecisionRecord {
    /// When the verdict was decided.
    #[serde(with = "rfc3339")]
    #[schemars(with = "String", description = "RFC 3339, UTC, microseconds")]
    pub time: SystemTime,
    /// Echoed by the shim's outcome; joins the two records.
    pub decision_id: u64,
    /// The asker's pid, from the kernel.
    pub pid: i32,
    /// The asker's real uid, from the kernel.
    pub uid: u32,
    /// The asker's executable, from the kernel.
    pub exe: String,
    /// SHA-256 of the executable, when some rule needed it.
    pub sha256: Option<String>,
    /// Team identifier from a valid signature.
    pub team_id: Option<String>,
    /// Signing identifier from a valid signature.
    pub signing_id: Option<String>,
    /// Code directory hash (hex) from a valid signature.
    pub cdhash: Option<String>,
    /// What the code signature is anchored at (`apple`, `developer-id`,
    /// `app-store`, `apple-development`, `ad-hoc`, `untrusted`, `invalid`,
    /// `unsigned`, `unreadable`: `metalift_policy::Anchor`); `null` where the
    /// platform has no code signatures (Linux). `team_id`/`signing_id` are
    /// filled only for the first four. Absent from records older daemons wrote.
    #[serde(default)]
    pub anchor: Option<String>,
    /// Why the executable could not be read, e.g. `identity unreadable:
    /// permission denied` (on macOS: metaliftd lacks Full Disk Access for a
    /// TCC-protected folder), or why the file it read was not used: `file hashes
    /// not used: the running code no longer matches its file
    /// (errSecCSStaticCodeChanged)` (no `sha256`, no `cdhash`); `null` otherwise.
    #[serde(default)]
    pub identity_error: Option<String>,
    /// The parent process's executable.
    pub parent_exe: Option<String>,
    /// The pids of the parent, its parent, … as the daemon read them at the check-in
    /// (see `PeerFacts::ancestors`): `metalift exec --require-unlock` counts a
    /// decision as its command's when the command's pid is the decision's or among
    /// these. Absent from records older daemons wrote, and when empty.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ancestors: Vec<u32>,
    /// The winning rule's id; `null` when no rule matched.
    pub rule: Option<String>,
    /// `unlock` or `stock`: what the shim was told.
    pub action: String,
    /// The profile unlocked (or, in monitor mode, that would have been).
    pub profile: Option<String>,
    /// `enforce` or `monitor`.
    pub mode: String,
    /// The Apple family ceiling an unlock verdict carried (a profile's
    /// `apple_family_max = "host"` is recorded resolved); `None` for stock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apple_family_max: Option<u8>,
    /// The Apple family the unlocked profile asked for (`"host"` resolved), beside
    /// `apple_family_max`, what was applied: they differ when the host chip capped it
    /// (never above the host). `None` for stock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apple_family_requested: Option<u8>,
    /// Why `apple_family_max` is below `apple_family_requested`: "profile `apple9`
    /// asks Apple9; this host (Apple M1 (Virtual)) has Apple7: applied as Apple7".
    /// `None` when nothing was capped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub apple_family_capped: Option<String>,
    /// Why an unlock was answered stock: its profile requires a passing
    /// verification (`require_verified = true`) and none covers this host chip and
    /// macOS build. `None` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unverified: Option<String>,
    /// The winning rule's window (`from`/`until`), when it has one: this verdict
    /// holds only within it, and the same check-in after `until` is decided
    /// without that rule. Absent when the rule has none (or no rule matched).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window: Option<WindowRecord>,
    /// In monitor mode: the winning rule would have unlocked.
    #[serde(default)]
    pub would_unlock: bool,
    /// The host chip's brand string the daemon compiled its policies with (for
    /// `apple_family_max = "host"` and the ceiling no unlock exceeds), so
    /// `metalift explain --decision` re-explains on the daemon's chip, not the
    /// reader's; `null` when the daemon could not read it (or an older daemon).
    #[serde(default)]
    pub host_chip: Option<String>,
    /// SHA-256 of the policy that decided.
    pub policy_sha256: String,
    /// Microseconds from check-in received to verdict decided.
    #[serde(default)]
    pub latency_us: u64,
    /// `unix` or `xpc`.
    #[serde(default)]
    pub transport: String,
    /// What the client said about itself: logged, never matched.
    #[serde(default)]
    pub advisory: Advisory,
}

/// A rule's window as a decision records it: RFC 3339, UTC, to the second.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WindowRecord {
    /// The rule's `from`: the first instant it matches; absent: no start.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The rule's `until`: the first instant it no longer matches; absent: no end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<String>,
}

impl From<&metalift_policy::Window> for WindowRecord {
    fn from(w: &metalift_policy::Window) -> Self {
        use metalift_policy::window::format_rfc3339;
        WindowRecord {
            from: w.from.map(format_rfc3339),
            until: w.until.map(format_rfc3339),
        }
    }
}

/// The client's own claims in a check-in. Advisory only: never used to decide.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Advisory {
    /// The shim's version string.
    pub shim_version: String,
    /// The shim's architecture.
    pub arch: String,
    /// The executable the client claims to be.
    pub claimed_executable: Option<String>,
    /// The CI job the client says it runs in: allow-listed environment variables
    /// of its own (`metalift_policy::job::JOB_VARIABLES`), bounded. Never matched;
    /// `metalift audit --job ID` filters by any of the values. Absent when none.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub job: BTreeMap<String, String>,
}

/// What the shim did with a verdict.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OutcomeRecord {
    /// When the outcome was received.
    #[serde(with = "rfc3339")]
    #[schemars(with = "String", description = "RFC 3339, UTC, microseconds")]
    pub time: SystemTime,
    /// The decision it reports on (0 when no verdict reached the shim).
    pub decision_id: u64,
    /// The reporter's pid, from the kernel.
    pub pid: i32,
    /// The reporter's executable, from the kernel.
    pub exe: String,
    /// `applied`, `stock` or `failed`.
    pub result: String,
    /// Why stock or failed (empty when applied).
    #[serde(default)]
    pub reason: String,
    /// The live device's concrete class.
    #[serde(default)]
    pub device_class: String,
    /// The device's answers through the IMPs the shim found, before any hook of
    /// its own: Metal's stock answers, unless `found_through` names another
    /// shim's image (then they are the answers as found).
    #[serde(default)]
    pub stock: AnswersRecord,
    /// The answers the process now sees.
    #[serde(default)]
    pub effective: AnswersRecord,
    /// Another shim's IMPs on the capability methods (neither Metal's own nor
    /// metalift's), which metalift leaves in place. Absent: none found (or an
    /// older shim, which did not look).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub other_shim: Option<OtherShimRecord>,
    /// The job claims of the check-in this outcome reports on (its decision's
    /// `advisory.job`), so an outcome read alone still says which job it was.
    /// Advisory, never matched. Absent when the check-in claimed none (and from
    /// records of older daemons).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub job: BTreeMap<String, String>,
}

/// Another shim the reporting shim found on the capability methods.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct OtherShimRecord {
    /// The path of the image holding its IMPs.
    pub image: String,
    /// The selectors whose IMP was its, e.g. `["supportsFamily:"]`.
    pub methods: Vec<String>,
    /// `before`: its IMPs were there when metalift looked, so `stock` is the
    /// answers as found; `after`: it patched over metalift's (or Metal's) while
    /// the device was built, so `effective` is its answers.
    pub patched: String,
}

impl OutcomeRecord {
    /// The record for `outcome`, reported by `pid` running `exe`, received at `time`.
    #[must_use]
    pub fn new(time: SystemTime, pid: i32, exe: String, outcome: &Outcome) -> Self {
        OutcomeRecord {
            time,
            decision_id: outcome.decision_id,
            pid,
            exe,
            result: outcome.result.as_str().to_owned(),
            reason: outcome.reason.clone(),
            device_class: outcome.device_class.clone(),
            stock: AnswersRecord {
                found_through: outcome
                    .other_shim
                    .as_ref()
                    .filter(|o| o.patched == OtherShimPatched::Before)
                    .map(|o| o.image.clone()),
                ..AnswersRecord::from(&outcome.stock)
            },
            effective: AnswersRecord::from(&outcome.effective),
            other_shim: outcome.other_shim.as_ref().map(|o| OtherShimRecord {
                image: o.image.clone(),
                methods: o.methods.clone(),
                patched: o.patched.as_str().to_owned(),
            }),
            job: BTreeMap::new(),
        }
    }

    /// What to call the `stock` answers: `found` when another shim's IMPs were
    /// already there (they are not Metal's own), else `stock`.
    #[must_use]
    pub fn stock_label(&self) -> &'static str {
        if self.stock.found_through.is_some() {
            "found"
        } else {
            "stock"
        }
    }
}

/// A device's answers, with the families spelled out by name.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct AnswersRecord {
    /// Families answered YES, e.g. `["Apple1", ..., "Apple5", "Common3"]`.
    pub families: Vec<String>,
    /// `maxThreadgroupMemoryLength`.
    pub threadgroup_memory: u64,
    /// `recommendedMaxWorkingSetSize`.
    pub working_set: u64,
    /// Set on `stock` only: these answers came through another shim's IMPs
    /// (this image's), already there when metalift looked: the answers as found,
    /// not Metal's stock. Absent: Metal's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub found_through: Option<String>,
}

impl From<&Answers> for AnswersRecord {
    fn from(answers: &Answers) -> Self {
        AnswersRecord {
            families: answers.family_names().map(str::to_owned).collect(),
            threadgroup_memory: answers.threadgroup_memory,
            working_set: answers.working_set,
            found_through: None,
        }
    }
}

impl Record {
    /// Every `"kind"` word a [`Record`] has, in the order of the enum: what
    /// `metalift audit --kind` accepts and what the reader knows. A test checks it
    /// against the schema generated from the types, so a new kind cannot be missed.
    pub const KINDS: [&'static str; 10] = [
        "decision",
        "outcome",
        "refused",
        "policy_loaded",
        "policy_rejected",
        "daemon_start",
        "daemon_stop",
        "records_lost",
        "forward_gap",
        "verification",
    ];

    /// The `"kind"` word of this record.
    #[must_use]
    pub fn kind(&self) -> &'static str {
        match self {
            Record::Decision(_) => "decision",
            Record::Outcome(_) => "outcome",
            Record::Refused(_) => "refused",
            Record::PolicyLoaded { .. } => "policy_loaded",
            Record::PolicyRejected { .. } => "policy_rejected",
            Record::DaemonStart { .. } => "daemon_start",
            Record::DaemonStop { .. } => "daemon_stop",
            Record::RecordsLost { .. } => "records_lost",
            Record::ForwardGap { .. } => "forward_gap",
            Record::Verification(_) => "verification",
        }
    }

    /// When the event happened.
    #[must_use]
    pub fn time(&self) -> SystemTime {
        match self {
            Record::Decision(d) => d.time,
            Record::Outcome(o) => o.time,
            Record::Verification(v) => v.time,
            Record::Refused(r) => r.time,
            Record::PolicyLoaded { time, .. }
            | Record::PolicyRejected { time, .. }
            | Record::DaemonStart { time, .. }
            | Record::DaemonStop { time, .. }
            | Record::RecordsLost { time, .. }
            | Record::ForwardGap { time, .. } => *time,
        }
    }

    /// The record as one JSON line, newline included. Compact JSON escapes every
    /// control character inside strings, so the only newline is the last byte.
    pub fn to_line(&self) -> Result<Vec<u8>, serde_json::Error> {
        let mut line = serde_json::to_vec(self)?;
        line.push(b'\n');
        Ok(line)
    }
}

/// `SystemTime` as RFC 3339 (its own module, shared with [`super::refused`] and
/// [`super::verification`]).
pub use super::rfc3339;

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use metalift_policy::wire::{OtherShim, OutcomeResult};

    use super::*;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_micros(secs * 1_000_000 + 250)
    }

    fn decision() -> DecisionRecord {
        DecisionRecord {
            time: at(1_800_000_000),
            decision_id: 7,
            pid: 4242,
            uid: 501,
            exe: "/opt/llama.cpp/bin/llama-server".into(),
            sha256: None,
            team_id: None,
            signing_id: None,
            cdhash: None,
            anchor: None,
            identity_error: None,
            parent_exe: Some("/bin/zsh".into()),
            ancestors: vec![812, 501],
            rule: None,
            action: "stock".into(),
            profile: None,
            mode: "enforce".into(),
            apple_family_max: None,
            apple_family_requested: None,
            apple_family_capped: None,
            unverified: None,
            window: None,
            would_unlock: false,
            host_chip: None,
            policy_sha256: "ab".repeat(32),
            latency_us: 85,
            transport: "unix".into(),
            advisory: Advisory {
                shim_version: "0.1.0".into(),
                arch: "arm64e".into(),
                claimed_executable: Some("/usr/bin/true\nforged".into()),
                job: BTreeMap::new(),
            },
        }
    }

    fn outcome_beside(other_shim: Option<OtherShim>) -> serde_json::Value {
        let record = Record::Outcome(OutcomeRecord::new(
            at(5),
            4242,
            "/x".into(),
            &Outcome {
                decision_id: 7,
                result: OutcomeResult::Applied,
                device_class: "AppleParavirtDevice".into(),
                other_shim,
                ..Default::default()
            },
        ));
        serde_json::from_slice(&record.to_line().unwrap()).unwrap()
    }

    #[test]
    fn an_outcome_beside_another_shim_names_it_and_labels_only_answers_found_through_it() {
        let peer = |patched| {
            Some(OtherShim {
                image: "/usr/local/lib/libLumeMetalCapabilities.dylib".into(),
                methods: vec!["supportsFamily:".into()],
                patched,
            })
        };
        let before = outcome_beside(peer(OtherShimPatched::Before));
        assert_eq!(before["other_shim"]["patched"], "before", "{before}");
        assert_eq!(
            before["other_shim"]["methods"],
            serde_json::json!(["supportsFamily:"])
        );
        assert_eq!(
            before["stock"]["found_through"],
            "/usr/local/lib/libLumeMetalCapabilities.dylib"
        );
        assert!(
            before["effective"].get("found_through").is_none(),
            "{before}"
        );

        let after = outcome_beside(peer(OtherShimPatched::After));
        assert_eq!(after["other_shim"]["patched"], "after", "{after}");
        assert!(after["stock"].get("found_through").is_none(), "{after}");

        // None found: neither key is written (records read as before).
        let none = outcome_beside(None);
        assert!(none.get("other_shim").is_none(), "{none}");
        assert!(none["stock"].get("found_through").is_none(), "{none}");
    }

    #[test]
    fn given_a_decision_from_before_anchors_then_it_still_reads_and_a_new_one_round_trips() {
        let mut v: serde_json::Value =
            serde_json::from_slice(&Record::Decision(decision()).to_line().unwrap()).unwrap();
        let fields = v.as_object_mut().unwrap();
        fields.remove("anchor");
        fields.remove("identity_error");
        let old: Record = serde_json::from_value(v).expect("an older daemon's decision reads");
        assert_eq!(old, Record::Decision(decision()));

        let new = Record::Decision(DecisionRecord {
            anchor: Some("unreadable".into()),
            identity_error: Some("identity unreadable: permission denied".into()),
            ..decision()
        });
        let line = new.to_line().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["anchor"], "unreadable");
        assert_eq!(
            v["identity_error"],
            "identity unreadable: permission denied"
        );
        assert_eq!(serde_json::from_slice::<Record>(&line).unwrap(), new);
    }

    #[test]
    fn a_decision_is_one_line_tagged_decision_with_rule_null() {
        let line = Record::Decision(decision()).to_line().unwrap();
        assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1);
        assert_eq!(line.last(), Some(&b'\n'));
        let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
        assert_eq!(v["kind"], "decision");
        assert_eq!(v["time"], "2027-01-15T08:00:00.000250Z");
        assert!(v.get("rule").is_some_and(serde_json::Value::is_null));
        assert_eq!(v["action"], "stock");
        assert_eq!(v["advisory"]["claimed_executable"], "/usr/bin/true\nforged");
    }

    #[test]
    fn every_kind_round_trips_through_json() {
        let records = [
            Record::Decision(decision()),
            Record::Outcome(OutcomeRecord::new(
                at(5),
                4242,
                "/x".into(),
                &Outcome {
                    decision_id: 7,
                    result: OutcomeResult::Applied,
                    reason: String::new(),
                    device_class: "AppleParavirtDevice".into(),
                    stock: Answers {
                        families: 0b1_1111,
                        threadgroup_memory: 32768,
                        working_set: 1,
                    },
                    effective: Answers {
                        families: 0b111_1111,
                        threadgroup_memory: 32768,
                        working_set: 1,
                    },
                    ..Default::default()
                },
            )),
            Record::PolicyLoaded {
                time: at(6),
                path: "/etc/metalift/policy.toml".into(),
                sha256: "00".repeat(32),
                rules: 3,
                mode: "monitor".into(),
                warnings: vec!["p.toml:3:1: warning: w".into()],
                reason: LoadReason::Deleted,
            },
            Record::PolicyRejected {
                time: at(7),
                path: "p.toml".into(),
                sha256: None,
                errors: vec!["p.toml:1:1: error: e".into()],
                kept_sha256: "11".repeat(32),
            },
            Record::DaemonStart {
                time: at(8),
                version: "0.1.0".into(),
                pid: 1,
                policy: "p.toml".into(),
                listen: "/run/metalift/metalift.sock".into(),
            },
            Record::DaemonStop {
                time: at(9),
                reason: "SIGTERM".into(),
                checkins: 10,
                unlocks: 2,
                pid: 1,
            },
            Record::RecordsLost {
                time: at(10),
                count: 3,
                first_at: at(9),
                last_at: at(10),
                first_decision_id: Some(4),
                last_decision_id: Some(6),
                error: "cannot write audit log: No space left on device (os error 28)".into(),
                pid: 1,
            },
        ];
        for record in records {
            let line = record.to_line().unwrap();
            let back: Record = serde_json::from_slice(&line).unwrap();
            assert_eq!(back, record);
            let v: serde_json::Value = serde_json::from_slice(&line).unwrap();
            assert_eq!(v["kind"], record.kind());
        }
    }

    #[test]
    fn outcome_families_are_spelled_by_name() {
        let answers = Answers {
            families: 0b1_0000,
            threadgroup_memory: 1,
            working_set: 2,
        };
        assert_eq!(AnswersRecord::from(&answers).families, vec!["Apple5"]);
    }
}
