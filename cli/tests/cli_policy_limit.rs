//! Bounded input (issue 26): a policy larger than the limit (`policy.toml` and
//! `policy.d/*.toml` together; metaliftd `--max-policy-bytes`, 4 MiB by default)
//! is refused unread like any broken policy, the last good one kept; `validate`
//! refuses it too; `status` answers from the files' sizes, never parsing them.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use metalift_policy::wire::WireAction;
use serde_json::Value;

mod support;

use support::{DaemonDir, HANG_GUARD};

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn metalift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .env_remove("METALIFT_SOCKET")
        .env_remove("METALIFT_POLICY")
        .env_remove("METALIFT_AUDIT_LOG")
        .output()
        .expect("run metalift")
}

fn me() -> PathBuf {
    std::env::current_exe().expect("current exe")
}

/// A valid drop-in of `n` rules (about 70 bytes each), none matching this test.
fn many_rules(n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "[[rule]]\nid = \"r{i}\"\npath = \"/opt/tool-{i}/bin/x\"\nunlock = \"apple7\"\n"
            )
        })
        .collect()
}

#[test]
fn given_drop_ins_that_take_the_policy_over_the_limit_then_it_is_refused_and_the_last_good_stays() {
    let dir = DaemonDir::new("limit-");
    std::fs::write(
        dir.policy(),
        format!(
            "version = 1\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"me\"\npath = \"{}\"\nunlock = \"apple7\"\n",
            me().display()
        ),
    )
    .expect("policy");
    let _daemon = dir.start(&["--max-policy-bytes", "4096"], &[]);
    assert_eq!(support::check_in(&dir.socket()).action, WireAction::Unlock);

    // policy.toml alone is small; with the drop-in the policy is over 4096 bytes.
    let dropins = dir.path("etc/policy.d");
    std::fs::create_dir(&dropins).expect("policy.d");
    let dropin = many_rules(100);
    assert!(dropin.len() > 4096);
    std::fs::write(dropins.join("50-many.toml"), &dropin).expect("drop-in");
    let start = Instant::now();
    while dir.records_of("policy_rejected").is_empty() {
        assert!(
            start.elapsed() < HANG_GUARD,
            "the large policy was not refused"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let rejected = dir.records_of("policy_rejected");
    let error = rejected[0]["errors"][0].as_str().unwrap_or_default();
    assert!(error.contains("over the 4096-byte limit"), "{rejected:?}");
    assert!(
        rejected[0]["sha256"].is_null(),
        "refused unread: {rejected:?}"
    );
    assert!(dir.records_of("policy_loaded").len() == 1);
    assert_eq!(support::check_in(&dir.socket()).action, WireAction::Unlock);

    let out = metalift(&["status", "--json", "--socket", s(&dir.socket())]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON");
    assert_eq!(report["rule_count"], 1);
    assert_eq!(report["max_policy_bytes"], 4096);
    // status compared sizes and did not read (let alone parse) the large policy.
    assert!(report["disk_sha256"].is_null(), "not read: {report}");
    let problems = report["problems"].to_string();
    assert!(problems.contains("over the 4096-byte limit"), "{problems}");
}

#[test]
fn given_a_policy_over_the_default_limit_then_validate_refuses_it_unread() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("policy.toml");
    let mut text = String::from("version = 1\n[profile.apple7]\napple_family_max = 7\n\n");
    text.push_str(&many_rules(80_000));
    assert!(text.len() as u64 > metalift_policy::DEFAULT_MAX_POLICY_BYTES);
    std::fs::write(&policy, &text).expect("policy");
    let out = metalift(&["validate", "--skip-host-checks", s(&policy)]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(&format!(
            "over the {}-byte limit",
            metalift_policy::DEFAULT_MAX_POLICY_BYTES
        )),
        "{said}"
    );
}
