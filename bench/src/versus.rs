//! Issue 31 ("Must show"): 23.4 and 24.6 no worse than an older build, measured
//! in the same run, and the time a fresh marker adds to the first device
//! creation.
//!
//! `metalift-bench versus <old-build-dir>` runs the older build's metaliftd,
//! metalift-probe and libmetalift (each build with its own daemon, shim and
//! probe) and this tree's, interleaved:
//!
//! - **24.6**: rounds of the older metaliftd, this tree's and the
//!   transport-only baseline, one after the other (the first two swap places
//!   every round), at 1 and 64 clients; per round, this tree's figure over the
//!   older one's (p50 of one check-in; check-ins/s), and each over the baseline
//!   beside it, as `identity_hop` does. Ratios per round, because the load of a
//!   shared machine moves between rounds and neighbours share it.
//! - **23.4**: `stalls`' cases, paired: each iteration measures both builds
//!   (order swapped every iteration) for a healthy daemon, no daemon, and a
//!   healthy daemon behind a fresh marker of one timeout (v5 probes the daemon
//!   with a short deadline; an older shim that skips on a marker shows a skip's
//!   cost, which is the point of comparing); then rounds against a socket that
//!   accepts and never answers (the first process pays the deadline, the next
//!   one probes or skips, the ten after skip). Added time is injected minus
//!   uninjected, with each build's own probe.
//!
//! "No worse" is judged with a stated tolerance for run-to-run spread
//! ([`TOLERANCE`]); a miss prints as missed, never as an assertion.
#![forbid(unsafe_code)]

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context as _};

use crate::baseline::BaselineServer;
use crate::harness::{self, apple_family, Artifacts, Daemon};
use crate::stalls::{self, added, clear_markers, fresh_marker, injected, unresponsive};
use crate::stats::{thousands, Samples};
use crate::throughput::{realistic_policy, round, Client};
use crate::{Section, Target};

/// How much worse than the older build still counts as "no worse": 5 %, the
/// order of the spread between neighbouring rounds on a quiet machine
/// (BENCHMARKS.md's p10–p90 of per-round ratios).
pub const TOLERANCE: f64 = 0.05;

/// What a comparison needs: the two builds and their names in the table.
#[derive(Debug, Clone)]
pub struct Builds {
    /// The older build (`<old-build-dir>`).
    pub old: Artifacts,
    /// How the table names it.
    pub old_name: String,
    /// This tree's build.
    pub new: Artifacts,
}

impl Builds {
    /// The older build's artifacts from `dir` (metaliftd, metalift-probe,
    /// libmetalift.so), this benchmark binary serving both as baseline and
    /// fresh-process client; `new` is this tree's.
    pub fn in_dir(dir: &Path, new: Artifacts) -> anyhow::Result<Builds> {
        let find = |name: &str| {
            dir.join(name)
                .canonicalize()
                .with_context(|| format!("{name} is missing from {}", dir.display()))
        };
        let old = Artifacts {
            daemon: find("metaliftd")?,
            probe: find("metalift-probe")?,
            shim: find("libmetalift.so")?,
            bench: new.bench.clone(),
        };
        if old.daemon == new.daemon {
            bail!(
                "{} is this tree's build: give the older build's directory",
                dir.display()
            );
        }
        Ok(Builds {
            old,
            old_name: dir.display().to_string(),
            new,
        })
    }
}

/// `this / old` per pair, summarised as median (p10–p90).
fn ratio_summary(s: &mut Samples) -> String {
    format!(
        "{:.2}× ({:.2}–{:.2}×)",
        s.median(),
        s.percentile(10.0),
        s.percentile(90.0)
    )
}

/// Runs both comparisons: `rounds` × `length` per 24.6 row, `iterations` pairs
/// and `stall_rounds` unresponsive rounds for 23.4.
pub fn run(
    builds: &Builds,
    rounds: usize,
    length: Duration,
    iterations: usize,
    stall_rounds: usize,
) -> anyhow::Result<Section> {
    let load_before = harness::load_average();
    let (hop_table, mut targets) = identity_cost(builds, rounds, length)?;
    let (stall_table, stall_targets) = stall_cost(builds, iterations, stall_rounds)?;
    targets.extend(stall_targets);
    let load_after = harness::load_average();
    let body = format!(
        "The older build: `{}` (`{}`, `{}`, `{}`); this tree's: `{}`. Each build runs its own \
         metaliftd, libmetalift and metalift-probe; both in one run, interleaved. 1-min load \
         average {load_before} before, {load_after} after. \"No worse\" allows {:.0} % for the \
         spread between neighbouring rounds.\n\n\
         ### 24.6: one check-in and 64 clients\n\n\
         {rounds} rounds of {:.1} s per row (older, this tree, baseline; the first two swap \
         places every round), the policy of `identity_hop` (four rules, none matching).\n\n\
         {hop_table}\n\
         ### 23.4: what the daemon's state adds to the first device creation\n\n\
         {iterations} paired iterations (both builds, order swapped every iteration) and \
         {stall_rounds} rounds per build against a socket that accepts and never answers; the \
         deadline {} ms. µs, injected minus uninjected, median (p10–p90).\n\n{stall_table}",
        builds.old_name,
        builds.old.daemon.display(),
        builds.old.probe.display(),
        builds.old.shim.display(),
        builds.new.daemon.display(),
        TOLERANCE * 100.0,
        length.as_secs_f64(),
        stalls::DEADLINE_MS,
    );
    Ok(Section {
        title: "This tree versus an older build (issue 31: 23.4 and 24.6, same run)".into(),
        body,
        targets,
    })
}

/// 24.6 for both builds beside one baseline.
fn identity_cost(
    builds: &Builds,
    rounds: usize,
    length: Duration,
) -> anyhow::Result<(String, Vec<Target>)> {
    let policy = realistic_policy();
    let (old_dir, new_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let old = Daemon::start(&builds.old, old_dir.path(), &policy, &[])?;
    let new = Daemon::start(&builds.new, new_dir.path(), &policy, &[])?;
    let baseline = BaselineServer::start(&builds.new.bench, new_dir.path())?;

    let mut table = String::from(
        "| clients | older: p50 µs / check-ins/s | this tree: p50 µs / check-ins/s | baseline: p50 µs / check-ins/s | this / older, per round | older / baseline, per round | this / baseline, per round |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let mut targets = Vec::new();
    for clients in [1usize, 64] {
        let servers = [
            (&old.socket, old.pid()),
            (&new.socket, new.pid()),
            (&baseline.socket, baseline.pid()),
        ];
        for (socket, pid) in servers {
            round(socket, pid, clients, length / 4, Client::CheckIn)?;
        }
        // [old, new, baseline], per round.
        let mut p50: [Samples; 3] = Default::default();
        let mut rate: [Samples; 3] = Default::default();
        let (mut this_old, mut old_base, mut this_base) =
            (Samples::new(), Samples::new(), Samples::new());
        for r in 0..rounds {
            let order: [usize; 3] = if r % 2 == 0 { [0, 1, 2] } else { [1, 0, 2] };
            let mut measured = [0.0f64; 3];
            for i in order {
                let (socket, pid) = servers[i];
                let mut got = round(socket, pid, clients, length, Client::CheckIn)?;
                let p = got.latencies.median();
                p50[i].push(p);
                rate[i].push(got.per_second);
                // One client: the cost of one check-in; 64: the rate.
                measured[i] = if clients == 1 { p } else { got.per_second };
            }
            this_old.push(measured[1] / measured[0].max(1e-9));
            old_base.push(measured[0] / measured[2].max(1e-9));
            this_base.push(measured[1] / measured[2].max(1e-9));
        }
        let cell = |i: usize, p50: &mut [Samples; 3], rate: &mut [Samples; 3]| {
            format!("{:.0} / {}", p50[i].median(), thousands(rate[i].median()))
        };
        table.push_str(&format!(
            "| {clients} | {} | {} | {} | {} | {} | {} |\n",
            cell(0, &mut p50, &mut rate),
            cell(1, &mut p50, &mut rate),
            cell(2, &mut p50, &mut rate),
            ratio_summary(&mut this_old),
            ratio_summary(&mut old_base),
            ratio_summary(&mut this_base),
        ));
        let (item, target, met) = if clients == 1 {
            (
                "31 vs older: 24.6 one check-in's p50, this tree over the older build",
                format!("≤ {:.2}× (no worse)", 1.0 + TOLERANCE),
                this_old.median() <= 1.0 + TOLERANCE,
            )
        } else {
            (
                "31 vs older: 24.6 check-ins/s at 64 clients, this tree over the older build",
                format!("≥ {:.2}× (no worse)", 1.0 - TOLERANCE),
                this_old.median() >= 1.0 - TOLERANCE,
            )
        };
        targets.push(Target {
            item: item.into(),
            target,
            measured: format!(
                "{} per round (over the baseline: older {:.2}, this tree {:.2})",
                ratio_summary(&mut this_old),
                old_base.median(),
                this_base.median()
            ),
            met,
        });
    }
    Ok((table, targets))
}

/// One build's side of the 23.4 comparison.
struct StallSide<'a> {
    art: &'a Artifacts,
    daemon: Daemon,
    markers: std::path::PathBuf,
    healthy: Samples,
    with_marker: Samples,
    absent: Samples,
}

impl<'a> StallSide<'a> {
    fn start(art: &'a Artifacts, dir: &Path) -> anyhow::Result<StallSide<'a>> {
        let markers = dir.join("markers");
        std::fs::create_dir_all(&markers)?;
        let policy = harness::one_rule_policy(
            "probe",
            &harness::path_matcher(&art.probe),
            "unlock = \"apple7\"",
        );
        let daemon = Daemon::start(art, &dir.join("daemon"), &policy, &[])?;
        let unlocked = apple_family(injected(art, &daemon.socket, &markers))?;
        if unlocked != 7 {
            bail!(
                "{}: expected Apple7 under the healthy daemon, got Apple{unlocked}",
                art.shim.display()
            );
        }
        Ok(StallSide {
            art,
            daemon,
            markers,
            healthy: Samples::new(),
            with_marker: Samples::new(),
            absent: Samples::new(),
        })
    }

    fn iteration(&mut self, gone: &Path) -> anyhow::Result<()> {
        let (art, socket) = (self.art, &self.daemon.socket);
        self.healthy
            .push(added(art, injected(art, socket, &self.markers))?);
        fresh_marker(&self.markers, socket)?;
        self.with_marker
            .push(added(art, injected(art, socket, &self.markers))?);
        clear_markers(&self.markers)?;
        self.absent
            .push(added(art, injected(art, gone, &self.markers))?);
        Ok(())
    }
}

/// 23.4 for both builds, paired.
fn stall_cost(
    builds: &Builds,
    iterations: usize,
    rounds: usize,
) -> anyhow::Result<(String, Vec<Target>)> {
    let (old_dir, new_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let mut old = StallSide::start(&builds.old, old_dir.path())?;
    let mut new = StallSide::start(&builds.new, new_dir.path())?;
    let gone = new_dir.path().join("absent.sock");
    for i in 0..iterations {
        if i % 2 == 0 {
            old.iteration(&gone)?;
            new.iteration(&gone)?;
        } else {
            new.iteration(&gone)?;
            old.iteration(&gone)?;
        }
    }

    // A socket that accepts and never answers: the listener is kept, never read.
    let silent_socket = new_dir.path().join("silent.sock");
    let silent = UnixListener::bind(&silent_socket)?;
    let holder = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming() {
            match stream {
                Ok(s) => held.push(s),
                Err(_) => return,
            }
            if held.len() > 4096 {
                return;
            }
        }
    });
    let (mut old_first, mut old_second, mut old_next) =
        unresponsive(old.art, &silent_socket, &old.markers, rounds)?;
    let (mut new_first, mut new_second, mut new_next) =
        unresponsive(new.art, &silent_socket, &new.markers, rounds)?;
    drop(holder);

    let mut table =
        String::from("| case | older | this tree | this − older (medians) |\n|---|---|---|---|\n");
    let rows: [(&str, &mut Samples, &mut Samples); 6] = [
        (
            "healthy metaliftd, unlocked",
            &mut old.healthy,
            &mut new.healthy,
        ),
        (
            "healthy metaliftd behind a fresh marker of one timeout",
            &mut old.with_marker,
            &mut new.with_marker,
        ),
        (
            "not running: no socket file",
            &mut old.absent,
            &mut new.absent,
        ),
        (
            "accepts, never answers: the first process",
            &mut old_first,
            &mut new_first,
        ),
        (
            "accepts, never answers: the second (v5: a probe)",
            &mut old_second,
            &mut new_second,
        ),
        (
            "accepts, never answers: each of the next ten",
            &mut old_next,
            &mut new_next,
        ),
    ];
    let mut medians = Vec::new();
    for (name, o, n) in rows {
        let (om, nm) = (o.median(), n.median());
        medians.push((om, nm));
        table.push_str(&format!(
            "| {name} | {} | {} | {:+.0} µs |\n",
            o.summary(0),
            n.summary(0),
            nm - om
        ));
    }
    let (old_healthy, new_healthy) = medians[0];
    let (old_marker, new_marker) = medians[1];
    let (old_absent, new_absent) = medians[2];
    // Healthy and absent are tens to a hundred µs: "no worse" within the
    // tolerance, or within 10 µs (a process start's jitter), whichever is larger.
    let no_worse = |old: f64, new: f64| new <= old + (old.abs() * TOLERANCE).max(10.0);
    let targets = vec![
        Target {
            item: "31 vs older: 23.4 healthy daemon, added to the first device creation".into(),
            target: format!(
                "no worse (≤ older + max({:.0} %, 10 µs))",
                TOLERANCE * 100.0
            ),
            measured: format!("{new_healthy:.0} µs (older {old_healthy:.0} µs)"),
            met: no_worse(old_healthy, new_healthy),
        },
        Target {
            item: "31 vs older: 23.4 daemon not running".into(),
            target: format!(
                "no worse (≤ older + max({:.0} %, 10 µs))",
                TOLERANCE * 100.0
            ),
            measured: format!("{new_absent:.0} µs (older {old_absent:.0} µs)"),
            met: no_worse(old_absent, new_absent),
        },
        Target {
            item: "31: a fresh marker, the daemon answering: added to the first device creation"
                .into(),
            target: "published (v5 probes the daemon instead of skipping)".into(),
            measured: format!(
                "{new_marker:.0} µs, {:+.0} µs over no marker (older build: {old_marker:.0} µs)",
                new_marker - new_healthy
            ),
            met: true,
        },
    ];
    Ok((table, targets))
}
