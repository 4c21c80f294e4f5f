//! One daemon per audit log (issue 34): a second metaliftd on the same
//! `--audit-log` refuses to start with a message naming the first; every
//! daemon record carries the daemon's pid.
#![cfg(target_os = "linux")]

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;

use support::{DaemonDir, HANG_GUARD};

#[test]
fn a_second_daemon_on_the_same_audit_log_refuses_to_start_and_records_carry_the_pid() {
    let dir = DaemonDir::new("log-lock-");
    std::fs::write(dir.policy(), "version = 1\n").expect("policy");
    let first = dir.start(&[], &[]);
    let pid = metalift_daemon::service::status::request(&first.socket, Duration::from_secs(5))
        .expect("status")
        .pid;

    let mut second = Command::new(support::workspace_binary("metaliftd"))
        .arg("--policy")
        .arg(dir.policy())
        .arg("--socket")
        .arg(dir.path("run/second.sock"))
        .arg("--audit-log")
        .arg(dir.audit_log())
        .arg("--allow-insecure-owner")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the second metaliftd");
    let start = Instant::now();
    while second.try_wait().expect("wait").is_none() {
        if start.elapsed() > Duration::from_secs(10) {
            let _ = second.kill();
            let _ = second.wait();
            panic!("a second metaliftd started on the same audit log");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let second = second.wait_with_output().expect("its stderr");
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(74), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "another metaliftd (pid {pid}) writes the audit log"
        )),
        "{stderr}"
    );
    assert!(stderr.contains("one daemon per audit log"), "{stderr}");
    assert_eq!(
        dir.records_of("daemon_start").len(),
        1,
        "the second daemon wrote nothing"
    );

    // SIGTERM: the daemon_stop record names its pid, as daemon_start does.
    let killed = Command::new("kill")
        .arg(pid.to_string())
        .status()
        .expect("kill");
    assert!(killed.success());
    let start = Instant::now();
    while dir.records_of("daemon_stop").is_empty() {
        assert!(start.elapsed() < HANG_GUARD, "no daemon_stop record");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(dir.records_of("daemon_stop")[0]["pid"], pid);
    assert_eq!(dir.records_of("daemon_start")[0]["pid"], pid);
    drop(first);
}
