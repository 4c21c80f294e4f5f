//! `metalift audit --records` against a fabricated log with rotated files: order,
//! table, JSON, filters, corrupt lines, and `--follow` across a rotation. The
//! joined view (the default) is tested in audit_join_cli.rs.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use metalift_daemon::audit::rotation::rotated_path;
use metalift_daemon::audit::{
    Advisory, AuditLog, DecisionRecord, LoadReason, OutcomeRecord, Record, Rotation,
};
use metalift_policy::wire::{Answers, Outcome, OutcomeResult};

fn ago(secs: u64) -> SystemTime {
    SystemTime::now() - Duration::from_secs(secs)
}

fn decision(id: u64, secs_ago: u64, exe: &str, rule: Option<&str>, action: &str) -> Record {
    Record::Decision(DecisionRecord {
        time: ago(secs_ago),
        decision_id: id,
        pid: 4000 + id as i32,
        uid: 501,
        exe: exe.to_owned(),
        sha256: None,
        team_id: None,
        signing_id: None,
        cdhash: None,
        anchor: None,
        identity_error: None,
        parent_exe: None,
        ancestors: Vec::new(),
        rule: rule.map(str::to_owned),
        action: action.to_owned(),
        profile: (action == "unlock").then(|| "apple7".to_owned()),
        mode: "enforce".into(),
        apple_family_max: None,
        apple_family_requested: None,
        apple_family_capped: None,
        unverified: None,
        window: None,
        would_unlock: false,
        host_chip: None,
        policy_sha256: "ab".repeat(32),
        latency_us: 90,
        transport: "unix".into(),
        advisory: Advisory::default(),
    })
}

fn outcome(id: u64, secs_ago: u64, exe: &str, result: OutcomeResult) -> Record {
    Record::Outcome(OutcomeRecord::new(
        ago(secs_ago),
        4000 + id as i32,
        exe.to_owned(),
        &Outcome {
            decision_id: id,
            result,
            reason: String::new(),
            device_class: "AppleParavirtDevice".into(),
            stock: Answers {
                families: 0b1_1111,
                threadgroup_memory: 32768,
                working_set: 1 << 30,
            },
            effective: Answers {
                families: 0b111_1111,
                threadgroup_memory: 32768,
                working_set: 1 << 30,
            },
            ..Default::default()
        },
    ))
}

fn line(record: &Record) -> String {
    String::from_utf8(record.to_line().unwrap()).unwrap()
}

/// A log of three files: `.2` (oldest, 3 h ago), `.1` (with a corrupt line), and the
/// live file (minutes ago). Returns the live path and the valid lines in order.
fn fabricate(dir: &Path) -> (PathBuf, Vec<String>) {
    let path = dir.join("audit.jsonl");
    let llama = "/opt/llama.cpp/bin/llama-server";
    let files: [Vec<Record>; 3] = [
        vec![
            Record::DaemonStart {
                time: ago(3 * 3600),
                version: "0.1.0".into(),
                pid: 77,
                policy: "/etc/metalift/policy.toml".into(),
                listen: "/run/metalift/metalift.sock".into(),
            },
            Record::PolicyLoaded {
                time: ago(3 * 3600),
                path: "/etc/metalift/policy.toml".into(),
                sha256: "cd".repeat(32),
                rules: 2,
                mode: "enforce".into(),
                warnings: Vec::new(),
                reason: LoadReason::Start,
            },
            decision(1, 3 * 3600, llama, Some("llama-cpp"), "unlock"),
        ],
        vec![
            outcome(1, 3 * 3600 - 1, llama, OutcomeResult::Applied),
            decision(2, 2 * 3600, "/usr/bin/python3", None, "stock"),
            Record::PolicyRejected {
                time: ago(2 * 3600),
                path: "/etc/metalift/policy.toml".into(),
                sha256: Some("ee".repeat(32)),
                errors: vec!["/etc/metalift/policy.toml:3:8: error: unknown mode".into()],
                kept_sha256: "cd".repeat(32),
            },
        ],
        vec![
            decision(3, 300, llama, Some("llama-cpp"), "unlock"),
            outcome(3, 299, llama, OutcomeResult::Failed),
            decision(4, 120, "/usr/local/bin/whisper", Some("never"), "stock"),
            Record::DaemonStop {
                time: ago(60),
                reason: "SIGTERM".into(),
                checkins: 4,
                unlocks: 2,
                pid: 1,
            },
        ],
    ];
    let mut valid = Vec::new();
    for (i, records) in files.iter().enumerate() {
        let mut text = String::new();
        for (j, r) in records.iter().enumerate() {
            text.push_str(&line(r));
            valid.push(line(r).trim_end().to_owned());
            if i == 1 && j == 0 {
                // Line 2 of audit.jsonl.1: torn garbage.
                text.push_str("{\"kind\":\"decision\",\"ti\n");
            }
        }
        let file = match i {
            0 => rotated_path(&path, 2),
            1 => rotated_path(&path, 1),
            _ => path.clone(),
        };
        std::fs::write(file, text).unwrap();
    }
    (path, valid)
}

fn metalift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .arg("audit")
        .args(args)
        .output()
        .unwrap()
}

fn stdout_lines(out: &Output) -> Vec<String> {
    assert!(
        out.status.success(),
        "exit {:?}, stderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone())
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

/// Issue 26: `audit -n N` used to require `--follow`; it is `tail -n` for the log.
#[test]
fn lines_without_follow_prints_the_last_n_of_the_live_file_and_exits() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, valid) = fabricate(tmp.path());
    let log = log.to_str().unwrap();
    let out = metalift(&["--records", "--json", "-n", "2", "--log", log]);
    assert_eq!(stdout_lines(&out), valid[valid.len() - 2..]);
    // One line per process: the last one decided in the live file.
    let out = metalift(&["--json", "-n", "1", "--log", log]);
    let lines = stdout_lines(&out);
    assert_eq!(lines.len(), 1, "{lines:?}");
    assert!(lines[0].contains("/usr/local/bin/whisper"), "{lines:?}");
}

#[test]
fn json_prints_every_record_oldest_file_first_and_reports_the_corrupt_line() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, valid) = fabricate(tmp.path());
    let out = metalift(&["--records", "--log", log.to_str().unwrap(), "--json"]);
    assert_eq!(stdout_lines(&out), valid);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let location = format!("{}:2:", rotated_path(&log, 1).display());
    assert!(stderr.contains(&location), "{stderr}");
    assert!(stderr.contains("corrupt"), "{stderr}");
}

#[test]
fn the_records_table_has_aligned_columns_and_a_row_per_record() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, valid) = fabricate(tmp.path());
    let lines = stdout_lines(&metalift(&["--records", "--log", log.to_str().unwrap()]));
    assert_eq!(lines.len(), valid.len() + 1, "{lines:#?}");
    let header = &lines[0];
    for column in ["TIME", "KIND", "PID", "EXE", "RULE", "ACTION", "DETAIL"] {
        assert!(header.contains(column), "{header}");
    }
    // Every row's KIND and EXE cells start under their headings.
    let kind_at = header.find("KIND").unwrap();
    let exe_at = header.find("EXE").unwrap();
    for row in &lines[1..] {
        let kind = row[kind_at..].split_whitespace().next().unwrap();
        assert!(
            [
                "decision",
                "outcome",
                "policy_loaded",
                "policy_rejected",
                "daemon_start",
                "daemon_stop"
            ]
            .contains(&kind),
            "{row}"
        );
        assert_eq!(row.as_bytes()[exe_at - 1], b' ', "{row}");
        let exe = row[exe_at..].split_whitespace().next().unwrap();
        assert!(exe.starts_with('/') || exe == "-", "{row}");
    }
    let decision = lines
        .iter()
        .find(|l| l.contains("/usr/bin/python3"))
        .unwrap();
    assert!(decision.contains("stock"), "{decision}");
    let rejected = lines
        .iter()
        .find(|l| l.contains("policy_rejected"))
        .unwrap();
    assert!(rejected.contains("policy.toml:3:8"), "{rejected}");
}

#[test]
fn filters_select_by_exe_rule_action_kind_and_age() {
    let tmp = tempfile::tempdir().unwrap();
    let (log, _) = fabricate(tmp.path());
    let log = log.to_str().unwrap();
    let records = |args: &[&str]| -> Vec<serde_json::Value> {
        let mut all = vec!["--records", "--log", log, "--json"];
        all.extend_from_slice(args);
        stdout_lines(&metalift(&all))
            .iter()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let ids = |rs: &[serde_json::Value]| -> Vec<(String, u64)> {
        rs.iter()
            .map(|r| {
                (
                    r["kind"].as_str().unwrap().to_owned(),
                    r["decision_id"].as_u64().unwrap_or(0),
                )
            })
            .collect()
    };
    let d = |id| ("decision".to_owned(), id);
    let o = |id| ("outcome".to_owned(), id);

    // A glob without `/` matches the file name; with `/`, the whole path.
    assert_eq!(
        ids(&records(&["--exe", "llama-*"])),
        [d(1), o(1), d(3), o(3)]
    );
    assert_eq!(ids(&records(&["--exe", "/usr/**"])), [d(2), d(4)]);
    // A rule selects its decisions and the outcomes that answer them.
    assert_eq!(
        ids(&records(&["--rule", "llama-cpp"])),
        [d(1), o(1), d(3), o(3)]
    );
    assert_eq!(ids(&records(&["--action", "stock"])), [d(2), d(4)]);
    assert_eq!(
        ids(&records(&["--action", "unlock", "--kind", "outcome"])),
        [o(1), o(3)]
    );
    let rejected = records(&["--kind", "policy_rejected"]);
    assert_eq!(rejected.len(), 1);
    // Only the live file's records are under an hour old.
    assert_eq!(
        ids(&records(&["--since", "1h"])),
        [d(3), o(3), d(4), ("daemon_stop".to_owned(), 0)]
    );
}

#[test]
fn a_missing_log_or_a_bad_duration_is_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let missing = tmp.path().join("nope.jsonl");
    let out = metalift(&["--log", missing.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no audit log"));
    assert_eq!(out.status.code(), Some(2));
    let (log, _) = fabricate(tmp.path());
    let out = metalift(&["--log", log.to_str().unwrap(), "--since", "soon"]);
    assert!(!out.status.success());
}

/// Kills the `--follow` child when the test ends, pass or fail.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn follow_keeps_reading_across_rotations_without_losing_a_record() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("audit.jsonl");
    // Every ~3 records rotate; keep enough files that none is dropped.
    let log = AuditLog::open(
        &path,
        Rotation {
            max_bytes: 1_500,
            keep: 100,
        },
    )
    .unwrap();
    log.append(&decision(0, 10, "/bin/first", None, "stock"))
        .unwrap();

    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_metalift"))
            .args([
                "audit",
                "--records",
                "--follow",
                "-n",
                "1",
                "--json",
                "--log",
            ])
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let (tx, rx) = mpsc::channel();
    let stdout = child.0.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = |what: &str| -> serde_json::Value {
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no line from --follow: {what}"));
        serde_json::from_str(&line).unwrap()
    };
    assert_eq!(next("the existing record")["decision_id"], 0);

    let total = 40u64;
    for id in 1..=total {
        log.append(&decision(id, 1, "/bin/next", None, "stock"))
            .unwrap();
    }
    assert!(
        rotated_path(&path, 5).exists(),
        "the log rotated several times"
    );
    for id in 1..=total {
        assert_eq!(next("an appended record")["decision_id"], id);
    }
}
