//! Never above the host, as `metalift validate` and `metalift explain` say it: a
//! profile asking more Apple family than the host chip has is applied at the host's
//! family; with the host unknown, Apple9 and above draw a warning.
//!
//! Linux only: here the CLI knows the host chip only from `--host-chip-brand` (on a
//! Mac it reads `machdep.cpu.brand_string`, which these tests cannot pin).
#![cfg(target_os = "linux")]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// `metalift` with `METALIFT_HOST_CHIP_BRAND` set to an M1 brand in its environment:
/// only metaliftd reads that variable, so it must change nothing here.
fn metalift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .env("METALIFT_HOST_CHIP_BRAND", "Apple M1 (Virtual)")
        .output()
        .expect("run metalift")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A policy whose profile `apple9` asks `family`, unlocked for `exe`.
fn policy_dir(family: &str, exe: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policy.toml");
    let text = format!(
        "version = 1\n[profile.apple9]\napple_family_max = {family}\n\n[[rule]]\nid = \"llama\"\npath = \"{exe}\"\nunlock = \"apple9\"\n"
    );
    fs::write(&path, text).expect("write policy");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
    (dir, path)
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

const WHY: &str =
    "profile `apple9` asks Apple9; this host (Apple M1 (Virtual)) has Apple7: applied as Apple7";

#[test]
fn validate_on_an_m1_host_says_apple9_is_applied_as_apple7() {
    let (_d, path) = policy_dir("9", "/opt/llama/bin/llama-server");
    let p = path.display();
    let out = metalift(&[
        "validate",
        s(&path),
        "--skip-host-checks",
        "--allow-insecure-owner",
        "--host-chip-brand",
        "Apple M1 (Virtual)",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "{p}:3:20: warning: {WHY}, as metaliftd on this host applies it: "
        )),
        "{text}"
    );
    assert!(text.contains(", 1 warning; sha256 "), "{text}");
    // The same policy on an M3 host: nothing to say.
    let out = metalift(&[
        "validate",
        s(&path),
        "--skip-host-checks",
        "--allow-insecure-owner",
        "--host-chip-brand",
        "Apple M3 (Virtual)",
    ]);
    let text = stdout(&out);
    assert!(!text.contains(": warning:"), "{text}");
    assert!(text.contains(", 0 warnings; sha256 "), "{text}");
}

/// A path that exists, so the checks against this machine have nothing to say about it.
fn existing_exe(dir: &tempfile::TempDir) -> PathBuf {
    let exe = dir.path().join("llama-server");
    fs::write(&exe, b"x").expect("write exe");
    fs::canonicalize(&exe).expect("resolve")
}

#[test]
fn validate_with_the_host_unknown_warns_on_apple9_and_not_on_apple8() {
    let exes = tempfile::tempdir().expect("tempdir");
    let exe = existing_exe(&exes);
    let (_d, path) = policy_dir("9", s(&exe));
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["warnings"], 1, "{doc}");
    let message = doc["diagnostics"][0]["message"]
        .as_str()
        .unwrap_or_default();
    assert!(
        message.starts_with("profile `apple9` asks Apple9 and the host chip could not be read here, so it cannot be capped at the host's family: at Apple9 and above Metal turns its own bf16 emulation off"),
        "{doc}"
    );
    assert_eq!(doc["diagnostics"][0]["line"], 3, "{doc}");

    // --skip-host-checks: nothing about this machine's chip, so nothing to say.
    let out = metalift(&[
        "validate",
        s(&path),
        "--skip-host-checks",
        "--allow-insecure-owner",
        "--json",
    ]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["warnings"], 0, "{doc}");

    let (_d, path) = policy_dir("8", s(&exe));
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner", "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["warnings"], 0, "{doc}");
}

/// Issue 26: README recommends `apple_family_max = "host"` and `validate --strict` "for
/// CI"; they must agree wherever validate runs: a machine whose chip cannot be read (a
/// Linux runner, an Intel Mac), a chip this metalift does not know, a known one, and
/// with `--skip-host-checks`. What `"host"` resolves to on an unknown chip is a note,
/// and no message advises writing a number instead.
#[test]
fn readme_host_ceiling_passes_validate_strict_on_every_machine() {
    let exes = tempfile::tempdir().expect("tempdir");
    let exe = existing_exe(&exes);
    let (_d, path) = policy_dir("\"host\"", s(&exe));
    let p = path.display();
    let strict = |extra: &[&str]| {
        let mut args = vec!["validate", "--strict", "--allow-insecure-owner", s(&path)];
        args.extend_from_slice(extra);
        let out = metalift(&args);
        (out.status.code(), stdout(&out))
    };

    let (code, text) = strict(&[]);
    assert_eq!(code, Some(0), "no chip readable here: {text}");
    assert!(
        text.contains(&format!("{p}:3:20: note: apple_family_max = \"host\": the host chip could not be read here: the ceiling is 7")),
        "{text}"
    );
    assert!(text.contains("--host-chip-brand"), "{text}");
    assert!(text.contains(", 0 warnings, 1 note; sha256 "), "{text}");

    let (code, text) = strict(&["--host-chip-brand", "Apple M7 (Virtual)"]);
    assert_eq!(code, Some(0), "a chip metalift does not know: {text}");
    assert!(
        text.contains("note: apple_family_max = \"host\": the chip `Apple M7 (Virtual)` is not one this metalift knows (M1 → 7, M2 → 8, M3/M4 → 9, M5 → 10): the ceiling is 7"),
        "{text}"
    );

    for brand in [
        "Apple M1 (Virtual)",
        "Apple M3 Max (Virtual)",
        "Apple M5 (Virtual)",
    ] {
        let (code, text) = strict(&["--host-chip-brand", brand]);
        assert_eq!(code, Some(0), "{brand}: {text}");
        assert!(
            !text.contains("note:") && !text.contains(": warning:"),
            "{brand}: {text}"
        );
    }

    let (code, text) = strict(&["--skip-host-checks"]);
    assert_eq!(code, Some(0), "--skip-host-checks: {text}");
    assert!(
        !text.contains("note:") && !text.contains("host chip"),
        "{text}"
    );

    for (_, text) in [strict(&[]), strict(&["--host-chip-brand", "Apple M7"])] {
        assert!(
            !text.contains("set the number"),
            "advises against README: {text}"
        );
    }
}

#[test]
fn explain_shows_the_cap_under_the_applied_value() {
    let (d, _) = policy_dir("9", "/nowhere");
    let exe = d.path().join("llama-server");
    fs::write(&exe, b"x").expect("write exe");
    let exe = fs::canonicalize(&exe).expect("resolve");
    let (_d, path) = policy_dir("9", s(&exe));
    let args = |brand: &'static str| {
        vec![
            "explain".to_owned(),
            "--policy".to_owned(),
            s(&path).to_owned(),
            "--path".to_owned(),
            s(&exe).to_owned(),
            "--allow-insecure-owner".to_owned(),
            "--host-chip-brand".to_owned(),
            brand.to_owned(),
        ]
    };
    let run = |a: Vec<String>| metalift(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let out = run(args("Apple M1 (Virtual)"));
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "  apple_family_max         7 (supportsFamily: YES for Apple1..Apple7; Metal3/Common/Mac unchanged)\n                           {WHY} (never above the host)\n"
        )),
        "{text}"
    );
    let mut json = args("Apple M1 (Virtual)");
    json.push("--json".to_owned());
    let doc: Value = serde_json::from_slice(&run(json).stdout).expect("json");
    let caps = &doc["verdict"]["capabilities"];
    assert_eq!(caps["apple_family_max"], 7, "{doc}");
    assert_eq!(caps["apple_family_requested"], 9, "{doc}");
    assert_eq!(caps["apple_family_capped"], WHY, "{doc}");

    // On an M3 host the profile is applied as asked, with no cap line.
    let text = stdout(&run(args("Apple M3 (Virtual)")));
    assert!(
        text.contains("  apple_family_max         9 (supportsFamily: YES for Apple1..Apple9"),
        "{text}"
    );
    assert!(!text.contains("never above the host"), "{text}");
}
