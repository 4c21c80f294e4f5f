//! Issue 34 ("every daemon record carries the daemon's pid"): in one run of the
//! real metaliftd, every record it writes, whatever its kind (start, decisions, a
//! policy loaded and one refused, stop), has `host.pid` = the daemon's pid, and
//! `metalift audit --records --json` shows it.
#![cfg(target_os = "linux")]

use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;

use support::{DaemonDir, HANG_GUARD};

fn wait_for(dir: &DaemonDir, kind: &str, n: usize) {
    let start = Instant::now();
    while dir.records_of(kind).len() < n {
        assert!(start.elapsed() < HANG_GUARD, "no {n} {kind} records");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn given_one_daemon_run_then_every_record_it_writes_carries_its_pid() {
    let dir = DaemonDir::new("writer-pid-");
    std::fs::write(dir.policy(), "version = 1\nmode = \"enforce\"\n").expect("policy");
    let daemon = dir.start(&[], &[]);
    let pid = daemon.pid();

    // Decisions, a policy change, a refused policy, then a stop.
    support::check_in(&dir.socket());
    support::check_in(&dir.socket());
    std::fs::write(dir.policy(), "version = 1\nmode = \"monitor\"\n").expect("policy");
    wait_for(&dir, "policy_loaded", 2);
    std::fs::write(dir.policy(), "version = 1\nmode = \"neither\"\n").expect("policy");
    wait_for(&dir, "policy_rejected", 1);
    let killed = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .expect("kill");
    assert!(killed.success());
    wait_for(&dir, "daemon_stop", 1);

    let log = std::fs::read_to_string(dir.audit_log()).expect("audit log");
    let records: Vec<Value> = log
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON record"))
        .collect();
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| r["kind"].as_str().unwrap_or("?"))
        .collect();
    for kind in [
        "daemon_start",
        "decision",
        "policy_loaded",
        "policy_rejected",
        "daemon_stop",
    ] {
        assert!(kinds.contains(&kind), "no {kind} in {kinds:?}");
    }
    for record in &records {
        assert_eq!(record["host"]["pid"], pid, "{record}");
    }

    // The records view shows it, each line as written.
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["audit", "--records", "--json", "--log"])
        .arg(dir.audit_log())
        .env_remove("METALIFT_AUDIT_LOG")
        .output()
        .expect("metalift audit");
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let shown: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("JSON line"))
        .collect();
    assert_eq!(shown.len(), records.len(), "{shown:?}");
    assert!(shown.iter().all(|r| r["host"]["pid"] == pid), "{shown:?}");
}
