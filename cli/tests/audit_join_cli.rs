//! `metalift audit`'s joined view (one line per process) against real binaries:
//! the join, each filter, `--summary`, newer record kinds, permission denied,
//! `--follow` starting at the end, a closed pipe, and a large log read in bounded memory.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

use metalift_daemon::audit::{Advisory, DecisionRecord, OutcomeRecord, Record};
use metalift_policy::wire::{Answers, Outcome, OutcomeResult};
use serde_json::Value;

const LLAMA: &str = "/opt/llama.cpp/bin/llama-server";

fn ago(secs: u64) -> SystemTime {
    SystemTime::now() - Duration::from_secs(secs)
}

fn decision_at(id: u64, time: SystemTime, exe: &str, rule: Option<&str>, action: &str) -> Record {
    Record::Decision(DecisionRecord {
        time,
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
        policy_sha256: format!("{:02x}", id % 256).repeat(32),
        latency_us: 90,
        transport: "unix".into(),
        advisory: Advisory::default(),
    })
}

fn outcome_at(id: u64, time: SystemTime, exe: &str, result: OutcomeResult, reason: &str) -> Record {
    Record::Outcome(OutcomeRecord::new(
        time,
        4000 + id as i32,
        exe.to_owned(),
        &Outcome {
            decision_id: id,
            result,
            reason: reason.to_owned(),
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

fn write_log(path: &Path, records: &[Record]) {
    let mut text = Vec::new();
    for r in records {
        text.extend(r.to_line().unwrap());
    }
    std::fs::write(path, text).unwrap();
}

/// Four processes: 1 applied (3 h ago), 2 stock without an outcome (2 h ago),
/// 3 failed (5 min ago), 4 stock without an outcome (2 min ago).
fn fabricate(dir: &Path) -> PathBuf {
    let path = dir.join("audit.jsonl");
    write_log(
        &path,
        &[
            decision_at(1, ago(3 * 3600), LLAMA, Some("llama-cpp"), "unlock"),
            outcome_at(1, ago(3 * 3600 - 1), LLAMA, OutcomeResult::Applied, ""),
            decision_at(2, ago(2 * 3600), "/usr/bin/python3", None, "stock"),
            decision_at(3, ago(300), LLAMA, Some("llama-cpp"), "unlock"),
            outcome_at(
                3,
                ago(299),
                LLAMA,
                OutcomeResult::Failed,
                "supportsFamily: not found",
            ),
            decision_at(
                4,
                ago(120),
                "/usr/local/bin/whisper",
                Some("never"),
                "stock",
            ),
        ],
    );
    path
}

fn audit(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .arg("audit")
        .args(args)
        .env("TZ", "UTC")
        .output()
        .unwrap()
}

fn ok_lines(out: &Output) -> Vec<String> {
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

/// (decision id, result) of each joined JSON line.
fn joined(log: &Path, args: &[&str]) -> Vec<(u64, String)> {
    let mut all = vec!["--log", log.to_str().unwrap(), "--json"];
    all.extend_from_slice(args);
    ok_lines(&audit(&all))
        .iter()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["decision_id"].as_u64().unwrap(),
                v["result"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn r(id: u64, result: &str) -> (u64, String) {
    (id, result.to_owned())
}

#[test]
fn each_decision_is_one_line_with_its_outcome_or_no_outcome() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fabricate(tmp.path());
    assert_eq!(
        joined(&log, &[]),
        [
            r(1, "applied"),
            r(2, "no outcome"),
            r(3, "failed"),
            r(4, "no outcome")
        ]
    );
    let lines = ok_lines(&audit(&["--log", log.to_str().unwrap()]));
    for column in ["TIME", "PID", "RULE", "ACTION", "RESULT", "POLICY", "EXE"] {
        assert!(lines[0].contains(column), "{}", lines[0]);
    }
    assert_eq!(lines.len(), 5, "{lines:#?}");
    let first = &lines[1];
    for cell in [
        "4001",
        "llama-cpp",
        "unlock",
        "applied",
        "010101010101",
        LLAMA,
    ] {
        assert!(first.contains(cell), "{cell} missing in {first}");
    }
    assert!(
        lines[3].contains("failed") && lines[3].contains("(supportsFamily: not found)"),
        "{}",
        lines[3]
    );
}

#[test]
fn filters_select_by_result_pid_decision_rule_action_and_exe() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fabricate(tmp.path());
    assert_eq!(joined(&log, &["--result", "applied"]), [r(1, "applied")]);
    assert_eq!(
        joined(&log, &["--result", "no-outcome"]),
        [r(2, "no outcome"), r(4, "no outcome")]
    );
    assert_eq!(joined(&log, &["--pid", "4003"]), [r(3, "failed")]);
    assert_eq!(joined(&log, &["--decision", "2"]), [r(2, "no outcome")]);
    assert_eq!(
        joined(&log, &["--rule", "llama-cpp"]),
        [r(1, "applied"), r(3, "failed")]
    );
    assert_eq!(
        joined(&log, &["--action", "stock"]),
        [r(2, "no outcome"), r(4, "no outcome")]
    );
    assert_eq!(joined(&log, &["--exe", "whisper"]), [r(4, "no outcome")]);
}

#[test]
fn since_and_until_take_rfc3339_times_and_durations() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fabricate(tmp.path());
    let hour_ago = humantime::format_rfc3339_seconds(ago(3600)).to_string();
    assert_eq!(
        joined(&log, &["--since", &hour_ago]),
        [r(3, "failed"), r(4, "no outcome")]
    );
    assert_eq!(
        joined(&log, &["--until", &hour_ago]),
        [r(1, "applied"), r(2, "no outcome")]
    );
    assert_eq!(
        joined(&log, &["--since", "150m", "--until", "1h"]),
        [r(2, "no outcome")]
    );
    let out = audit(&["--log", log.to_str().unwrap(), "--since", "soon"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("RFC 3339"));
}

#[test]
fn today_and_yesterday_start_at_local_midnight() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("audit.jsonl");
    // TZ=UTC for the child: local midnight is UTC midnight.
    let now = SystemTime::now();
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    let midnight = SystemTime::UNIX_EPOCH + Duration::from_secs(secs - secs % 86_400);
    let hours_before = |h: u64| midnight - Duration::from_secs(h * 3600);
    write_log(
        &path,
        &[
            decision_at(1, hours_before(36), "/a", None, "stock"),
            decision_at(2, hours_before(12), "/b", None, "stock"),
            decision_at(3, now, "/c", None, "stock"),
        ],
    );
    let ids =
        |args: &[&str]| -> Vec<u64> { joined(&path, args).into_iter().map(|(id, _)| id).collect() };
    assert_eq!(ids(&["--since", "today"]), [3]);
    assert_eq!(ids(&["--since", "yesterday"]), [2, 3]);
    assert_eq!(ids(&["--since", "yesterday", "--until", "today"]), [2]);
    assert_eq!(ids(&["--until", "yesterday"]), [1]);
}

#[test]
fn an_exe_given_as_a_symlink_matches_the_resolved_path_in_the_log() {
    let tmp = tempfile::tempdir().unwrap();
    let real = tmp.path().join("llama-server");
    std::fs::write(&real, "").unwrap();
    let real = real.canonicalize().unwrap();
    let link = tmp.path().join("llama");
    std::os::unix::fs::symlink(&real, &link).unwrap();
    let path = tmp.path().join("audit.jsonl");
    write_log(
        &path,
        &[
            decision_at(1, ago(5), real.to_str().unwrap(), None, "stock"),
            decision_at(2, ago(4), "/other", None, "stock"),
        ],
    );
    assert_eq!(
        joined(&path, &["--exe", link.to_str().unwrap()]),
        [r(1, "no outcome")]
    );
}

#[test]
fn summary_counts_by_result_rule_and_executable() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fabricate(tmp.path());
    let lines = ok_lines(&audit(&[
        "--log",
        log.to_str().unwrap(),
        "--summary",
        "--json",
    ]));
    let v: Value = serde_json::from_str(&lines[0]).unwrap();
    assert_eq!(v["processes"], 4);
    assert_eq!(v["by_result"]["applied"], 1);
    assert_eq!(v["by_result"]["failed"], 1);
    assert_eq!(v["by_result"]["no outcome"], 2);
    assert_eq!(v["by_rule"]["llama-cpp"], 2);
    assert_eq!(v["by_rule"]["(no rule)"], 1);
    assert_eq!(v["by_exe"][LLAMA], 2);
    let text = ok_lines(&audit(&["--log", log.to_str().unwrap(), "--summary"])).join("\n");
    assert!(text.contains("processes  4"), "{text}");
    assert!(text.contains("by rule"), "{text}");
}

#[test]
fn a_record_kind_from_a_newer_daemon_is_skipped_and_counted() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fabricate(tmp.path());
    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
    writeln!(
        f,
        "{{\"kind\":\"quota_exceeded\",\"time\":\"2026-01-01T00:00:00Z\",\"limit\":3}}"
    )
    .unwrap();
    let out = audit(&["--log", log.to_str().unwrap(), "--json"]);
    assert_eq!(ok_lines(&out).len(), 4);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("skipped 1 records of kinds"), "{stderr}");
}

#[test]
fn an_unreadable_log_is_permission_denied_not_missing() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fabricate(tmp.path());
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // Readable by nobody but root (mode 000); root reads anything, so then the
    // reader runs as nobody.
    std::fs::set_permissions(&log, std::fs::Permissions::from_mode(0o000)).unwrap();
    let mut cmd = if rustix::process::geteuid().is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_metalift"));
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_metalift"))
    };
    let out = cmd
        .args(["audit", "--log"])
        .arg(&log)
        .output()
        .expect("setpriv (util-linux) runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("permission denied"), "{stderr}");
    assert!(!stderr.contains("no audit log"), "{stderr}");
}

/// Kills the `--follow` child when the test ends, pass or fail.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn follow(log: &Path, extra: &[&str]) -> (Child, mpsc::Receiver<String>) {
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_metalift"))
            .args(["audit", "--follow", "--json", "--log"])
            .arg(log)
            .args(extra)
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
    (child, rx)
}

fn append(log: &Path, records: &[Record]) {
    let mut f = std::fs::OpenOptions::new().append(true).open(log).unwrap();
    for r in records {
        f.write_all(&r.to_line().unwrap()).unwrap();
    }
}

fn id_of(line: &str) -> u64 {
    serde_json::from_str::<Value>(line).unwrap()["decision_id"]
        .as_u64()
        .unwrap()
}

#[test]
fn follow_starts_at_the_end_without_replaying_history() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fabricate(tmp.path());
    let (_child, rx) = follow(&log, &[]);
    // Append new processes until the follower prints one (it may take a moment
    // to start): the first line it prints must be new, not history (ids 1..=4).
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut id = 10;
    let line = loop {
        append(
            &log,
            &[
                decision_at(id, ago(0), LLAMA, Some("llama-cpp"), "unlock"),
                outcome_at(id, ago(0), LLAMA, OutcomeResult::Applied, ""),
            ],
        );
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(500)) {
            break line;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no line from --follow"
        );
        id += 1;
    };
    assert!(id_of(&line) >= 10, "history was replayed: {line}");
}

#[test]
fn follow_with_n_shows_the_last_n_processes_first() {
    let tmp = tempfile::tempdir().unwrap();
    let log = fabricate(tmp.path());
    let (_child, rx) = follow(&log, &["-n", "2"]);
    // The last two decisions of the file are 3 and 4: 3 joins its outcome at once;
    // 4 has none and waits out the window (minutes); 1 and 2 are history.
    let first = id_of(&rx.recv_timeout(Duration::from_secs(20)).expect("a line"));
    assert_eq!(first, 3);
    append(
        &log,
        &[
            decision_at(11, ago(0), LLAMA, None, "stock"),
            outcome_at(11, ago(0), LLAMA, OutcomeResult::Stock, ""),
        ],
    );
    let second = id_of(&rx.recv_timeout(Duration::from_secs(20)).expect("a line"));
    assert_eq!(second, 11);
}

#[test]
fn a_closed_pipe_ends_audit_quietly() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("audit.jsonl");
    let records: Vec<Record> = (0..20_000)
        .map(|i| decision_at(i, ago(10), LLAMA, None, "stock"))
        .collect();
    write_log(&path, &records);
    let mut child = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["audit", "--log"])
        .arg(&path)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).unwrap();
    drop(stdout);
    let out = child.wait_with_output().unwrap();
    assert_quiet_pipe_end(&out);
}

/// Exit 0, or killed by SIGPIPE (a shell shows 141); never a panic (101).
pub fn assert_quiet_pipe_end(out: &Output) {
    use std::os::unix::process::ExitStatusExt;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        out.status.success() || out.status.signal() == Some(libc::SIGPIPE),
        "{:?}: {stderr}",
        out.status
    );
}

/// The peak resident memory of `child`, read from /proc while it runs (Linux).
fn peak_rss_kib(child: &mut std::process::Child) -> u64 {
    let status = format!("/proc/{}/status", child.id());
    let mut peak = 0;
    while child.try_wait().unwrap().is_none() {
        if let Ok(text) = std::fs::read_to_string(&status) {
            if let Some(kib) = text
                .lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            {
                peak = peak.max(kib);
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    peak
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "reads peak memory from /proc/<pid>/status (Linux)"
)]
fn a_large_log_is_joined_in_bounded_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("audit.jsonl");
    // 200,000 records: 100,000 processes, one in ten without an outcome.
    let start = ago(100_000);
    let mut text = Vec::with_capacity(90 << 20);
    for id in 0..100_000u64 {
        let t = start + Duration::from_millis(id * 500);
        text.extend(
            decision_at(id, t, LLAMA, Some("llama-cpp"), "unlock")
                .to_line()
                .unwrap(),
        );
        let result = if id % 10 == 0 {
            decision_at(1_000_000 + id, t, "/bin/other", None, "stock")
        } else {
            outcome_at(id, t, LLAMA, OutcomeResult::Applied, "")
        };
        text.extend(result.to_line().unwrap());
    }
    std::fs::write(&path, &text).unwrap();
    let size_mib = text.len() >> 20;
    drop(text);

    let mut child = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["audit", "--log"])
        .arg(&path)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    let peak = peak_rss_kib(&mut child);
    eprintln!(
        "metalift audit (joined, text) over {size_mib} MiB / 200,000 records: peak RSS {} MiB, {:.1} s",
        peak >> 10,
        started.elapsed().as_secs_f64()
    );
    assert!(child.wait().unwrap().success());
    assert!(
        peak < 40 * 1024,
        "peak RSS {peak} KiB for a {size_mib} MiB log: not streaming"
    );

    let out = audit(&["--log", path.to_str().unwrap(), "--summary", "--json"]);
    let v: Value = serde_json::from_str(&ok_lines(&out)[0]).unwrap();
    assert_eq!(v["processes"], 110_000);
    assert_eq!(v["by_result"]["applied"], 90_000);
    assert_eq!(v["by_result"]["no outcome"], 20_000);
}

#[test]
fn follow_with_n_reaches_into_the_rotated_file_when_the_live_one_is_short() {
    let tmp = tempfile::tempdir().unwrap();
    let live = tmp.path().join("audit.jsonl");
    write_log(
        &tmp.path().join("audit.jsonl.1"),
        &[
            decision_at(1, ago(30), LLAMA, None, "stock"),
            decision_at(2, ago(20), LLAMA, None, "stock"),
            decision_at(3, ago(10), LLAMA, None, "stock"),
        ],
    );
    write_log(&live, &[decision_at(4, ago(5), LLAMA, None, "stock")]);
    let (_child, rx) = follow(&live, &["--records", "-n", "3"]);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(id_of(
            &rx.recv_timeout(Duration::from_secs(20)).expect("a line"),
        ));
    }
    assert_eq!(ids, [2, 3, 4]);
    // Nothing older comes after them.
    assert!(rx.recv_timeout(Duration::from_millis(800)).is_err());
}
