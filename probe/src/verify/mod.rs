//! `metalift-probe --verify`: run the kernels an unlock promises and compare each
//! with the CPU's answer.
//!
//! An unlock is a claim ("this device runs simdgroup reductions, simdgroup matrices
//! and bfloat"). It is true while the host's GPU executes the guest's kernels; a
//! macOS or host update can change that, and then llama.cpp computes garbage
//! instead of running slowly. This module checks the kernels, not the answers: for
//! each capability the device claims (the llama.cpp flags the probe's report
//! derives, and its threadgroup memory), compile one small kernel, run it, read the
//! buffer back and compare.
//!
//! - [`kernels`]: the MSL sources, inputs and CPU answers.
//! - [`Compute`]: what a platform must do with a [`Job`]: the real Metal through
//!   `objc2-metal` (`crate::macos_compute`), the simulated one on Linux
//!   (`crate::sim_compute`).
#![forbid(unsafe_code)]

pub mod kernels;

use kernels::{Capability, Expected};

use crate::report::Report;

/// One kernel to compile and run: one threadgroup of `threads` threads.
#[derive(Debug, Clone)]
pub struct Job {
    /// The kernel function's name in `source`.
    pub function: &'static str,
    /// Metal Shading Language source of a library holding the function.
    pub source: &'static str,
    /// The buffers' initial bytes, bound at indexes 0, 1, ...
    pub buffers: Vec<Vec<u8>>,
    /// Which buffer holds the answer.
    pub output: usize,
    /// Threads in the one threadgroup dispatched.
    pub threads: u64,
    /// Bytes of threadgroup memory at `[[threadgroup(0)]]`; 0: none.
    pub threadgroup_memory: u64,
}

/// Why a kernel gave no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// The library did not compile, the function was not found, or no pipeline
    /// could be made of it.
    Compile(String),
    /// The command buffer ended in error (or buffers could not be made).
    Run(String),
}

/// A GPU that can compile and run a [`Job`].
pub trait Compute {
    /// Compiles `job.source`, runs `job.function`, and returns the bytes of buffer
    /// `job.output` after the GPU finished.
    fn run(&self, job: &Job) -> Result<Vec<u8>, Failure>;
}

/// What became of one kernel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The GPU's answer is the CPU's.
    Pass,
    /// The GPU answered something else.
    Differs(String),
    /// See [`Failure::Compile`].
    CompileFailed(String),
    /// See [`Failure::Run`].
    RunFailed(String),
    /// The device does not claim the capability: nothing to check.
    NotClaimed,
}

impl Outcome {
    /// The word the table and the JSON use.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Outcome::Pass => "pass",
            Outcome::Differs(_) => "differs",
            Outcome::CompileFailed(_) => "compile_failed",
            Outcome::RunFailed(_) => "run_failed",
            Outcome::NotClaimed => "not_claimed",
        }
    }

    fn detail(&self) -> Option<&str> {
        match self {
            Outcome::Differs(d) | Outcome::CompileFailed(d) | Outcome::RunFailed(d) => Some(d),
            Outcome::Pass | Outcome::NotClaimed => None,
        }
    }

    /// Whether this outcome breaks the claim.
    #[must_use]
    pub fn is_failure(&self) -> bool {
        !matches!(self, Outcome::Pass | Outcome::NotClaimed)
    }
}

/// One row of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelResult {
    /// What it checks.
    pub capability: Capability,
    /// What became of it.
    pub outcome: Outcome,
}

/// Every kernel's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verification {
    /// In [`Capability::ALL`] order (only the one asked for with `--kernel`).
    pub kernels: Vec<KernelResult>,
    /// The control's outcome, when it ran (`--kernel control`): it must be
    /// `differs`; anything else means the comparison cannot fail, and
    /// `metalift verify` calls the verification void.
    pub control: Option<Outcome>,
    /// The threadgroup memory the device claimed (and the kernel allocated).
    pub threadgroup_memory: u64,
}

/// Whether `report`'s device claims `capability`. Threadgroup memory is always
/// claimed: every device answers some `maxThreadgroupMemoryLength`.
#[must_use]
pub fn claims(report: &Report, capability: Capability) -> bool {
    match capability {
        Capability::SimdSum | Capability::SimdMax => report.llama.has_simdgroup_reduction,
        Capability::SimdgroupMatrix => report.llama.has_simdgroup_mm,
        Capability::Bfloat => report.llama.has_bfloat,
        Capability::ThreadgroupMemory => true,
    }
}

/// The control's function name as `--kernel` takes it and the JSON names it.
pub const CONTROL: &str = "control";

/// Test rigs only: with this set to `1` the control's reference is not perturbed
/// (a comparison that cannot fail), so a test can show `metalift verify` calls such
/// a run void. Never set it on a real machine.
pub const BREAK_CONTROL_ENV: &str = "METALIFT_VERIFY_BREAK_CONTROL";

/// The control: the threadgroup-memory kernel (every device claims some), checked
/// against its CPU answer with one value changed. A comparison that works says
/// `differs`; `pass` means the check cannot fail (broken comparison, or a GPU and
/// probe that agree on anything) and nothing it says is evidence.
pub fn control(gpu: &dyn Compute, report: &Report, perturb: bool) -> Outcome {
    let (job, expected) =
        kernels::job(Capability::ThreadgroupMemory, report.max_threadgroup_memory);
    let expected = if perturb {
        expected.perturbed()
    } else {
        expected
    };
    check(gpu, &job, &expected)
}

/// Runs every kernel `report`'s device claims on `gpu`.
pub fn verify(gpu: &dyn Compute, report: &Report) -> Verification {
    verify_capabilities(gpu, report, &Capability::ALL)
}

/// [`verify`], or with `only` (`--kernel`) just that kernel, or the control.
///
/// # Errors
/// `only` names no kernel.
pub fn verify_selected(
    gpu: &dyn Compute,
    report: &Report,
    only: Option<&str>,
) -> Result<Verification, String> {
    match only {
        None => Ok(verify(gpu, report)),
        Some(CONTROL) => {
            let perturb = std::env::var(BREAK_CONTROL_ENV).as_deref() != Ok("1");
            Ok(Verification {
                kernels: Vec::new(),
                control: Some(control(gpu, report, perturb)),
                threadgroup_memory: report.max_threadgroup_memory,
            })
        }
        Some(name) => {
            let capability = Capability::ALL
                .into_iter()
                .find(|c| c.function() == name)
                .ok_or_else(|| {
                    let names: Vec<&str> = Capability::ALL.iter().map(|c| c.function()).collect();
                    format!(
                        "--kernel {name}: no such kernel (kernels: {}, {CONTROL})",
                        names.join(", ")
                    )
                })?;
            Ok(verify_capabilities(gpu, report, &[capability]))
        }
    }
}

fn verify_capabilities(gpu: &dyn Compute, report: &Report, which: &[Capability]) -> Verification {
    let kernels = which
        .iter()
        .map(|&capability| {
            let outcome = if claims(report, capability) {
                let (job, expected) = kernels::job(capability, report.max_threadgroup_memory);
                check(gpu, &job, &expected)
            } else {
                Outcome::NotClaimed
            };
            KernelResult {
                capability,
                outcome,
            }
        })
        .collect();
    Verification {
        kernels,
        control: None,
        threadgroup_memory: report.max_threadgroup_memory,
    }
}

fn check(gpu: &dyn Compute, job: &Job, expected: &Expected) -> Outcome {
    match gpu.run(job) {
        Ok(bytes) => match expected.mismatch(&bytes) {
            None => Outcome::Pass,
            Some(where_) => Outcome::Differs(where_),
        },
        Err(Failure::Compile(why)) => Outcome::CompileFailed(why),
        Err(Failure::Run(why)) => Outcome::RunFailed(why),
    }
}

impl Verification {
    /// Whether every claimed kernel passed.
    #[must_use]
    pub fn passed(&self) -> bool {
        !self.kernels.iter().any(|k| k.outcome.is_failure())
    }

    /// The table `metalift-probe --verify` prints.
    #[must_use]
    pub fn to_text(&self) -> String {
        let mut out = format!(
            "verification (kernels run on the device):\n  {:<24} {:<26} {:<15} detail\n",
            "kernel", "claim", "result"
        );
        for k in &self.kernels {
            let claim = match k.capability {
                Capability::ThreadgroupMemory => {
                    format!("{} {}", k.capability.claim(), self.threadgroup_memory)
                }
                _ => k.capability.claim().to_owned(),
            };
            out.push_str(&format!(
                "  {:<24} {:<26} {:<15} {}\n",
                k.capability.function(),
                claim,
                k.outcome.as_str(),
                k.outcome.detail().unwrap_or("")
            ));
        }
        if let Some(c) = &self.control {
            out.push_str(&format!(
                "  {:<24} {:<26} {:<15} {}\n",
                CONTROL,
                "(must differ)",
                c.as_str(),
                c.detail().unwrap_or("")
            ));
        }
        out.push_str(if self.passed() {
            "verification: passed\n"
        } else {
            "verification: FAILED (a claimed capability does not compute correctly)\n"
        });
        out
    }

    /// The `verification` object of the probe's JSON.
    #[must_use]
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "passed": self.passed(),
            "threadgroup_memory": self.threadgroup_memory,
            "kernels": self.kernels.iter().map(|k| serde_json::json!({
                "kernel": k.capability.function(),
                "claim": k.capability.claim(),
                "result": k.outcome.as_str(),
                "detail": k.outcome.detail(),
            })).collect::<Vec<_>>(),
            "control": self.control.as_ref().map(|c| serde_json::json!({
                "result": c.as_str(),
                "detail": c.detail(),
            })),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::Device;

    /// A CPU "GPU" that computes every job right, or breaks one way.
    enum Cpu {
        Right,
        Refuses,
    }

    impl Compute for Cpu {
        fn run(&self, job: &Job) -> Result<Vec<u8>, Failure> {
            match self {
                Cpu::Refuses if job.source.contains("simd") => {
                    Err(Failure::Compile("no simdgroup functions".into()))
                }
                _ => {
                    let capability = Capability::ALL
                        .into_iter()
                        .find(|c| c.function() == job.function)
                        .ok_or_else(|| Failure::Compile("unknown".into()))?;
                    let (_, expected) = kernels::job(capability, job.threadgroup_memory);
                    Ok(match expected {
                        Expected::Floats(v) => v.iter().flat_map(|f| f.to_le_bytes()).collect(),
                        Expected::Words(v) => v.iter().flat_map(|w| w.to_le_bytes()).collect(),
                    })
                }
            }
        }
    }

    struct Apple(i64);

    impl Device for Apple {
        fn name(&self) -> String {
            "fake".into()
        }
        fn supports_family(&self, family: i64) -> bool {
            (1001..=self.0).contains(&family)
        }
        fn max_threadgroup_memory(&self) -> u64 {
            32768
        }
        fn recommended_working_set(&self) -> Option<u64> {
            None
        }
    }

    #[test]
    fn stock_answers_claim_only_threadgroup_memory() {
        let v = verify(&Cpu::Refuses, &Report::probe(&Apple(1005)));
        assert!(v.passed(), "{}", v.to_text());
        let checked: Vec<_> = v
            .kernels
            .iter()
            .filter(|k| k.outcome != Outcome::NotClaimed)
            .map(|k| k.capability)
            .collect();
        assert_eq!(checked, [Capability::ThreadgroupMemory]);
    }

    #[test]
    fn an_apple7_claim_runs_every_kernel_and_a_compile_failure_fails_it() {
        let report = Report::probe(&Apple(1007));
        assert!(verify(&Cpu::Right, &report).passed());
        let v = verify(&Cpu::Refuses, &report);
        assert!(!v.passed());
        assert_eq!(v.kernels[0].outcome.as_str(), "compile_failed");
        assert_eq!(v.to_json()["passed"], false);
    }

    #[test]
    fn the_control_differs_on_a_right_gpu_and_passes_only_unperturbed() {
        let report = Report::probe(&Apple(1007));
        assert_eq!(control(&Cpu::Right, &report, true).as_str(), "differs");
        assert_eq!(control(&Cpu::Right, &report, false).as_str(), "pass");
    }

    #[test]
    fn kernel_selects_one_row_and_control_alone_passes() {
        let report = Report::probe(&Apple(1007));
        let v = verify_selected(&Cpu::Right, &report, Some("metalift_bfloat")).unwrap();
        assert_eq!(v.kernels.len(), 1);
        assert_eq!(v.kernels[0].capability, Capability::Bfloat);
        let c = verify_selected(&Cpu::Right, &report, Some(CONTROL)).unwrap();
        assert!(c.kernels.is_empty() && c.passed());
        assert_eq!(c.to_json()["control"]["result"], "differs");
        assert!(verify_selected(&Cpu::Right, &report, Some("nope")).is_err());
    }
}
