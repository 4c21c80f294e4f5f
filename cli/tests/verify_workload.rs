//! `metalift verify --workload -- CMD…` (issue 32 item 4): the workload runs stock
//! and unlocked and its own speed-up is in the receipt. On Linux the workload is
//! `metalift-llama-bench`, the probe package's test double for llama.cpp's
//! llama-bench (`probe/tests/llama_bench/`: a recorded `-o json` output, sped up
//! when the simulated device answers llama.cpp's flags), unlocked by the real
//! shim through verify's throw-away daemon.
//!
//! Needs the workspace built first (`cargo build --workspace --all-targets`, as
//! scripts/test.sh does: the double is the probe package's example).
#![cfg(target_os = "linux")]

mod support;

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{simmetal_normal, workspace_binary, DaemonDir};

const CHIP: &str = "Apple M2 (Virtual)";
const BUILD: &str = "24A335";

fn write_policy(dir: &DaemonDir) {
    std::fs::write(
        dir.policy(),
        "version = 1\n\n[profile.apple7]\napple_family_max = 7\nrequire_verified = true\n",
    )
    .expect("policy");
}

/// The llama-bench test double, as a workload (it prints its recorded pp512 and
/// tg128 whatever it is asked).
fn llama_bench() -> Vec<String> {
    // The probe package's example: target/debug/examples/, beside metalift-probe's.
    let examples = workspace_binary("metalift-probe").with_file_name("examples");
    let bench = examples.join("metalift-llama-bench");
    assert!(
        bench.is_file(),
        "{} is missing: run `cargo build --workspace --all-targets` first (scripts/test.sh does)",
        bench.display()
    );
    [
        bench.display().to_string(),
        "-m".into(),
        "tiny.gguf".into(),
        "-o".into(),
        "json".into(),
    ]
    .into()
}

/// `metalift verify --profile apple7 --json ARGS --workload -- WORKLOAD`.
fn verify(
    dir: &DaemonDir,
    args: &[&str],
    workload: &[String],
) -> (Output, Option<Value>, Duration) {
    let started = Instant::now();
    let output = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["verify", "--profile", "apple7", "--json", "--policy"])
        .arg(dir.policy())
        .arg("--audit-log")
        .arg(dir.audit_log())
        .args(args)
        .arg("--workload")
        .arg("--")
        .args(workload)
        .env("METALIFT_HOST_CHIP_BRAND", CHIP)
        .env("METALIFT_HOST_OS_BUILD", BUILD)
        .env("LD_LIBRARY_PATH", simmetal_normal())
        .env("METALIFT_TIMEOUT_MS", "10000")
        .env_remove("LD_PRELOAD")
        .env_remove("METALIFT_DISABLE")
        .env_remove("METALIFT_VERIFY_BREAK_CONTROL")
        .output()
        .expect("run metalift verify");
    let took = started.elapsed();
    let json = serde_json::from_slice(&output.stdout).ok();
    (output, json, took)
}

fn record(output: &Output, json: Option<Value>) -> Value {
    json.unwrap_or_else(|| {
        panic!(
            "metalift verify printed no JSON: {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        )
    })
}

fn test_row<'a>(workload: &'a Value, name: &str) -> &'a Value {
    workload["tests"]
        .as_array()
        .and_then(|t| t.iter().find(|t| t["test"] == name))
        .unwrap_or_else(|| panic!("no test {name} in {workload}"))
}

/// The verification file's lines, each a whole record.
fn file_records(dir: &DaemonDir) -> Vec<Value> {
    let text = std::fs::read_to_string(dir.path("etc/verifications.jsonl")).unwrap_or_default();
    assert!(text.is_empty() || text.ends_with('\n'), "{text}");
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

#[test]
fn given_the_llama_bench_double_the_receipt_records_prompt_and_generation_speedups() {
    let dir = DaemonDir::new("verify-workload");
    write_policy(&dir);
    let (output, json, _) = verify(&dir, &[], &llama_bench());
    let record = record(&output, json);
    assert!(output.status.success(), "{record}");
    assert_eq!(record["passed"], true, "{record}");
    let w = &record["receipt"]["workload"];
    assert_eq!(w["measure"], "llama_bench", "{w}");
    assert_eq!(w["runs"], 3, "{w}");
    assert_eq!(w["result"], "pass", "{w}");
    // The double's rates: pp 431.86 -> 4786.70 (11.1x), tg 12.63 -> 206.60 (16.4x).
    let pp = test_row(w, "pp512");
    let tg = test_row(w, "tg128");
    for (row, stock, fast) in [(pp, 431.86, 4786.70), (tg, 12.63, 206.60)] {
        assert_eq!(row["unit"], "tokens/s", "{row}");
        assert_eq!(row["stock"].as_array().map(Vec::len), Some(3), "{row}");
        assert_eq!(row["unlocked"].as_array().map(Vec::len), Some(3), "{row}");
        let s = row["stock_median"].as_f64().expect("stock median");
        let u = row["unlocked_median"].as_f64().expect("unlocked median");
        assert!(s > stock * 0.8 && s <= stock * 1.01, "{row}");
        assert!(u > fast * 0.5 && u <= fast * 1.01, "{row}");
        let speedup = row["speedup"].as_f64().expect("speedup");
        assert!((speedup - u / s).abs() < 1e-9, "{row}");
    }
    let pp_x = w["pp_speedup"].as_f64().expect("pp_speedup");
    let tg_x = w["tg_speedup"].as_f64().expect("tg_speedup");
    assert!(pp_x > 5.0 && tg_x > 8.0 && tg_x > pp_x, "{w}");
    assert_eq!(w["speedup"].as_f64(), Some(pp_x), "{w}");
    // The same receipt in the verification file and the audit log.
    assert_eq!(file_records(&dir)[0]["receipt"]["workload"], *w);
    assert_eq!(dir.records_of("verification")[0]["receipt"]["workload"], *w);
}

#[test]
fn a_speedup_below_min_speedup_fails_the_verification_naming_the_test() {
    let dir = DaemonDir::new("verify-minspeedup");
    write_policy(&dir);
    // pp's modelled speed-up is 11.1x, tg's 16.4x: 13 sits between them.
    let (output, json, _) = verify(
        &dir,
        &["--workload-runs", "1", "--min-speedup", "13"],
        &llama_bench(),
    );
    let record = record(&output, json);
    assert_eq!(output.status.code(), Some(1), "{record}");
    assert_eq!(record["passed"], false, "{record}");
    let w = &record["receipt"]["workload"];
    assert_eq!(w["result"], "below_min_speedup", "{w}");
    assert_eq!(w["min_speedup"], 13.0, "{w}");
    let detail = w["detail"].as_str().unwrap_or("");
    assert!(detail.contains("pp512"), "{w}");
    assert!(!detail.contains("tg128"), "{w}");
    // Every kernel passed: only the workload fails it, and the record says why.
    assert!(record["kernels"]
        .as_array()
        .unwrap()
        .iter()
        .all(|k| k["result"] == "pass"));
    let error = record["error"].as_str().unwrap_or("");
    assert!(error.contains("workload: below_min_speedup"), "{record}");
    let file = file_records(&dir);
    assert_eq!(file.len(), 1);
    assert_eq!(file[0]["passed"], false);
}

#[test]
fn a_workload_that_hangs_is_killed_at_the_timeout_with_its_children() {
    let dir = DaemonDir::new("verify-workload-hang");
    write_policy(&dir);
    let pid_file = dir.path("workload.pid");
    // The shell's child holds its pipes and does not know the deadline.
    let script = format!(
        "sleep 600 & echo $! > {}; wait; echo never",
        pid_file.display()
    );
    let workload = ["sh".to_owned(), "-c".to_owned(), script];
    let (output, json, took) = verify(&dir, &["--timeout", "8"], &workload);
    let record = record(&output, json);
    assert_eq!(output.status.code(), Some(1), "{record}");
    assert!(took < Duration::from_secs(30), "took {took:?}: not bounded");
    assert_eq!(record["passed"], false, "{record}");
    let w = &record["receipt"]["workload"];
    assert_eq!(w["result"], "hung", "{w}");
    assert!(
        w["detail"]
            .as_str()
            .unwrap_or("")
            .contains("stock run 1 of 3"),
        "{w}"
    );
    // The shell led a process group of its own; its `sleep` went with it.
    let sleep: u32 = std::fs::read_to_string(&pid_file)
        .expect("the workload started")
        .trim()
        .parse()
        .expect("a pid");
    // A killed process lingers as a zombie until init reaps it: give it a moment.
    let deadline = Instant::now() + Duration::from_secs(10);
    while alive(sleep) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        !alive(sleep),
        "the workload's child {sleep} was left running"
    );
    // One whole record in the file, nothing half-written.
    assert_eq!(file_records(&dir).len(), 1);
}

/// Whether `pid` is a process that is not a zombie (`/proc/PID/stat`: the state
/// is the field after the parenthesised name).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

#[test]
fn any_other_command_is_measured_by_wall_time_and_a_missing_one_records_nothing() {
    let dir = DaemonDir::new("verify-workload-wall");
    write_policy(&dir);
    let workload = ["sh".to_owned(), "-c".to_owned(), "echo not json".to_owned()];
    let (output, json, _) = verify(&dir, &["--workload-runs", "2"], &workload);
    let record = record(&output, json);
    assert!(output.status.success(), "{record}");
    let w = &record["receipt"]["workload"];
    assert_eq!(w["measure"], "wall_time", "{w}");
    let wall = test_row(w, "wall");
    assert_eq!(wall["unit"], "ms", "{wall}");
    assert_eq!(wall["stock"].as_array().map(Vec::len), Some(2), "{wall}");
    assert!(
        w["pp_speedup"].is_null() && w["speedup"].as_f64().is_some(),
        "{w}"
    );

    let (output, json, _) = verify(&dir, &[], &["no-such-workload-here".to_owned()]);
    assert_eq!(output.status.code(), Some(2));
    // --json: the error is a JSON object on stdout.
    let error = json.map(|j| j["error"].to_string()).unwrap_or_default();
    assert!(
        error.contains("no-such-workload-here is not on PATH"),
        "{error}"
    );
    assert_eq!(
        file_records(&dir).len(),
        1,
        "a verification that could not run records nothing"
    );
}
