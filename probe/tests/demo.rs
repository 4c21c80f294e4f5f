//! `metalift demo` end to end: the real metaliftd, the real policy engine, the
//! real audit log, the shim injected into the probe on the simulated Metal; and
//! README's two commands as README writes them (the demo run by bash; the test
//! command the one CI runs).
//!
//! Needs the workspace's binaries (`metalift`, `metaliftd`) next to the probe:
//! `scripts/test.sh` builds them first (`cargo build --workspace --all-targets`).
//! Linux only (the simulated Metal).
#![cfg(target_os = "linux")]

mod support;

use std::path::{Path, PathBuf};

use support::*;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The one command line in the first `sh` block under README's `heading`.
fn readme_command(heading: &str) -> String {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README.md");
    let at = readme
        .lines()
        .position(|l| l == heading)
        .unwrap_or_else(|| panic!("README.md has no heading {heading:?}"));
    let block: Vec<&str> = readme
        .lines()
        .skip(at)
        .skip_while(|l| *l != "```sh")
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .collect();
    assert_eq!(
        block.len(),
        1,
        "README {heading:?}: one command line: {block:?}"
    );
    block[0].to_owned()
}

#[test]
fn given_the_real_daemon_then_only_the_allowed_probe_is_unlocked_and_every_run_is_audited() {
    let bin_dir = probe().parent().unwrap().to_path_buf();
    let metalift = bin_dir.join("metalift");
    assert!(
        metalift.is_file() && bin_dir.join("metaliftd").is_file(),
        "metalift and metaliftd must be built first: cargo build --workspace (scripts/test.sh does)"
    );
    let mut cmd = clean(&metalift);
    // A loaded CI box must not turn an answer into a timeout.
    cmd.args(["demo", "--timeout-ms", "10000"]);
    let output = run(cmd, b"");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "metalift demo failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let row = |case: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(case))
            .unwrap_or_else(|| panic!("no row {case:?} in:\n{stdout}"))
            .to_owned()
    };
    assert!(
        row("allowed: metalift-probe").contains("Apple7"),
        "{stdout}"
    );
    for case in ["before", "denied", "monitor mode", "daemon stopped"] {
        assert!(row(case).contains("Apple5"), "{case}: {stdout}");
    }
    // The audit trail: the decision and the shim's outcome for each run.
    assert!(stdout.contains(r#""result":"applied""#), "{stdout}");
    assert!(
        stdout.contains(r#""rule":"demo-untrusted","action":"stock""#),
        "{stdout}"
    );
    assert!(stdout.contains(r#""would_unlock":true"#), "{stdout}");
    assert!(
        stdout.contains(r#""reason":"monitor mode: would unlock (demo-probe)""#),
        "{stdout}"
    );
}

/// README's demo command, run by bash exactly as written from the repository root.
/// Its build step is answered by the build this test run already made (a
/// `cargo` that only records its arguments stands first on PATH: a second cargo
/// inside `cargo test` would rebuild the binaries other tests are running); the
/// test checks that step is the build it stands in for. `scripts/setup.sh` and
/// the demo run for real, with the shim's own verdict deadline.
#[test]
fn readmes_demo_command_as_written_prints_the_verdicts_and_the_audit_records() {
    let line = readme_command("## Run the demo");
    let bin_dir = probe().parent().unwrap().to_path_buf();
    assert_eq!(
        bin_dir.canonicalize().unwrap(),
        repo().join("target/debug").canonicalize().unwrap(),
        "README's demo command runs target/debug/metalift: build into the default target directory"
    );
    let stand_in = tempfile::tempdir().unwrap();
    let record = stand_in.path().join("cargo-args");
    let cargo = stand_in.path().join("cargo");
    std::fs::write(
        &cargo,
        format!("#!/bin/sh\necho \"$*\" >> '{}'\n", record.display()),
    )
    .unwrap();
    std::fs::set_permissions(&cargo, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let path = format!(
        "{}:{}",
        stand_in.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let mut cmd = clean("bash");
    cmd.arg("-c")
        .arg(&line)
        .current_dir(repo())
        .env("PATH", path);
    let output = run(cmd, b"");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{line}: {}\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&record).unwrap_or_default(),
        "build --workspace\n",
        "{line}: the build step this test stands in for"
    );
    for (case, family) in [
        ("before (no shim)", "Apple5"),
        ("allowed: metalift-probe", "Apple7"),
        ("denied: untrusted-probe", "Apple5"),
        ("monitor mode: metalift-probe", "Apple5"),
        ("daemon stopped: metalift-probe", "Apple5"),
    ] {
        let row = stdout
            .lines()
            .find(|l| l.starts_with(case))
            .unwrap_or_else(|| panic!("{line}: no row {case:?} in:\n{stdout}"));
        assert!(row.contains(family), "{case}: {row}");
    }
    for record in [
        r#""kind":"decision""#,
        r#""kind":"outcome""#,
        r#""result":"applied""#,
    ] {
        assert!(stdout.contains(record), "{line}: no {record} in:\n{stdout}");
    }
}

/// README's test command is the one CI runs: `.ci/run` has it as a line of its own.
#[test]
fn readmes_test_command_is_the_one_ci_runs() {
    let line = readme_command("## Run the tests");
    let ci = std::fs::read_to_string(repo().join(".ci/run")).expect(".ci/run");
    assert!(
        ci.lines().any(|l| l.trim() == line),
        ".ci/run does not run README's test command `{line}`"
    );
    assert!(
        repo().join(line.trim_start_matches("bash ")).is_file(),
        "README's test command names a script that exists: {line}"
    );
}
