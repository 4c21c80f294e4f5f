//! The `verification` record: one run of `metalift verify` (verified unlock), as
//! the audit log holds it and as the verification file beside the policy holds it
//! (`crate::live_policy::verification` reads that file; `metalift verify` writes
//! both). One type for every writer and reader.

use std::time::SystemTime;

use metalift_policy::Capabilities;
use serde::{Deserialize, Serialize};

use super::receipt::Receipt;
use super::rfc3339;

/// One kernel of a verification (`metalift-probe --verify`'s JSON row).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct KernelLine {
    /// The kernel's function name, e.g. `metalift_simd_sum`.
    pub kernel: String,
    /// `pass`, `differs`, `compile_failed`, `run_failed`, `not_claimed`, `hung`
    /// (killed at its deadline) or `not_run` (the verification's bound was reached).
    pub result: String,
    /// Where it differed or why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// How long its probe child ran, in milliseconds (`None`: recorded before
    /// kernels were timed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ms: Option<u64>,
}

/// One verification: a line of the verification file, and the audit log's
/// `verification` record (the same type for both, and for every reader).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct VerificationRecord {
    /// When the probe ran.
    #[serde(with = "rfc3339")]
    #[schemars(with = "String", description = "RFC 3339, UTC, microseconds")]
    pub time: SystemTime,
    /// The profile verified.
    pub profile: String,
    /// Its `apple_family_max` as applied (after the host's ceiling).
    pub apple_family_max: u8,
    /// Its `max_threadgroup_memory`.
    pub max_threadgroup_memory: u64,
    /// Its `recommended_working_set`, if set.
    #[serde(default)]
    pub recommended_working_set: Option<u64>,
    /// The host chip's brand string it ran on (`None`: not known here).
    pub host_chip: Option<String>,
    /// The macOS build it ran on (`None`: not known here).
    pub os_build: Option<String>,
    /// The metalift version that ran it (recorded, not compared: the kernels run
    /// on the GPU, whichever metalift asked).
    pub metalift_version: String,
    /// Whether every claimed kernel computed what the CPU did.
    pub passed: bool,
    /// Every kernel's result.
    pub kernels: Vec<KernelLine>,
    /// Why there are no kernel results (the probe failed or was not unlocked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Who ran `metalift verify` (advisory: the file's owner is what counts).
    pub recorded_by_uid: u32,
    /// What ran, the stock and effective answers, the control, the bounds
    /// (`None`: recorded by a metalift without receipts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub receipt: Option<Receipt>,
}

impl VerificationRecord {
    /// The capabilities it verified.
    #[must_use]
    pub fn capabilities(&self) -> Capabilities {
        Capabilities {
            apple_family_max: self.apple_family_max,
            max_threadgroup_memory: self.max_threadgroup_memory,
            recommended_working_set: self.recommended_working_set,
        }
    }

    /// The kernels that failed, `kernel: result` each.
    #[must_use]
    pub fn failures(&self) -> Vec<String> {
        self.kernels
            .iter()
            .filter(|k| k.result != "pass" && k.result != "not_claimed")
            .map(|k| format!("{}: {}", k.kernel, k.result))
            .chain(self.error.clone())
            .collect()
    }
}
