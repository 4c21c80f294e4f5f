//! `metalift demo`: the whole loop on this machine, in one command.
//!
//! Starts a throw-away `metaliftd` (sibling of this executable) on a temporary
//! socket and audit log, with a policy written here that unlocks `metalift-probe`
//! by name and keeps a copy of the probe named `untrusted-probe` stock. Then runs
//! the probe, with libmetalift injected through the loader variable:
//!
//! 1. without the shim (the paravirtual GPU's own answers: "before");
//! 2. as the allowed executable (`metalift-probe`);
//! 3. as a denied one (`untrusted-probe`, an explicit `stock = true` rule);
//! 4. under a second daemon whose policy is in `monitor` mode;
//! 5. with the daemons stopped (stock, promptly);
//!
//! and prints a before/after table (Apple family, threadgroup memory, the three
//! llama.cpp flags) followed by the audit records both daemons wrote. On Linux the
//! probe runs on the simulated Metal; on macOS on the real one.
//!
//! The policy files live in a temporary directory owned by the user, so the
//! daemons run with `--allow-insecure-owner` (a development flag; a real install
//! keeps `/etc/metalift/policy.toml` root-owned). Everything needed comes from
//! `cargo build --workspace`: `metaliftd`, `metalift-probe` and libmetalift sit
//! next to this executable.

use std::io::BufRead;
use std::path::Path;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::exec::INSERT_VAR;
use crate::tools::{start_daemon, TempDir, Tools};

/// Arguments of `metalift demo`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Keep the temporary directory (policies, sockets, audit logs) and print its path.
    #[arg(long)]
    pub keep: bool,
    /// The shim's verdict deadline for the probe runs (METALIFT_TIMEOUT_MS);
    /// default: the shim's own.
    #[arg(long, value_name = "MS")]
    pub timeout_ms: Option<u64>,
    /// Print one JSON object (the cases and whether they came out as expected).
    #[arg(long)]
    pub json: bool,
}

const ENFORCE_POLICY: &str = r#"# metalift demo: unlock the probe by name, refuse its renamed copy.
version = 1
mode = "enforce"

[profile.apple7]
apple_family_max = 7
max_threadgroup_memory = 32768

[[rule]]
id = "demo-probe"
name = "metalift-probe"
unlock = "apple7"

[[rule]]
id = "demo-untrusted"
name = "untrusted-probe"
stock = true
"#;

/// The same rules, in monitor mode: decide and record, change nothing.
fn monitor_policy() -> String {
    ENFORCE_POLICY.replace("mode = \"enforce\"", "mode = \"monitor\"")
}

/// Runs `metalift demo`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let tools = Tools::find(args.timeout_ms)?;
    let dir = TempDir::create()?;
    let result = demo(&tools, dir.path(), args.json);
    if args.keep {
        if !args.json {
            println!("\nkept: {}", dir.path().display());
        }
        std::mem::forget(dir);
    }
    result
}

fn demo(tools: &Tools, dir: &Path, json: bool) -> anyhow::Result<ExitCode> {
    let untrusted = dir.join("untrusted-probe");
    std::fs::copy(&tools.probe, &untrusted).context("copying the probe")?;

    let (enforce_dir, enforce) = start_daemon(tools, dir, "enforce", ENFORCE_POLICY)?;
    let (monitor_dir, monitor) = start_daemon(tools, dir, "monitor", &monitor_policy())?;

    let mut rows = vec![Row::run("before (no shim)", &tools.probe, None, tools)?];
    rows.push(Row::run(
        "allowed: metalift-probe",
        &tools.probe,
        Some(enforce.socket()),
        tools,
    )?);
    rows.push(Row::run(
        "denied: untrusted-probe",
        &untrusted,
        Some(enforce.socket()),
        tools,
    )?);
    rows.push(Row::run(
        "monitor mode: metalift-probe",
        &tools.probe,
        Some(monitor.socket()),
        tools,
    )?);
    let audit_logs = [
        ("enforce", enforce_dir.audit_log()),
        ("monitor", monitor_dir.audit_log()),
    ];
    let stopped_socket = enforce.socket().to_owned();
    enforce.stop().context("stopping the enforce daemon")?;
    monitor.stop().context("stopping the monitor daemon")?;
    rows.push(Row::run(
        "daemon stopped: metalift-probe",
        &tools.probe,
        Some(&stopped_socket),
        tools,
    )?);

    let expected = [5, 7, 5, 5, 5];
    let apple: Vec<u64> = rows.iter().map(|r| r.apple_family).collect();
    let ok = apple == expected && rows[1].flags == [true; 3] && !rows[1].metal3;
    if json {
        let cases: Vec<serde_json::Value> = rows
            .iter()
            .map(|r| {
                serde_json::json!({
                    "case": r.case,
                    "apple_family": r.apple_family,
                    "threadgroup_memory": r.threadgroup_memory,
                    "has_simdgroup_reduction": r.flags[0],
                    "has_simdgroup_mm": r.flags[1],
                    "has_bfloat": r.flags[2],
                    "metal3": r.metal3,
                    "ms": r.elapsed.as_millis(),
                })
            })
            .collect();
        println!("{}", serde_json::json!({"ok": ok, "cases": cases}));
        return Ok(if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        });
    }
    print_table(&rows);
    for (name, log) in &audit_logs {
        println!("\naudit records ({name} daemon, {}):", log.display());
        match std::fs::File::open(log) {
            Ok(file) => {
                for line in std::io::BufReader::new(file).lines() {
                    println!("  {}", line.context("reading the audit log")?);
                }
            }
            Err(err) => println!("  (none: {err})"),
        }
    }

    if ok {
        println!("\nOK: only the allowed executable saw Apple7 and llama.cpp's fast paths; Metal3 was never claimed.");
        Ok(ExitCode::SUCCESS)
    } else {
        println!("\nUNEXPECTED: Apple families {apple:?}, expected {expected:?}");
        Ok(ExitCode::FAILURE)
    }
}

/// One probe run, as the table shows it.
struct Row {
    case: &'static str,
    apple_family: u64,
    threadgroup_memory: u64,
    /// has_simdgroup_reduction, has_simdgroup_mm, has_bfloat.
    flags: [bool; 3],
    metal3: bool,
    elapsed: Duration,
}

impl Row {
    fn run(
        case: &'static str,
        probe: &Path,
        socket: Option<&Path>,
        tools: &Tools,
    ) -> anyhow::Result<Row> {
        let mut cmd = Command::new(probe);
        cmd.arg("--json").stdin(Stdio::null());
        for var in ["METALIFT_DISABLE", "METALIFT_TIMEOUT_MS", "METALIFT_DEBUG"] {
            cmd.env_remove(var);
        }
        match socket {
            Some(socket) => {
                cmd.env(INSERT_VAR, &tools.shim)
                    .env("METALIFT_SOCKET", socket);
                if let Some(ms) = tools.timeout_ms {
                    cmd.env("METALIFT_TIMEOUT_MS", ms.to_string());
                }
            }
            None => {
                cmd.env_remove(INSERT_VAR);
            }
        }
        let start = Instant::now();
        let report = crate::gpu::probe_report(&mut cmd, start + crate::gpu::PROBE_TIMEOUT, case)?;
        let elapsed = start.elapsed();
        let flag = |name: &str| report["llama_cpp"][name].as_bool().unwrap_or(false);
        Ok(Row {
            case,
            apple_family: report["apple_family"].as_u64().unwrap_or(0),
            threadgroup_memory: report["max_threadgroup_memory"].as_u64().unwrap_or(0),
            flags: [
                flag("has_simdgroup_reduction"),
                flag("has_simdgroup_mm"),
                flag("has_bfloat"),
            ],
            metal3: report["families"]["Metal3"].as_bool().unwrap_or(false),
            elapsed,
        })
    }
}

fn print_table(rows: &[Row]) {
    let yes_no = |b: bool| if b { "yes" } else { "no" };
    println!(
        "{:<32} {:<8} {:>11} {:>10} {:>9} {:>7} {:>7} {:>8}",
        "case", "family", "tg memory", "simd-red.", "simd-mm", "bfloat", "Metal3", "time"
    );
    for r in rows {
        println!(
            "{:<32} {:<8} {:>11} {:>10} {:>9} {:>7} {:>7} {:>6}ms",
            r.case,
            format!("Apple{}", r.apple_family),
            r.threadgroup_memory,
            yes_no(r.flags[0]),
            yes_no(r.flags[1]),
            yes_no(r.flags[2]),
            yes_no(r.metal3),
            r.elapsed.as_millis()
        );
    }
}
