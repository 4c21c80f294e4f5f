//! The joined view of the audit log: each decision with the outcome the shim
//! reported for it (by decision id), as one line per process.
//!
//! Streaming in bounded memory: only decisions still waiting for their outcome are
//! kept, at most [`Join::capacity`] of them, and none longer than the window of log
//! time. A decision that falls out (or is still waiting at the end) is reported
//! with the result "no outcome". Outcomes arrive within seconds of their decision
//! (the shim reports when Metal's device is first created), so five minutes of window
//! loses no join in practice.

use std::collections::{BTreeMap, HashMap};
use std::io;
use std::time::{Duration, SystemTime};

use metalift_daemon::audit::{DecisionRecord, Host, OtherShimRecord, OutcomeRecord, Record, Stamp};

/// Decisions kept waiting for their outcome, at most.
pub const DEFAULT_CAPACITY: usize = 10_000;

/// How long (in log time) a decision waits for its outcome before it is reported
/// as "no outcome".
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

/// What became of a verdict, as the joined view reports it.
pub const NO_OUTCOME: &str = "no outcome";

/// One process: its decision and what the shim did with it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Process {
    /// When the decision was made (the outcome's time when the decision is not in the log read).
    #[serde(with = "metalift_daemon::audit::record::rfc3339")]
    pub time: SystemTime,
    /// Joins the two records.
    pub decision_id: u64,
    /// The process, from the kernel.
    pub pid: i32,
    /// Its real uid (unknown without the decision).
    pub uid: Option<u32>,
    /// Its executable.
    pub exe: String,
    /// The winning rule; `None` when no rule matched (or the decision is not in the log read).
    pub rule: Option<String>,
    /// `unlock`, `stock`, `would-unlock` (monitor mode), or `?` when the decision is not in the log read.
    pub action: String,
    /// The profile unlocked.
    pub profile: Option<String>,
    /// `applied`, `stock`, `failed` (the shim's report), or `no outcome`.
    pub result: String,
    /// Why stock or failed, as the shim said.
    pub reason: String,
    /// The policy that decided (unknown without the decision).
    pub policy_sha256: Option<String>,
    /// The device's concrete class, from the outcome.
    pub device_class: Option<String>,
    /// Another shim the outcome names on the capability methods (its image,
    /// `patched` before or after metalift); absent when none.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub other_shim: Option<OtherShimRecord>,
    /// The CI job the process claimed (the decision's `advisory.job`); empty when none.
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub job: std::collections::BTreeMap<String, String>,
    /// The guest: host name, boot id and labels of the record (`null` for records
    /// older than the `host` part).
    pub host: Option<Host>,
    /// The host chip the daemon decided on (the decision's `host_chip`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host_chip: Option<String>,
}

impl Process {
    fn decided(d: DecisionRecord) -> Process {
        let action = if d.would_unlock && d.action == "stock" {
            "would-unlock".to_owned()
        } else {
            d.action
        };
        Process {
            time: d.time,
            decision_id: d.decision_id,
            pid: d.pid,
            uid: Some(d.uid),
            exe: d.exe,
            rule: d.rule,
            action,
            profile: d.profile,
            result: NO_OUTCOME.to_owned(),
            reason: String::new(),
            policy_sha256: Some(d.policy_sha256),
            device_class: None,
            other_shim: None,
            job: d.advisory.job,
            host: None,
            host_chip: d.host_chip,
        }
    }

    /// This process on the guest `host` (the writer's pid left out: it is metaliftd's).
    fn on(mut self, host: Option<&Host>) -> Process {
        self.host = host.map(|h| Host {
            pid: None,
            ..h.clone()
        });
        self
    }

    fn answered(mut self, o: OutcomeRecord) -> Process {
        self.result = o.result;
        self.reason = o.reason;
        self.device_class = Some(o.device_class);
        self.other_shim = o.other_shim;
        self
    }

    /// An outcome whose decision is not in what was read (rotated away, before a
    /// `-n` start, or id 0: no verdict reached the shim).
    fn orphan(o: OutcomeRecord) -> Process {
        Process {
            time: o.time,
            decision_id: o.decision_id,
            pid: o.pid,
            uid: None,
            exe: o.exe.clone(),
            rule: None,
            action: "?".to_owned(),
            profile: None,
            result: String::new(),
            reason: String::new(),
            policy_sha256: None,
            device_class: None,
            other_shim: None,
            job: std::collections::BTreeMap::new(),
            host: None,
            host_chip: None,
        }
        .answered(o)
    }
}

/// Which daemon run wrote a record: the 128 random bits of its `id`
/// (`metalift_daemon::audit::stamp`), 0 for records older than ids.
///
/// Why the run and not the boot id: a decision and its outcome are written by the
/// same daemon process (the shim reports on the check-in's own connection, which
/// ends with that process; see [`Join::push`] on `daemon_start`), and the run is
/// unique per daemon process, while a boot id is shared by every daemon run of one
/// boot and is `null` where it cannot be read. `decision_id` alone is not unique
/// across guests: it is the daemon's start time in microseconds plus a counter, so
/// two clones booted together can share it.
fn run_of(stamp: &Stamp) -> u128 {
    super::dedup::split_id(&stamp.id).map_or(0, |(run, _)| run)
}

/// Joins decisions to outcomes as records stream by.
#[derive(Debug)]
pub struct Join {
    /// Where each waiting decision is in `by_age`, by (run, decision id).
    waiting: HashMap<(u128, u64), u64>,
    /// Waiting decisions in the order they were read (about their log time: a
    /// collector's file is in arrival order), so the first is the oldest.
    by_age: BTreeMap<u64, ((u128, u64), Process)>,
    read: u64,
    capacity: usize,
    window: Duration,
}

impl Default for Join {
    fn default() -> Self {
        Join::new(DEFAULT_CAPACITY, DEFAULT_WINDOW)
    }
}

/// Where joined lines go.
pub type Out<'a> = &'a mut dyn FnMut(Process) -> io::Result<()>;

impl Join {
    /// A join keeping at most `capacity` decisions, each at most `window` of log time.
    #[must_use]
    pub fn new(capacity: usize, window: Duration) -> Join {
        Join {
            waiting: HashMap::new(),
            by_age: BTreeMap::new(),
            read: 0,
            capacity: capacity.max(1),
            window,
        }
    }

    /// The most decisions ever kept waiting.
    #[must_use]
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Decisions waiting now.
    #[must_use]
    pub fn pending(&self) -> usize {
        self.by_age.len()
    }

    /// Whether the decision `decision_id` of daemon run `run` waits for its outcome.
    #[must_use]
    pub fn is_waiting(&self, run: u128, decision_id: u64) -> bool {
        self.waiting.contains_key(&(run, decision_id))
    }

    fn pop_oldest(&mut self) -> Option<Process> {
        let (_, (key, p)) = self.by_age.pop_first()?;
        self.waiting.remove(&key);
        Some(p)
    }

    /// Takes the next record of the log with its stamp (which run, which guest);
    /// lines that are complete go to `out`. A decision is joined only with an
    /// outcome of the same daemon run ([`run_of`]).
    pub fn push(&mut self, record: Record, stamp: &Stamp, out: Out<'_>) -> io::Result<()> {
        self.expire(record.time(), out)?;
        let run = run_of(stamp);
        match record {
            Record::Decision(d) => {
                let key = (run, d.decision_id);
                let p = Process::decided(d).on(stamp.host.as_ref());
                self.read += 1;
                if let Some(earlier) = self.waiting.insert(key, self.read) {
                    // The same id twice in one run: the first will never be joined now.
                    if let Some((_, replaced)) = self.by_age.remove(&earlier) {
                        out(replaced)?;
                    }
                }
                self.by_age.insert(self.read, (key, p));
                while self.by_age.len() > self.capacity {
                    if let Some(oldest) = self.pop_oldest() {
                        out(oldest)?;
                    }
                }
                Ok(())
            }
            Record::Outcome(o) => {
                let decided = self
                    .waiting
                    .remove(&(run, o.decision_id))
                    .and_then(|at| self.by_age.remove(&at));
                match decided {
                    Some((_, decided)) => out(decided.answered(o)),
                    None => out(Process::orphan(o).on(stamp.host.as_ref())),
                }
            }
            // A new daemon on a guest: the connections that would carry its
            // previous daemon's outcomes are gone (those of other guests are not).
            Record::DaemonStart { .. } => {
                let restarted: Vec<u64> = self
                    .by_age
                    .iter()
                    .filter(|(_, ((r, _), p))| {
                        // Records older than ids (run 0) cannot tell runs apart.
                        (*r != run || run == 0) && same_guest(p.host.as_ref(), stamp.host.as_ref())
                    })
                    .map(|(at, _)| *at)
                    .collect();
                for at in restarted {
                    if let Some((key, p)) = self.by_age.remove(&at) {
                        self.waiting.remove(&key);
                        out(p)?;
                    }
                }
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Reports the decisions that waited longer than the window before `now` (log
    /// time, or the wall clock while following an idle log) as "no outcome".
    pub fn expire(&mut self, now: SystemTime, out: Out<'_>) -> io::Result<()> {
        let Some(limit) = now.checked_sub(self.window) else {
            return Ok(());
        };
        // Oldest first, so only the front is looked at.
        while self
            .by_age
            .first_key_value()
            .is_some_and(|(_, (_, p))| p.time < limit)
        {
            if let Some(p) = self.pop_oldest() {
                out(p)?;
            }
        }
        Ok(())
    }

    /// The end of the log read: every decision still waiting is "no outcome".
    pub fn finish(&mut self, out: Out<'_>) -> io::Result<()> {
        while let Some(p) = self.pop_oldest() {
            out(p)?;
        }
        Ok(())
    }
}

/// Whether two records' hosts are one guest: the same boot id, or, where either
/// has none (older daemons, an unreadable boot id), the same host name.
fn same_guest(a: Option<&Host>, b: Option<&Host>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => match (&a.boot_id, &b.boot_id) {
            (Some(x), Some(y)) => x == y,
            _ => a.name == b.name,
        },
        (None, None) => true,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use metalift_policy::wire::{Answers, Outcome, OutcomeResult};

    use super::*;
    use metalift_daemon::audit::Advisory;

    fn at(secs: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + secs)
    }

    fn decision(id: u64, secs: u64) -> Record {
        Record::Decision(DecisionRecord {
            time: at(secs),
            decision_id: id,
            pid: id as i32,
            uid: 501,
            exe: format!("/bin/p{id}"),
            sha256: None,
            team_id: None,
            signing_id: None,
            cdhash: None,
            anchor: None,
            identity_error: None,
            parent_exe: None,
            ancestors: Vec::new(),
            rule: Some("r".into()),
            action: "unlock".into(),
            profile: Some("apple7".into()),
            mode: "enforce".into(),
            apple_family_max: None,
            apple_family_requested: None,
            apple_family_capped: None,
            unverified: None,
            window: None,
            would_unlock: false,
            host_chip: None,
            policy_sha256: "ab".repeat(32),
            latency_us: 1,
            transport: "unix".into(),
            advisory: Advisory::default(),
        })
    }

    fn outcome(id: u64, secs: u64) -> Record {
        Record::Outcome(OutcomeRecord::new(
            at(secs),
            id as i32,
            format!("/bin/p{id}"),
            &Outcome {
                decision_id: id,
                result: OutcomeResult::Applied,
                reason: String::new(),
                device_class: "AppleParavirtDevice".into(),
                stock: Answers::default(),
                effective: Answers::default(),
                ..Default::default()
            },
        ))
    }

    fn run(join: &mut Join, records: Vec<Record>) -> Vec<(u64, String)> {
        let mut lines = Vec::new();
        let mut out = |p: Process| {
            lines.push((p.decision_id, p.result));
            Ok(())
        };
        for r in records {
            join.push(r, &Stamp::default(), &mut out).unwrap();
        }
        join.finish(&mut out).unwrap();
        lines
    }

    #[test]
    fn a_decision_and_its_outcome_are_one_line_and_a_lonely_decision_has_no_outcome() {
        let lines = run(
            &mut Join::default(),
            vec![decision(1, 0), decision(2, 1), outcome(1, 2)],
        );
        assert_eq!(
            lines,
            [(1, "applied".to_owned()), (2, NO_OUTCOME.to_owned())]
        );
    }

    #[test]
    fn a_process_beside_another_shim_shows_it_in_the_joined_line() {
        let Record::Outcome(mut o) = outcome(1, 2) else {
            unreachable!()
        };
        o.other_shim = Some(OtherShimRecord {
            image: "/opt/lume/libLumeMetalCapabilities.dylib".into(),
            methods: vec!["supportsFamily:".into()],
            patched: "after".into(),
        });
        let mut seen = Vec::new();
        let mut out = |p: Process| {
            seen.push(p);
            Ok(())
        };
        let mut join = Join::default();
        join.push(decision(1, 0), &Stamp::default(), &mut out)
            .unwrap();
        join.push(Record::Outcome(o), &Stamp::default(), &mut out)
            .unwrap();
        join.finish(&mut out).unwrap();
        let mut text = Vec::new();
        super::super::view::line(&mut text, &seen[0], &super::super::view::Columns::default())
            .unwrap();
        let text = String::from_utf8(text).unwrap();
        assert!(
            text.contains(
                "[other shim /opt/lume/libLumeMetalCapabilities.dylib patched after metalift]"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&seen[0]).unwrap();
        assert_eq!(json["other_shim"]["patched"], "after", "{json}");
    }

    #[test]
    fn the_pending_decisions_stay_bounded_by_capacity_on_a_long_log() {
        let mut join = Join::new(100, Duration::from_secs(3600));
        let mut most = 0;
        let mut lines = 0usize;
        let mut out = |_p: Process| {
            lines += 1;
            Ok(())
        };
        // Every other decision never gets an outcome.
        for id in 0..200_000u64 {
            join.push(decision(id, id / 1000), &Stamp::default(), &mut out)
                .unwrap();
            if id % 2 == 0 {
                join.push(outcome(id, id / 1000), &Stamp::default(), &mut out)
                    .unwrap();
            }
            most = most.max(join.pending());
        }
        join.finish(&mut out).unwrap();
        assert!(most <= 100, "{most} decisions kept");
        assert_eq!(lines, 200_000, "every decision is reported exactly once");
    }

    #[test]
    fn a_decision_older_than_the_window_is_reported_when_log_time_passes_it() {
        let mut join = Join::new(100, Duration::from_secs(60));
        let mut lines = Vec::new();
        let mut out = |p: Process| {
            lines.push((p.decision_id, p.result));
            Ok(())
        };
        join.push(decision(1, 0), &Stamp::default(), &mut out)
            .unwrap();
        join.push(decision(2, 61), &Stamp::default(), &mut out)
            .unwrap();
        assert_eq!(lines, [(1, NO_OUTCOME.to_owned())]);
        assert_eq!(join.pending(), 1);
    }

    #[test]
    fn a_daemon_restart_ends_the_wait_of_the_old_daemons_decisions() {
        let lines = run(
            &mut Join::default(),
            vec![
                decision(1, 0),
                Record::DaemonStart {
                    time: at(1),
                    version: "0".into(),
                    pid: 1,
                    policy: "p".into(),
                    listen: "s".into(),
                },
                outcome(1, 2),
            ],
        );
        assert_eq!(
            lines,
            [(1, NO_OUTCOME.to_owned()), (1, "applied".to_owned())]
        );
    }

    fn guest(run: u128, seq: u64, name: &str, boot: &str) -> Stamp {
        Stamp {
            schema: 1,
            id: format!("{run:032x}-{seq}"),
            host: Some(Host {
                name: name.into(),
                boot_id: Some(boot.into()),
                labels: BTreeMap::new(),
                pid: Some(1),
                os_build: None,
                instance: None,
            }),
        }
    }

    #[test]
    fn two_clones_with_the_same_decision_id_each_get_their_own_outcome() {
        // Two guests cloned from one image, booted together: their daemons drew the
        // same decision ids. Guest B's decision 1 is not in what was read (rotated
        // away before the collector kept it); its outcome must not join guest A's.
        let a = |seq| guest(0xa, seq, "clone", "boot-a");
        let b = |seq| guest(0xb, seq, "clone", "boot-b");
        let Record::Outcome(mut failed) = outcome(1, 2) else {
            unreachable!()
        };
        failed.result = "failed".into();
        failed.exe = "/bin/on-b".into();
        let mut lines = Vec::new();
        let mut out = |p: Process| {
            lines.push((
                p.host.map(|h| h.boot_id.unwrap_or_default()),
                p.exe,
                p.action,
                p.result,
            ));
            Ok(())
        };
        let mut join = Join::default();
        join.push(decision(1, 0), &a(1), &mut out).unwrap();
        join.push(Record::Outcome(failed), &b(7), &mut out).unwrap();
        join.push(outcome(1, 3), &a(2), &mut out).unwrap();
        join.finish(&mut out).unwrap();
        let line = |boot: &str, exe: &str, action: &str, result: &str| {
            (
                Some(boot.to_owned()),
                exe.to_owned(),
                action.to_owned(),
                result.to_owned(),
            )
        };
        assert_eq!(
            lines,
            [
                line("boot-b", "/bin/on-b", "?", "failed"),
                line("boot-a", "/bin/p1", "unlock", "applied"),
            ]
        );
    }

    #[test]
    fn a_daemon_start_on_one_guest_does_not_end_another_guests_wait() {
        let mut lines = Vec::new();
        let mut out = |p: Process| {
            lines.push((p.decision_id, p.result));
            Ok(())
        };
        let mut join = Join::default();
        join.push(decision(1, 0), &guest(0xa, 1, "a", "boot-a"), &mut out)
            .unwrap();
        let start = Record::DaemonStart {
            time: at(1),
            version: "0".into(),
            pid: 1,
            policy: "p".into(),
            listen: "s".into(),
        };
        join.push(start, &guest(0xb, 1, "b", "boot-b"), &mut out)
            .unwrap();
        join.push(outcome(1, 2), &guest(0xa, 2, "a", "boot-a"), &mut out)
            .unwrap();
        assert_eq!(lines, [(1, "applied".to_owned())]);
    }
}
