//! Conventions every `metalift` command keeps, against the real binaries: errors as
//! JSON under `--json`, exit codes in `--help`, a closed pipe ends quietly, and
//! `NO_COLOR` turns colour off (metalift's and metaliftd's).

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod support;

fn metalift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .output()
        .unwrap()
}

fn json_error(out: &Output) -> Value {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object on stdout ({e}): {stdout:?}"));
    assert_eq!(v["ok"], false, "{v}");
    assert!(v["error"].as_str().is_some_and(|e| !e.is_empty()), "{v}");
    assert_eq!(
        v["code"].as_u64(),
        out.status.code().map(|c| c as u64),
        "{v}"
    );
    v
}

#[test]
fn a_runtime_error_under_json_is_one_object_on_stdout_with_the_exit_code() {
    let out = metalift(&["audit", "--json", "--log", "/nonexistent/audit.jsonl"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_error(&out);
    assert!(v["error"].as_str().unwrap().contains("no audit log"), "{v}");
}

#[test]
fn a_usage_error_under_json_is_one_object_on_stdout_too() {
    let out = metalift(&["audit", "--json", "--since", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    let v = json_error(&out);
    assert!(v["error"].as_str().unwrap().contains("soon"), "{v}");
}

#[test]
fn help_documents_the_exit_status() {
    for args in [&["--help"][..], &["audit", "--help"], &["exec", "--help"]] {
        let out = metalift(args);
        assert!(out.status.success());
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("Exit status"), "{args:?}: {text}");
    }
    let top = String::from_utf8_lossy(&metalift(&["--help"]).stdout).into_owned();
    for code in ["126", "127", "  4 "] {
        assert!(top.contains(code), "{code} missing: {top}");
    }
}

/// Exit 0, or killed by SIGPIPE (141 in a shell); never a panic (101).
fn assert_quiet_pipe_end(out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
}

#[test]
fn validate_json_into_a_closed_pipe_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let policy = tmp.path().join("policy.toml");
    std::fs::write(&policy, "version = 1\n").unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["validate", "--allow-insecure-owner", "--json"])
        .arg(&policy)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The reader is gone before the first byte is written (`| head -0`).
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_quiet_pipe_end(&out);
}

#[test]
fn audit_into_a_closed_pipe_ends_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("audit.jsonl");
    std::fs::write(
        &log,
        "{\"kind\":\"daemon_stop\",\"time\":\"2026-01-01T00:00:00Z\",\"reason\":\"x\",\"checkins\":0,\"unlocks\":0}\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["audit", "--records", "--log"])
        .arg(&log)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_quiet_pipe_end(&out);
}

#[test]
fn no_color_turns_off_metalifts_colour_even_when_forced() {
    let run = |no_color: bool| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_metalift"));
        cmd.arg("no-such-subcommand").env("CLICOLOR_FORCE", "1");
        if no_color {
            cmd.env("NO_COLOR", "1");
        } else {
            cmd.env_remove("NO_COLOR");
        }
        String::from_utf8_lossy(&cmd.output().unwrap().stderr).into_owned()
    };
    assert!(
        run(false).contains('\x1b'),
        "colour is forced: the test can see it"
    );
    assert!(!run(true).contains('\x1b'), "{}", run(true));
}

/// metaliftd's first log lines on a pseudo-terminal (`script` allocates one).
fn metaliftd_on_a_terminal(dir: &Path, no_color: bool) -> String {
    let policy = dir.join("policy.toml");
    std::fs::write(&policy, "version = 1\n").unwrap();
    let daemon = format!(
        "{}timeout 3 {} --policy {} --socket {} --audit-log {} --allow-insecure-owner",
        if no_color { "NO_COLOR=1 " } else { "" },
        support::workspace_binary("metaliftd").display(),
        policy.display(),
        dir.join(format!("s{no_color}.sock")).display(),
        dir.join("audit.jsonl").display()
    );
    let out = Command::new("script")
        .args(["-qec", &daemon, "/dev/null"])
        .env_remove("NO_COLOR")
        .output()
        .expect("script (util-linux) runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        text.contains("metaliftd serving"),
        "the daemon did not start: {text}"
    );
    text
}

#[test]
fn no_color_turns_off_metaliftds_colour_on_a_terminal() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(
        metaliftd_on_a_terminal(tmp.path(), false).contains('\x1b'),
        "at a terminal without NO_COLOR the daemon colours: the test can see it"
    );
    let plain = metaliftd_on_a_terminal(tmp.path(), true);
    assert!(!plain.contains('\x1b'), "{plain}");
}

#[test]
fn demo_reports_as_one_json_object() {
    let out = metalift(&["demo", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let v: Value = serde_json::from_str(stdout.trim())
        .unwrap_or_else(|e| panic!("not one JSON object ({e}): {stdout}"));
    assert_eq!(out.status.code(), Some(0), "{v}");
    assert_eq!(v["ok"], true, "{v}");
    let cases = v["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 5, "{v}");
    assert_eq!(cases[1]["apple_family"], 7, "{v}");
    assert_eq!(cases[1]["metal3"], false, "{v}");
}
