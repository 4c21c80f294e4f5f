//! `metalift verify` writes its `verification` record into the audit log itself
//! (not through the daemon), and that record carries the policy's `[audit.labels]`
//! in its host part like every record the daemon writes: a record copied off a
//! guest says which image it came from whoever wrote it.
//!
//! Needs the workspace built first (`cargo build --workspace`, as scripts/test.sh does).
#![cfg(target_os = "linux")]

mod support;

use std::process::Command;

use support::{simmetal_normal, DaemonDir};

/// The simulated Metal's normal GPU (`metalift-probe --simmetal-dir`/normal).
#[test]
fn the_verification_record_carries_the_policys_audit_labels() {
    let dir = DaemonDir::new("verify-labels");
    std::fs::write(
        dir.policy(),
        "version = 1\n\n[audit.labels]\nimage = \"macos-26-xcode-17\"\npool = \"ci-m2\"\n\n\
         [profile.apple7]\napple_family_max = 7\n",
    )
    .expect("policy");
    let output = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["verify", "--profile", "apple7", "--json", "--policy"])
        .arg(dir.policy())
        .arg("--audit-log")
        .arg(dir.audit_log())
        .arg("--socket")
        .arg(dir.socket())
        .env("METALIFT_HOST_CHIP_BRAND", "Apple M2 (Virtual)")
        .env("METALIFT_HOST_OS_BUILD", "24A335")
        .env("LD_LIBRARY_PATH", simmetal_normal())
        .env("METALIFT_TIMEOUT_MS", "10000")
        .env_remove("LD_PRELOAD")
        .env_remove("METALIFT_DISABLE")
        .output()
        .expect("run metalift verify");
    assert!(
        output.status.success(),
        "metalift verify: {}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let audited = dir.records_of("verification");
    assert_eq!(audited.len(), 1, "one verification record");
    let host = &audited[0]["host"];
    assert_eq!(host["labels"]["image"], "macos-26-xcode-17", "{host}");
    assert_eq!(host["labels"]["pool"], "ci-m2", "{host}");
    assert!(host["boot_id"].is_string(), "{host}");
}
