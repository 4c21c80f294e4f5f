//! libmetalift must not change what a process that never touches Metal does:
//! same stdout, same stderr, same exit code, with a daemon and without one —
//! and it must not even connect: no daemon work, no audit record, no log line.
//!
//! Linux only: the simulated Metal and `LD_PRELOAD` (macOS runs the real Metal).
#![cfg(target_os = "linux")]

mod support;

use std::path::Path;
use std::process::Command;

use support::*;

fn sh(script: &str) -> Command {
    let mut cmd = clean("sh");
    cmd.args(["-c", script]);
    cmd
}

fn assert_transparent(make: impl Fn() -> Command, stdin: &[u8], socket: &Path) {
    let plain = run(make(), stdin);
    let mut cmd = make();
    cmd.env("LD_PRELOAD", shim()).env("METALIFT_SOCKET", socket);
    let injected = run(cmd, stdin);
    assert_eq!(injected.status.code(), plain.status.code(), "exit code");
    assert_eq!(
        String::from_utf8_lossy(&injected.stdout),
        String::from_utf8_lossy(&plain.stdout),
        "stdout"
    );
    assert_eq!(
        String::from_utf8_lossy(&injected.stderr),
        String::from_utf8_lossy(&plain.stderr),
        "stderr"
    );
}

fn every_program(socket: &Path) {
    assert_transparent(|| clean("/bin/true"), b"", socket);
    assert_transparent(|| clean("/bin/false"), b"", socket);
    assert_transparent(|| sh("echo hi | cat"), b"", socket);
    assert_transparent(|| sh("echo out; echo err >&2; exit 7"), b"", socket);
    let input: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
    assert_transparent(|| clean("cat"), &input, socket);
    assert_transparent(|| sh("wc -c; head -c 3 /dev/null"), &input, socket);
}

#[test]
fn given_a_daemon_that_unlocks_everything_then_programs_without_metal_are_unchanged() {
    let daemon = FakeDaemon::start(unlock(APPLE7));
    every_program(&daemon.socket);
    assert_eq!(
        daemon.connections(),
        0,
        "a process without Metal never connects"
    );
}

#[test]
fn given_a_daemon_that_answers_after_3_s_then_a_program_without_metal_finishes_at_once() {
    let daemon = FakeDaemon::start_delayed(unlock(APPLE7), std::time::Duration::from_secs(3));
    let start = std::time::Instant::now();
    let status = injected("/bin/true", &daemon.socket).status().unwrap();
    assert!(status.success());
    let took = start.elapsed();
    assert!(took < std::time::Duration::from_secs(1), "took {took:?}");
    assert_eq!(daemon.connections(), 0);
}

#[test]
fn given_a_daemon_that_never_answers_then_programs_without_metal_are_unchanged() {
    let daemon = FakeDaemon::start(Behaviour::Silent);
    every_program(&daemon.socket);
}

#[test]
fn given_no_daemon_then_programs_without_metal_are_unchanged() {
    let dir = tempfile::tempdir().unwrap();
    every_program(&dir.path().join("absent.sock"));
}
