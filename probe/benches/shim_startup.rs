//! Shim start-up cost: what injecting libmetalift adds to a process's wall time.
//!
//! `cargo bench -p metalift-probe --bench shim_startup [-- ITERATIONS]`
//!
//! Runs, interleaved so that machine load hits every case alike:
//! - `/bin/true` without and with the shim (a daemon up, answering every
//!   check-in): the cost a process that never touches Metal pays — load the
//!   shim, one non-blocking connect and one send. Target: ratio ≤ 1.10.
//! - `metalift-probe` without the shim and with it under an unlock verdict: the
//!   added time of a Metal process (wait for the verdict, install the hooks,
//!   report the outcome).
//!
//! The daemon is the tests' scripted fake (`tests/support`), in this process: it
//! answers at once, so the numbers are the shim's own cost plus one socket round
//! trip, not the policy engine's. Prints a Markdown table (medians) for
//! BENCHMARKS.md. A benchmark, not a test: it asserts nothing.

#[path = "../tests/support/mod.rs"]
mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{clean, injected, probe, shim, unlock, FakeDaemon, APPLE7};

/// Builds one case's command afresh for every run.
type MakeCommand<'a> = Box<dyn Fn() -> Command + 'a>;

fn time(mut cmd: Command) -> Duration {
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let start = Instant::now();
    let status = cmd.status().expect("spawn");
    let elapsed = start.elapsed();
    assert!(status.success(), "benchmark command failed: {status}");
    elapsed
}

fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    let iterations: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(300);
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let cases: [(&str, MakeCommand); 5] = [
        ("/bin/true", Box::new(|| clean("/bin/true"))),
        (
            "/bin/true + libmetalift",
            Box::new(|| injected("/bin/true", &daemon.socket)),
        ),
        ("metalift-probe", Box::new(|| clean(probe()))),
        (
            "metalift-probe + libmetalift (unlock)",
            Box::new(|| injected(probe(), &daemon.socket)),
        ),
        (
            "/bin/true + libmetalift, METALIFT_DISABLE=1 (loading only)",
            Box::new(|| {
                let mut cmd = injected("/bin/true", &daemon.socket);
                cmd.env("METALIFT_DISABLE", "1");
                cmd
            }),
        ),
    ];
    // Warm the page cache and the dynamic loader's paths.
    for (_, make) in &cases {
        for _ in 0..10 {
            time(make());
        }
    }
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(iterations); cases.len()];
    for _ in 0..iterations {
        for (i, (_, make)) in cases.iter().enumerate() {
            samples[i].push(time(make()));
        }
    }
    let medians: Vec<Duration> = samples.iter_mut().map(|s| median(s)).collect();
    println!("shim: {}", shim().display());
    println!(
        "iterations per case: {iterations} (interleaved), {} CPUs",
        num_cpus()
    );
    println!();
    println!("| case | median wall time |");
    println!("|---|---|");
    for ((name, _), m) in cases.iter().zip(&medians) {
        println!("| {name} | {} |", micros(*m));
    }
    let ratio = medians[1].as_secs_f64() / medians[0].as_secs_f64();
    let added = medians[3].saturating_sub(medians[2]);
    println!("| **/bin/true ratio (with / without)** | **{ratio:.3}** (target ≤ 1.10) |");
    println!(
        "| **probe: added by an unlock verdict** | **{}** |",
        micros(added)
    );
}

fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
