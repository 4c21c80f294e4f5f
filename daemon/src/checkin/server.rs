//! The server core: decides a check-in, audits it, and only then answers.
//!
//! Transport-independent: the Unix-socket transport and the macOS XPC transport
//! both hand it kernel-verified [`PeerFacts`] and the client's [`CheckIn`], and
//! send back whatever [`Core::check_in`] returns. There is exactly one code path
//! that decides and audits.
//!
//! The order inside a check-in is the security argument:
//!
//! 1. take one snapshot of the live policy (a reload mid-decision cannot mix two);
//! 2. build the [`Subject`] from the peer facts only — the client's claims are
//!    copied into the record as advisory and never reach the subject;
//! 3. evaluate, assign a decision id, and append the decision record;
//! 4. if the append failed, the answer is **stock**: no unlock is ever given that
//!    the audit log does not hold.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use metalift_policy::wire::{CheckIn, Outcome, VerdictMsg};
use metalift_policy::{Action, Needs, Subject, Verdict};

use crate::audit::refused::RefusalBudget;
use crate::audit::{AuditError, AuditLog, OutcomeRecord, Record, RefusedRecord};
use crate::checkin::blocking_pool::BlockingPool;
use crate::checkin::decision::{decision_record, pid_i32, verdict_msg};
use crate::checkin::identity_cache::IdentityCache;
use crate::checkin::peer::{self, PeerFacts};
use crate::live_policy::store::PolicyStore;
use crate::live_policy::verification::{HostBuild, VerificationStore};
use crate::service::status::StatusReport;

/// The decision-making heart of metaliftd. `Send + Sync`; share it in an `Arc`.
#[derive(Debug)]
pub struct Core {
    /// The live policy; each check-in takes one snapshot of it.
    policy: Arc<PolicyStore>,
    /// Where decisions and outcomes are recorded before anyone acts on them.
    audit: Arc<AuditLog>,
    /// Executable hashes by file version, for `sha256` rules.
    cache: IdentityCache,
    /// Where every transport's blocking identity work runs (peer facts, hashes,
    /// user lookups): off the executor, a bounded number at once.
    pool: BlockingPool,
    /// The next decision id (see [`first_decision_id`]).
    next_id: AtomicU64,
    /// Counters for `metalift status`; relaxed atomics, they are statistics only.
    counters: Counters,
    /// When this core was created (the daemon's start).
    started_at: SystemTime,
    /// Connections being read or answered now, over every transport.
    active: Arc<Gauge>,
    /// Answered connections waiting for an outcome report, over every transport.
    waiting: Arc<Gauge>,
    /// Whether this daemon can read TCC-protected files (macOS), probed at start.
    full_disk_access: Option<bool>,
    /// Verified unlock: the verifications beside the policy, for profiles with
    /// `require_verified = true`.
    verification: VerificationStore,
    /// How many `refused` records may be written (a flood cannot fill the disk).
    refusals: RefusalBudget,
    /// The audit forwarder, once started (`metalift status` shows it).
    forwarder: std::sync::OnceLock<Arc<crate::audit::forward::Shared>>,
}

/// A count of things alive now, kept by [`Counted`] guards. Statistics only.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    fn enter(self: &Arc<Self>) -> Counted {
        self.0.fetch_add(1, Ordering::Relaxed);
        Counted(Arc::clone(self))
    }

    fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Counts one connection in a [`Gauge`] until dropped.
#[derive(Debug)]
pub struct Counted(Arc<Gauge>);

impl Drop for Counted {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[derive(Debug, Default)]
struct Counters {
    check_ins: AtomicU64,
    unlocks: AtomicU64,
    would_unlock: AtomicU64,
    outcomes: AtomicU64,
    audit_failures: AtomicU64,
    unidentified: AtomicU64,
    /// Of `unidentified`: peers that exited before they could be identified
    /// (short-lived processes; counted, not logged one line each).
    peers_gone: AtomicU64,
    /// When an unidentified peer other than a departed one was last logged
    /// (milliseconds since `started_at`, plus one; 0: never).
    unidentified_logged_at_ms: AtomicU64,
}

impl Core {
    /// A core deciding against `policy`, recording to `audit`, caching up to
    /// `cache_entries` executable hashes.
    #[must_use]
    pub fn new(policy: Arc<PolicyStore>, audit: Arc<AuditLog>, cache_entries: usize) -> Self {
        let started_at = SystemTime::now();
        let verification = VerificationStore::beside(
            policy.path(),
            policy.allows_insecure_owner(),
            HostBuild::daemon(),
        );
        Core {
            policy,
            audit,
            cache: IdentityCache::new(cache_entries),
            pool: BlockingPool::default(),
            next_id: AtomicU64::new(first_decision_id(started_at)),
            counters: Counters::default(),
            started_at,
            active: Arc::default(),
            waiting: Arc::default(),
            full_disk_access: crate::service::full_disk_access::probe(),
            verification,
            refusals: RefusalBudget::default(),
            forwarder: std::sync::OnceLock::new(),
        }
    }

    /// The bounded blocking pool every transport identifies peers on.
    #[must_use]
    pub fn blocking(&self) -> &BlockingPool {
        &self.pool
    }

    /// Which subject fields the live policy's rules read.
    #[must_use]
    pub fn needs(&self) -> metalift_policy::Needs {
        self.policy.current().policy.needs()
    }

    /// Counts a connection as being read or answered, until the guard is dropped.
    #[must_use]
    pub fn count_active(&self) -> Counted {
        self.active.enter()
    }

    /// Counts an answered connection as waiting for its outcome, until dropped.
    #[must_use]
    pub fn count_waiting(&self) -> Counted {
        self.waiting.enter()
    }

    /// Notes a check-in closed unanswered because the kernel could not tell who
    /// sent it (the peer exited, another pid namespace, ...).
    ///
    /// One log line per problem, not per peer: a peer that exited before it was
    /// identified is normal (a short-lived process that loaded the shim) and only
    /// counted (`peers_gone` in status); any other failure is logged at most once
    /// a minute, with the count so far.
    ///
    /// A peer refused for trying to pass as someone else
    /// ([`PeerError::is_refusal`](crate::checkin::peer::PeerError::is_refusal)) is
    /// also a `refused` audit record.
    pub fn note_unidentified(
        &self,
        error: &crate::checkin::peer::PeerError,
        transport: &'static str,
    ) {
        if let crate::checkin::peer::PeerError::UidChanged {
            pid, connect_uid, ..
        } = error
        {
            self.refused(RefusedRecord {
                time: SystemTime::now(),
                message: "check_in".to_owned(),
                reason: "uid_changed".to_owned(),
                detail: error.to_string(),
                pid: Some(pid_i32(*pid)),
                uid: Some(*connect_uid),
                exe: None,
                decision_id: None,
                transport: transport.to_owned(),
                suppressed: 0,
            });
        }
        let total = self.counters.unidentified.fetch_add(1, Ordering::Relaxed) + 1;
        if matches!(error, crate::checkin::peer::PeerError::Gone { .. }) {
            self.counters.peers_gone.fetch_add(1, Ordering::Relaxed);
            tracing::debug!(%error, "check-in from a peer that exited: closed unanswered");
            return;
        }
        let now_ms = u64::try_from(self.started_at.elapsed().unwrap_or_default().as_millis())
            .unwrap_or(u64::MAX)
            .saturating_add(1);
        let last = self
            .counters
            .unidentified_logged_at_ms
            .load(Ordering::Relaxed);
        let due = last == 0 || now_ms.saturating_sub(last) >= UNIDENTIFIED_LOG_EVERY_MS;
        if due
            && self
                .counters
                .unidentified_logged_at_ms
                .compare_exchange(last, now_ms, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            tracing::warn!(%error, unidentified_so_far = total,
                "check-in from an unidentifiable peer: closed unanswered (logged at most once a minute; see `metalift status`)");
        } else {
            tracing::debug!(%error, "check-in from an unidentifiable peer: closed unanswered");
        }
    }

    /// Decides `req` from `peer`, records the decision, and returns the verdict to send.
    ///
    /// Runs to completion once called (transports do not race it against
    /// shutdown), so an in-flight check-in is always answered and recorded.
    pub async fn check_in(
        &self,
        peer: &PeerFacts,
        req: CheckIn,
        transport: &'static str,
    ) -> VerdictMsg {
        let received = Instant::now();
        let live = self.policy.current();
        let subject = self.subject(peer, live.policy.needs()).await;
        // The time of the decision: rules outside their window (`from`/`until`)
        // do not match, so a window's edge needs no reload. The record carries it.
        let decided_at = SystemTime::now();
        // Verified unlock: stock, with the reason, unless a passing verification
        // covers this host (only for profiles with `require_verified = true`).
        let verdict = self
            .verification
            .gate(live.policy.evaluate(&subject, decided_at), &live.policy);
        let decision_id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let latency_us = u64::try_from(received.elapsed().as_micros()).unwrap_or(u64::MAX);
        let record = decision_record(
            decided_at,
            decision_id,
            peer,
            &subject,
            &verdict,
            &live.sha256,
            latency_us,
            transport,
            req,
        );
        self.counters.check_ins.fetch_add(1, Ordering::Relaxed);
        match self.append(&Record::Decision(record)) {
            Ok(()) => {
                if matches!(verdict.action, Action::Unlock { .. }) {
                    self.counters.unlocks.fetch_add(1, Ordering::Relaxed);
                }
                if verdict.would_unlock.is_some() {
                    self.counters.would_unlock.fetch_add(1, Ordering::Relaxed);
                }
                verdict_msg(decision_id, verdict)
            }
            Err(error) => {
                self.counters.audit_failures.fetch_add(1, Ordering::Relaxed);
                tracing::error!(
                    decision_id,
                    pid = peer.pid,
                    exe = %peer.exe.display(),
                    would_have_been = verdict.action.as_str(),
                    %error,
                    "decision could not be audited: answering stock"
                );
                verdict_msg(decision_id, Verdict::stock(verdict.mode))
            }
        }
    }

    /// Records what the shim in `peer` reports it did. The transport has checked
    /// that `outcome.decision_id` is the decision it gave this peer (or 0);
    /// `job` is that check-in's job claim text, recorded as its decision's was.
    pub async fn outcome(&self, peer: &PeerFacts, job: Option<&str>, outcome: Outcome) {
        let record = OutcomeRecord {
            job: job.map(metalift_policy::job::parse).unwrap_or_default(),
            ..OutcomeRecord::new(
                SystemTime::now(),
                pid_i32(peer.pid),
                peer.exe.display().to_string(),
                &outcome,
            )
        };
        self.counters.outcomes.fetch_add(1, Ordering::Relaxed);
        if let Err(error) = self.append(&Record::Outcome(record)) {
            tracing::error!(
                decision_id = outcome.decision_id,
                pid = peer.pid,
                %error,
                "outcome could not be audited"
            );
        }
    }

    /// Records a refused check-in or outcome as a `refused` audit record, within
    /// the refusal budget ([`RefusalBudget`]). Every transport calls this for
    /// every message it refuses after the first one was accepted (and for an
    /// outcome sent without a check-in), so an attempt to make the log say
    /// something false shows in the log.
    pub fn refuse(&self, refusal: Refusing<'_>) {
        let asker = refusal.asker;
        self.refused(RefusedRecord {
            time: SystemTime::now(),
            message: refusal.message.to_owned(),
            reason: refusal.reason.to_owned(),
            detail: refusal.detail,
            pid: refusal.sender_pid.or(asker.map(|a| a.pid)).map(pid_i32),
            uid: asker.filter(|_| refusal.sent_by_asker).map(|a| a.uid),
            exe: asker.map(|a| a.exe.display().to_string()),
            decision_id: refusal.decision_id,
            transport: refusal.transport.to_owned(),
            suppressed: 0,
        });
    }

    /// Writes `record` if the budget allows: over it, the refusal is counted and
    /// the next record written says how many were not (its `suppressed`).
    fn refused(&self, record: RefusedRecord) {
        tracing::debug!(
            message = %record.message,
            reason = %record.reason,
            detail = %record.detail,
            transport = %record.transport,
            "refused"
        );
        let Some(suppressed) = self.refusals.take(Instant::now()) else {
            return;
        };
        let record = RefusedRecord {
            suppressed,
            ..record
        };
        if let Err(error) = self.append(&Record::Refused(record)) {
            tracing::error!(%error, "a refusal could not be audited");
        }
    }

    /// Counts and policy facts for `metalift status`; nothing about any one process.
    #[must_use]
    pub fn status(&self) -> StatusReport {
        // One snapshot: the policy and the refusal shown belong together.
        let published = self.policy.published();
        let live = &published.live;
        let refusal = published.refusal.as_ref();
        let count = |c: &AtomicU64| c.load(Ordering::Relaxed);
        // A log that failed is tried again first: fixed, it is healthy at once.
        self.audit.retry_failed();
        let audit = crate::service::health::AuditFacts::of(&self.audit);
        let forwarder = self.forwarder.get().map(|f| f.status());
        StatusReport {
            health: crate::service::health::assess(&published, &audit)
                .and(self.verification.health_causes(&live.policy))
                .and(crate::service::health::forward_behind(
                    forwarder.as_ref(),
                    SystemTime::now(),
                )),
            audit_free_bytes: audit.free_bytes,
            audit_log: Some(audit.path),
            max_policy_bytes: Some(self.policy.max_bytes()),
            policy_archived: Some(self.policy.archived(&self.audit)),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            started_at: crate::audit::record::rfc3339::format(self.started_at),
            policy_path: live.path.display().to_string(),
            policy_sha256: live.sha256.clone(),
            policy_loaded_at: crate::audit::record::rfc3339::format(live.loaded_at),
            rule_count: live.rule_count,
            mode: live.policy.mode().as_str().to_owned(),
            last_reload_error: refusal.map(|r| locating_lines(&r.errors.join("\n"))),
            last_reload_errors: refusal
                .map(|r| r.errors.iter().map(|e| locating_lines(e)).collect())
                .unwrap_or_default(),
            refused_sha256: refusal.and_then(|r| r.sha256.clone()),
            peers_gone: count(&self.counters.peers_gone),
            check_ins: count(&self.counters.check_ins),
            unlocks: count(&self.counters.unlocks),
            would_unlock: count(&self.counters.would_unlock),
            outcomes: count(&self.counters.outcomes),
            audit_failures: count(&self.counters.audit_failures),
            unidentified: count(&self.counters.unidentified),
            connections_active: self.active.get(),
            connections_waiting: self.waiting.get(),
            cache_entries: self.cache.len(),
            full_disk_access: self.full_disk_access,
            verified_unlock: self.verification.status_lines(&live.policy),
            host_chip_brand: crate::live_policy::host_chip::daemon_host().brand.clone(),
            host_os_build: crate::live_policy::host_os::daemon_os_build().map(str::to_owned),
            forwarder,
            next_change: live
                .policy
                .next_change(SystemTime::now())
                .as_ref()
                .map(crate::service::status::NextChange::from),
        }
    }

    /// The `daemon_stop` record, with this run's counts.
    #[must_use]
    pub fn stop_record(&self, reason: &str) -> Record {
        Record::DaemonStop {
            time: SystemTime::now(),
            reason: reason.to_owned(),
            checkins: self.counters.check_ins.load(Ordering::Relaxed),
            unlocks: self.counters.unlocks.load(Ordering::Relaxed),
            pid: std::process::id(),
        }
    }

    /// Attaches the audit forwarder, so `status` reports it (once; later calls are ignored).
    pub fn set_forwarder(&self, forwarder: Arc<crate::audit::forward::Shared>) {
        let _ = self.forwarder.set(forwarder);
    }

    /// The audit log records go to.
    #[must_use]
    pub fn audit_log(&self) -> &Arc<AuditLog> {
        &self.audit
    }

    /// Builds the subject from kernel facts, computing the costly fields only when
    /// some rule of the snapshot needs them.
    async fn subject(&self, peer: &PeerFacts, needs: Needs) -> Subject {
        let mut unreadable = peer.unreadable.clone();
        let sha256 = match (&peer.exe_file, needs.sha256) {
            // The file is not the code that runs: its hash must not match.
            (_, true) if peer.hashes_withheld.is_some() => None,
            (Some(exe), true) => match self.cache.sha256(exe, &self.pool, peer.uid).await {
                Ok(hash) => Some(hash),
                Err(error @ crate::checkin::identity_cache::HashError::TooLarge { .. }) => {
                    // The decision says why: the subject's unreadable reason is
                    // what `sha256 unknown (...)` quotes.
                    unreadable.get_or_insert_with(|| error.to_string());
                    None
                }
                Err(error) => {
                    tracing::warn!(pid = peer.pid, exe = %peer.exe.display(), %error,
                        "cannot hash the executable: sha256 rules will not match it");
                    if let crate::checkin::identity_cache::HashError::Io(e) = &error {
                        unreadable.get_or_insert_with(|| peer::read_failure(e));
                    }
                    None
                }
            },
            (None, true) if unreadable.is_some() => {
                tracing::warn!(pid = peer.pid, exe = %peer.exe.display(),
                    why = unreadable.as_deref().unwrap_or_default(),
                    "identity unreadable: sha256 rules will not match it (on macOS: does metaliftd have Full Disk Access? see `metalift doctor`)");
                None
            }
            _ => None,
        };
        let user = if needs.user {
            let uid = peer.uid;
            // NSS may ask a directory service: keep it off the executor.
            self.pool
                .run_for(uid, move || peer::user_name(uid))
                .await
                .ok()
                .flatten()
        } else {
            None
        };
        // Team and signing identifiers count only from a signature that chains
        // to Apple (`peer::signature::trusted_ids`, the one place that decides):
        // the subject never carries a claim, so no rule, explanation or record
        // can treat one as the developer's. The cdhash names the exact code that
        // runs, so the platform module keeps it for any signature that
        // validated, ad hoc and untrusted included.
        let signature = peer.code_signature.as_ref();
        let (team_id, signing_id) = signature.map_or((None, None), |s| {
            peer::signature::trusted_ids(s.anchor, s.team_id.as_deref(), s.signing_id.as_deref())
        });
        Subject {
            path: peer.exe.clone(),
            uid: peer.uid,
            user,
            parent_path: peer.parent_exe.clone(),
            sha256,
            cdhash: signature.and_then(|s| s.cdhash.clone()),
            team_id,
            signing_id,
            anchor: signature.map(|s| s.anchor),
            unreadable,
        }
    }

    /// Appends inline, on the executor thread: `AuditLog::append` is one
    /// `write(2)` to an `O_APPEND` file (a few microseconds, like the `/proc` reads
    /// the peer's identity already costs), and handing it to the blocking pool cost
    /// more than the write itself: thread wake-ups were the largest item in the
    /// daemon's profile under load (BENCHMARKS.md, item 3). The price is that a
    /// stalled disk (or a rotation's renames on one) stalls this worker thread for
    /// that long; the decision must wait for the record either way.
    fn append(&self, record: &Record) -> Result<(), AuditError> {
        self.audit.append(record)
    }
}

/// A message a transport refused, for [`Core::refuse`].
#[derive(Debug)]
pub struct Refusing<'a> {
    /// What was refused: `check_in` or `outcome`.
    pub message: &'static str,
    /// Why, one word (`metalift_xpc::exchange::Refusal::code` on XPC).
    pub reason: &'static str,
    /// The same in words.
    pub detail: String,
    /// The sender's pid, as the kernel named it with the message; `None` when it
    /// named none, or when the sender is the connection's asker by construction
    /// (a Unix socket).
    pub sender_pid: Option<u32>,
    /// The process that checked in on this connection, once identified.
    pub asker: Option<&'a PeerFacts>,
    /// Whether the kernel says `asker` sent the refused message (same pid and pid
    /// version; always on a Unix socket): only then is its uid the sender's.
    pub sent_by_asker: bool,
    /// The decision given on this connection, if one was.
    pub decision_id: Option<u64>,
    /// `unix` or `xpc`.
    pub transport: &'static str,
}

/// The least time between two log lines about unidentifiable peers.
const UNIDENTIFIED_LOG_EVERY_MS: u64 = 60_000;

/// Decision ids are unique across restarts without any state on disk: they start
/// at the daemon's start time in microseconds since the epoch and count up by one.
/// A restart repeats an id only if the previous run issued more than one decision
/// per microsecond on average, or the clock went back (e.g. a VM restored from a
/// snapshot) — then ids are still unique within a run, and records carry times.
fn first_decision_id(now: SystemTime) -> u64 {
    let micros = now
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0);
    u64::try_from(micros).unwrap_or(u64::MAX / 2).max(1)
}

/// The `file:line:col: error: ...` lines of a rendered load error, without the
/// quoted source lines and underlines: status is served to any local user, and
/// the policy file need not be readable by all of them.
fn locating_lines(error: &str) -> String {
    let located: Vec<&str> = error.lines().filter(|l| l.contains(": error: ")).collect();
    if located.is_empty() {
        error.lines().next().unwrap_or_default().to_owned()
    } else {
        located.join("\n")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_shows_where_the_policy_is_wrong_but_not_its_lines() {
        let rendered = "p.toml:2:1: error: unknown key `bogus`\nbogus = \"secret\"\n^~~~~\n\n\
                        p.toml:4:4: error: rule `x` has no identity matcher\nid=\"x\"\n   ^~~";
        assert_eq!(
            locating_lines(rendered),
            "p.toml:2:1: error: unknown key `bogus`\np.toml:4:4: error: rule `x` has no identity matcher"
        );
        assert_eq!(
            locating_lines("cannot read /etc/metalift/policy.toml: permission denied"),
            "cannot read /etc/metalift/policy.toml: permission denied"
        );
    }

    #[test]
    fn decision_ids_start_at_the_start_time_in_microseconds() {
        let t = UNIX_EPOCH + std::time::Duration::from_micros(1_800_000_000_123_456);
        assert_eq!(first_decision_id(t), 1_800_000_000_123_456);
        assert_eq!(first_decision_id(UNIX_EPOCH), 1);
    }
}
