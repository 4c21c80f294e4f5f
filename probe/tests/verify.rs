//! `metalift-probe --verify` under libmetalift, on the simulated Metal's compute
//! path: an unlocked device whose host GPU runs the kernels passes; the two
//! breakages a macOS or host update could bring (`nocompile/`, `wrongresults/`
//! builds of `probe/simmetal/compute.m`) fail with exit status 4 and say which
//! kernel; a threadgroup claim beyond what the GPU has fails its kernel; stock
//! answers claim nothing but threadgroup memory.
#![cfg(target_os = "linux")]

mod support;

use std::process::Output;

use metalift_policy::profile::Capabilities;
use support::*;

/// Runs the probe with `--verify --json` under the shim (the fake daemon answers
/// `behaviour`) on simulated Metal `variant`.
fn verify(variant: &str, behaviour: Behaviour) -> (Output, serde_json::Value) {
    let daemon = FakeDaemon::start(behaviour);
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("LD_LIBRARY_PATH", simmetal(variant))
        .args(["--verify", "--json"]);
    run_json(cmd)
}

/// `kernel → result` of the probe's verification.
fn results(json: &serde_json::Value) -> Vec<(String, String)> {
    json["verification"]["kernels"]
        .as_array()
        .unwrap_or_else(|| panic!("no kernels: {json}"))
        .iter()
        .map(|k| {
            (
                k["kernel"].as_str().unwrap_or_default().to_owned(),
                k["result"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

fn result_of(json: &serde_json::Value, kernel: &str) -> String {
    results(json)
        .into_iter()
        .find(|(k, _)| k == kernel)
        .map(|(_, r)| r)
        .unwrap_or_else(|| panic!("no {kernel}: {json}"))
}

#[test]
fn an_unlocked_device_whose_gpu_runs_the_kernels_passes_every_one() {
    let (output, json) = verify("normal", unlock(APPLE7));
    assert!(output.status.success(), "{json}");
    assert_apple7(&json);
    assert_eq!(json["verification"]["passed"], true, "{json}");
    for (kernel, result) in results(&json) {
        assert_eq!(result, "pass", "{kernel}: {json}");
    }
}

#[test]
fn when_the_compiler_rejects_simdgroup_functions_verify_exits_4_naming_them() {
    let (output, json) = verify("nocompile", unlock(APPLE7));
    assert_eq!(output.status.code(), Some(4), "{json}");
    assert_eq!(json["verification"]["passed"], false);
    for kernel in [
        "metalift_simd_sum",
        "metalift_simd_max",
        "metalift_simdgroup_mm",
    ] {
        assert_eq!(result_of(&json, kernel), "compile_failed", "{json}");
    }
    // Kernels without simdgroup functions still compile and pass.
    assert_eq!(result_of(&json, "metalift_bfloat"), "pass");
    assert_eq!(result_of(&json, "metalift_threadgroup"), "pass");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("metalift_simd_sum"), "{stderr}");
}

#[test]
fn when_simdgroup_operations_compute_garbage_verify_exits_4_with_where_they_differ() {
    let (output, json) = verify("wrongresults", unlock(APPLE7));
    assert_eq!(output.status.code(), Some(4), "{json}");
    assert_eq!(result_of(&json, "metalift_simd_sum"), "differs");
    assert_eq!(result_of(&json, "metalift_simd_max"), "differs");
    assert_eq!(result_of(&json, "metalift_simdgroup_mm"), "differs");
    assert_eq!(result_of(&json, "metalift_bfloat"), "pass");
    let detail = json["verification"]["kernels"][0]["detail"]
        .as_str()
        .unwrap_or_default();
    assert!(detail.contains("the CPU says 528"), "{detail}");
}

#[test]
fn a_threadgroup_claim_beyond_the_gpu_fails_its_kernel_whatever_the_device_answers() {
    let (output, json) = verify(
        "normal",
        unlock(Capabilities {
            max_threadgroup_memory: 65536,
            ..APPLE7
        }),
    );
    assert_eq!(json["max_threadgroup_memory"], 65536, "{json}");
    assert_eq!(output.status.code(), Some(4), "{json}");
    assert_eq!(result_of(&json, "metalift_threadgroup"), "run_failed");
    assert_eq!(result_of(&json, "metalift_simd_sum"), "pass");
}

#[test]
fn stock_answers_claim_no_simdgroup_kernel_and_the_compute_path_ignores_the_answers() {
    // On the broken build, a stock device checks only threadgroup memory: the
    // kernels follow the claims, and the GPU follows nothing the shim patched.
    let (output, json) = verify(
        "nocompile",
        stock(metalift_policy::verdict::Mode::Enforce, false),
    );
    assert_stock(&json);
    assert!(output.status.success(), "{json}");
    assert_eq!(result_of(&json, "metalift_simd_sum"), "not_claimed");
    assert_eq!(result_of(&json, "metalift_threadgroup"), "pass");
}
