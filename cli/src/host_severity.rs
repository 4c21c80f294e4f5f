//! How much `apple_family_max = "host"` on a chip this metalift cannot read (or
//! does not know) weighs: one decision for `validate`, `doctor`, `edit` and
//! `explain`, so the recommended profile reads the same in every tool.
//!
//! It is a **note**, not a warning: `"host"` is the recommended ceiling, the
//! policy has nothing to change, and metaliftd resolves it with its own host's
//! chip (the policy crate marks the diagnostic [`Basis::HostChipUnknown`] for this
//! reason). So `validate --strict` passes it and `doctor` exits 0 for it (a note
//! never fails `doctor --strict` either: there is nothing to fix).

use metalift_policy::{Basis, Diagnostic, Severity};

/// The severity every tool gives `d`.
#[must_use]
pub fn severity(d: &Diagnostic) -> Severity {
    if d.basis == Basis::HostChipUnknown && d.severity == Severity::Warning {
        Severity::Note
    } else {
        d.severity
    }
}

/// `diagnostics` with every severity as [`severity`] decides it; a `"host"` note
/// says how to check it for one chip.
#[must_use]
pub fn judged(diagnostics: Vec<Diagnostic>) -> Vec<Diagnostic> {
    diagnostics
        .into_iter()
        .map(|d| {
            let severity = severity(&d);
            if severity == d.severity {
                return d;
            }
            Diagnostic {
                severity,
                message: format!(
                    "{}; `\"host\"` is resolved where metaliftd runs: check it for one host with \
                     --host-chip-brand \"Apple M2 (Virtual)\"",
                    d.message
                ),
                ..d
            }
        })
        .collect()
}

/// Only the diagnostics that are still warnings (or errors) once judged: what
/// `doctor` and `edit` count and show as warnings.
#[must_use]
pub fn warnings(diagnostics: &[Diagnostic]) -> Vec<&Diagnostic> {
    diagnostics
        .iter()
        .filter(|d| severity(d) != Severity::Note)
        .collect()
}
