//! `metalift audit --kind refused` (issue 24 item 2): the refusals the daemon
//! recorded (an outcome for another process or decision, a uid changed since
//! connect) are shown and selected like any other record, and stay out of the
//! joined view of processes.

use std::process::Command;
use std::time::{Duration, SystemTime};

use metalift_daemon::audit::{Record, RefusedRecord};

fn refused(reason: &str, pid: i32, decision_id: Option<u64>, suppressed: u64) -> Record {
    Record::Refused(RefusedRecord {
        time: SystemTime::now() - Duration::from_secs(30),
        message: "outcome".into(),
        reason: reason.into(),
        detail: format!("the {reason} detail"),
        pid: Some(pid),
        uid: None,
        exe: Some("/opt/llama.cpp/bin/llama-server".into()),
        decision_id,
        transport: "xpc".into(),
        suppressed,
    })
}

fn audit(log: &std::path::Path, args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .arg("audit")
        .arg("--log")
        .arg(log)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn refused_records_are_listed_by_kind_with_their_reason_and_selected_by_pid() {
    let tmp = tempfile::tempdir().unwrap();
    let log = tmp.path().join("audit.jsonl");
    let mut text = String::new();
    for r in [
        refused("other_process", 4243, Some(7), 0),
        refused("wrong_decision", 4242, Some(8), 12),
    ] {
        text.push_str(std::str::from_utf8(&r.to_line().unwrap()).unwrap());
    }
    std::fs::write(&log, text).unwrap();

    let table = audit(&log, &["--kind", "refused"]);
    let rows: Vec<&str> = table.lines().skip(1).collect();
    assert_eq!(rows.len(), 2, "{table}");
    assert!(
        rows[0].contains("refused")
            && rows[0].contains("4243")
            && rows[0].contains("outcome refused: other_process id=7"),
        "{table}"
    );
    assert!(rows[1].contains("(+12 not recorded)"), "{table}");

    let json = audit(&log, &["--kind", "refused", "--pid", "4242", "--json"]);
    let lines: Vec<serde_json::Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 1, "{json}");
    assert_eq!(lines[0]["reason"], "wrong_decision");

    // The joined view lists processes (decisions), not refusals.
    let joined = audit(&log, &[]);
    assert!(!joined.contains("other_process"), "{joined}");
}
