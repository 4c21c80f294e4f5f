//! The opt-in LaunchAgent's launcher (`pkg/libexec/metaliftd-agent`) and what
//! metaliftd does when it cannot open its socket or log: one error line and a
//! non-zero status, so launchd's throttle (not a hot loop) governs retries.

use super::*;

/// A root with a fake metaliftd that prints its arguments, one per line.
fn launcher_root() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let bin = root.join("usr/local/metalift/bin");
    fs::create_dir_all(&bin).unwrap();
    fs::write(bin.join("metaliftd"), "#!/bin/sh\nprintf '%s\\n' \"$@\"\n").unwrap();
    fs::set_permissions(bin.join("metaliftd"), fs::Permissions::from_mode(0o755)).unwrap();
    let home = dir.path().join("home");
    fs::create_dir_all(&home).unwrap();
    (dir, root, home)
}

fn launch(root: &Path, home: &Path) -> Output {
    Command::new(repo().join("pkg/libexec/metaliftd-agent"))
        .env("METALIFT_ROOT", root)
        .env("HOME", home)
        .output()
        .expect("run metaliftd-agent")
}

/// The one error line, after checking it is the only output and the status.
fn one_error_line(out: &Output, status: i32) -> String {
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(status), "stderr: {stderr}");
    assert!(
        out.stdout.is_empty(),
        "metaliftd must not have been started"
    );
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "exactly one line: {stderr}");
    lines[0].to_owned()
}

#[test]
fn agent_launcher_gives_the_user_a_private_log_and_leaves_the_socket_to_metaliftds_default() {
    let (_dir, root, home) = launcher_root();
    let out = check(launch(&root, &home), "metaliftd-agent");
    let args: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    // No --socket: metaliftd, not running as root, takes metalift.sock in the
    // user's own DARWIN_USER_TEMP_DIR (socket_path.rs), the place the shim and
    // the CLI compute too. A path chosen here could drift from theirs.
    assert!(!args.iter().any(|a| a == "--socket"), "{args:?}");
    assert_eq!(
        flag_value(&args, "--audit-log"),
        home.join("Library/Logs/metalift/audit.jsonl")
            .display()
            .to_string()
    );
    assert!(home.join("Library/Logs/metalift").is_dir());
    assert_metaliftd_has_flags(
        args.iter()
            .filter(|a| a.starts_with('-'))
            .map(String::as_str),
        "metaliftd-agent",
    );
    // Nothing outside the user's home, least of all a directory another user
    // could have created first.
    assert!(!root.join("Users").exists());
}

#[test]
fn metaliftds_default_socket_for_a_user_on_macos_is_in_the_users_temp_dir() {
    let help = Command::new(crate::support::workspace_binary("metaliftd"))
        .arg("--help")
        .output()
        .expect("run metaliftd --help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(help.contains("DARWIN_USER_TEMP_DIR"), "{help}");
    let temp = std::ffi::OsStr::new("/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T/");
    assert_eq!(
        metalift_policy::socket_path::daemon_socket_for(501, Some(temp)),
        Some(PathBuf::from(
            "/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T/metalift.sock"
        ))
    );
}

#[test]
fn agent_launcher_that_cannot_create_its_log_dir_says_one_line_and_exits_74() {
    let (_dir, root, home) = launcher_root();
    // A file where a directory must go: fails for root as well.
    fs::write(home.join("Library"), "").unwrap();
    let line = one_error_line(&launch(&root, &home), 74);
    assert!(line.contains("Library/Logs/metalift"), "{line}");
}

#[test]
fn agent_launcher_without_home_says_one_line_and_exits_78() {
    let (_dir, root, _home) = launcher_root();
    let out = Command::new(repo().join("pkg/libexec/metaliftd-agent"))
        .env("METALIFT_ROOT", &root)
        .env_remove("HOME")
        .output()
        .unwrap();
    let line = one_error_line(&out, 78);
    assert!(line.contains("HOME"), "{line}");
}

/// metaliftd itself: one line naming what failed and the path, and a status of its
/// own for each (73 the socket, 74 the audit log), so launchd's throttled restarts
/// are not a mystery.
#[test]
fn metaliftd_that_cannot_open_its_socket_or_audit_log_says_one_line_and_exits_non_zero() {
    let dir = tempfile::tempdir().unwrap();
    let blocker = dir.path().join("file");
    fs::write(&blocker, "").unwrap();
    let policy = dir.path().join("policy.toml");
    fs::write(&policy, "version = 1\n").unwrap();
    for (socket, log, names, status) in [
        (
            dir.path().join("s.sock"),
            blocker.join("audit.jsonl"),
            "cannot open the audit log",
            74,
        ),
        (
            blocker.join("s.sock"),
            dir.path().join("a.jsonl"),
            "cannot listen on the socket",
            73,
        ),
    ] {
        let out = Command::new(crate::support::workspace_binary("metaliftd"))
            .arg("--policy")
            .arg(&policy)
            .arg("--allow-insecure-owner")
            .arg("--socket")
            .arg(&socket)
            .arg("--audit-log")
            .arg(&log)
            .env_remove("RUST_LOG")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(status), "{stderr}");
        let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one line: {stderr}");
        assert!(
            lines[0].contains("error") && lines[0].contains(names),
            "{stderr}"
        );
    }
}
