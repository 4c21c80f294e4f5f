//! One load of the policy, as the store sees it: valid (and archived, or kept for
//! a retry), missing, or refused with every problem rendered; and the audit
//! record of a refusal. What the store then does with it is `store`'s concern.

use std::path::Path;
use std::time::SystemTime;

use metalift_policy::{sources_sha256, LoadError, LoadOptions, Policy};

use crate::audit::{AuditLog, Record};
use crate::live_policy::archive_retry::Unarchived;

/// The last refused load: every problem it had, and what was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LastRefusal {
    /// Every problem, each rendered `file:line:col: error: ...` with its source
    /// line, in the order the policy crate reports them (causes before knock-ons).
    pub errors: Vec<String>,
    /// SHA-256 of the refused input, when its text could be read.
    pub sha256: Option<String>,
    /// When it was refused.
    pub at: SystemTime,
    /// Whether the refusal is that `policy.toml` does not exist (status:
    /// `policy_missing`, not `policy_rejected`).
    pub missing: bool,
}

/// A load that did not produce a policy.
pub(super) struct Refusal {
    /// Rendered problems, each `file:line:col: error: ...` with its source line.
    pub(super) errors: Vec<String>,
    /// SHA-256 of the refused input, when it could be read.
    pub(super) sha256: Option<String>,
    /// The main file does not exist.
    pub(super) missing: bool,
}

impl Refusal {
    /// `policy.toml` is not there: refused like a broken file.
    pub(super) fn missing(path: &Path) -> Refusal {
        Refusal {
            errors: vec![format!(
                "{}: no such policy file (deleted or moved?): a missing policy is refused like \
                 a broken one; to turn unlocking off on purpose, install a policy with no rules",
                path.display()
            )],
            sha256: None,
            missing: true,
        }
    }

    pub(super) fn published(&self) -> LastRefusal {
        LastRefusal {
            errors: self.errors.clone(),
            sha256: self.sha256.clone(),
            at: SystemTime::now(),
            missing: self.missing,
        }
    }
}

pub(super) enum Attempt {
    Valid {
        /// Boxed: a compiled policy is large, and this enum is moved around.
        policy: Box<Policy>,
        warnings: Vec<String>,
        /// Its text, when the archive write failed (to retry).
        unarchived: Option<Unarchived>,
    },
    Missing,
    Refused(Refusal),
}

pub(super) fn attempt(
    path: &Path,
    opts: &LoadOptions,
    max_bytes: u64,
    audit: &AuditLog,
) -> Attempt {
    // pol: `"host"` family ceilings resolve for this machine (crate::live_policy::host_chip).
    match crate::live_policy::host_chip::load(path, opts, max_bytes) {
        Ok(loaded) => {
            // pol: keep the text of every valid policy by hash, for `explain --live/--decision`;
            // a failed write is retried (`crate::live_policy::archive_retry`).
            let unarchived = match crate::live_policy::archive::store_loaded(audit.path(), &loaded)
            {
                Ok(()) => None,
                Err(error) => {
                    tracing::warn!(%error, "could not archive the policy text: retried at every reload and status request");
                    Some(Unarchived {
                        sha256: loaded.policy.sha256_hex().to_owned(),
                        sources: crate::live_policy::archive::named(&loaded.sources),
                    })
                }
            };
            Attempt::Valid {
                unarchived,
                warnings: loaded
                    .warnings
                    .iter()
                    .map(|w| w.render(&loaded.sources))
                    .collect(),
                policy: Box::new(loaded.policy),
            }
        }
        Err(LoadError::NotFound { .. }) => Attempt::Missing,
        Err(LoadError::Invalid {
            diagnostics,
            sources,
        }) => Attempt::Refused(Refusal {
            errors: diagnostics
                .iter()
                .filter(|d| d.is_error())
                .map(|d| d.render(&sources))
                .collect(),
            sha256: Some(sources_sha256(&sources)),
            missing: false,
        }),
        Err(
            other @ (LoadError::Io { .. }
            | LoadError::Permission { .. }
            | LoadError::TooLarge { .. }),
        ) => Attempt::Refused(Refusal {
            errors: vec![other.to_string()],
            sha256: None,
            missing: false,
        }),
    }
}

pub(super) fn rejected_record(path: &Path, refusal: &Refusal, kept_sha256: &str) -> Record {
    Record::PolicyRejected {
        time: SystemTime::now(),
        path: path.display().to_string(),
        sha256: refusal.sha256.clone(),
        // The audit log keeps the locating first line; the full rendering with the
        // source line and underline goes to `tracing` and `last_error`.
        errors: refusal
            .errors
            .iter()
            .map(|e| e.lines().next().unwrap_or_default().to_owned())
            .collect(),
        kept_sha256: kept_sha256.to_owned(),
    }
}
