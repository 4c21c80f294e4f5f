//! Issue 24 item 6: what the hop to the blocking pool costs a check-in, measured
//! both ways in one run.
//!
//! Two metaliftd processes from the same binary, same policy, same limits: one as
//! shipped (on Linux the peer's identity is read inline: `SO_PEERCRED`, pidfd and
//! procfs answer from kernel memory), one started with the benchmark-only
//! `--identify-on-blocking-pool`, which identifies every peer on the blocking
//! pool as metaliftd did from e5b2ecb until this change. The transport-only
//! baseline server runs in the same alternating rounds, so the ratios the issue
//! asks for (≤ 1.2× a connect + echo for one check-in, ≥ 0.50 of the baseline's
//! rate at 64 clients) come from one machine at one time.
#![forbid(unsafe_code)]

use std::time::Duration;

use crate::baseline::BaselineServer;
use crate::harness::{self, Artifacts, Daemon};
use crate::stats::thousands;
use crate::throughput::{realistic_policy, round, Client, Level};
use crate::{Section, Target};

/// The three servers of every round, in the order they run.
const SERVERS: [&str; 3] = [
    "metaliftd, identity inline (as shipped)",
    "metaliftd, identity on the blocking pool (before)",
    "baseline (connect + echo)",
];

/// Runs the comparison: `rounds` alternating rounds of `length` per level and server.
pub fn run(art: &Artifacts, rounds: usize, length: Duration) -> anyhow::Result<Section> {
    let policy = realistic_policy();
    let inline_dir = tempfile::tempdir()?;
    let pool_dir = tempfile::tempdir()?;
    let inline = Daemon::start(art, inline_dir.path(), &policy, &[])?;
    let pool = Daemon::start(
        art,
        pool_dir.path(),
        &policy,
        &["--identify-on-blocking-pool"],
    )?;
    let baseline = BaselineServer::start(&art.bench, inline_dir.path())?;
    let servers = [
        (&inline.socket, inline.pid()),
        (&pool.socket, pool.pid()),
        (&baseline.socket, baseline.pid()),
    ];
    let load_before = harness::load_average();

    let mut table = String::from(
        "| server, concurrency | check-ins/s: median (p10–p90 of rounds) | latency µs p50 / p99 / p99.9 | errors | CPU cores used: server / load generator | check-ins per server CPU-second | server RSS / peak (VmRSS / VmHWM), MiB |\n\
         |---|---|---|---|---|---|---|\n",
    );
    // [server] → (p50 µs at 1 client, rate at 64 clients, per CPU-second at 64)
    let mut one = [0.0f64; 3];
    let mut many = [(0.0f64, 0.0f64); 3];
    for clients in [1usize, 64] {
        for (socket, pid) in servers {
            round(socket, pid, clients, length / 4, Client::CheckIn)?;
        }
        let mut levels: [Level; 3] = Default::default();
        for _ in 0..rounds {
            for (level, (socket, pid)) in levels.iter_mut().zip(servers) {
                level.add(round(socket, pid, clients, length, Client::CheckIn)?);
            }
        }
        for (i, level) in levels.iter_mut().enumerate() {
            let memory = match i {
                0 => Some(harness::memory(inline.pid())?),
                1 => Some(harness::memory(pool.pid())?),
                _ => None,
            };
            let name = format!(
                "{}, {clients} client{}",
                SERVERS[i],
                if clients == 1 { "" } else { "s" }
            );
            table.push_str(&level.row(&name, memory));
            if clients == 1 {
                one[i] = level.latencies.median();
            } else {
                let per_cpu = level.count as f64 / level.server_cpu.as_secs_f64().max(1e-9);
                many[i] = (level.rates.median(), per_cpu);
            }
        }
    }
    let load_after = harness::load_average();

    let echo = one[2].max(1e-9);
    let base_rate = many[2].0.max(1e-9);
    let body = format!(
        "{rounds} rounds of {:.1} s per row; in every round the three servers run one after \
         the other (inline, pool, baseline). Both metaliftd are the same binary with the same \
         policy (four rules, none matching: every verdict stock) and the audit log on; the second \
         is started with the benchmark-only `--identify-on-blocking-pool`, the identification path \
         metaliftd had before this change. Clients share the CPUs with the servers. 1-min load \
         average {load_before} before, {load_after} after.\n\n{table}\n\
         One check-in, p50: inline {:.0} µs = {:.2}× the connect + echo ({:.0} µs); on the pool \
         {:.0} µs = {:.2}×. At 64 clients: inline {} /s = {:.2} of the baseline's {} /s ({} per \
         daemon CPU-second); on the pool {} /s = {:.2} ({} per CPU-second).\n",
        length.as_secs_f64(),
        one[0],
        one[0] / echo,
        one[2],
        one[1],
        one[1] / echo,
        thousands(many[0].0),
        many[0].0 / base_rate,
        thousands(many[2].0),
        thousands(many[0].1),
        thousands(many[1].0),
        many[1].0 / base_rate,
        thousands(many[1].1),
    );
    let cost = Target {
        item: "24.6 one check-in vs a fresh connect + echo (same run)".into(),
        target: "≤ 1.2×".into(),
        measured: format!(
            "{:.2}× (p50 {:.0} µs vs {:.0} µs); with the pool hop {:.2}×",
            one[0] / echo,
            one[0],
            one[2],
            one[1] / echo
        ),
        met: one[0] <= 1.2 * one[2],
    };
    let share = Target {
        item: "24.6 check-ins/s at 64 clients vs the baseline (same run)".into(),
        target: "≥ 0.50".into(),
        measured: format!(
            "{:.2} ({} /s vs {} /s); with the pool hop {:.2}",
            many[0].0 / base_rate,
            thousands(many[0].0),
            thousands(many[2].0),
            many[1].0 / base_rate
        ),
        met: many[0].0 >= 0.5 * many[2].0,
    };
    Ok(Section {
        title: "The identity hop: inline vs the blocking pool (issue 24 item 6)".into(),
        body,
        targets: vec![cost, share],
    })
}
