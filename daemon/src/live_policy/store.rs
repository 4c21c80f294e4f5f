//! The live policy: loaded at start, replaced atomically on reload, last good kept.
//!
//! A check-in calls [`PolicyStore::current`] (a lock-free load of an `Arc`) and
//! decides against that snapshot; a reload builds and compiles the new policy
//! completely before one atomic swap, so no check-in ever sees a half-loaded policy.
//! Every load, refusal and deletion is written to the audit log.
//!
//! # What happens when
//!
//! | on disk                          | at start                          | on reload                              |
//! |----------------------------------|-----------------------------------|----------------------------------------|
//! | valid                            | live, `policy_loaded` (`start`)   | swapped in, `policy_loaded` (`change`) |
//! | same content as live             | —                                 | nothing (no record)                    |
//! | `policy.toml` missing            | empty + refusal, `policy_loaded` (`missing`) | last good kept (drop-ins included), `policy_rejected` |
//! | invalid, unreadable, bad owner, too large | empty + `policy_rejected`, then `policy_loaded` (`rejected_at_start`) | last good kept, `policy_rejected` |
//! | the same refusal again           | —                                 | nothing (no record)                    |
//! | a refused edit reverted          | —                                 | error cleared, `policy_loaded` (`restored`) |
//! | anything, on SIGHUP              | —                                 | always audited: `policy_loaded` (`sighup`) or `policy_rejected` |
//!
//! A missing `policy.toml` is refused like a broken one (issue 26): a deleted or
//! moved file is far more often an accident (a bad `mv`, a configuration tool
//! between steps) than a wish to turn every unlock off, and silently dropping every
//! rule, drop-ins included, is the surprise an admin cannot see. Until the file is
//! back, `metalift status` reports the daemon degraded (`policy_missing`). To turn
//! unlocking off on purpose, install a policy with no rules (`version = 1` alone).
//!
//! The live policy and the last refusal are published as one value
//! ([`Published`]), swapped in one atomic store: a reader sees either the state
//! before a reload or the one after, never a mix.
//!
//! A refused input's `sha256` is recorded when its text was read (syntax and
//! validation errors); an ownership or I/O refusal records `null`.
//!
//! An invalid policy at start does not stop the daemon: an admin expects metaliftd to
//! come up and stay safe, and with no rules everything is stock, which is what the
//! machine did before metalift. The refusal is logged loudly (`tracing` error, audit
//! record, [`PolicyStore::last_error`] for `metalift status`), and the first valid
//! edit is picked up by the watcher.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use arc_swap::ArcSwap;
use metalift_policy::{LoadOptions, Policy, DEFAULT_MAX_POLICY_BYTES};

use crate::audit::{AuditError, AuditLog, LoadReason, Record};
use crate::live_policy::archive_retry::PendingArchives;
pub use crate::live_policy::load_attempt::LastRefusal;
use crate::live_policy::load_attempt::{attempt, rejected_record, Attempt, Refusal};

/// A policy that is live, and where it came from.
#[derive(Debug)]
pub struct LivePolicy {
    /// The compiled policy check-ins are decided against.
    pub policy: Arc<Policy>,
    /// The main policy file it was loaded from (it may not exist: empty policy).
    pub path: PathBuf,
    /// SHA-256 (hex) of the merged policy text; the empty policy's when no file.
    pub sha256: String,
    /// When it became live.
    pub loaded_at: SystemTime,
    /// Number of rules.
    pub rule_count: usize,
    /// Warnings it drew, rendered `file:line:col: warning: ...`.
    pub warnings: Vec<String>,
    /// Why it was loaded.
    pub reason: LoadReason,
}

impl LivePolicy {
    fn new(policy: Policy, path: &Path, warnings: Vec<String>, reason: LoadReason) -> Self {
        LivePolicy {
            sha256: policy.sha256_hex().to_owned(),
            rule_count: policy.rule_count(),
            policy: Arc::new(policy),
            path: path.to_owned(),
            loaded_at: SystemTime::now(),
            warnings,
            reason,
        }
    }

    fn loaded_record(&self) -> Record {
        Record::PolicyLoaded {
            time: self.loaded_at,
            path: self.path.display().to_string(),
            sha256: self.sha256.clone(),
            rules: self.rule_count,
            mode: self.policy.mode().as_str().to_owned(),
            warnings: self.warnings.clone(),
            reason: self.reason,
        }
    }
}

/// What a [`PolicyStore::reload`] did.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReloadOutcome {
    /// A new policy is live.
    Loaded {
        /// Its sha256.
        sha256: String,
        /// Its rule count.
        rules: usize,
        /// Its rendered warnings.
        warnings: Vec<String>,
    },
    /// The file is gone: refused like a broken policy, the last good one stays live.
    Missing,
    /// The file is gone, but the trigger ([`Trigger::Watch`]) asked to wait before
    /// believing it: nothing swapped, nothing audited.
    Vanished,
    /// The content is what is live already (or the same refusal as last time):
    /// nothing swapped, nothing audited.
    Unchanged,
    /// The new content was refused; the last good policy stays live.
    Rejected {
        /// Every problem, rendered with `file:line:col`.
        errors: Vec<String>,
    },
}

/// Everything the store publishes, as ONE value: the live policy and the last
/// refusal are swapped together, so no reader (a check-in, `metalift status`) can
/// ever see a new policy beside an old error, or an old policy without the error
/// that kept the new one out.
#[derive(Debug)]
pub struct Published {
    /// The live policy.
    pub live: Arc<LivePolicy>,
    /// Why the last load was refused, until a load succeeds.
    pub refusal: Option<LastRefusal>,
}

/// What started a reload; decides the audited reason of a load it causes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Trigger {
    /// A plain request ([`PolicyStore::reload`]): an unchanged policy is a no-op,
    /// a missing file is refused (the last good policy stays live).
    Request,
    /// The watcher saw a change: like `Request`, except that a missing
    /// `policy.toml` changes nothing yet ([`ReloadOutcome::Vanished`]): an editor
    /// may be between renaming the old file away and writing the new one. The
    /// watcher then waits a moment and asks again with `Request`.
    Watch,
    /// An admin sent SIGHUP: always audited, even when nothing changed, so the
    /// admin's request leaves a record (`policy_loaded` with reason `sighup`, or
    /// `policy_rejected`).
    Sighup,
}

/// The live policy and the last reload error.
#[derive(Debug)]
pub struct PolicyStore {
    /// The main policy file (`policy.toml`); `policy.d/` sits beside it.
    path: PathBuf,
    /// Ownership checks for every load.
    opts: LoadOptions,
    /// The most bytes the policy's files may hold together (`--max-policy-bytes`).
    max_bytes: u64,
    /// The published state: check-ins load it lock-free; a reload stores a complete one.
    published: ArcSwap<Published>,
    /// Serializes reloads, so two concurrent reloads cannot swap out of order or
    /// audit the same change twice. Never taken by check-ins.
    reloading: Mutex<()>,
    /// When the first load started reading: a file changed after this may not be
    /// in the live policy.
    first_read_at: SystemTime,
    /// Policies made live whose archive write failed (disk full, ...), retried
    /// at every reload and every status request until written.
    unarchived: PendingArchives,
}

impl PolicyStore {
    /// Loads the policy at `path` (plus `policy.d/`) and audits the result.
    ///
    /// Never refuses to start over the policy (see the module doc): a missing file
    /// gives the empty policy (and a standing refusal: status says degraded), an
    /// invalid one the empty policy and a `policy_rejected` record. The only error
    /// is the audit log refusing the record: a daemon that cannot audit must not serve.
    pub fn load_initial(
        path: &Path,
        opts: LoadOptions,
        audit: &AuditLog,
    ) -> Result<PolicyStore, AuditError> {
        Self::load_initial_within(path, opts, DEFAULT_MAX_POLICY_BYTES, audit)
    }

    /// [`PolicyStore::load_initial`], refusing (now and on every reload) a policy
    /// whose files hold more than `max_bytes` together, like any broken policy.
    pub fn load_initial_within(
        path: &Path,
        opts: LoadOptions,
        max_bytes: u64,
        audit: &AuditLog,
    ) -> Result<PolicyStore, AuditError> {
        let first_read_at = SystemTime::now();
        let mut unarchived = None;
        let (live, refusal) = match attempt(path, &opts, max_bytes, audit) {
            Attempt::Valid {
                policy,
                warnings,
                unarchived: pending,
            } => {
                unarchived = pending;
                (
                    LivePolicy::new(*policy, path, warnings, LoadReason::Start),
                    None,
                )
            }
            Attempt::Missing => {
                tracing::warn!(path = %path.display(), "no policy file: no rules, everything stock");
                (
                    LivePolicy::new(Policy::empty(), path, Vec::new(), LoadReason::Missing),
                    Some(Refusal::missing(path).published()),
                )
            }
            Attempt::Refused(refusal) => {
                let empty = LivePolicy::new(
                    Policy::empty(),
                    path,
                    Vec::new(),
                    LoadReason::RejectedAtStart,
                );
                tracing::error!(
                    path = %path.display(),
                    errors = %refusal.errors.join("\n"),
                    "policy refused at start: running with no rules, everything stock"
                );
                audit.append(&rejected_record(path, &refusal, &empty.sha256))?;
                (empty, Some(refusal.published()))
            }
        };
        audit.set_labels(live.policy.labels());
        audit.append(&live.loaded_record())?;
        tracing::info!(sha256 = %live.sha256, rules = live.rule_count, "policy live");
        Ok(PolicyStore {
            path: path.to_owned(),
            opts,
            max_bytes,
            published: ArcSwap::from_pointee(Published {
                live: Arc::new(live),
                refusal,
            }),
            reloading: Mutex::new(()),
            first_read_at,
            unarchived: PendingArchives::new(unarchived),
        })
    }

    /// The live policy. Lock-free; keep the `Arc` for the whole decision so one
    /// check-in is decided and audited against one policy.
    #[must_use]
    pub fn current(&self) -> Arc<LivePolicy> {
        Arc::clone(&self.published.load().live)
    }

    /// The live policy and the last refusal, as one consistent snapshot: what
    /// `metalift status` reports.
    #[must_use]
    pub fn published(&self) -> Arc<Published> {
        self.published.load_full()
    }

    /// When [`PolicyStore::load_initial`] started reading the files.
    #[must_use]
    pub fn first_read_at(&self) -> SystemTime {
        self.first_read_at
    }

    /// Whether it accepts files not owned by root (`--allow-insecure-owner`); the
    /// verification file beside the policy is judged the same way.
    #[must_use]
    pub fn allows_insecure_owner(&self) -> bool {
        self.opts.allow_insecure_owner
    }

    /// The main policy file this store loads.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the live policy's text is in the archive, after retrying every
    /// archive write that failed: what `metalift status` reports as
    /// `policy_archived`.
    pub fn archived(&self, audit: &AuditLog) -> bool {
        self.unarchived.retry(audit.path());
        !self.unarchived.waiting(&self.current().sha256)
    }

    /// The most bytes the policy's files may hold together.
    #[must_use]
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Why the last load was refused, until a later load succeeds.
    #[must_use]
    pub fn last_error(&self) -> Option<String> {
        self.published
            .load()
            .refusal
            .as_ref()
            .map(|r| r.errors.join("\n"))
    }

    /// Reads the policy again and, when it changed, swaps it in (valid), keeps the
    /// last good one (refused, or the file is missing), auditing each. Blocking file
    /// I/O: call it off the async executor (`spawn_blocking`).
    ///
    /// A failure to audit does not stop a reload: the new policy is still the
    /// admin's latest word, and the failure is reported through `tracing`.
    pub fn reload(&self, audit: &AuditLog) -> ReloadOutcome {
        self.reload_on(Trigger::Request, audit)
    }

    /// [`PolicyStore::reload`], saying what asked for it: a [`Trigger::Sighup`]
    /// reload audits its result even when nothing changed.
    pub fn reload_on(&self, trigger: Trigger, audit: &AuditLog) -> ReloadOutcome {
        let _one_at_a_time = lock(&self.reloading);
        let outcome = self.reload_locked(trigger, audit);
        // Whatever happened, a whole policy was compiled and one (new or old) was
        // freed: give the pages back (glibc keeps them otherwise).
        crate::service::memory::release_freed_memory();
        outcome
    }

    fn reload_locked(&self, trigger: Trigger, audit: &AuditLog) -> ReloadOutcome {
        let before = self.published();
        let current = &before.live;
        let refused_before = before.refusal.as_ref();
        let sighup = trigger == Trigger::Sighup;
        self.unarchived.retry(audit.path());
        match attempt(&self.path, &self.opts, self.max_bytes, audit) {
            Attempt::Valid {
                policy,
                warnings,
                unarchived,
            } => {
                let same = policy.sha256_hex() == current.sha256;
                if same && refused_before.is_none() && !sighup {
                    return ReloadOutcome::Unchanged;
                }
                let reason = match (sighup, same) {
                    (true, _) => LoadReason::Sighup,
                    (false, true) => LoadReason::Restored,
                    (false, false) => LoadReason::Change,
                };
                let live = LivePolicy::new(*policy, &self.path, warnings, reason);
                let outcome = ReloadOutcome::Loaded {
                    sha256: live.sha256.clone(),
                    rules: live.rule_count,
                    warnings: live.warnings.clone(),
                };
                drop(before);
                if let Some(pending) = unarchived {
                    self.unarchived.keep(pending);
                }
                self.swap_in(live, audit);
                outcome
            }
            Attempt::Missing if trigger == Trigger::Watch => ReloadOutcome::Vanished,
            Attempt::Missing => self.refuse(trigger, &before, Refusal::missing(&self.path), audit),
            Attempt::Refused(refusal) => self.refuse(trigger, &before, refusal, audit),
        }
    }

    /// Keeps the live policy, audits the refusal (unless it is the standing one
    /// again, SIGHUP excepted) and publishes it for `metalift status`.
    fn refuse(
        &self,
        trigger: Trigger,
        before: &Published,
        refusal: Refusal,
        audit: &AuditLog,
    ) -> ReloadOutcome {
        let current = &before.live;
        let refused_before = before.refusal.as_ref();
        let sighup = trigger == Trigger::Sighup;
        if refused_before.is_some_and(|r| r.errors == refusal.errors) && !sighup {
            return ReloadOutcome::Unchanged;
        }
        // One line per problem, not one per attempt: the same refusal
        // again (from a SIGHUP) is audited but logged once.
        if refused_before.is_none_or(|r| r.errors != refusal.errors) {
            tracing::error!(
                path = %self.path.display(),
                errors = %refusal.errors.join("\n"),
                kept = %current.sha256,
                "policy refused: the last good policy stays live"
            );
        }
        let record = rejected_record(&self.path, &refusal, &current.sha256);
        if let Err(error) = audit.append(&record) {
            tracing::error!(%error, "could not audit the policy refusal");
        }
        self.published.store(Arc::new(Published {
            live: Arc::clone(current),
            refusal: Some(refusal.published()),
        }));
        if refusal.missing {
            ReloadOutcome::Missing
        } else {
            ReloadOutcome::Rejected {
                errors: refusal.errors,
            }
        }
    }

    fn swap_in(&self, live: LivePolicy, audit: &AuditLog) {
        let record = live.loaded_record();
        tracing::info!(
            sha256 = %live.sha256,
            rules = live.rule_count,
            reason = live.reason.as_str(),
            "policy live"
        );
        // Recorded before it goes live, so that in the log every decision made
        // under this policy comes after its `policy_loaded` record. A failed append
        // does not keep the policy out: decisions under it then fail to be audited
        // too, and so answer stock.
        audit.set_labels(live.policy.labels());
        if let Err(error) = audit.append(&record) {
            tracing::error!(%error, "could not audit the policy load");
        }
        // Policy and error in one store: never a new policy beside an old error.
        let old = self.published.swap(Arc::new(Published {
            live: Arc::new(live),
            refusal: None,
        }));
        // The old compiled policy is freed here unless a check-in still holds it;
        // then it goes with that check-in's snapshot, a few microseconds later.
        drop(old);
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // The guarded values are replaced whole, never left half-written: a poisoned
    // lock still holds a consistent value.
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use metalift_policy::{sources_sha256, Source};

    use super::*;

    #[test]
    fn a_refused_input_is_hashed_like_an_accepted_policy() {
        let sources = vec![
            Source::new("policy.toml", "version = 1\n"),
            Source::new("policy.d/a.toml", "version = 1\n"),
        ];
        let loaded = metalift_policy::compile_sources(sources.clone())
            .unwrap_or_else(|e| panic!("valid policy refused: {e}"));
        assert_eq!(sources_sha256(&sources), loaded.policy.sha256_hex());
        assert_eq!(sources_sha256(&[]), Policy::empty().sha256_hex());
    }
}
