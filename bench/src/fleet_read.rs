//! Issue 41 item 5: `metalift audit` on a collector's day of a fleet's records,
//! against jq answering the same questions in the same run.
//!
//! The input is generated: 200 guests (pairs of clones sharing a host name and
//! their daemons' decision ids), each with its daemon start, policy load and a
//! passing verification, then decisions and outcomes (90% applied, 5% failed, 5%
//! stock) across CI jobs, as RFC 5424 lines the way rsyslog's `%rawmsg%` keeps
//! what metaliftd sends (the forwarder's own frame), 1% of lines received twice.
//!
//! Three questions, each answered by `metalift audit` and by a jq 1.6 program that
//! reads the same file (`-R`, the syslog header cut, `fromjson`) and joins decision
//! and outcome by daemon run and decision id as metalift does:
//! 1. a job's processes with their outcomes (`--job J --json`);
//! 2. the summary by image (`--summary --by label:image`);
//! 3. the matrix rows: chip × macOS build × image × executable
//!    (`--summary --by chip,os,label:image,exe`).
//!
//! Wall time, CPU and peak RSS of each process come from GNU time (`/usr/bin/time`).
//! jq reads the file's first [`JQ_MEGABYTES`] MB (cut at a line); the ratio is of
//! throughputs (MB/s), and both tools' answers on that prefix are compared.
#![forbid(unsafe_code)]

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::SystemTime;

use anyhow::Context as _;
use metalift_daemon::audit::forward::frame::{self, Header};
use metalift_daemon::audit::{Host, Record, Stamper};
use serde_json::json;

use crate::{Section, Target};

/// Guests writing to the collector.
const GUESTS: usize = 200;

/// Decisions per CI job (across all guests).
const PER_JOB: u64 = 20_000;

/// The job the first question asks about (within jq's prefix of the file).
const JOB: u64 = 1;

/// How much of the file jq reads: its throughput is measured on this prefix (jq
/// streams, so its rate does not depend on the length; on the whole gigabyte it
/// would take a quarter of an hour per question on this machine).
const JQ_MEGABYTES: u64 = 100;

/// One generated guest.
struct Guest {
    stamper: Stamper,
    header: Header,
    next_decision: u64,
}

fn record(value: serde_json::Value) -> anyhow::Result<Record> {
    Ok(serde_json::from_value(value)?)
}

fn time_of(n: u64) -> String {
    let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(1_796_000_000_000 + n * 7);
    humantime::format_rfc3339_micros(t).to_string()
}

/// Writes the collector's file of at least `bytes` bytes; returns the lines written.
pub fn generate(path: &Path, bytes: u64) -> anyhow::Result<u64> {
    let mut out = BufWriter::with_capacity(1 << 20, File::create(path)?);
    let chips = ["Apple M2 (Virtual)", "Apple M4 Pro (Virtual)"];
    let builds = ["24A335", "24B83", "25A354"];
    let mut guests: Vec<Guest> = (0..GUESTS)
        .map(|i| {
            let name = format!("ci-runner-{:03}", i / 2);
            let stamper = Stamper::with_host(Host {
                name: name.clone(),
                boot_id: Some(format!(
                    "{:08x}-4e1f-4a8e-9d3c-{:012x}",
                    0x1000_0000 + i * 7919,
                    i
                )),
                labels: [
                    ("image".to_owned(), format!("macos-15-ci-{}", i % 5)),
                    ("pool".to_owned(), "ci".to_owned()),
                ]
                .into(),
                pid: Some(412),
                os_build: Some(builds[i % builds.len()].to_owned()),
                instance: None,
            });
            Guest {
                stamper,
                header: Header {
                    hostname: name,
                    pid: 412,
                },
                // Booted together: every daemon drew the same decision-id base.
                next_decision: 1_796_045_217_947_117,
            }
        })
        .collect();
    let mut written = 0u64;
    let mut lines = 0u64;
    let mut frame_buf = Vec::new();
    let mut held: Vec<(u64, Vec<u8>)> = Vec::new();
    let emit = |line: &[u8], out: &mut BufWriter<File>, lines: &mut u64| -> anyhow::Result<u64> {
        out.write_all(line)?;
        out.write_all(b"\n")?;
        *lines += 1;
        Ok(line.len() as u64 + 1)
    };
    let push = |g: &Guest, r: &Record, frame_buf: &mut Vec<u8>| -> anyhow::Result<Vec<u8>> {
        let line = g.stamper.line(r)?;
        let line = line.strip_suffix(b"\n").unwrap_or(&line);
        frame_buf.clear();
        frame::push(frame_buf, &g.header, line);
        // rsyslog's %rawmsg%: the message without RFC 6587's length prefix.
        let at = frame_buf.iter().position(|&b| b == b' ').unwrap_or(0) + 1;
        Ok(frame_buf[at..].to_vec())
    };
    for (i, g) in guests.iter().enumerate() {
        let chip = chips[i % chips.len()];
        let first = [
            record(
                json!({"kind": "daemon_start", "time": time_of(0), "version": "0.1.0",
                "pid": 412, "policy": "/etc/metalift/policy.toml", "listen": "xpc"}),
            )?,
            record(json!({"kind": "policy_loaded", "time": time_of(0),
                "path": "/etc/metalift/policy.toml", "sha256": "ab".repeat(32), "rules": 3,
                "mode": "enforce", "warnings": [], "reason": "start"}))?,
            record(
                json!({"kind": "verification", "time": time_of(1), "profile": "apple7",
                "apple_family_max": 7, "max_threadgroup_memory": 32768,
                "recommended_working_set": null, "host_chip": chip,
                "os_build": g.stamper.host().os_build, "metalift_version": "0.1.0",
                "passed": true, "kernels": [], "recorded_by_uid": 0}),
            )?,
        ];
        for r in &first {
            let line = push(g, r, &mut frame_buf)?;
            written += emit(&line, &mut out, &mut lines)?;
        }
    }
    let mut n = 0u64;
    while written < bytes {
        let i = (n as usize) % GUESTS;
        let g = &mut guests[i];
        g.next_decision += 1;
        let id = g.next_decision;
        let job = n / PER_JOB;
        let exe = [
            "/opt/llama.cpp/bin/llama-server",
            "/opt/llama.cpp/bin/llama-bench",
            "/usr/local/bin/whisper-cli",
        ][(n % 3) as usize];
        let decision = record(json!({
            "kind": "decision", "time": time_of(n), "decision_id": id, "pid": 4000 + (n % 30000),
            "uid": 501, "exe": exe, "sha256": null, "team_id": null, "signing_id": null,
            "cdhash": null, "anchor": null, "identity_error": null, "parent_exe": "/bin/zsh",
            "ancestors": [3999, 1], "rule": "llama-cpp",
            "action": "unlock", "profile": "apple7", "mode": "enforce", "apple_family_max": 7,
            "would_unlock": false, "host_chip": chips[i % chips.len()],
            "policy_sha256": "ab".repeat(32), "latency_us": 90, "transport": "xpc",
            "advisory": {"shim_version": "0.1.0", "arch": "arm64", "claimed_executable": null,
                "job": {"GITHUB_RUN_ID": job.to_string()}},
        }))?;
        let (result, reason) = match n % 20 {
            0 => ("failed", "supportsFamily: not found"),
            1 => ("stock", "told to stay stock"),
            _ => ("applied", ""),
        };
        let outcome = record(json!({
            "kind": "outcome", "time": time_of(n + 1), "decision_id": id, "pid": 4000 + (n % 30000),
            "exe": exe, "result": result, "reason": reason, "device_class": "AppleParavirtDevice",
            "stock": {"families": ["apple5"], "threadgroup_memory": 32768, "working_set": 0},
            "effective": {"families": ["apple7"], "threadgroup_memory": 32768, "working_set": 0},
        }))?;
        for r in [&decision, &outcome] {
            let line = push(g, r, &mut frame_buf)?;
            written += emit(&line, &mut out, &mut lines)?;
            // 1% of lines are received twice, a few lines later.
            if lines % 100 == 0 {
                held.push((lines + 5, line));
            }
        }
        while held.first().is_some_and(|(at, _)| *at <= lines) {
            let (_, line) = held.remove(0);
            written += emit(&line, &mut out, &mut lines)?;
        }
        n += 1;
    }
    out.flush()?;
    Ok(lines)
}

/// One run of a command: wall seconds, CPU seconds, peak RSS in KiB, its output.
struct Run {
    wall: f64,
    cpu: f64,
    max_rss_kib: u64,
    stdout: Vec<u8>,
}

fn timed(program: &Path, args: &[&str]) -> anyhow::Result<Run> {
    let stats = tempfile::NamedTempFile::new()?;
    let out = Command::new("/usr/bin/time")
        .arg("-o")
        .arg(stats.path())
        .args(["-f", "%e %U %S %M"])
        .arg(program)
        .args(args)
        .output()
        .context("running /usr/bin/time (Debian's `time` package; scripts/setup.sh installs it)")?;
    anyhow::ensure!(
        out.status.success(),
        "{} {args:?} failed: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(stats.path())?;
    let f: Vec<f64> = text
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    anyhow::ensure!(f.len() == 4, "unexpected GNU time output {text:?}");
    Ok(Run {
        wall: f[0],
        cpu: f[1] + f[2],
        max_rss_kib: f[3] as u64,
        stdout: out.stdout,
    })
}

/// jq's join (by daemon run and decision id, as metalift joins) as a `reduce`
/// (jq updates its state in place there; a `foreach` copied it per record and ran
/// at 1 MB/s): `on_decision` keeps what a decision contributes under its key (or
/// `empty` to skip it), `on_outcome` folds `$d` (that value) and `$r` (the
/// outcome) into the state, `finish` prints it.
fn jq_program(on_decision: &str, on_outcome: &str, finish: &str) -> String {
    format!(
        r#"def key: (.id | split("-")[0]) + ":" + (.decision_id | tostring);
reduce (inputs | .[index("{{"):] | fromjson?) as $r ({{w: {{}}, out: [], c: {{}}}};
  if $r.kind == "decision" then
    ([$r | {on_decision}] | first) as $v | if $v == null then . else .w[$r | key] = $v end
  elif $r.kind == "outcome" then ($r | key) as $k
    | if .w[$k] then .w[$k] as $d | {on_outcome} | del(.w[$k]) else . end
  else . end) | {finish}"#
    )
}

/// The first `megabytes` MB of `file`, cut after a newline, as a new file.
fn prefix(file: &Path, megabytes: u64) -> anyhow::Result<PathBuf> {
    use std::io::{BufRead, BufReader};
    let out_path = file.with_extension("prefix.log");
    let mut out = BufWriter::new(File::create(&out_path)?);
    let mut written = 0u64;
    for line in BufReader::new(File::open(file)?).split(b'\n') {
        let line = line?;
        out.write_all(&line)?;
        out.write_all(b"\n")?;
        written += line.len() as u64 + 1;
        if written >= megabytes * 1_000_000 {
            break;
        }
    }
    out.flush()?;
    Ok(out_path)
}

/// Runs the benchmark on a generated file of `megabytes` MB in `dir`.
pub fn run(cli: &Path, megabytes: u64, rounds: usize) -> anyhow::Result<Section> {
    let dir = tempfile::tempdir()?;
    let file: PathBuf = dir.path().join("metalift-audit.log");
    let lines = generate(&file, megabytes * 1_000_000)?;
    let size = std::fs::metadata(&file)?.len();
    let log = file.to_str().context("temp path is not UTF-8")?;
    let job = JOB.to_string();
    let jq = Path::new("jq");
    let short = prefix(&file, JQ_MEGABYTES)?;
    let short_log = short.to_str().context("temp path is not UTF-8")?;
    let short_mb = std::fs::metadata(&short)?.len() as f64 / 1e6;
    let job_value = format!(
        r#"select(.advisory.job.GITHUB_RUN_ID == "{job}") | {{exe, rule, host: .host.name, boot: .host.boot_id}}"#
    );
    let questions: [(&str, Vec<&str>, String); 3] = [
        (
            "a job's processes with their outcomes",
            vec!["--job", &job, "--json"],
            jq_program(&job_value, ".out += [$d + {result: $r.result}]", ".out[]"),
        ),
        (
            "summary by image",
            vec!["--summary", "--by", "label:image", "--json"],
            jq_program(
                ".host.labels.image",
                r#".c[$d + " " + $r.result] += 1"#,
                ".c",
            ),
        ),
        (
            "matrix rows (chip × macOS build × image × executable)",
            vec!["--summary", "--by", "chip,os,label:image,exe", "--json"],
            jq_program(
                r#"[.host_chip, .host.os_build, .host.labels.image, .exe] | join(" ")"#,
                r#".c[$d + " " + $r.result] += 1"#,
                ".c",
            ),
        ),
    ];
    let mb = size as f64 / 1e6;
    let mut body = format!(
        "`metalift audit` and jq 1.6 in one run on a generated collector file: {mb:.0} MB, \
         {lines} RFC 5424 lines from {GUESTS} guests (clones in pairs: same host name; every \
         daemon drew the same decision ids), 1% of lines twice. metalift reads the whole \
         file (the median of {rounds} runs); jq reads its first {short_mb:.0} MB once per \
         question (a `reduce` joining decision and outcome by daemon run and decision id as \
         metalift does, without deduplicating), and the ratio is of throughputs. Wall time, \
         CPU and peak RSS by GNU time.\n\n\
         | question | metalift, {mb:.0} MB: wall, MB/s, CPU, peak RSS | jq, {short_mb:.0} MB: wall, MB/s, CPU, peak RSS | metalift vs jq (MB/s) |\n\
         |---|---|---|---|\n"
    );
    let mut targets = Vec::new();
    for (name, question, program) in &questions {
        let with_log = |log: &'_ str| -> Vec<String> {
            ["audit", "--log", log]
                .iter()
                .map(|s| (*s).to_owned())
                .chain(question.iter().map(|s| (*s).to_owned()))
                .collect()
        };
        let args = with_log(log);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let mut runs = Vec::new();
        for _ in 0..rounds.max(1) {
            runs.push(timed(cli, &args)?);
        }
        runs.sort_by(|a, b| a.wall.total_cmp(&b.wall));
        let ours = &runs[runs.len() / 2];
        let peak = runs.iter().map(|r| r.max_rss_kib).max().unwrap_or(0);
        let theirs = timed(jq, &["-cnR", program, short_log])?;
        let our_rate = mb / ours.wall.max(0.001);
        let their_rate = short_mb / theirs.wall.max(0.001);
        let ratio = our_rate / their_rate;
        body.push_str(&format!(
            "| {name} | {:.2} s, **{our_rate:.0} MB/s**, {:.2} s, {:.1} MiB | {:.1} s, {their_rate:.1} MB/s, {:.1} s, {:.0} MiB | **{ratio:.0}×** |\n",
            ours.wall,
            ours.cpu,
            peak as f64 / 1024.0,
            theirs.wall,
            theirs.cpu,
            theirs.max_rss_kib as f64 / 1024.0,
        ));
        if name.starts_with("a job") {
            // The same question on jq's prefix: the answers must agree.
            let short_args = with_log(short_log);
            let short_args: Vec<&str> = short_args.iter().map(String::as_str).collect();
            let ours_n = String::from_utf8_lossy(&timed(cli, &short_args)?.stdout)
                .lines()
                .count();
            let theirs_n = String::from_utf8_lossy(&theirs.stdout).lines().count();
            body.push_str(&format!(
                "| (answers on jq's {short_mb:.0} MB) | {ours_n} processes | {theirs_n} processes | {} |\n",
                if ours_n == theirs_n { "agree" } else { "**differ**" }
            ));
            targets.push(Target {
                item: "41.5 job query throughput".into(),
                target: "≥ 250 MB/s".into(),
                measured: format!("{our_rate:.0} MB/s"),
                met: our_rate >= 250.0,
            });
        }
        targets.push(Target {
            item: format!("41.5 {name}: vs jq"),
            target: "≥ 10× jq's throughput".into(),
            measured: format!("{ratio:.0}× ({our_rate:.0} vs {their_rate:.1} MB/s)"),
            met: ratio >= 10.0,
        });
        targets.push(Target {
            item: format!("41.5 {name}: peak RSS"),
            target: "≤ 100 MiB".into(),
            measured: format!("{:.1} MiB", peak as f64 / 1024.0),
            met: peak <= 100 * 1024,
        });
    }
    Ok(Section {
        title: "Reading a fleet's records (issue 41)".into(),
        body,
        targets,
    })
}
