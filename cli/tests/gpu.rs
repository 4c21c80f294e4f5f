//! `metalift gpu` (issue 43 item 7): the stock answers with no rule involved, on
//! the simulated Metal, and doctor's `stock gpu` check the day the device answers
//! a profile's claims by itself (the `apple7` variant: modelled on its host's
//! answer, probe/simmetal/simmetal.m `SIMMETAL_STOCK_APPLE7`).
#![cfg(target_os = "linux")]

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

mod support;

fn simmetal(variant: &str) -> PathBuf {
    let out = Command::new(support::workspace_binary("metalift-probe"))
        .arg("--simmetal-dir")
        .output()
        .expect("metalift-probe --simmetal-dir");
    PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join(variant)
}

fn policy(dir: &tempfile::TempDir) -> PathBuf {
    let path = dir.path().join("policy.toml");
    std::fs::write(
        &path,
        "version = 1\n\n[profile.apple7]\napple_family_max = 7\n\n\
         [profile.apple7-64k]\napple_family_max = 7\nmax_threadgroup_memory = 65536\n",
    )
    .unwrap();
    path
}

/// `metalift ARGS` on the simulated GPU `variant`, with the shim in the
/// environment as a job would have it: the stock answers must not go through it.
fn metalift(args: &[&str], variant: &str, dir: &tempfile::TempDir) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .env("LD_LIBRARY_PATH", simmetal(variant))
        .env("LD_PRELOAD", support::workspace_binary("libmetalift.so"))
        .env("METALIFT_SOCKET", dir.path().join("no-daemon.sock"))
        .env_remove("METALIFT_DISABLE")
        .output()
        .expect("run metalift")
}

fn gpu(variant: &str) -> Value {
    let dir = tempfile::tempdir().unwrap();
    let p = policy(&dir);
    let out = metalift(
        &["gpu", "--json", "--policy", p.to_str().unwrap()],
        variant,
        &dir,
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("one JSON object")
}

fn profile<'a>(report: &'a Value, name: &str) -> &'a Value {
    report["profiles"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["profile"] == name)
        .unwrap_or_else(|| panic!("no profile {name}: {report}"))
}

#[test]
fn the_stock_report_says_what_a_guest_answers_and_which_profiles_need_the_unlock() {
    let report = gpu("normal");
    let stock = &report["stock"];
    // REAL-METAL 6: what a guest answers today.
    assert_eq!(stock["name"], "Apple Paravirtual device", "{report}");
    assert_eq!(stock["class"], "AppleParavirtDevice", "{report}");
    assert_eq!(stock["apple_family"], 5, "{report}");
    assert_eq!(stock["families"]["Apple7"], false, "{report}");
    assert_eq!(stock["max_threadgroup_memory"], 32768, "{report}");
    assert_eq!(stock["has_simdgroup_mm"], false, "{report}");
    assert!(report["host_chip_from"]
        .as_str()
        .is_some_and(|f| f.starts_with("this machine (")));
    let apple7 = profile(&report, "apple7");
    assert_eq!(apple7["unlock_needed"], true, "{report}");
    assert_eq!(apple7["short_of"][0], "Apple7 (stock: Apple5)", "{report}");
}

#[test]
fn a_device_that_answers_apple7_itself_needs_no_unlock_and_doctor_says_so() {
    let report = gpu("apple7");
    assert_eq!(report["stock"]["apple_family"], 7, "{report}");
    assert_eq!(
        profile(&report, "apple7")["unlock_needed"],
        false,
        "{report}"
    );
    // The claim beyond the stock answer still needs it.
    let big = profile(&report, "apple7-64k");
    assert_eq!(big["unlock_needed"], true, "{report}");
    assert_eq!(
        big["short_of"][0], "65536 bytes of threadgroup memory (stock: 32768)",
        "{report}"
    );

    let dir = tempfile::tempdir().unwrap();
    let p = policy(&dir);
    let check = |variant: &str| -> Value {
        let out = metalift(
            &[
                "doctor",
                "--json",
                "--allow-insecure-owner",
                "--root",
                dir.path().to_str().unwrap(),
                "--policy",
                p.to_str().unwrap(),
            ],
            variant,
            &dir,
        );
        let v: Value = serde_json::from_slice(&out.stdout).expect("doctor JSON");
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "stock gpu")
            .cloned()
            .unwrap_or_else(|| panic!("no stock gpu check: {v}"))
    };
    let today = check("normal");
    assert_eq!(today["status"], "ok", "{today}");
    assert!(
        today["message"]
            .as_str()
            .is_some_and(|m| m.contains("answers Apple5") && m.contains("needs the unlock")),
        "{today}"
    );
    let apple7 = check("apple7");
    assert_eq!(apple7["status"], "warn", "{apple7}");
    assert!(
        apple7["message"].as_str().is_some_and(|m| m
            .starts_with("the stock device already answers what profile apple7 claims")
            && !m.contains("apple7-64k")),
        "{apple7}"
    );
}
