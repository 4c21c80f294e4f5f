//! Item 1 (issue 10): what libmetalift costs a process that never touches
//! Metal, next to the floor of any preload, and what it adds to one that is
//! unlocked.
//!
//! In one run, interleaved per iteration so machine load hits every case alike,
//! every command behind `/usr/bin/env` (the way a CI agent's shells start
//! programs, and so each case pays the same exec chain):
//!
//! - `env /usr/bin/true` (unshimmed);
//! - `env LD_PRELOAD=<empty C library> /usr/bin/true` (the floor: an empty
//!   shared library built by this benchmark with the system C compiler);
//! - `env LD_PRELOAD=libmetalift.so /usr/bin/true` (a daemon is up: a process
//!   without Metal must not even connect);
//! - `env metalift-probe` and `env LD_PRELOAD=libmetalift.so metalift-probe`
//!   unlocked by a real metaliftd (the added time of an unlock, paired).
//!
//! Targets: shimmed `true` ≤ 1.10× unshimmed and ≤ 1.03× the empty library.
//! Prints what it measured; a missed target is printed as missed.
#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{bail, Context};

use crate::harness::{self, apple_family, time, Artifacts, Daemon};
use crate::stats::Samples;
use crate::{Section, Target};

/// `/usr/bin/true` runs per probe run in each iteration (true is ~1 ms; the
/// probe ~10 ms).
const TRUE_RUNS_PER_ITERATION: usize = 5;

/// Builds `libempty.so` (one empty function, no constructor) in `dir`.
fn empty_library(dir: &Path) -> anyhow::Result<PathBuf> {
    let source = dir.join("empty.c");
    std::fs::write(&source, "void metalift_bench_empty(void) {}\n")?;
    let library = dir.join("libempty.so");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_owned());
    let status = Command::new(&cc)
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .with_context(|| format!("running {cc} to build the empty library"))?;
    if !status.success() {
        bail!("{cc} failed building the empty preload library ({status})");
    }
    Ok(library)
}

/// `env [LD_PRELOAD=lib] [METALIFT_SOCKET=socket] program`, with no inherited
/// METALIFT_* or preload variables.
fn behind_env(program: &Path, preload: Option<&Path>, socket: &Path) -> Command {
    let mut cmd = Command::new("/usr/bin/env");
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("METALIFT_") || key == "LD_PRELOAD" || key == "LD_LIBRARY_PATH" {
            cmd.env_remove(key);
        }
    }
    if let Some(lib) = preload {
        cmd.arg(format!("LD_PRELOAD={}", lib.display()));
    }
    cmd.arg(format!("METALIFT_SOCKET={}", socket.display()));
    cmd.arg(program);
    cmd.stdin(Stdio::null());
    cmd
}

#[derive(Default)]
struct Cases {
    plain: Samples,
    empty: Samples,
    shimmed: Samples,
    probe_plain: Samples,
    probe_unlocked: Samples,
    /// Unlocked probe minus plain probe, per iteration.
    probe_added: Samples,
}

/// Runs item 1 for `iterations` interleaved rounds.
pub fn run(art: &Artifacts, iterations: usize) -> anyhow::Result<Section> {
    let dir = tempfile::tempdir()?;
    let empty = empty_library(dir.path())?;
    let policy = harness::one_rule_policy(
        "probe",
        &harness::path_matcher(&art.probe),
        "unlock = \"apple7\"",
    );
    let daemon = Daemon::start(art, dir.path(), &policy, &[])?;
    let socket = daemon.socket.clone();
    let truth = Path::new("/usr/bin/true");

    // The probe cases measure an unlock only if the verdict really unlocks.
    let stock = apple_family(behind_env(&art.probe, None, &socket))?;
    let unlocked = apple_family(behind_env(&art.probe, Some(&art.shim), &socket))?;
    if (stock, unlocked) != (5, 7) {
        bail!("expected Apple5 unshimmed and Apple7 unlocked, got {stock} and {unlocked}");
    }
    let decisions_before = daemon.records()?.len();

    let mut c = Cases::default();
    let load_before = harness::load_average();
    for round in 0..iterations + 5 {
        let warm_up = round < 5;
        for _ in 0..TRUE_RUNS_PER_ITERATION {
            let p = time(behind_env(truth, None, &socket))?;
            let e = time(behind_env(truth, Some(&empty), &socket))?;
            let s = time(behind_env(truth, Some(&art.shim), &socket))?;
            if !warm_up {
                c.plain.push_micros(p);
                c.empty.push_micros(e);
                c.shimmed.push_micros(s);
            }
        }
        let p = time(behind_env(&art.probe, None, &socket))?;
        let u = time(behind_env(&art.probe, Some(&art.shim), &socket))?;
        if !warm_up {
            c.probe_plain.push_micros(p);
            c.probe_unlocked.push_micros(u);
            c.probe_added
                .push((u.as_secs_f64() - p.as_secs_f64()) * 1e6);
        }
    }
    let load_after = harness::load_average();
    // Only the probe runs may have reached the daemon: one decision each (and
    // its outcome); `true` never connects.
    let records = daemon.records()?.len() - decisions_before;
    let probe_runs = iterations + 5;

    let Cases {
        mut plain,
        mut empty,
        mut shimmed,
        mut probe_plain,
        mut probe_unlocked,
        mut probe_added,
    } = c;
    let vs_plain = shimmed.median() / plain.median();
    let vs_empty = shimmed.median() / empty.median();
    let empty_vs_plain = empty.median() / plain.median();
    let mut body = format!(
        "{iterations} interleaved iterations ({TRUE_RUNS_PER_ITERATION} runs of each `true` case and \
         one of each probe case per iteration, after 5 warm-up iterations); every command behind \
         `/usr/bin/env`; a real metaliftd unlocks `metalift-probe` by exact path (verified: Apple{stock} \
         unshimmed, Apple{unlocked} shimmed). Audit records written during the run: {records} for \
         {probe_runs} shimmed probe runs and {} shimmed `true` runs. 1-min load average {load_before} \
         before, {load_after} after.\n\n\
         | case | wall time, µs: median (p10–p90) | ratio (medians) |\n|---|---|---|\n",
        (iterations + 5) * TRUE_RUNS_PER_ITERATION
    );
    let rows: [(&str, &mut Samples, String); 6] = [
        ("`env /usr/bin/true`", &mut plain, "1.00".into()),
        (
            "`env LD_PRELOAD=<empty C library> /usr/bin/true`",
            &mut empty,
            format!("{empty_vs_plain:.3} × unshimmed"),
        ),
        (
            "`env LD_PRELOAD=libmetalift.so /usr/bin/true`",
            &mut shimmed,
            format!("**{vs_plain:.3} × unshimmed, {vs_empty:.3} × empty library**"),
        ),
        ("`env metalift-probe`", &mut probe_plain, String::new()),
        (
            "`env LD_PRELOAD=libmetalift.so metalift-probe`, unlocked",
            &mut probe_unlocked,
            String::new(),
        ),
        (
            "**added by an unlock (shimmed − unshimmed probe, paired)**",
            &mut probe_added,
            String::new(),
        ),
    ];
    for (name, samples, ratio) in rows {
        body.push_str(&format!("| {name} | {} | {ratio} |\n", samples.summary(0)));
    }
    let targets = vec![
        Target {
            item: "1. start-up without Metal vs unshimmed".into(),
            target: "≤ 1.10×".into(),
            measured: format!(
                "{vs_plain:.3}× ({:.0} vs {:.0} µs)",
                shimmed.median(),
                plain.median()
            ),
            met: vs_plain <= 1.10,
        },
        Target {
            item: "1. start-up without Metal vs an empty preloaded C library".into(),
            target: "≤ 1.03×".into(),
            measured: format!(
                "{vs_empty:.3}× ({:.0} vs {:.0} µs)",
                shimmed.median(),
                empty.median()
            ),
            met: vs_empty <= 1.03,
        },
    ];
    Ok(Section {
        title: "Start-up cost (item 1)".into(),
        body,
        targets,
    })
}
