//! The receipt a `verification` record carries: what ran (the sha256 of the shim
//! and the probe), where (the OS product version), what the device answered stock
//! and unlocked, whether the control came out `differs`, and the bounds it ran
//! under. Written by `metalift verify`; the daemon reads only `passed`.

use serde::{Deserialize, Serialize};

/// What a device answered (`metalift-probe --json`): stock (shim disabled) or
/// effective (unlocked by the scratch daemon).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct DeviceAnswers {
    /// The highest Apple family it supports (`None`: none).
    pub apple_family: Option<u8>,
    /// `maxThreadgroupMemoryLength`.
    pub max_threadgroup_memory: u64,
    /// `recommendedMaxWorkingSetSize`, if answered.
    #[serde(default)]
    pub recommended_working_set: Option<u64>,
    /// llama.cpp's `has_simdgroup_reduction` as derived from the answers.
    pub has_simdgroup_reduction: bool,
    /// llama.cpp's `has_simdgroup_mm`.
    pub has_simdgroup_mm: bool,
    /// llama.cpp's `has_bfloat`.
    pub has_bfloat: bool,
}

/// The receipt of one verification.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Receipt {
    /// The shim injected into the probe, and its sha256 (hex).
    pub shim: String,
    /// `None`: it could not be read.
    pub shim_sha256: Option<String>,
    /// The probe that ran, and its sha256 (hex).
    pub probe: String,
    /// `None`: it could not be read.
    pub probe_sha256: Option<String>,
    /// `sw_vers -productVersion` (`None`: not macOS, or not known).
    pub os_product_version: Option<String>,
    /// The device with the shim disabled (`METALIFT_DISABLE=1`).
    pub stock: Option<DeviceAnswers>,
    /// The device as the unlock left it.
    pub effective: Option<DeviceAnswers>,
    /// `false`: the stock device already answers what the profile claims, so the
    /// unlock is not needed on this machine.
    pub unlock_needed: Option<bool>,
    /// The control's result (`differs` is the only good one); `hung` or `not_run`
    /// when it gave none.
    pub control: String,
    /// Why the verification is void (the control did not come out `differs`):
    /// never a pass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub void: Option<String>,
    /// Each kernel's deadline (`--kernel-timeout`), in milliseconds.
    pub kernel_timeout_ms: u64,
    /// The whole verification's bound (`--timeout`), in milliseconds.
    pub timeout_ms: u64,
    /// How long the verification took, in milliseconds.
    pub elapsed_ms: u64,
}
