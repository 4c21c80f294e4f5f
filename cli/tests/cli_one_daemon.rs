//! One way to point every tool at a daemon (issue 26): `METALIFT_SOCKET`,
//! `METALIFT_POLICY` and `METALIFT_AUDIT_LOG` alone, no flags, reach a real
//! metaliftd from `status`, `doctor`, `edit`, `explain --live` and `audit`; the
//! flag spellings agree with metaliftd's; `doctor` compares the daemon's policy
//! and log as files, not as spellings; and an error says its cause once.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod support;

use support::DaemonDir;

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn me() -> PathBuf {
    std::env::current_exe().expect("current exe")
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// `metalift ARGS` with exactly `envs` of the variables that point it at a daemon.
fn metalift_with(args: &[&str], envs: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_metalift"));
    cmd.args(args)
        .env_remove("METALIFT_SOCKET")
        .env_remove("METALIFT_POLICY")
        .env_remove("METALIFT_AUDIT_LOG")
        .stdin(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run metalift")
}

fn unlock_me_policy(id: &str) -> String {
    format!(
        "version = 1\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"{id}\"\npath = \"{}\"\nunlock = \"apple7\"\n",
        me().display()
    )
}

#[test]
fn given_only_the_environment_then_status_doctor_edit_explain_and_audit_reach_the_daemon() {
    let dir = DaemonDir::new("one-env-");
    std::fs::write(dir.policy(), unlock_me_policy("me")).expect("policy");
    let daemon = dir.start(&[], &[]);
    support::check_in(&daemon.socket);
    let (socket, policy, log) = (dir.socket(), dir.policy(), dir.audit_log());
    let env: &[(&str, &Path)] = &[
        ("METALIFT_SOCKET", &socket),
        ("METALIFT_POLICY", &policy),
        ("METALIFT_AUDIT_LOG", &log),
    ];

    let status = metalift_with(&["status", "--json"], env);
    assert_eq!(status.status.code(), Some(0), "{}", text(&status.stdout));
    let report: Value = serde_json::from_slice(&status.stdout).expect("JSON");
    assert_eq!(report["socket"], s(&socket));

    let doctor = metalift_with(&["doctor", "--json", "--allow-insecure-owner"], env);
    let checks: Value = serde_json::from_slice(&doctor.stdout).expect("doctor JSON");
    let by_name = |name: &str| {
        checks["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no {name} check: {checks}"))
    };
    for name in ["daemon", "health", "live policy", "audit log"] {
        assert_eq!(by_name(name)["status"], "ok", "{name}: {checks}");
    }

    let explain = metalift_with(&["explain", "--live", "--path", s(&me())], env);
    assert_eq!(
        explain.status.code(),
        Some(0),
        "{}{}",
        text(&explain.stdout),
        text(&explain.stderr)
    );
    assert!(
        text(&explain.stdout).contains("live in metaliftd"),
        "{}",
        text(&explain.stdout)
    );

    let audit = metalift_with(&["audit", "--json"], env);
    assert_eq!(audit.status.code(), Some(0), "{}", text(&audit.stderr));
    assert!(
        text(&audit.stdout).contains("\"me\""),
        "{}",
        text(&audit.stdout)
    );

    // edit: the daemon is found, so the new policy is reported live (exit 0), not
    // "goes live when metaliftd starts".
    let editor = dir.path("editor.sh");
    std::fs::write(
        &editor,
        format!(
            "#!/bin/sh\nsed 's/id = \"me\"/id = \"me-edited\"/' \"$1\" > \"$1.new\" && mv \"$1.new\" \"$1\"\n# {}\n",
            me().display()
        ),
    )
    .expect("editor");
    std::fs::set_permissions(&editor, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let mut edit_env = env.to_vec();
    edit_env.push(("VISUAL", &editor));
    let edit = metalift_with(&["edit", "--allow-insecure-owner"], &edit_env);
    let said = format!("{}{}", text(&edit.stdout), text(&edit.stderr));
    assert_eq!(edit.status.code(), Some(0), "{said}");
    assert!(said.contains("live in metaliftd"), "{said}");
    assert!(!said.contains("when metaliftd starts"), "{said}");
}

#[test]
fn given_the_daemons_flag_spelling_then_the_cli_takes_it_too() {
    let dir = DaemonDir::new("one-flags-");
    std::fs::write(dir.policy(), unlock_me_policy("me")).expect("policy");
    let daemon = dir.start(&[], &[]);
    support::check_in(&daemon.socket);
    let log = dir.audit_log();
    // metaliftd says --audit-log; so may every command that reads the log.
    let audit = metalift_with(&["audit", "--audit-log", s(&log), "--json"], &[]);
    assert_eq!(audit.status.code(), Some(0), "{}", text(&audit.stderr));
    let doctor = metalift_with(
        &[
            "doctor",
            "--json",
            "--socket",
            s(&dir.socket()),
            "--audit-log",
            s(&log),
        ],
        &[],
    );
    let checks: Value = serde_json::from_slice(&doctor.stdout).expect("doctor JSON");
    let audit_check = checks["checks"]
        .as_array()
        .unwrap_or_else(|| panic!("not a doctor report: {checks}"))
        .iter()
        .find(|c| c["name"] == "audit log")
        .expect("audit log check");
    assert!(
        audit_check["message"]
            .as_str()
            .is_some_and(|m| m.starts_with(s(&log))),
        "{audit_check}"
    );
}

#[test]
fn given_the_daemons_policy_through_a_symlink_or_relative_path_then_doctor_sees_the_same_file() {
    let dir = DaemonDir::new("one-same-");
    std::fs::write(dir.policy(), unlock_me_policy("me")).expect("policy");
    let link = dir.path("etc-link");
    std::os::unix::fs::symlink(dir.path("etc"), &link).expect("symlink");
    // The daemon is told the policy through the link, doctor the real path; the
    // log is given to doctor relative to its working directory.
    let mut cmd = Command::new(support::workspace_binary("metaliftd"));
    cmd.arg("--policy")
        .arg(link.join("policy.toml"))
        .arg("--socket")
        .arg(dir.socket())
        .arg("--audit-log")
        .arg(dir.audit_log())
        .arg("--allow-insecure-owner")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let _daemon = support::Daemon::spawn(cmd, dir.socket());
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .current_dir(dir.root())
        .env_remove("METALIFT_SOCKET")
        .env_remove("METALIFT_POLICY")
        .env_remove("METALIFT_AUDIT_LOG")
        .args([
            "doctor",
            "--json",
            "--allow-insecure-owner",
            "--socket",
            s(&dir.socket()),
            "--policy",
            s(&dir.policy()),
            "--log",
            "log/audit.jsonl",
        ])
        .output()
        .expect("doctor");
    let checks: Value = serde_json::from_slice(&out.stdout).expect("doctor JSON");
    for name in ["live policy", "audit log"] {
        let check = checks["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["name"] == name)
            .expect("check");
        assert_eq!(check["status"], "ok", "{name}: {check}");
    }
}

#[test]
fn given_an_os_error_then_metaliftd_and_metalift_say_it_once() {
    let dir = DaemonDir::new("one-once-");
    // A directory under a regular file: ENOTDIR ("Not a directory (os error 20)").
    let file = dir.path("file");
    std::fs::write(&file, "").expect("file");
    let daemon = Command::new(support::workspace_binary("metaliftd"))
        .arg("--policy")
        .arg(dir.policy())
        .arg("--socket")
        .arg(dir.socket())
        .arg("--audit-log")
        .arg(file.join("log/audit.jsonl"))
        .output()
        .expect("metaliftd");
    let said = text(&daemon.stderr);
    assert_eq!(daemon.status.code(), Some(74), "{said}");
    assert_eq!(said.matches("os error 20").count(), 1, "{said}");

    let edit = metalift_with(&["edit", "--policy", s(&file.join("policy.toml"))], &[]);
    let said = text(&edit.stderr);
    assert_eq!(edit.status.code(), Some(2), "{said}");
    assert_eq!(said.matches("os error 20").count(), 1, "{said}");
}

#[test]
fn given_a_hung_daemon_then_status_validate_and_exec_wait_only_the_one_daemon_timeout() {
    let dir = tempfile::tempdir().expect("tempdir");
    let socket = dir.path().join("hung.sock");
    // Bound and never accepted: a connect succeeds (the backlog), no answer comes.
    let _listener = std::os::unix::net::UnixListener::bind(&socket).expect("bind");
    let policy = dir.path().join("policy.toml");
    std::fs::write(&policy, "version = 1\n").expect("policy");
    let true_bin = if Path::new("/bin/true").exists() {
        "/bin/true"
    } else {
        "/usr/bin/true"
    };
    for args in [
        vec!["status", "--daemon-timeout", "0.3"],
        vec!["validate", s(&policy), "--daemon-timeout", "0.3"],
        vec!["exec", "--daemon-timeout", "0.3", "--", true_bin],
    ] {
        let start = std::time::Instant::now();
        let out = metalift_with(&args, &[("METALIFT_SOCKET", &socket)]);
        let took = start.elapsed();
        // The default is 5 s: a command asking with its own timeout takes that long.
        assert!(
            took < std::time::Duration::from_secs(3),
            "{args:?} took {took:?}"
        );
        let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
        assert!(said.contains(s(&socket)), "{args:?}: {said}");
        assert!(
            said.contains("unlocks_nothing") || said.contains("unreachable"),
            "{args:?}: {said}"
        );
    }
    let out = metalift_with(
        &["status", "--daemon-timeout", "0.3"],
        &[("METALIFT_SOCKET", &socket)],
    );
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
}
