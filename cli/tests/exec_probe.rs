//! `metalift exec` end to end on Linux: the real CLI injects the real shim
//! (`LD_PRELOAD`) into the real probe, which runs on the simulated Metal.
//!
//! Needs the workspace built first (`metalift-probe`, libmetalift and the
//! simulated Metal come from other crates): `scripts/test.sh` does that.
#![cfg(target_os = "linux")]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;
use metalift_daemon::scratch::records_in;
use support::DaemonDir;

fn bin_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_metalift"))
        .parent()
        .expect("binary has a directory")
        .to_path_buf();
    for needed in ["metalift-probe", "libmetalift.so"] {
        assert!(
            dir.join(needed).exists(),
            "{} is missing: build the workspace first (cargo build --workspace, as scripts/test.sh does)",
            dir.join(needed).display()
        );
    }
    dir
}

fn probe() -> PathBuf {
    bin_dir().join("metalift-probe").canonicalize().unwrap()
}

fn shim() -> PathBuf {
    bin_dir().join("libmetalift.so").canonicalize().unwrap()
}

/// `metalift exec ARGS...` with a scrubbed loader environment and the shim
/// pointed at `socket` (which may not exist).
fn metalift_exec(socket: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .arg("exec")
        .args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("METALIFT_SHIM")
        .env_remove("METALIFT_DISABLE")
        .env("METALIFT_SOCKET", socket)
        .env("METALIFT_TIMEOUT_MS", "2000")
        .output()
        .expect("run metalift")
}

fn stdout(output: &Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn stderr(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

fn probe_json(output: &Output) -> Value {
    assert!(
        output.status.success(),
        "probe failed ({}): {}",
        output.status,
        stderr(output)
    );
    serde_json::from_str(&stdout(output))
        .unwrap_or_else(|e| panic!("probe --json printed no JSON ({e}): {}", stdout(output)))
}

#[test]
fn exec_without_a_daemon_leaves_the_probe_stock() {
    let dir = tempfile::tempdir().unwrap();
    let no_daemon = dir.path().join("nobody-listens.sock");
    let out = metalift_exec(
        &no_daemon,
        &[
            "--shim",
            shim().to_str().unwrap(),
            "--",
            probe().to_str().unwrap(),
            "--json",
        ],
    );
    let report = probe_json(&out);
    assert_eq!(report["apple_family"], 5, "{report}");
    assert_eq!(report["families"]["Apple7"], false, "{report}");
    assert_eq!(report["max_threadgroup_memory"], 32768, "{report}");
    assert_eq!(
        report["llama_cpp"]["has_simdgroup_reduction"], false,
        "{report}"
    );
    // The shim is silent unless METALIFT_DEBUG=1: nothing breaks a tool parsing
    // stderr. The one line is metalift's own, before the program starts.
    let lines: Vec<String> = stderr(&out).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(
        lines[0].starts_with("metalift: warning: no metalift daemon answers"),
        "{lines:?}"
    );

    // It was injected all the same, and stayed stock because nobody answered.
    let debug = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["exec", "--shim"])
        .arg(shim())
        .arg("--")
        .arg(probe())
        .env_remove("LD_PRELOAD")
        .env("METALIFT_SOCKET", &no_daemon)
        .env("METALIFT_DEBUG", "1")
        .output()
        .unwrap();
    let said = stderr(&debug);
    assert!(
        said.contains("libmetalift") && said.contains("no daemon") && said.contains("stock"),
        "{said}"
    );
}

#[test]
fn exec_appends_the_shim_to_an_existing_ld_preload_and_keeps_argv0() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["exec", "--shim"])
        .arg(shim())
        .args([
            "--",
            "sh",
            "-c",
            "printf '%s\\n%s\\n' \"$LD_PRELOAD\" \"$0\"",
        ])
        .env("LD_PRELOAD", "libc.so.6")
        .env("METALIFT_SOCKET", dir.path().join("absent.sock"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let lines: Vec<String> = stdout(&out).lines().map(str::to_owned).collect();
    assert_eq!(lines[0], format!("libc.so.6:{}", shim().display()));
    assert_eq!(lines[1], "sh", "argv[0] is the name as typed");
}

#[test]
fn exec_finds_the_shim_next_to_itself_without_flags() {
    let dir = tempfile::tempdir().unwrap();
    let out = metalift_exec(
        &dir.path().join("absent.sock"),
        &["sh", "-c", "echo \"$LD_PRELOAD\""],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), shim().display().to_string());
}

#[test]
fn exec_passes_arguments_and_the_exit_status_through() {
    let dir = tempfile::tempdir().unwrap();
    let out = metalift_exec(
        &dir.path().join("absent.sock"),
        &[
            "sh",
            "-c",
            "echo \"$1\"; exit 7",
            "sh",
            "--not-a-metalift-flag",
        ],
    );
    assert_eq!(out.status.code(), Some(7), "{}", stderr(&out));
    assert_eq!(stdout(&out).trim(), "--not-a-metalift-flag");
}

#[test]
fn exec_of_an_unknown_command_exits_127_like_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let out = metalift_exec(
        &dir.path().join("absent.sock"),
        &["metalift-no-such-command"],
    );
    assert_eq!(out.status.code(), Some(127));
    assert!(
        stderr(&out).contains("metalift-no-such-command: command not found"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn exec_with_a_missing_shim_fails_instead_of_running_uninjected() {
    let dir = tempfile::tempdir().unwrap();
    let out = metalift_exec(
        &dir.path().join("absent.sock"),
        &["--shim", "/nonexistent/libmetalift.so", "--", "true"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr(&out).contains("/nonexistent/libmetalift.so"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn exec_warns_when_the_target_architecture_cannot_load_the_shim() {
    let dir = tempfile::tempdir().unwrap();
    // A 32-bit ARM ELF header: the x86-64 (or aarch64) shim cannot go into it.
    let mut header = b"\x7fELF\x01\x01\x01".to_vec();
    header.resize(16, 0);
    header.extend_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    header.extend_from_slice(&0x28u16.to_le_bytes()); // EM_ARM
    header.resize(52, 0);
    let foreign = dir.path().join("foreign-arm32");
    fs::write(&foreign, header).unwrap();
    fs::set_permissions(&foreign, fs::Permissions::from_mode(0o755)).unwrap();

    let out = metalift_exec(
        &dir.path().join("absent.sock"),
        &[
            "--shim",
            shim().to_str().unwrap(),
            "--",
            foreign.to_str().unwrap(),
        ],
    );
    let err = stderr(&out);
    assert!(
        err.contains("metalift: warning:") && err.contains("32-bit arm ELF"),
        "{err}"
    );
}

#[test]
fn exec_warns_when_the_shim_is_not_a_library() {
    let dir = tempfile::tempdir().unwrap();
    let not_a_library = dir.path().join("libmetalift.so");
    fs::write(&not_a_library, "not an ELF file").unwrap();
    let out = metalift_exec(
        &dir.path().join("absent.sock"),
        &["--shim", not_a_library.to_str().unwrap(), "--", "true"],
    );
    assert!(
        stderr(&out).contains("is not a shared library the loader can use"),
        "{}",
        stderr(&out)
    );
}

/// A real metaliftd (the one scratch daemon, through `support`), stopped on drop.
struct Daemon {
    // Dropped before its directory.
    _process: support::Daemon,
    socket: PathBuf,
    audit: PathBuf,
    _dir: DaemonDir,
}

impl Daemon {
    fn start(policy: &str) -> Daemon {
        let dir = DaemonDir::new("exec-");
        // The temporary policy belongs to whoever runs the tests (the scratch
        // daemon runs with --allow-insecure-owner).
        dir.write_policy(policy).unwrap();
        Daemon {
            _process: dir.start(&[], &[]),
            socket: dir.socket(),
            audit: dir.audit_log(),
            _dir: dir,
        }
    }
}

#[test]
fn exec_with_an_unlocking_verdict_unlocks_the_probe_and_the_daemon_audits_it() {
    let policy = format!(
        r#"version = 1
mode = "enforce"

[profile.apple7]
apple_family_max = 7
max_threadgroup_memory = 32768

[[rule]]
id = "the-probe"
path = "{}"
unlock = "apple7"
"#,
        probe().display()
    );
    let daemon = Daemon::start(&policy);
    let out = metalift_exec(
        &daemon.socket,
        &[
            "--shim",
            shim().to_str().unwrap(),
            "--",
            probe().to_str().unwrap(),
            "--json",
        ],
    );
    let report = probe_json(&out);
    assert_eq!(report["apple_family"], 7, "{report}");
    assert_eq!(
        report["families"]["Metal3"], false,
        "Metal3 is never claimed: {report}"
    );
    assert_eq!(
        report["llama_cpp"]["has_simdgroup_reduction"], true,
        "{report}"
    );
    assert_eq!(report["llama_cpp"]["has_simdgroup_mm"], true, "{report}");

    // The decision is in the audit log with the rule that made it, and so is
    // what the shim reported it actually did.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let records: Vec<Value> = records_in(&daemon.audit).unwrap_or_else(|e| panic!("{e}"));
        let decided = records.iter().any(|r| {
            r["kind"] == "decision" && r["rule"] == "the-probe" && r["action"] == "unlock"
        });
        let applied = records
            .iter()
            .any(|r| r["kind"] == "outcome" && r["result"] == "applied");
        if decided && applied {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no unlock decision with an applied outcome in the audit log:\n{records:#?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn exec_of_a_file_that_is_not_executable_exits_126_like_a_shell() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("not-executable");
    fs::write(&script, "#!/bin/sh\nexit 0\n").unwrap();
    fs::set_permissions(&script, fs::Permissions::from_mode(0o644)).unwrap();
    let out = metalift_exec(&dir.path().join("absent.sock"), &[script.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("Permission denied"),
        "{}",
        stderr(&out)
    );
    let out = metalift_exec(
        &dir.path().join("absent.sock"),
        &[dir.path().to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(126), "{}", stderr(&out));
    let out = metalift_exec(
        &dir.path().join("absent.sock"),
        &[dir.path().join("missing").to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(127), "{}", stderr(&out));
}

#[test]
fn exec_warns_that_the_command_runs_stock_when_no_daemon_answers() {
    let dir = tempfile::tempdir().unwrap();
    let out = metalift_exec(&dir.path().join("absent.sock"), &["true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("warning: no metalift daemon answers on") && err.contains("will run stock"),
        "{err}"
    );
    assert!(err.contains("absent.sock"), "{err}");
}

#[test]
fn exec_says_nothing_about_the_daemon_when_one_answers() {
    let daemon = Daemon::start("version = 1\n");
    let out = metalift_exec(&daemon.socket, &["true"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(
        !stderr(&out).contains("no metalift daemon"),
        "{}",
        stderr(&out)
    );
}

fn unlock_policy() -> String {
    format!(
        "version = 1\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"the-probe\"\npath = \"{}\"\nunlock = \"apple7\"\n",
        probe().display()
    )
}

fn require_unlock(daemon: &Daemon, command: &[&str]) -> Output {
    let mut args = vec![
        "--require-unlock",
        "--log",
        daemon.audit.to_str().unwrap(),
        "--shim",
    ];
    let shim = shim();
    args.push(shim.to_str().unwrap());
    args.push("--");
    args.extend_from_slice(command);
    metalift_exec(&daemon.socket, &args)
}

#[test]
fn require_unlock_passes_through_the_status_when_the_audit_log_shows_applied() {
    let daemon = Daemon::start(&unlock_policy());
    let probe = probe();
    let out = require_unlock(&daemon, &[probe.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(probe_json(&out)["apple_family"], 7);
    assert!(
        stderr(&out).contains("unlocked by rule the-probe"),
        "{}",
        stderr(&out)
    );
}

#[test]
fn require_unlock_exits_4_when_the_verdict_was_stock() {
    let daemon = Daemon::start("version = 1\n");
    let probe = probe();
    let out = require_unlock(&daemon, &[probe.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(stderr(&out).contains("stock"), "{}", stderr(&out));
}

#[test]
fn require_unlock_exits_5_when_no_daemon_decided_for_the_command() {
    // The daemon writes the log, but the shim is pointed at a socket nobody serves:
    // no decision for the child's pid is ever written.
    let daemon = Daemon::start(&unlock_policy());
    let probe = probe();
    let out = metalift_exec(
        &daemon._dir.path("absent.sock"),
        &[
            "--require-unlock",
            "--log",
            daemon.audit.to_str().unwrap(),
            "--shim",
            shim().to_str().unwrap(),
            "--",
            probe.to_str().unwrap(),
        ],
    );
    // No daemon: it unlocks nothing, the ladder's 5 (never milder than 4).
    assert_eq!(out.status.code(), Some(5), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("no decision for pid"),
        "{}",
        stderr(&out)
    );
    assert!(stderr(&out).contains("will run stock"), "{}", stderr(&out));
}

#[test]
fn require_unlock_exits_4_when_the_audit_log_cannot_be_read() {
    let daemon = Daemon::start(&unlock_policy());
    let probe = probe();
    let out = metalift_exec(
        &daemon.socket,
        &[
            "--require-unlock",
            "--log",
            "/nonexistent-dir/audit.jsonl",
            "--shim",
            shim().to_str().unwrap(),
            "--",
            probe.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
}

#[test]
fn require_unlock_exits_4_when_the_shim_was_disabled() {
    // METALIFT_DISABLE=1: the program runs stock, whatever it prints.
    let daemon = Daemon::start(&unlock_policy());
    let probe = probe();
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["exec", "--require-unlock", "--log"])
        .arg(&daemon.audit)
        .arg("--shim")
        .arg(shim())
        .arg("--")
        .arg(&probe)
        .env_remove("LD_PRELOAD")
        .env("METALIFT_DISABLE", "1")
        .env("METALIFT_SOCKET", &daemon.socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
}
