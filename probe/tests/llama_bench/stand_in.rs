//! `metalift-llama-bench`: a test double for llama.cpp's `llama-bench` on the
//! simulated Metal, for `metalift verify --workload` and the guide's blocks. It
//! prints `recorded.json` (llama-bench's `-o json` output; README.md beside this
//! file says what is recorded and what is illustrative), each test's speed scaled
//! by what this process's Metal device answers. Its arguments are ignored.
//!
//! The evidence that the shim unlocked this process is the device itself: the
//! binary links `MTLCreateSystemDefaultDevice` from the simulated Metal (probe's
//! build.rs; llama.cpp links Metal.framework), creates the default device as
//! `metalift-probe` does and derives llama.cpp's flags from its answers
//! (`LlamaFlags::derive`, as `ggml-metal-device.m` does). A prompt-processing
//! test runs at the unlocked rate only with `has_simdgroup_mm` (llama.cpp's
//! matrix-matrix kernels), a generation test only with `has_simdgroup_reduction`
//! (its matrix-vector kernels); otherwise the recorded (stock) numbers are
//! printed as they are.

use std::process::ExitCode;

use metalift_probe::LlamaFlags;
use serde_json::Value;

/// A stock guest's `llama-bench -o json` (M1 Ultra host, TinyLlama 1.1B Q4_0).
const RECORDED: &str = include_str!("recorded.json");

/// The published guest speed-ups, unlocked over stock tokens per second
/// (`bench/llama-guest.sh`: pp512 431.86 -> 4786.70, tg128 12.63 -> 206.60).
const PP_SPEEDUP: f64 = 4786.70 / 431.86;
const TG_SPEEDUP: f64 = 206.60 / 12.63;

fn main() -> ExitCode {
    let (gpu, flags) = match platform::device() {
        Ok(device) => device,
        Err(err) => {
            eprintln!("metalift-llama-bench: no Metal device: {err}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "metalift-llama-bench: {gpu}: has_simdgroup_mm = {}, has_simdgroup_reduction = {}",
        flags.has_simdgroup_mm, flags.has_simdgroup_reduction
    );
    if !flags.has_simdgroup_mm && !flags.has_simdgroup_reduction {
        // Stock: the recorded output, byte for byte.
        print!("{RECORDED}");
        return ExitCode::SUCCESS;
    }
    match scaled(&flags) {
        Ok(text) => {
            println!("{text}");
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("metalift-llama-bench: recorded.json: {err}");
            ExitCode::FAILURE
        }
    }
}

/// The recorded tests, each sped up by the flags that govern it: tokens per
/// second times the speed-up, nanoseconds divided by it.
fn scaled(flags: &LlamaFlags) -> Result<String, String> {
    let mut tests: Vec<Value> = serde_json::from_str(RECORDED).map_err(|e| e.to_string())?;
    for test in &mut tests {
        let n_prompt = test["n_prompt"].as_u64().ok_or("a test without n_prompt")?;
        let n_gen = test["n_gen"].as_u64().ok_or("a test without n_gen")?;
        let x = match (n_prompt, n_gen) {
            (_, 0) if flags.has_simdgroup_mm => PP_SPEEDUP,
            (0, _) if flags.has_simdgroup_reduction => TG_SPEEDUP,
            (p, g) if p > 0 && g > 0 => return Err("a pp+tg test: no speed-up is recorded".into()),
            _ => 1.0,
        };
        let test = test.as_object_mut().ok_or("a test that is not an object")?;
        for (field, value) in test.iter_mut() {
            let per = match field.as_str() {
                "avg_ts" | "stddev_ts" | "samples_ts" => x,
                "avg_ns" | "stddev_ns" | "samples_ns" => 1.0 / x,
                _ => continue,
            };
            let times = |v: &Value| v.as_f64().map(|f| f * per);
            *value = match &*value {
                Value::Array(items) => items
                    .iter()
                    .map(|v| times(v).map(|f| number(field, f)))
                    .collect::<Option<Value>>(),
                other => times(other).map(|f| number(field, f)),
            }
            .ok_or_else(|| format!("{field} is not a number or a list of numbers"))?;
        }
    }
    serde_json::to_string_pretty(&tests).map_err(|e| e.to_string())
}

/// Nanoseconds are integers in llama-bench's output (`uint64_t`).
fn number(field: &str, f: f64) -> Value {
    if field.ends_with("_ns") {
        Value::from(f.round() as u64)
    } else {
        Value::from(f)
    }
}

#[cfg(target_os = "linux")]
mod platform {
    use std::ffi::c_void;

    use metalift_probe::report::Device;
    use metalift_probe::sim::{self, Scope};
    use metalift_probe::LlamaFlags;

    // Linked from libsimmetal.so (probe/build.rs), as llama.cpp links Metal.framework.
    extern "C" {
        fn MTLCreateSystemDefaultDevice() -> *mut c_void;
    }

    pub fn device() -> Result<(String, LlamaFlags), String> {
        // SAFETY: the linked symbol is the simulated Metal's MTLCreateSystemDefaultDevice.
        let device = unsafe { sim::default_device(MTLCreateSystemDefaultDevice, Scope::Global) }?;
        Ok((
            device.name(),
            LlamaFlags::derive(|f| device.supports_family(f)),
        ))
    }
}

#[cfg(not(target_os = "linux"))]
mod platform {
    use metalift_probe::LlamaFlags;

    pub fn device() -> Result<(String, LlamaFlags), String> {
        Err("the stand-in runs on the simulated Metal (Linux); on macOS run llama.cpp's llama-bench".into())
    }
}
