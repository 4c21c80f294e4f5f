//! `metalift verify` cannot hang or lie (issue 32): each kernel runs in a probe
//! child killed at its deadline and named `hung`; the whole run is bounded; a
//! control built to come out `differs` voids the run when it does not; the record
//! is a receipt (sha256 of the shim and the probe that ran, stock and effective
//! answers, each kernel's time). On the simulated Metal: `hang/` is its variant
//! whose simdgroup matrix kernel never completes.
//!
//! Needs the workspace built first (`cargo build --workspace`, as scripts/test.sh does).
#![cfg(target_os = "linux")]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use metalift_policy::wire::WireAction;
use serde_json::Value;
use support::{check_in, workspace_binary, Daemon, DaemonDir};

const CHIP: &str = "Apple M2 (Virtual)";
const BUILD: &str = "24A335";

/// `apple7` requires verification and unlocks this test process.
fn write_policy(dir: &DaemonDir, family: u8) {
    let me = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .expect("this test's executable");
    std::fs::write(
        dir.policy(),
        format!(
            "version = 1\n\n[profile.apple7]\napple_family_max = {family}\nrequire_verified = true\n\n\
             [[rule]]\nid = \"this-test\"\npath = {:?}\nunlock = \"apple7\"\n",
            me.display().to_string()
        ),
    )
    .expect("policy");
}

fn start(dir: &DaemonDir) -> Daemon {
    dir.start(
        &[],
        &[
            ("METALIFT_HOST_CHIP_BRAND", CHIP),
            ("METALIFT_HOST_OS_BUILD", BUILD),
        ],
    )
}

fn simmetal(variant: &str) -> PathBuf {
    let out = Command::new(workspace_binary("metalift-probe"))
        .arg("--simmetal-dir")
        .output()
        .expect("metalift-probe --simmetal-dir");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join(variant)
}

/// `metalift verify --profile apple7 --json ARGS` on the GPU of `variant`.
fn verify(
    dir: &DaemonDir,
    variant: &str,
    args: &[&str],
    env: &[(&str, &str)],
) -> (Output, Value, Duration) {
    let started = Instant::now();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_metalift"));
    cmd.args(["verify", "--profile", "apple7", "--json", "--policy"])
        .arg(dir.policy())
        .arg("--audit-log")
        .arg(dir.audit_log())
        .args(args)
        .env("METALIFT_HOST_CHIP_BRAND", CHIP)
        .env("METALIFT_HOST_OS_BUILD", BUILD)
        .env("LD_LIBRARY_PATH", simmetal(variant))
        .env("METALIFT_TIMEOUT_MS", "10000")
        .env_remove("LD_PRELOAD")
        .env_remove("METALIFT_DISABLE")
        .env_remove("METALIFT_VERIFY_BREAK_CONTROL");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let output = cmd.output().expect("run metalift verify");
    let took = started.elapsed();
    let json = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "metalift verify printed no JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output, json, took)
}

fn decide(dir: &DaemonDir, socket: &Path) -> (WireAction, Value) {
    let verdict = check_in(socket);
    let decision = dir
        .records_of("decision")
        .into_iter()
        .rfind(|d| d["decision_id"] == verdict.decision_id)
        .expect("the decision is audited");
    (verdict.action, decision)
}

fn kernel<'a>(record: &'a Value, name: &str) -> &'a Value {
    record["kernels"]
        .as_array()
        .and_then(|k| k.iter().find(|k| k["kernel"] == name))
        .unwrap_or_else(|| panic!("no {name} in {record}"))
}

/// The verification file holds whole lines only, each a record.
fn file_records(dir: &DaemonDir) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.path("etc/verifications.jsonl")).expect("file");
    assert!(text.ends_with('\n'), "{text}");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn a_hung_kernel_is_killed_at_its_deadline_named_hung_and_the_profile_stays_stock() {
    let dir = DaemonDir::new("verify-hung");
    write_policy(&dir, 7);
    let daemon = start(&dir);
    // A pass first, so the hung run is seen revoking it.
    let (output, pass, _) = verify(&dir, "normal", &[], &[]);
    assert!(output.status.success(), "{pass}");
    assert_eq!(decide(&dir, &daemon.socket).0, WireAction::Unlock);

    let (output, record, took) = verify(
        &dir,
        "hang",
        &["--kernel-timeout", "2", "--timeout", "60"],
        &[],
    );
    assert_eq!(output.status.code(), Some(1), "{record}");
    assert!(took < Duration::from_secs(40), "took {took:?}: not bounded");
    assert_eq!(record["passed"], false, "{record}");
    let mm = kernel(&record, "metalift_simdgroup_mm");
    assert_eq!(mm["result"], "hung", "{record}");
    let ms = mm["ms"].as_u64().expect("the hung kernel's time");
    assert!((1900..10_000).contains(&ms), "{mm}");
    assert!(
        mm["detail"].as_str().unwrap_or("").contains("killed"),
        "{mm}"
    );
    // The others completed in their own children.
    for other in [
        "metalift_simd_sum",
        "metalift_bfloat",
        "metalift_threadgroup",
    ] {
        assert_eq!(kernel(&record, other)["result"], "pass", "{record}");
    }
    let (action, decision) = decide(&dir, &daemon.socket);
    assert_eq!(action, WireAction::Stock, "{decision}");
    assert!(
        decision["unverified"]
            .as_str()
            .unwrap_or("")
            .contains("metalift_simdgroup_mm: hung"),
        "{decision}"
    );
    assert_eq!(file_records(&dir).len(), 2);
}

#[test]
fn the_whole_verification_is_bounded_and_kernels_after_the_bound_are_not_run() {
    let dir = DaemonDir::new("verify-bound");
    write_policy(&dir, 7);
    let (output, record, took) = verify(
        &dir,
        "hang",
        &["--kernel-timeout", "60", "--timeout", "4"],
        &[],
    );
    assert_eq!(output.status.code(), Some(1), "{record}");
    assert!(
        took < Duration::from_secs(20),
        "took {took:?}: --timeout not kept"
    );
    assert_eq!(
        kernel(&record, "metalift_simdgroup_mm")["result"],
        "hung",
        "{record}"
    );
    assert_eq!(
        kernel(&record, "metalift_bfloat")["result"],
        "not_run",
        "{record}"
    );
    assert_eq!(record["receipt"]["control"], "not_run", "{record}");
    assert_eq!(record["passed"], false);
    assert_eq!(file_records(&dir).len(), 1);
}

#[test]
fn a_control_that_comes_out_equal_voids_the_verification_never_a_pass() {
    let dir = DaemonDir::new("verify-void");
    write_policy(&dir, 7);
    let daemon = start(&dir);
    let (output, record, _) = verify(&dir, "normal", &[], &[]);
    assert!(output.status.success(), "{record}");
    assert_eq!(record["receipt"]["control"], "differs", "{record}");
    assert!(record["receipt"]["void"].is_null(), "{record}");

    let (output, record, _) = verify(
        &dir,
        "normal",
        &[],
        &[("METALIFT_VERIFY_BREAK_CONTROL", "1")],
    );
    assert_eq!(output.status.code(), Some(1), "{record}");
    assert_eq!(record["passed"], false, "{record}");
    assert_eq!(record["receipt"]["control"], "pass", "{record}");
    assert!(
        record["receipt"]["void"]
            .as_str()
            .unwrap_or("")
            .contains("control"),
        "{record}"
    );
    // Every real kernel passed: only the control makes it void.
    assert!(record["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .all(|k| k["result"] == "pass"));
    let (action, decision) = decide(&dir, &daemon.socket);
    assert_eq!(action, WireAction::Stock, "{decision}");
}

#[test]
fn the_receipt_holds_the_hashes_of_the_files_that_ran_and_both_devices_answers() {
    let dir = DaemonDir::new("verify-receipt");
    write_policy(&dir, 7);
    let (output, record, _) = verify(&dir, "normal", &[], &[]);
    assert!(output.status.success(), "{record}");
    let receipt = &record["receipt"];
    for (path, hash) in [("shim", "shim_sha256"), ("probe", "probe_sha256")] {
        let file = receipt[path].as_str().expect("path");
        let sum = Command::new("sha256sum")
            .arg(file)
            .output()
            .expect("sha256sum");
        let sum = String::from_utf8_lossy(&sum.stdout);
        let sum = sum.split_whitespace().next().expect("a hash");
        assert_eq!(receipt[hash], sum, "{path}: {receipt}");
    }
    assert_eq!(receipt["stock"]["apple_family"], 5, "{receipt}");
    assert_eq!(receipt["stock"]["has_simdgroup_mm"], false, "{receipt}");
    assert_eq!(receipt["effective"]["apple_family"], 7, "{receipt}");
    assert_eq!(receipt["effective"]["has_simdgroup_mm"], true, "{receipt}");
    assert_eq!(receipt["unlock_needed"], true, "{receipt}");
    for k in record["kernels"].as_array().unwrap() {
        assert!(k["ms"].as_u64().is_some(), "{k}");
    }
    assert_eq!(record["host_chip"], CHIP);
    assert_eq!(record["os_build"], BUILD);
    // The file and the audit log hold the same receipt.
    assert_eq!(file_records(&dir)[0]["receipt"], *receipt);
    assert_eq!(dir.records_of("verification")[0]["receipt"], *receipt);
}

#[test]
fn a_stock_device_that_already_answers_the_claim_is_recorded_as_not_needed() {
    let dir = DaemonDir::new("verify-notneeded");
    // The stock simulated device answers Apple5 and 32768 bytes already.
    write_policy(&dir, 5);
    let (output, record, _) = verify(&dir, "normal", &[], &[]);
    assert!(output.status.success(), "{record}");
    assert_eq!(record["receipt"]["unlock_needed"], false, "{record}");
    let daemon = start(&dir);
    let doctor = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["doctor", "--allow-insecure-owner", "--socket"])
        .arg(&daemon.socket)
        .arg("--policy")
        .arg(dir.policy())
        .arg("--log")
        .arg(dir.audit_log())
        .env("METALIFT_HOST_CHIP_BRAND", CHIP)
        .env("METALIFT_HOST_OS_BUILD", BUILD)
        .output()
        .expect("metalift doctor");
    let text = String::from_utf8_lossy(&doctor.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("verified unlock"))
        .unwrap_or_else(|| panic!("no verified unlock check:\n{text}"));
    assert!(line.contains("the unlock is not needed here"), "{line}");
}
