//! `metalift validate` and `metalift explain`, run as the built binary against
//! policies in a temp dir per test.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn metalift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .output()
        .expect("run metalift")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A temp dir with `policy.toml` holding `text` (mode 0644).
fn policy_dir(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policy.toml");
    fs::write(&path, text).expect("write policy");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
    (dir, path)
}

fn example(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    fs::read_to_string(path).expect("example")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

const INVALID: &str = "version = 1\nmode = \"loud\"\n[profile.apple7]\napple_family_max = 11\n";

#[test]
fn validate_a_valid_policy_exits_0_with_a_summary() {
    let (_d, path) = policy_dir(&example("llama-fleet.toml"));
    let out = metalift(&[
        "validate",
        s(&path),
        "--allow-insecure-owner",
        "--skip-host-checks",
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains(
            ": valid: 5 rules and 2 profiles in 1 file, mode enforce, 0 warnings; sha256 "
        ),
        "{text}"
    );
}

#[test]
fn validate_an_invalid_policy_exits_1_and_underlines_every_error() {
    let (_d, path) = policy_dir(INVALID);
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let p = path.display();
    assert!(
        text.contains(&format!(
            "{p}:2:8: error: unknown mode `loud` (expected \"enforce\" or \"monitor\")\nmode = \"loud\"\n       ^~~~~~\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{p}:4:20: error: apple_family_max 11 is outside Apple5..Apple10\napple_family_max = 11\n                   ^~\n"
        )),
        "{text}"
    );
    assert!(
        text.ends_with(&format!("{p}: invalid: 2 errors, 0 warnings\n")),
        "{text}"
    );
}

#[test]
fn validate_prints_warnings_but_still_exits_0() {
    let (_d, path) = policy_dir(
        "version = 1\n[profile.p]\napple_family_max = 7\nmax_threadgroup_memory = 65536\n",
    );
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains(":4:26: warning: max_threadgroup_memory 65536 exceeds 32768"));
}

#[test]
fn validate_a_missing_policy_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policy.toml");
    let out = metalift(&["validate", s(&path)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).contains("no such policy file"));
}

#[test]
fn validate_reports_a_group_writable_candidate_as_a_warning_and_checks_it() {
    let (_d, path) = policy_dir(&example("default-policy.toml"));
    fs::set_permissions(&path, fs::Permissions::from_mode(0o664)).expect("chmod");
    let out = metalift(&["validate", s(&path)]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "{}: warning: writable by group or other (mode 0664): metaliftd refuses a policy file that is not owned by root or is writable by group or other; install it with `sudo install -o root -m 0644`",
            path.display()
        )),
        "{text}"
    );
    assert!(
        text.contains(": valid: 0 rules and 1 profile in 1 file, mode enforce, 1 warning; sha256 "),
        "{text}"
    );
    // --strict is about the policy's contents: the owner stays a warning.
    assert_eq!(
        metalift(&["validate", s(&path), "--strict"]).status.code(),
        Some(0)
    );
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!stdout(&out).contains(": warning:"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(", 0 warnings; sha256 "),
        "{}",
        stdout(&out)
    );
}

#[test]
fn validate_json_lists_diagnostics_with_locations() {
    let (_d, path) = policy_dir(INVALID);
    let out = metalift(&["validate", s(&path), "--json", "--allow-insecure-owner"]);
    assert_eq!(out.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["status"], "invalid");
    assert_eq!(doc["errors"], 2);
    assert_eq!(doc["diagnostics"][0]["line"], 2);
    assert_eq!(doc["diagnostics"][0]["col"], 8);
    assert_eq!(doc["diagnostics"][0]["len"], 6);
    assert_eq!(doc["diagnostics"][1]["severity"], "error");

    let (_d, path) = policy_dir(&example("default-policy.toml"));
    let out = metalift(&["validate", s(&path), "--json", "--allow-insecure-owner"]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["status"], "valid");
    assert_eq!(doc["policy"]["rules"], 0);
    assert_eq!(doc["policy"]["sha256"].as_str().map(str::len), Some(64));
}

/// An executable-like file named `name` in `dir`.
fn exe(dir: &Path, name: &str, contents: &[u8]) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, contents).expect("write exe");
    path
}

#[test]
fn explain_a_path_shows_identity_every_rule_the_winner_and_the_profile() {
    let (d, path) = policy_dir(&example("dev-policy.toml"));
    let probe = exe(d.path(), "metalift-probe", b"probe");
    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--path",
        s(&probe),
        "--allow-insecure-owner",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "  path        {}\n",
            fs::canonicalize(&probe).expect("canon").display()
        )),
        "{text}"
    );
    assert!(
        text.contains("  sha256      not computed (no rule needs it)"),
        "{text}"
    );
    assert!(text.contains("  WINS  probe ("), "{text}");
    assert!(
        text.contains("unlock with profile `apple7` (rule `probe`, mode enforce)"),
        "{text}"
    );
    assert!(text.contains("  apple_family_max         7 "), "{text}");

    let other = exe(d.path(), "llama-server", b"x");
    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--path",
        s(&other),
        "--allow-insecure-owner",
    ]);
    let text = stdout(&out);
    assert!(text.contains("  -   probe ("), "{text}");
    assert!(text.contains("stock: no rule matches"), "{text}");
}

#[test]
fn explain_computes_sha256_only_when_a_rule_needs_it() {
    // sha256("hello") = 2cf24dba...
    let digest = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
    let (d, path) = policy_dir(&format!(
        "version = 1\nmode = \"monitor\"\n[profile.apple7]\napple_family_max = 7\n[[rule]]\nid = \"h\"\nsha256 = \"{digest}\"\nunlock = \"apple7\"\n"
    ));
    let bin = exe(d.path(), "tool", b"hello");
    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--path",
        s(&bin),
        "--json",
        "--allow-insecure-owner",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["subject"]["sha256"], digest);
    assert_eq!(doc["verdict"]["action"], "stock");
    assert_eq!(doc["verdict"]["mode"], "monitor");
    assert_eq!(doc["verdict"]["rule"], "h");
    assert_eq!(doc["verdict"]["would_unlock"], "apple7");
    assert_eq!(doc["verdict"]["capabilities"]["apple_family_max"], 7);
    assert_eq!(doc["trace"][0]["winner"], true);
}

#[test]
fn explain_what_if_signature_flags_reach_team_and_signing_rules() {
    let (d, path) = policy_dir(&example("llama-fleet.toml"));
    let bin = exe(d.path(), "bench", b"b");
    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--path",
        s(&bin),
        "--team-id",
        "ABCDE12345",
        "--signing-id",
        "com.example.bench-runner",
        "--json",
        "--allow-insecure-owner",
    ]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["verdict"]["rule"], "bench-runner");
    assert_eq!(doc["verdict"]["action"], "unlock");
    assert_eq!(doc["trace"].as_array().map(Vec::len), Some(5));
}

#[cfg(target_os = "linux")]
#[test]
fn explain_a_pid_reads_its_executable_uid_and_parent_from_proc() {
    let (_d, path) = policy_dir(&example("default-policy.toml"));
    let me = std::process::id().to_string();
    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--pid",
        &me,
        "--json",
        "--allow-insecure-owner",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    let exe = std::env::current_exe().expect("current exe");
    assert_eq!(doc["subject"]["path"], exe.display().to_string());
    let uid = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .expect("stat");
    assert_eq!(doc["subject"]["uid"], uid);
    assert!(doc["subject"]["parent"].is_string(), "{doc}");
    assert_eq!(doc["verdict"]["action"], "stock");
}

#[test]
fn explain_with_no_policy_file_says_everything_is_stock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("absent.toml");
    let out = metalift(&["explain", "--policy", s(&policy), "--path", "/bin/sh"]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(text.contains("no such policy file"), "{text}");
    assert!(text.contains("(none: the policy has no rules)"), "{text}");
}

#[test]
fn explain_with_an_invalid_policy_exits_1_and_prints_the_errors() {
    let (_d, path) = policy_dir(INVALID);
    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--path",
        "/bin/sh",
        "--allow-insecure-owner",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(":2:8: error: unknown mode"));
}

#[test]
fn explain_needs_a_path_or_a_pid() {
    let out = metalift(&["explain", "--policy", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(2), "clap usage error");
}
