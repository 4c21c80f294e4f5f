//! Shim start-up cost: what injecting libmetalift adds to a process's wall time.
//!
//! `cargo bench -p metalift-probe --bench shim_startup [-- ITERATIONS]` (default 300)
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

#[cfg(target_os = "linux")]
#[path = "../tests/support/mod.rs"]
mod support;

#[cfg(target_os = "linux")]
use std::process::{Command, Stdio};
#[cfg(target_os = "linux")]
use std::time::{Duration, Instant};

#[cfg(target_os = "linux")]
use support::{clean, injected, probe, shim, unlock, FakeDaemon, APPLE7};

#[cfg(not(target_os = "linux"))]
fn main() {
    println!("shim_startup measures LD_PRELOAD on the simulated Metal: Linux only");
}

#[cfg(target_os = "linux")]
/// Builds one case's command afresh for every run.
type MakeCommand<'a> = Box<dyn Fn() -> Command + 'a>;

#[cfg(target_os = "linux")]
fn time(mut cmd: Command) -> Duration {
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let start = Instant::now();
    let status = cmd.status().expect("spawn");
    let elapsed = start.elapsed();
    assert!(status.success(), "benchmark command failed: {status}");
    elapsed
}

#[cfg(target_os = "linux")]
fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

#[cfg(target_os = "linux")]
fn micros(d: Duration) -> String {
    format!("{:.0} µs", d.as_secs_f64() * 1e6)
}

#[cfg(target_os = "linux")]
fn main() {
    // `cargo bench` passes `--bench`; `cargo test --all-targets` runs this binary
    // without it, as a smoke test of the harness, so keep that run short.
    let args: Vec<String> = std::env::args().skip(1).collect();
    let default = if args.iter().any(|a| a == "--bench") {
        300
    } else {
        3
    };
    let iterations: usize = args.iter().find_map(|a| a.parse().ok()).unwrap_or(default);
    let warm_up = iterations.min(10);
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
    let mut cases: Vec<(&str, MakeCommand)> = cases.into_iter().collect();
    // Reference floor: the unwinder every Rust std cdylib on linux-gnu needs.
    if let Some(gcc_s) = LIBGCC_S.iter().find(|p| std::path::Path::new(p).exists()) {
        cases.push((
            "/bin/true + libgcc_s.so.1 only (reference)",
            Box::new(move || {
                let mut cmd = clean("/bin/true");
                cmd.env("LD_PRELOAD", gcc_s);
                cmd
            }),
        ));
    }
    // Reference floor of LD_PRELOAD itself: an empty C library (no libgcc_s, no
    // std, a constructor that returns). No preloaded library can cost less.
    if let Some(empty) = empty_c_library() {
        cases.push((
            "/bin/true + an empty C library (floor of any preload)",
            Box::new(move || {
                let mut cmd = clean("/bin/true");
                cmd.env("LD_PRELOAD", &empty);
                cmd
            }),
        ));
    }
    // Warm the page cache and the dynamic loader's paths.
    for (_, make) in &cases {
        for _ in 0..warm_up {
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

/// Builds `libempty.so` (one empty constructor) with the system C compiler;
/// `None` when there is none.
#[cfg(target_os = "linux")]
fn empty_c_library() -> Option<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
    let source = dir.join("empty.c");
    let library = dir.join("libempty.so");
    std::fs::write(
        &source,
        "__attribute__((constructor)) static void init(void) {}\n",
    )
    .ok()?;
    let built = std::process::Command::new("cc")
        .args(["-O2", "-shared", "-fPIC", "-o"])
        .arg(&library)
        .arg(&source)
        .status()
        .ok()?;
    built.success().then_some(library)
}

#[cfg(target_os = "linux")]
/// Where Debian-like systems keep libgcc_s.
const LIBGCC_S: [&str; 2] = [
    "/lib/x86_64-linux-gnu/libgcc_s.so.1",
    "/lib/aarch64-linux-gnu/libgcc_s.so.1",
];

#[cfg(target_os = "linux")]
fn num_cpus() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}
