//! The receipt a `verification` record carries: what ran (the sha256 of the shim
//! and the probe), where (the OS product version), what the device answered stock
//! and unlocked, whether the control came out `differs`, the bounds it ran
//! under, and (`--workload`) the workload's own speed-up. Written by `metalift
//! verify`; the daemon reads only `passed`.

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
    /// `--workload`: the workload run stock and unlocked, and its speed-ups.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadReceipt>,
}

/// A measured number (tokens per second, milliseconds, a ratio), compared by its
/// bits so the records holding it stay `Eq`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(transparent)]
pub struct Measure(pub f64);

impl PartialEq for Measure {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

impl Eq for Measure {}

/// `metalift verify --workload -- CMD…`: the command run stock (the shim
/// disabled) and unlocked, `runs` times each, alternately.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkloadReceipt {
    /// The command as given (its first word resolved on `PATH`).
    pub command: Vec<String>,
    /// How many times it ran each way (`--workload-runs`).
    pub runs: u32,
    /// `llama_bench`: each test's tokens per second from llama-bench's `-o json`
    /// (`avg_ts`); `wall_time`: the whole command's wall time, for any other
    /// output; `none` when no run finished.
    pub measure: String,
    /// `pass`; `below_min_speedup`; `run_failed` (a run exited non-zero or printed
    /// something else than the first one); `hung` (killed at the verification's
    /// `--timeout`); `not_run` (the bound was reached before it). Anything but
    /// `pass` fails the verification.
    pub result: String,
    /// Why it is not `pass`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// `--min-speedup`, if given: every test's speed-up must reach it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_speedup: Option<Measure>,
    /// The lowest speed-up of the prompt-processing tests (`ppN`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp_speedup: Option<Measure>,
    /// The lowest speed-up of the generation tests (`tgN`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tg_speedup: Option<Measure>,
    /// The lowest speed-up of all tests (what `--min-speedup` is compared with).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub speedup: Option<Measure>,
    /// Each test (llama-bench's), or the one `wall` test.
    pub tests: Vec<WorkloadTest>,
}

/// One test of the workload, stock and unlocked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct WorkloadTest {
    /// llama-bench's name for it (`pp512`, `tg128`, `pp512+tg128`, ` @ dN` for a
    /// depth), or `wall`.
    pub test: String,
    /// `tokens/s` (higher is faster) or `ms` (lower is faster).
    pub unit: String,
    /// Each stock run's value.
    pub stock: Vec<Measure>,
    /// Each unlocked run's value.
    pub unlocked: Vec<Measure>,
    /// The median of `stock`.
    pub stock_median: Measure,
    /// The median of `unlocked`.
    pub unlocked_median: Measure,
    /// How many times faster unlocked: `unlocked_median / stock_median` for
    /// tokens per second, `stock_median / unlocked_median` for wall time.
    pub speedup: Measure,
}
