//! `metalift-bench`: runs issue 7's benchmarks against the real metaliftd,
//! libmetalift and metalift-probe, and prints Markdown for BENCHMARKS.md.
//!
//! ```text
//! cargo build --release -p metalift-daemon -p metalift-probe -p metalift-shim -p metalift-bench
//! target/release/metalift-bench all
//! ```
//!
//! Thin: the benchmarks live in the library (`metalift_bench::*`).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// metalift's benchmarks (issue 7, items 2–5). Prints Markdown tables.
#[derive(Debug, Parser)]
#[command(name = "metalift-bench")]
struct Args {
    #[command(subcommand)]
    command: Cmd,
    /// Fewer iterations and shorter rounds: a smoke run, not a figure to publish.
    #[arg(long, global = true)]
    quick: bool,
    /// With `all`: also write the whole document to this file (BENCHMARKS.md),
    /// naming the commit it was measured from.
    #[arg(long, global = true)]
    write: Option<std::path::PathBuf>,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Every benchmark but `versus` (which needs an older build), then the summary
    /// table. The forwarding benchmark needs rsyslogd (scripts/setup.sh installs it).
    All,
    /// Item 1: start-up of a process without Metal (shimmed, unshimmed, empty
    /// preload), and the added time of an unlock.
    Startup,
    /// Item 2: a Metal process (the probe) unlocked vs uninjected, next to a round trip.
    Probe,
    /// Item 3: daemon throughput and latency at 1, 8, 64 clients, and RSS.
    Throughput,
    /// Issue 23 item 4: the first device creation with the daemon healthy, not
    /// running, stopped and silent; the registration lock's wait.
    Stalls,
    /// Issue 24 item 6: a check-in identified inline vs on the blocking pool, in one run.
    IdentityHop,
    /// Item 4: policy write → first verdict under it.
    Reload,
    /// Item 5: a 100 MB executable under a sha256 rule, first vs later decisions.
    BigExe,
    /// Issue 31: 23.4 and 24.6 for an older build and this tree in one run, with
    /// ratios; and what a fresh marker adds to the first device creation.
    Versus {
        /// The older build's directory (its metaliftd, metalift-probe and
        /// libmetalift.so: `cargo build --release -p metalift-daemon -p
        /// metalift-probe -p metalift-shim` in a checkout of that commit).
        old_build_dir: std::path::PathBuf,
    },
    /// Issues 30 and 42: check-ins with audit forwarding (to a local rsyslogd, over
    /// TCP and over RELP) on vs off, and RSS with the collector down through 100,000
    /// records.
    Forwarding,
    /// Issue 41: `metalift audit` on a generated collector file (RFC 5424 lines from
    /// 200 guests) against jq answering the same three questions. Needs jq and GNU
    /// time (scripts/setup.sh installs both) and target/release/metalift.
    FleetRead {
        /// The generated file's size in MB (the issue asks for at least 1000).
        #[arg(long, default_value_t = 1000)]
        megabytes: u64,
    },
    /// Internal: the transport-only baseline server.
    #[command(hide = true)]
    ServeBaseline {
        /// The socket to listen on.
        socket: std::path::PathBuf,
    },
    /// Internal: one check-in, printed as `VERDICT <rule> <ns>` (run by the big-exe benchmark).
    #[command(hide = true)]
    CheckInOnce {
        /// The daemon's socket.
        #[arg(long)]
        socket: std::path::PathBuf,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("metalift-bench: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(target_os = "linux")]
fn run(args: Args) -> anyhow::Result<()> {
    use std::time::Duration;

    use anyhow::Context as _;
    use metalift_bench::harness::{self, Artifacts};
    use metalift_bench::{
        big_exe, fleet_read, forwarding, identity_hop, probe_cost, reload, stalls, startup,
        summary_table, throughput, versus, Section,
    };

    let q = args.quick;
    let start_up = |art: &Artifacts| startup::run(art, if q { 30 } else { 300 });
    let probe = |art: &Artifacts| probe_cost::run(art, if q { 20 } else { 1000 });
    let through = |art: &Artifacts| {
        let (rounds, length) = if q {
            (2, Duration::from_millis(500))
        } else {
            (5, Duration::from_secs(2))
        };
        throughput::run(art, rounds, length)
    };
    let hop = |art: &Artifacts| {
        let (rounds, length) = if q {
            (2, Duration::from_millis(500))
        } else {
            (5, Duration::from_secs(2))
        };
        identity_hop::run(art, rounds, length)
    };
    let forward = |art: &Artifacts| {
        if q {
            forwarding::run(art, 2, Duration::from_millis(500), 10_000)
        } else {
            forwarding::run(art, 8, Duration::from_secs(2), 100_000)
        }
    };
    // `metalift` beside this binary (target/release/): the only artifact it needs.
    let fleet = |megabytes: u64| {
        let cli = std::env::current_exe()?
            .parent()
            .map(|d| d.join("metalift"))
            .context("the benchmark binary has no directory")?;
        fleet_read::run(
            &cli,
            if q { megabytes.min(100) } else { megabytes },
            if q { 1 } else { 3 },
        )
    };
    let reloads = |art: &Artifacts| reload::run(art, if q { 10 } else { 100 });
    let stall = |art: &Artifacts| {
        if q {
            stalls::run(art, 10, 1)
        } else {
            stalls::run(art, 200, 3)
        }
    };
    let big = |art: &Artifacts| {
        if q {
            big_exe::run(art, 2, 10)
        } else {
            big_exe::run(art, 10, 200)
        }
    };
    let sections: Vec<Section> = match args.command {
        Cmd::ServeBaseline { socket } => return metalift_bench::baseline::serve(&socket),
        Cmd::CheckInOnce { socket } => return big_exe::check_in_once(&socket),
        Cmd::FleetRead { megabytes } => {
            let section = fleet(megabytes)?;
            if let Some(path) = &args.write {
                // This section and its summary rows measured again, the rest kept.
                let provenance = metalift_bench::report::Provenance::of_this_tree(q);
                let doc = std::fs::read_to_string(path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let doc = metalift_bench::report::update_section(
                    &doc,
                    &provenance,
                    "fleet-read",
                    &section,
                );
                let tmp = path.with_extension("md.tmp");
                std::fs::write(&tmp, &doc).with_context(|| format!("writing {}", tmp.display()))?;
                std::fs::rename(&tmp, path)
                    .with_context(|| format!("replacing {}", path.display()))?;
                eprintln!("metalift-bench: updated {}", path.display());
            }
            vec![section]
        }
        cmd => {
            let art = Artifacts::locate()?;
            let provenance = metalift_bench::report::Provenance::of_this_tree(q);
            let machine = harness::machine_facts();
            let binaries = format!(
                "`{}`, `{}`, `{}`",
                art.daemon.display(),
                art.probe.display(),
                art.shim.display()
            );
            if !matches!(cmd, Cmd::All) {
                println!("## Machine\n");
                println!("| | |\n|---|---|");
                for (k, v) in &machine {
                    println!("| {k} | {v} |");
                }
                println!("| binaries | {binaries} |\n");
            }
            match cmd {
                Cmd::Startup => vec![start_up(&art)?],
                Cmd::Probe => vec![probe(&art)?],
                Cmd::Throughput => vec![through(&art)?],
                Cmd::IdentityHop => vec![hop(&art)?],
                Cmd::Reload => vec![reloads(&art)?],
                Cmd::BigExe => vec![big(&art)?],
                Cmd::Forwarding => vec![forward(&art)?],
                Cmd::Stalls => vec![stall(&art)?],
                Cmd::Versus { old_build_dir } => {
                    let builds = versus::Builds::in_dir(&old_build_dir, art.clone())?;
                    let (rounds, length, iterations, stall_rounds) = if q {
                        (2, Duration::from_millis(500), 10, 1)
                    } else {
                        (6, Duration::from_secs(2), 100, 3)
                    };
                    vec![versus::run(
                        &builds,
                        rounds,
                        length,
                        iterations,
                        stall_rounds,
                    )?]
                }
                _ => {
                    let mut all = Vec::new();
                    for (name, bench) in [
                        (
                            "startup",
                            &start_up as &dyn Fn(&Artifacts) -> anyhow::Result<Section>,
                        ),
                        ("probe", &probe),
                        ("stalls", &stall),
                        ("throughput", &through),
                        ("identity-hop", &hop),
                        ("reload", &reloads),
                        ("big-exe", &big),
                        ("forwarding", &forward),
                        ("fleet-read", &|_: &Artifacts| fleet(1000)),
                    ] {
                        eprintln!("metalift-bench: running {name}…");
                        all.push(bench(&art)?);
                    }
                    let doc =
                        metalift_bench::report::document(&provenance, &machine, &binaries, &all);
                    print!("{doc}");
                    if let Some(path) = &args.write {
                        let tmp = path.with_extension("md.tmp");
                        std::fs::write(&tmp, &doc)
                            .with_context(|| format!("writing {}", tmp.display()))?;
                        std::fs::rename(&tmp, path)
                            .with_context(|| format!("replacing {}", path.display()))?;
                        eprintln!("metalift-bench: wrote {}", path.display());
                    }
                    return Ok(());
                }
            }
        }
    };
    for s in &sections {
        println!("{}", s.to_markdown());
    }
    let targets: Vec<_> = sections.iter().flat_map(|s| s.targets.clone()).collect();
    println!("{}", summary_table(&targets));
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn run(_args: Args) -> anyhow::Result<()> {
    anyhow::bail!(
        "the benchmarks drive the simulated Metal and read /proc: run them on Linux \
         (on a Mac, bench/llama-guest.sh measures the real thing)"
    )
}
