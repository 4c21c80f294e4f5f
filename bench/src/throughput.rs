//! Item 3: metaliftd's throughput and latency at 1, 8 and 64 concurrent clients,
//! audit log on, and its resident memory; the transport-only baseline server is
//! measured at the same levels in alternating rounds.
//!
//! Each client is a thread that does what a shim does, in a loop: connect, send
//! a check-in, read the verdict, close. The protocol allows one check-in per
//! connection (after the verdict only an outcome is accepted), so there is no
//! reused-connection variant; the last row adds the outcome report a Metal
//! process sends (two audit records per process).
//!
//! The load generator runs on the same CPUs as the daemon. CPU time is read from
//! `/proc` for both, so the table says how the CPUs were shared, and
//! "check-ins per daemon CPU-second" gives the daemon's cost independent of it.
#![forbid(unsafe_code)]

use std::path::Path;
use std::sync::Barrier;
use std::time::{Duration, Instant};

use metalift_policy::wire::{self, Answers, ClientError, Message, Outcome, OutcomeResult};

use crate::baseline::BaselineServer;
use crate::harness::{self, Artifacts, Daemon};
use crate::stats::{thousands, Samples};
use crate::{Section, Target};

/// How a round's clients behave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Client {
    /// Check in, read the verdict, close (a process that never touches Metal).
    CheckIn,
    /// Also send the outcome report before closing (a Metal process).
    WithOutcome,
}

/// What one round measured.
pub(crate) struct Round {
    pub(crate) per_second: f64,
    pub(crate) latencies: Samples,
    errors: u64,
    server_cpu: Duration,
    client_cpu: Duration,
    wall: Duration,
    count: u64,
}

fn outcome_frame() -> Vec<u8> {
    wire::encode_frame(&Message::Outcome(Outcome {
        decision_id: 0,
        result: OutcomeResult::Stock,
        reason: "bench".into(),
        device_class: "AppleParavirtDevice".into(),
        stock: Answers::default(),
        effective: Answers::default(),
        ..Default::default()
    }))
}

fn one(socket: &Path, check_in: &[u8], outcome: Option<&[u8]>) -> Result<(), ClientError> {
    let mut client = wire::Client::connect(socket, harness::HANG_GUARD)?;
    harness::check_in_on(&mut client, socket, check_in)?;
    if let Some(frame) = outcome {
        client.send_bytes(frame)?;
    }
    Ok(())
}

pub(crate) fn round(
    socket: &Path,
    server_pid: u32,
    clients: usize,
    length: Duration,
    kind: Client,
) -> anyhow::Result<Round> {
    let check_in = harness::check_in_frame();
    let outcome = outcome_frame();
    let outcome = (kind == Client::WithOutcome).then_some(outcome.as_slice());
    let barrier = Barrier::new(clients + 1);
    let me = std::process::id();
    let (server_before, client_before, started, results) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|_| {
                let (barrier, check_in) = (&barrier, &check_in);
                s.spawn(move || {
                    let mut latencies = Samples::new();
                    let mut errors = 0u64;
                    barrier.wait();
                    let end = Instant::now() + length;
                    while Instant::now() < end {
                        let t = Instant::now();
                        match one(socket, check_in, outcome) {
                            Ok(()) => latencies.push_micros(t.elapsed()),
                            Err(_) => errors += 1,
                        }
                    }
                    (latencies, errors)
                })
            })
            .collect();
        let server_before = harness::cpu_time(server_pid);
        let client_before = harness::cpu_time(me);
        let started = Instant::now();
        barrier.wait();
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().expect("client thread"))
            .collect();
        (server_before, client_before, started, results)
    });
    let wall = started.elapsed();
    let server_cpu = harness::cpu_time(server_pid)?.saturating_sub(server_before?);
    let client_cpu = harness::cpu_time(me)?.saturating_sub(client_before?);
    let mut latencies = Samples::new();
    let mut errors = 0;
    for (l, e) in &results {
        latencies.extend(l);
        errors += e;
    }
    let count = latencies.len() as u64;
    Ok(Round {
        per_second: count as f64 / wall.as_secs_f64(),
        latencies,
        errors,
        server_cpu,
        client_cpu,
        wall,
        count,
    })
}

/// Rounds of one server at one level, merged.
#[derive(Default)]
pub(crate) struct Level {
    pub(crate) rates: Samples,
    pub(crate) latencies: Samples,
    errors: u64,
    pub(crate) count: u64,
    pub(crate) server_cpu: Duration,
    client_cpu: Duration,
    wall: Duration,
}

impl Level {
    pub(crate) fn add(&mut self, r: Round) {
        self.rates.push(r.per_second);
        self.latencies.extend(&r.latencies);
        self.errors += r.errors;
        self.count += r.count;
        self.server_cpu += r.server_cpu;
        self.client_cpu += r.client_cpu;
        self.wall += r.wall;
    }

    pub(crate) fn row(&mut self, name: &str, memory: Option<harness::Memory>) -> String {
        let cores = |d: Duration| d.as_secs_f64() / self.wall.as_secs_f64();
        let per_cpu_second = self.count as f64 / self.server_cpu.as_secs_f64().max(1e-9);
        format!(
            "| {name} | {} ({}–{}) | {:.0} / {:.0} / {:.0} | {} | {:.2} / {:.2} | {} | {} |\n",
            thousands(self.rates.median()),
            thousands(self.rates.percentile(10.0)),
            thousands(self.rates.percentile(90.0)),
            self.latencies.median(),
            self.latencies.percentile(99.0),
            self.latencies.percentile(99.9),
            self.errors,
            cores(self.server_cpu),
            cores(self.client_cpu),
            thousands(per_cpu_second),
            memory.map_or("—".into(), |m| format!(
                "{:.1} / {:.1}",
                m.rss_kib as f64 / 1024.0,
                m.hwm_kib as f64 / 1024.0
            )),
        )
    }
}

/// Sets the CPU affinity of every thread of `pid` with `taskset`; false if that failed.
fn pin(pid: u32, cpus: &str) -> bool {
    std::process::Command::new("taskset")
        .args(["-a", "-p", "-c", cpus, &pid.to_string()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// A realistic policy: a few rules, none matching the load generator, so every
/// verdict is stock after the whole rule set has been considered.
pub(crate) fn realistic_policy() -> String {
    let mut policy = harness::one_rule_policy(
        "llama",
        "path = \"/opt/llama.cpp/bin/llama-*\"",
        "unlock = \"apple7\"",
    );
    for (id, matcher) in [
        ("runner", "name = \"actions-runner\""),
        ("python", "path = \"/opt/homebrew/bin/python3*\""),
        ("never", "name = \"never-this\""),
    ] {
        policy.push_str(&format!(
            "\n[[rule]]\nid = \"{id}\"\n{matcher}\nunlock = \"apple7\"\n"
        ));
    }
    policy
}

/// Runs item 3: `rounds` alternating rounds of `length` per level and server.
pub fn run(art: &Artifacts, rounds: usize, length: Duration) -> anyhow::Result<Section> {
    let dir = tempfile::tempdir()?;
    let policy = realistic_policy();
    let daemon = Daemon::start(art, dir.path(), &policy, &[])?;
    let baseline = BaselineServer::start(&art.bench, dir.path())?;
    let idle = harness::memory(daemon.pid())?;
    let load_before = harness::load_average();

    let levels: [(usize, Client, &str); 4] = [
        (1, Client::CheckIn, "1 client"),
        (8, Client::CheckIn, "8 clients"),
        (64, Client::CheckIn, "64 clients"),
        (64, Client::WithOutcome, "64 clients, check-in + outcome"),
    ];
    let mut table = String::from(
        "| server, concurrency | check-ins/s: median (p10–p90 of rounds) | latency µs p50 / p99 / p99.9 | errors | CPU cores used: server / load generator | check-ins per server CPU-second | server RSS / peak (VmRSS / VmHWM), MiB |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mut at_64 = None;
    let mut at_1 = None;
    for (clients, kind, name) in levels {
        // Warm up: connections, the runtime's threads, the page cache of the log.
        round(&daemon.socket, daemon.pid(), clients, length / 4, kind)?;
        round(&baseline.socket, baseline.pid(), clients, length / 4, kind)?;
        let mut d = Level::default();
        let mut b = Level::default();
        for _ in 0..rounds {
            d.add(round(&daemon.socket, daemon.pid(), clients, length, kind)?);
            b.add(round(
                &baseline.socket,
                baseline.pid(),
                clients,
                length,
                kind,
            )?);
        }
        let mem = harness::memory(daemon.pid())?;
        table.push_str(&d.row(&format!("metaliftd, {name}"), Some(mem)));
        table.push_str(&b.row(&format!("baseline, {name}"), None));
        if clients == 1 {
            at_1 = Some((d.latencies.median(), b.latencies.median()));
        }
        if clients == 64 && kind == Client::CheckIn {
            at_64 = Some((
                d.rates.median(),
                d.rates.percentile(10.0),
                d.rates.percentile(90.0),
                d.count as f64 / d.server_cpu.as_secs_f64().max(1e-9),
                b.rates.median(),
            ));
        }
    }
    // The same 64 clients with the CPUs split by affinity: the daemon alone on
    // the last CPU, the load generator on the others. Other work on the machine
    // still lands anywhere.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut pinned = None;
    if cpus >= 2 && pin(daemon.pid(), &format!("{}", cpus - 1)) {
        let me = std::process::id();
        if pin(me, &format!("0-{}", cpus - 2)) {
            round(
                &daemon.socket,
                daemon.pid(),
                64,
                length / 4,
                Client::CheckIn,
            )?;
            let mut d = Level::default();
            for _ in 0..rounds {
                d.add(round(
                    &daemon.socket,
                    daemon.pid(),
                    64,
                    length,
                    Client::CheckIn,
                )?);
            }
            let mem = harness::memory(daemon.pid())?;
            table.push_str(&d.row(
                &format!(
                    "metaliftd pinned to 1 CPU, load generator to the other{}, 64 clients",
                    if cpus > 2 { "s" } else { "" }
                ),
                Some(mem),
            ));
            pinned = Some(d.rates.median());
            pin(me, &format!("0-{}", cpus - 1));
        }
    }
    let load_after = harness::load_average();
    let decisions = daemon
        .records()?
        .iter()
        .filter(|r| r["kind"] == "decision")
        .count();
    let end = harness::memory(daemon.pid())?;

    let (rate, p10, p90, per_cpu, baseline_rate) = at_64.expect("the 64-client level ran");
    let body = format!(
        "{rounds} rounds of {:.1} s per row, metaliftd and baseline rounds alternating; each \
         connection is one check-in (the protocol allows one per connection). metaliftd runs with \
         its default limits and the audit log on a local disk ({decisions} decision records written \
         in the run). Load generator: {} threads in this process, **sharing the {} CPUs with the \
         server** (the CPU columns show the split). 1-min load average {load_before} before, \
         {load_after} after.\n\n{table}\n\
         metaliftd idle RSS before the run: {:.1} MiB; after the run: {:.1} MiB (peak {:.1} MiB).\n",
        length.as_secs_f64(),
        64,
        std::thread::available_parallelism().map_or(1, |n| n.get()),
        idle.rss_kib as f64 / 1024.0,
        end.rss_kib as f64 / 1024.0,
        end.hwm_kib as f64 / 1024.0,
    );
    let target = Target {
        item: "3. daemon throughput, 64 clients, audit on".into(),
        target: "≥ 20 000 check-ins/s on 2 cores".into(),
        measured: format!(
            "{} /s (p10–p90 {}–{}), load generator on the same 2 cores; {} per daemon CPU-second; \
             transport-only baseline {} /s",
            thousands(rate),
            thousands(p10),
            thousands(p90),
            thousands(per_cpu),
            thousands(baseline_rate),
        ) + &pinned.map_or(String::new(), |p| {
            format!(
                "; {} /s with the daemon pinned alone on 1 CPU",
                thousands(p)
            )
        }),
        met: rate >= 20_000.0,
    };
    let (check_in_us, echo_us) = at_1.expect("the 1-client level ran");
    let cost = Target {
        item: "12.8 check-in cost vs a fresh connect + echo (1 client, same run)".into(),
        target: "≤ 2×".into(),
        measured: format!(
            "{:.2}× (p50 {check_in_us:.0} µs vs {echo_us:.0} µs for the transport-only baseline)",
            check_in_us / echo_us.max(1e-9)
        ),
        met: check_in_us <= 2.0 * echo_us,
    };
    let floor = Target {
        item: "12.8 throughput at p10 of rounds, 64 clients, audit on".into(),
        target: "≥ 20 000 check-ins/s".into(),
        measured: format!("p10 {} /s (median {})", thousands(p10), thousands(rate)),
        met: p10 >= 20_000.0,
    };
    Ok(Section {
        title: "Daemon throughput and latency (item 3; issue 12 item 8)".into(),
        body,
        targets: vec![target, cost, floor],
    })
}
