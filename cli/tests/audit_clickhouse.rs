//! The documented path into an analytics engine (docs/src/operations/fleet.md,
//! "Past one collector host"): examples/collectors/clickhouse.sql's table and
//! questions, run in a real ClickHouse engine (chdb, its embedded form from PyPI,
//! through scripts/clickhouse-fleet.py), answer what `metalift audit` answers on
//! the same records. The records are written by two real metaliftd (two images,
//! as two guests), gathered into one file as a collector would, one of them twice
//! (at-least-once delivery).
#![cfg(target_os = "linux")]

use std::path::Path;
use std::process::Command;

use metalift_policy::wire::{CheckIn, Client, Outcome, OutcomeResult};
use serde_json::Value;

mod support;

use support::{DaemonDir, HANG_GUARD};

fn metalift(args: &[&str]) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .output()
        .expect("run metalift");
    assert!(
        out.status.success(),
        "metalift {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    // JSON Lines (the per-process view) or one document (the summary).
    match serde_json::from_str(&text) {
        Ok(v) => v,
        Err(_) => Value::Array(
            text.lines()
                .map(|l| serde_json::from_str(l).expect("a JSON line"))
                .collect(),
        ),
    }
}

/// Two guests' records in one file: `img-a` applied in jobs 42 and 41, `img-b`
/// failed in job 42 and never reported in job 41; one record copied.
fn fleet_records(root: &Path) -> std::path::PathBuf {
    let me = std::env::current_exe().unwrap();
    let mut all = String::new();
    let guests: Vec<DaemonDir> = ["img-a", "img-b"]
        .iter()
        .map(|_| DaemonDir::new("clickhouse-"))
        .collect();
    for (dir, image) in guests.iter().zip(["img-a", "img-b"]) {
        std::fs::write(
            dir.policy(),
            format!(
                "version = 1\n[profile.apple7]\napple_family_max = 7\n\n\
                 [[rule]]\nid = \"me\"\npath = \"{}\"\nunlock = \"apple7\"\n\n\
                 [audit.labels]\nimage = \"{image}\"\n",
                me.display()
            ),
        )
        .unwrap();
        let daemon = dir.start(&[], &[]);
        for job in ["42", "41"] {
            let mut client = Client::connect(&daemon.socket, HANG_GUARD).unwrap();
            let verdict = client
                .check_in(&CheckIn {
                    shim_version: "0.1.0".into(),
                    arch: "x86_64".into(),
                    claimed_executable: None,
                    job: Some(format!("GITHUB_RUN_ID={job}")),
                })
                .unwrap();
            let result = match (image, job) {
                ("img-b", "41") => continue, // no outcome
                ("img-b", _) => OutcomeResult::Failed,
                _ => OutcomeResult::Applied,
            };
            client
                .outcome(&Outcome {
                    decision_id: verdict.decision_id,
                    result,
                    reason: "r".into(),
                    device_class: "SimulatedParavirtDevice".into(),
                    ..Default::default()
                })
                .unwrap();
        }
        // Every record written before the daemon is stopped.
        let start = std::time::Instant::now();
        while dir.records_of("outcome").len() < if image == "img-a" { 2 } else { 1 } {
            assert!(start.elapsed() < HANG_GUARD, "outcomes never recorded");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        drop(daemon);
        let text = std::fs::read_to_string(dir.audit_log()).unwrap();
        all.push_str(&text);
        if image == "img-a" {
            // A collector's second copy of an outcome.
            let outcome = text
                .lines()
                .find(|l| l.contains("\"kind\":\"outcome\""))
                .expect("an outcome line");
            all.push_str(outcome);
            all.push('\n');
        }
    }
    let path = root.join("fleet.jsonl");
    std::fs::write(&path, all).unwrap();
    path
}

fn clickhouse(records: &Path) -> Value {
    let out = Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/clickhouse-fleet.py"))
        .arg(records)
        .args(["--param", "job=42", "--batch", "1", "--stop-merges"])
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "scripts/clickhouse-fleet.py: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn clickhouse_answers_the_fleet_questions_as_metalift_audit_does_on_the_same_records() {
    let root = tempfile::tempdir().unwrap();
    let records = fleet_records(root.path());
    let log = records.to_str().unwrap();
    let ch = clickhouse(&records);

    // The job question: one row per process of job 42.
    let mut ours: Vec<Vec<String>> = metalift(&["audit", "--log", log, "--job", "42", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            vec![
                p["host"]["name"].as_str().unwrap().to_owned(),
                p["host"]["labels"]["image"].as_str().unwrap().to_owned(),
                p["exe"].as_str().unwrap().to_owned(),
                p["rule"].as_str().unwrap().to_owned(),
                p["result"].as_str().unwrap().to_owned(),
            ]
        })
        .collect();
    ours.sort();
    let theirs: Vec<Vec<String>> = ch["job"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            ["host", "image", "exe", "rule", "result"]
                .iter()
                .map(|k| r[k].as_str().unwrap().to_owned())
                .collect()
        })
        .collect();
    assert_eq!(ours.len(), 2, "{ours:?}");
    assert_eq!(theirs, ours, "ClickHouse's job answer is metalift audit's");

    // The summary by image and result, copies counted once.
    let summary = metalift(&[
        "audit",
        "--log",
        log,
        "--summary",
        "--by",
        "label:image,result",
        "--json",
    ]);
    let mut ours: Vec<(String, String, u64)> = summary["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| {
            (
                g["key"]["label:image"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                g["key"]["result"].as_str().unwrap_or_default().to_owned(),
                g["counts"]["processes"].as_u64().unwrap(),
            )
        })
        .collect();
    ours.sort();
    let theirs: Vec<(String, String, u64)> = ch["summary_by_image"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["image"].as_str().unwrap().to_owned(),
                r["result"].as_str().unwrap().to_owned(),
                r["processes"]
                    .as_str()
                    .map_or_else(|| r["processes"].as_u64().unwrap(), |s| s.parse().unwrap()),
            )
        })
        .collect();
    assert_eq!(
        ours,
        [
            ("img-a".into(), "applied".into(), 2),
            ("img-b".into(), "failed".into(), 1),
            ("img-b".into(), "no outcome".into(), 1),
        ],
        "{summary}"
    );
    assert_eq!(theirs, ours, "ClickHouse's summary is metalift audit's");
}
