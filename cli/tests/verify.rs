//! Verified unlock end to end on Linux: `metalift verify` runs the real probe
//! under the real shim (a throw-away metaliftd unlocks it with the profile) on the
//! simulated Metal's compute path, records the result, and the real metaliftd
//! unlocks a profile with `require_verified = true` only while the last
//! verification for its host chip and macOS build passed.
//!
//! The host chip and build come through the daemon's host seam
//! (`METALIFT_HOST_CHIP_BRAND`, `METALIFT_HOST_OS_BUILD`), given to both the daemon
//! and `metalift verify`; a new build is a daemon restart with another string, as an
//! OS update restarts the machine. The broken GPUs are the simulated Metal's
//! `nocompile/` and `wrongresults/` builds, picked with `LD_LIBRARY_PATH`.
//!
//! Needs the workspace built first (`cargo build --workspace`, as scripts/test.sh does).
#![cfg(target_os = "linux")]

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use metalift_policy::wire::WireAction;
use serde_json::Value;
use support::{check_in, workspace_binary, Daemon, DaemonDir};

const CHIP: &str = "Apple M2 (Virtual)";

/// A policy whose `apple7` profile requires verification and unlocks this test
/// process (the check-ins come from it), plus a `free` profile that does not.
fn write_policy(dir: &DaemonDir) {
    let me = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .expect("this test's executable");
    std::fs::write(
        dir.policy(),
        format!(
            "version = 1\n\n[profile.apple7]\napple_family_max = 7\nrequire_verified = true\n\n\
             [[rule]]\nid = \"this-test\"\npath = {:?}\nunlock = \"apple7\"\n",
            me.display().to_string()
        ),
    )
    .expect("policy");
}

fn start(dir: &DaemonDir, build: &str) -> Daemon {
    dir.start(
        &[],
        &[
            ("METALIFT_HOST_CHIP_BRAND", CHIP),
            ("METALIFT_HOST_OS_BUILD", build),
        ],
    )
}

/// The simulated Metal variant directory (`normal`, `nocompile`, `wrongresults`).
fn simmetal(variant: &str) -> PathBuf {
    let out = Command::new(workspace_binary("metalift-probe"))
        .arg("--simmetal-dir")
        .output()
        .expect("metalift-probe --simmetal-dir");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join(variant)
}

/// `metalift verify --profile apple7 --json` on `build`, the GPU of `variant`.
fn verify(dir: &DaemonDir, build: &str, variant: &str) -> (Output, Value) {
    let output = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["verify", "--profile", "apple7", "--json", "--policy"])
        .arg(dir.policy())
        .arg("--audit-log")
        .arg(dir.audit_log())
        .env("METALIFT_HOST_CHIP_BRAND", CHIP)
        .env("METALIFT_HOST_OS_BUILD", build)
        .env("LD_LIBRARY_PATH", simmetal(variant))
        .env("METALIFT_TIMEOUT_MS", "10000")
        .env_remove("LD_PRELOAD")
        .env_remove("METALIFT_DISABLE")
        .output()
        .expect("run metalift verify");
    let json = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!(
            "metalift verify printed no JSON ({e}): {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output, json)
}

/// A check-in from this process, and the decision record the daemon wrote for it.
fn decide(dir: &DaemonDir, socket: &Path) -> (WireAction, Value) {
    let verdict = check_in(socket);
    let decision = dir
        .records_of("decision")
        .into_iter()
        .rfind(|d| d["decision_id"] == verdict.decision_id)
        .expect("the decision is audited");
    (verdict.action, decision)
}

fn reason(decision: &Value) -> &str {
    decision["unverified"].as_str().unwrap_or("")
}

#[test]
fn a_profile_requiring_verification_is_stock_until_a_passing_verification_then_unlocks() {
    let dir = DaemonDir::new("verify-pass");
    write_policy(&dir);
    let daemon = start(&dir, "24A335");
    let (action, decision) = decide(&dir, &daemon.socket);
    assert_eq!(action, WireAction::Stock, "{decision}");
    assert!(reason(&decision).contains("none recorded"), "{decision}");
    assert!(reason(&decision).contains("24A335"), "{decision}");

    let (output, record) = verify(&dir, "24A335", "normal");
    assert!(output.status.success(), "{record}");
    assert_eq!(record["passed"], true, "{record}");
    assert_eq!(record["os_build"], "24A335");
    assert_eq!(record["host_chip"], CHIP);
    assert_eq!(record["apple_family_max"], 7);
    assert!(
        record["kernels"]
            .as_array()
            .is_some_and(|k| k.len() == 5 && k.iter().all(|k| k["result"] == "pass")),
        "{record}"
    );
    let audited = dir.records_of("verification");
    assert_eq!(audited.len(), 1, "one verification record in the audit log");
    assert_eq!(audited[0]["passed"], true);
    let listed = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["audit", "--kind", "verification", "--log"])
        .arg(dir.audit_log())
        .output()
        .expect("metalift audit");
    let listed = String::from_utf8_lossy(&listed.stdout);
    assert!(
        listed.contains(" verified ") && listed.contains("profile=apple7 build=24A335"),
        "{listed}"
    );

    let (action, decision) = decide(&dir, &daemon.socket);
    assert_eq!(action, WireAction::Unlock, "{decision}");
    assert!(decision["unverified"].is_null(), "{decision}");
}

#[test]
fn each_broken_gpu_fails_verification_and_the_daemon_answers_stock_with_the_reason() {
    let dir = DaemonDir::new("verify-fail");
    write_policy(&dir);
    let daemon = start(&dir, "24A335");
    for (variant, result) in [("nocompile", "compile_failed"), ("wrongresults", "differs")] {
        // A pass first, so the failure is seen revoking it.
        let (output, _) = verify(&dir, "24A335", "normal");
        assert!(output.status.success(), "{variant}: the pass before");
        assert_eq!(decide(&dir, &daemon.socket).0, WireAction::Unlock);

        let (output, record) = verify(&dir, "24A335", variant);
        assert_eq!(output.status.code(), Some(1), "{variant}: {record}");
        assert_eq!(record["passed"], false, "{variant}: {record}");
        let simd_sum = &record["kernels"][0];
        assert_eq!(simd_sum["kernel"], "metalift_simd_sum");
        assert_eq!(simd_sum["result"], result, "{variant}: {record}");

        let (action, decision) = decide(&dir, &daemon.socket);
        assert_eq!(action, WireAction::Stock, "{variant}: {decision}");
        assert!(
            reason(&decision).contains("failed")
                && reason(&decision).contains(&format!("metalift_simd_sum: {result}")),
            "{variant}: {decision}"
        );
        assert_eq!(decision["rule"], "this-test");
    }
    let audited = dir.records_of("verification");
    assert_eq!(
        audited.len(),
        4,
        "every verification, pass or fail, is audited"
    );
}

#[test]
fn after_a_macos_update_the_profile_is_stock_until_verified_again() {
    let dir = DaemonDir::new("verify-build");
    write_policy(&dir);
    let daemon = start(&dir, "24A335");
    let (output, _) = verify(&dir, "24A335", "normal");
    assert!(output.status.success());
    assert_eq!(decide(&dir, &daemon.socket).0, WireAction::Unlock);
    drop(daemon);

    // The update: the machine (and the daemon) restart on another build.
    let daemon = start(&dir, "24B83");
    let (action, decision) = decide(&dir, &daemon.socket);
    assert_eq!(action, WireAction::Stock, "{decision}");
    assert!(reason(&decision).contains("24B83"), "{decision}");

    let (output, record) = verify(&dir, "24B83", "normal");
    assert!(output.status.success(), "{record}");
    assert_eq!(decide(&dir, &daemon.socket).0, WireAction::Unlock);
}

/// Issue 43: with no daemon answering and no chip this process can read (Linux,
/// no `METALIFT_HOST_CHIP_BRAND`), verify refuses before running anything: a
/// record for "host chip (unknown)" would vouch for no chip.
#[test]
fn with_no_daemon_and_an_unknown_chip_verify_records_nothing() {
    let dir = DaemonDir::new("verify-nochip");
    write_policy(&dir);
    let output = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["verify", "--profile", "apple7", "--policy"])
        .arg(dir.policy())
        .arg("--audit-log")
        .arg(dir.audit_log())
        .arg("--socket")
        .arg(dir.socket())
        .env_remove("METALIFT_HOST_CHIP_BRAND")
        .output()
        .expect("run metalift verify");
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{err}");
    assert!(
        err.contains("the host chip is unknown (")
            && err.contains(&dir.socket().display().to_string()),
        "{err}"
    );
    assert!(!dir.path("etc/verifications.jsonl").exists());
    assert!(dir.records_of("verification").is_empty());
}

#[test]
fn a_profile_that_does_not_exist_records_nothing() {
    let dir = DaemonDir::new("verify-noprofile");
    std::fs::write(dir.policy(), "version = 1\n").expect("policy");
    let output = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["verify", "--profile", "apple7", "--policy"])
        .arg(dir.policy())
        .arg("--audit-log")
        .arg(dir.audit_log())
        .output()
        .expect("run metalift verify");
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("no profile `apple7`"));
    assert!(!dir.path("etc/verifications.jsonl").exists());
}

/// `metalift ARGS` on this machine's seam (chip via the flag, build via the env).
fn metalift(args: &[&str], build: &str) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .env("METALIFT_HOST_OS_BUILD", build)
        .output()
        .expect("run metalift");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn validate_explain_and_status_say_whether_the_profile_unlocks_here() {
    let dir = DaemonDir::new("verify-show");
    write_policy(&dir);
    let daemon = start(&dir, "24A335");
    let policy = dir.policy().display().to_string();
    let me = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .expect("this test's executable")
        .display()
        .to_string();
    let validate = [
        "validate",
        "--allow-insecure-owner",
        "--host-chip-brand",
        CHIP,
        &policy,
    ];
    let explain = [
        "explain",
        "--allow-insecure-owner",
        "--host-chip-brand",
        CHIP,
        "--policy",
        &policy,
        "--path",
        &me,
    ];
    let socket = daemon.socket.display().to_string();
    let status = ["status", "--socket", &socket];

    let text = metalift(&validate, "24A335");
    assert!(
        text.contains("profile `apple7` requires verification: metaliftd answers stock here")
            && text.contains("none recorded"),
        "{text}"
    );
    let text = metalift(&explain, "24A335");
    assert!(
        text.contains("stock: rule `this-test` unlocks, but its profile requires verification"),
        "{text}"
    );
    let text = metalift(&status, "24A335");
    assert!(text.contains("verified unlock   apple7: stock:"), "{text}");

    let (output, _) = verify(&dir, "24A335", "normal");
    assert!(output.status.success());
    let text = metalift(&validate, "24A335");
    assert!(
        text.contains(&format!(
            "profile `apple7` requires verification: verified for host chip {CHIP}, macOS build 24A335"
        )),
        "{text}"
    );
    let text = metalift(&explain, "24A335");
    assert!(text.contains("unlock with profile `apple7`"), "{text}");
    assert!(text.contains("require_verified         yes"), "{text}");
    let text = metalift(&status, "24A335");
    assert!(
        text.contains("verified unlock   apple7: verified for host chip"),
        "{text}"
    );
    // validate and explain judge for this machine's build, as the daemon would.
    let text = metalift(&validate, "24B83");
    assert!(text.contains("metaliftd answers stock here"), "{text}");
}

/// `explain --live` and `explain --decision` judge verified unlock as the daemon
/// did: a profile without a passing verification is stock, with the reason, and
/// the recorded decision is the one explained (not "differs").
#[test]
fn explain_live_and_decision_say_stock_while_the_profile_is_unverified() {
    let dir = DaemonDir::new("verify-explain-live");
    write_policy(&dir);
    let daemon = start(&dir, "24A335");
    let (action, decision) = decide(&dir, &daemon.socket);
    assert_eq!(action, WireAction::Stock, "{decision}");
    let me = std::env::current_exe()
        .and_then(|p| p.canonicalize())
        .expect("this test's executable")
        .display()
        .to_string();
    let socket = daemon.socket.display().to_string();
    let log = dir.audit_log().display().to_string();
    let id = decision["decision_id"].to_string();
    let stock = "stock: rule `this-test` unlocks, but its profile requires verification";

    let live = metalift(
        &[
            "explain", "--live", "--socket", &socket, "--log", &log, "--path", &me,
        ],
        "24A335",
    );
    assert!(live.contains(stock), "{live}");
    let past = metalift(&["explain", "--decision", &id, "--log", &log], "24A335");
    assert!(past.contains(stock), "{past}");
    assert!(!past.contains("NOT the recorded decision"), "{past}");
}

/// `METALIFT_POLICY` and `METALIFT_AUDIT_LOG` point `verify` at a daemon's files
/// as they do every other command: the verification lands beside that policy.
#[test]
fn verify_reads_the_policy_and_audit_log_from_the_environment() {
    let dir = DaemonDir::new("verify-env");
    write_policy(&dir);
    let output = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["verify", "--profile", "apple7", "--json"])
        .env("METALIFT_POLICY", dir.policy())
        .env("METALIFT_AUDIT_LOG", dir.audit_log())
        .env("METALIFT_HOST_CHIP_BRAND", CHIP)
        .env("METALIFT_HOST_OS_BUILD", "24A335")
        .env("LD_LIBRARY_PATH", simmetal("normal"))
        .env("METALIFT_TIMEOUT_MS", "10000")
        .env_remove("LD_PRELOAD")
        .env_remove("METALIFT_DISABLE")
        .output()
        .expect("run metalift verify");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(dir.path("etc/verifications.jsonl").exists());
    assert!(!dir.records_of("verification").is_empty());
}

/// `doctor` warns while a profile that requires verification answers stock here,
/// and says ok once a passing verification covers this host chip and build.
#[test]
fn doctor_fails_while_a_required_profile_is_unverified() {
    let dir = DaemonDir::new("verify-doctor");
    write_policy(&dir);
    let daemon = start(&dir, "24A335");
    let socket = daemon.socket.display().to_string();
    let policy = dir.policy().display().to_string();
    let log = dir.audit_log().display().to_string();
    let doctor = [
        "doctor",
        "--allow-insecure-owner",
        "--socket",
        &socket,
        "--policy",
        &policy,
        "--log",
        &log,
    ];
    let text = metalift(&doctor, "24A335");
    let line = text
        .lines()
        .find(|l| l.contains("verified unlock"))
        .unwrap_or_else(|| panic!("no verified unlock check:\n{text}"));
    assert!(line.starts_with("fail"), "it cannot unlock: {line}");
    assert!(line.contains("profile `apple7` answers stock"), "{line}");

    let (output, _) = verify(&dir, "24A335", "normal");
    assert!(output.status.success());
    let text = metalift(&doctor, "24A335");
    let line = text
        .lines()
        .find(|l| l.contains("verified unlock"))
        .unwrap_or_else(|| panic!("no verified unlock check:\n{text}"));
    assert!(line.starts_with("ok"), "{line}");
}

#[test]
fn verify_records_the_chip_and_build_as_the_daemon_reads_them_and_they_do_not_cover_another_chip() {
    let dir = DaemonDir::new("verify-daemon-host");
    write_policy(&dir);
    let daemon = start(&dir, "24A335");
    // verify's own environment names another chip and no build: what the daemon
    // reads is what it will compare, so that is what is recorded.
    let output = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["verify", "--profile", "apple7", "--json", "--policy"])
        .arg(dir.policy())
        .arg("--audit-log")
        .arg(dir.audit_log())
        .arg("--socket")
        .arg(&daemon.socket)
        .env("METALIFT_HOST_CHIP_BRAND", "Apple M1 (Virtual)")
        .env_remove("METALIFT_HOST_OS_BUILD")
        .env("LD_LIBRARY_PATH", simmetal("normal"))
        .env("METALIFT_TIMEOUT_MS", "10000")
        .env_remove("LD_PRELOAD")
        .env_remove("METALIFT_DISABLE")
        .output()
        .expect("run metalift verify");
    let record: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&output.stderr));
    });
    assert!(output.status.success(), "{record}");
    assert_eq!(record["host_chip"], CHIP, "{record}");
    assert_eq!(record["os_build"], "24A335", "{record}");
    let (action, decision) = decide(&dir, &daemon.socket);
    assert_eq!(action, WireAction::Unlock, "the daemon agrees: {decision}");
    drop(daemon);

    // A clone of the image on another host chip: the record does not cover it, and
    // the reason names what differs, with both values.
    let other = dir.start(
        &[],
        &[
            ("METALIFT_HOST_CHIP_BRAND", "Apple M3 (Virtual)"),
            ("METALIFT_HOST_OS_BUILD", "24A335"),
        ],
    );
    let (action, decision) = decide(&dir, &other.socket);
    assert_eq!(action, WireAction::Stock, "{decision}");
    let why = reason(&decision);
    assert!(
        why.contains(&format!(
            "host chip \"Apple M3 (Virtual)\" here, \"{CHIP}\" recorded"
        )),
        "{why}"
    );
    let differs = why.split("differs: ").nth(1).unwrap_or_default();
    assert!(
        !differs.contains("macOS build") && !differs.contains("capabilities"),
        "only the chip differs: {why}"
    );
    let status =
        metalift_daemon::service::status::request(&other.socket, std::time::Duration::from_secs(5))
            .expect("status");
    assert!(
        status.health.causes.iter().any(|c| c.code == "unverified"),
        "{:?}",
        status.health
    );
}
