//! Issue 23 item 4: what the daemon's state costs a Metal process's first
//! device creation, where the shim's verdict wait runs under Metal's
//! registration lock (REAL-METAL.md item 3).
//!
//! Every figure is `device_creation_us` as the probe times its own
//! `MTLCreateSystemDefaultDevice`, injected minus uninjected (paired: one
//! uninjected run beside each injected one), in one run:
//!
//! - **healthy**: a real metaliftd whose policy unlocks the probe, next to one
//!   check-in round trip to it made by a fresh process (`metalift-bench
//!   check-in-once`: a new pid and connection, as the shim's) and, for scale,
//!   one from this long-lived process;
//! - **not running**: no socket file, and a socket file nobody listens on;
//! - **stopped**: that metaliftd stopped with SIGSTOP (its socket accepts into
//!   the backlog, nothing answers);
//! - **silent**: a socket that accepts and never answers (this process).
//!
//! For the last two, the first process of a round pays the deadline (the
//! shim's default, 2 s), the second probes the daemon (a check-in with a 300 ms
//! deadline: one timeout is never a silent skip) and the next ten skip the
//! check-in (two timeouts in a row; the shim's unresponsive marker,
//! `shim/c/unresponsive.c`); each round starts with no marker. And the healthy
//! daemon with a fresh marker left by an earlier timeout: what the probe adds
//! when the daemon answers. Last, `--threads 2`: how long the second thread's device creation
//! waits while the first waits for its verdict (Metal's registration lock).
#![forbid(unsafe_code)]

use std::os::unix::net::UnixListener;
use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context as _};

use crate::harness::{self, apple_family, clean, Artifacts, Daemon};
use crate::stats::Samples;
use crate::{Section, Target};

/// The processes that follow the first in each unresponsive round.
const NEXT: usize = 10;
/// The verdict deadline every injected probe is given (`METALIFT_TIMEOUT_MS`,
/// set explicitly so the table's deadline is the run's): the shim's default
/// (shim/c/metalift_shim.h ML_DEFAULT_TIMEOUT_MS).
pub(crate) const DEADLINE_MS: u64 = 2_000;
const DEADLINE_US: f64 = DEADLINE_MS as f64 * 1000.0;
/// What the first process may take beyond the deadline: its own start, Metal's
/// load and the probe's report around the wait.
const SLACK_US: f64 = 50_000.0;
/// The deadline of a probe, a check-in while a marker of one timeout is in
/// force (shim/c/metalift_shim.h ML_PROBE_MS).
const PROBE_US: f64 = 300_000.0;

/// The probe with libmetalift asking `socket`; markers go to `markers`.
pub(crate) fn injected(art: &Artifacts, socket: &Path, markers: &Path) -> Command {
    let mut cmd = clean(&art.probe);
    cmd.env("LD_PRELOAD", &art.shim)
        .env("METALIFT_SOCKET", socket)
        .env("METALIFT_TIMEOUT_MS", DEADLINE_MS.to_string())
        .env("XDG_RUNTIME_DIR", markers);
    cmd
}

/// Runs the probe with `--json` (and `extra`) and returns its report.
fn report(mut cmd: Command, extra: &[&str]) -> anyhow::Result<serde_json::Value> {
    cmd.arg("--json").args(extra).stderr(Stdio::null());
    let out = cmd.output()?;
    if !out.status.success() {
        bail!("metalift-probe failed: {}", out.status);
    }
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn creation_us(report: &serde_json::Value) -> anyhow::Result<f64> {
    report["device_creation_us"]
        .as_f64()
        .context("the probe reported no device_creation_us")
}

/// Injected minus uninjected first device creation, one pair.
pub(crate) fn added(art: &Artifacts, injected: Command) -> anyhow::Result<f64> {
    let plain = creation_us(&report(clean(&art.probe), &[])?)?;
    Ok(creation_us(&report(injected, &[])?)? - plain)
}

/// Removes every unresponsive marker from `dir` (a round starts without one).
pub(crate) fn clear_markers(dir: &Path) -> anyhow::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry
            .file_name()
            .to_string_lossy()
            .starts_with("metalift-unresponsive-")
        {
            std::fs::remove_file(entry.path())?;
        }
    }
    Ok(())
}

/// `rounds` rounds of one first process, one probe and [`NEXT`] later ones
/// against an unresponsive `socket`.
pub(crate) fn unresponsive(
    art: &Artifacts,
    socket: &Path,
    markers: &Path,
    rounds: usize,
) -> anyhow::Result<(Samples, Samples, Samples)> {
    let (mut first, mut probe, mut next) =
        (Samples::default(), Samples::default(), Samples::default());
    for _ in 0..rounds {
        clear_markers(markers)?;
        first.push(added(art, injected(art, socket, markers))?);
        probe.push(added(art, injected(art, socket, markers))?);
        for _ in 0..NEXT {
            next.push(added(art, injected(art, socket, markers))?);
        }
    }
    Ok((first, probe, next))
}

/// Leaves a fresh marker of one timeout for `socket` in `markers`, named as
/// the shim names it (uid, FNV-1a of the socket path).
pub(crate) fn fresh_marker(markers: &Path, socket: &Path) -> anyhow::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in socket.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let uid = std::fs::metadata(markers)?.uid();
    let path = markers.join(format!("metalift-unresponsive-{uid}-{hash:016x}"));
    std::fs::write(&path, "001\n")?;
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}

fn signal(pid: u32, sig: &str) -> anyhow::Result<()> {
    let status = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .context("running kill")?;
    if !status.success() {
        bail!("kill {sig} {pid}: {status}");
    }
    Ok(())
}

/// Runs the stall cases: `iterations` healthy and not-running pairs,
/// `rounds` rounds of each unresponsive case.
pub fn run(art: &Artifacts, iterations: usize, rounds: usize) -> anyhow::Result<Section> {
    let dir = tempfile::tempdir()?;
    let markers = dir.path().join("markers");
    std::fs::create_dir_all(&markers)?;
    let policy = harness::one_rule_policy(
        "probe",
        &harness::path_matcher(&art.probe),
        "unlock = \"apple7\"",
    );
    let daemon = Daemon::start(art, &dir.path().join("daemon"), &policy, &[])?;
    let unlocked = apple_family(injected(art, &daemon.socket, &markers))?;
    if unlocked != 7 {
        bail!("expected Apple7 under the healthy daemon, got Apple{unlocked}");
    }
    let frame = harness::check_in_frame();

    let (mut healthy, mut rtt, mut rtt_warm) =
        (Samples::default(), Samples::default(), Samples::default());
    let (mut absent, mut refused) = (Samples::default(), Samples::default());
    let (mut second_healthy, mut first_healthy) = (Samples::default(), Samples::default());
    let mut with_marker = Samples::default();
    let gone = dir.path().join("absent.sock");
    let dead = dir.path().join("dead.sock");
    drop(UnixListener::bind(&dead)?); // the file stays, nobody listens
    for _ in 0..iterations {
        healthy.push(added(art, injected(art, &daemon.socket, &markers))?);
        fresh_marker(&markers, &daemon.socket)?;
        with_marker.push(added(art, injected(art, &daemon.socket, &markers))?);
        rtt.push_micros(crate::big_exe::child_check_in(&art.bench, &daemon.socket)?.1);
        let t = std::time::Instant::now();
        harness::check_in_with(&daemon.socket, &frame)?;
        rtt_warm.push_micros(t.elapsed());
        absent.push(added(art, injected(art, &gone, &markers))?);
        refused.push(added(art, injected(art, &dead, &markers))?);
        let threads = report(injected(art, &daemon.socket, &markers), &["--threads", "2"])?;
        let times: Vec<f64> = threads["concurrent_creations_us"]
            .as_array()
            .context("no concurrent_creations_us")?
            .iter()
            .filter_map(serde_json::Value::as_f64)
            .collect();
        if let [a, b] = times[..] {
            first_healthy.push(a);
            second_healthy.push(b);
        }
    }

    // A socket that accepts and never answers: the listener is kept, never read.
    let silent_socket = dir.path().join("silent.sock");
    let silent = UnixListener::bind(&silent_socket)?;
    let holder = std::thread::spawn(move || {
        let mut held = Vec::new();
        for stream in silent.incoming() {
            match stream {
                Ok(s) => held.push(s),
                Err(_) => return,
            }
            if held.len() > 4 * NEXT * 64 {
                return;
            }
        }
    });
    let (mut silent_first, mut silent_probe, mut silent_next) =
        unresponsive(art, &silent_socket, &markers, rounds)?;

    signal(daemon.pid(), "-STOP")?;
    let stopped = unresponsive(art, &daemon.socket, &markers, rounds);
    // The registration lock while the first thread waits out a stopped daemon.
    let mut second_stopped = Samples::default();
    let stopped_threads = clear_markers(&markers)
        .and_then(|()| report(injected(art, &daemon.socket, &markers), &["--threads", "2"]));
    signal(daemon.pid(), "-CONT")?;
    let (mut stopped_first, mut stopped_probe, mut stopped_next) = stopped?;
    if let Some(times) = stopped_threads?["concurrent_creations_us"].as_array() {
        if let Some(b) = times.get(1).and_then(serde_json::Value::as_f64) {
            second_stopped.push(b);
        }
    }
    drop(holder);

    let rtt_median = rtt.median();
    let mut body = format!(
        "{iterations} paired iterations (healthy, not running) and {rounds} rounds of 1 + 1 + {NEXT} \
         processes per unresponsive case; the shim's default deadline ({:.0} ms). Each figure is the \
         probe's own first `MTLCreateSystemDefaultDevice`, injected minus uninjected. Markers \
         (`shim/c/unresponsive.c`) are cleared at the start of each round.\n\n\
         | case | added to the first device creation, µs: median (p10–p90) |\n|---|---|\n",
        DEADLINE_US / 1000.0
    );
    for (name, s) in [
        ("healthy metaliftd, unlocked", &mut healthy),
        (
            "healthy metaliftd, unlocked, with a fresh marker (the probe answered)",
            &mut with_marker,
        ),
        (
            "one check-in round trip to it, from a fresh process (`check-in-once`)",
            &mut rtt,
        ),
        (
            "one check-in round trip to it, from this long-lived process",
            &mut rtt_warm,
        ),
        ("not running: no socket file", &mut absent),
        ("not running: a socket file nobody listens on", &mut refused),
        ("stopped (SIGSTOP): the first process of a round", &mut stopped_first),
        ("stopped (SIGSTOP): the second, a probe", &mut stopped_probe),
        ("stopped (SIGSTOP): each of the next ten", &mut stopped_next),
        ("accepts, never answers: the first process", &mut silent_first),
        ("accepts, never answers: the second, a probe", &mut silent_probe),
        ("accepts, never answers: each of the next ten", &mut silent_next),
        (
            "`--threads 2`, healthy: the thread that creates first (absolute)",
            &mut first_healthy,
        ),
        (
            "`--threads 2`, healthy: the second thread, waiting on the registration lock (absolute)",
            &mut second_healthy,
        ),
        (
            "`--threads 2`, stopped daemon, first process: the second thread (absolute)",
            &mut second_stopped,
        ),
    ] {
        body.push_str(&format!("| {name} | {} |\n", s.summary(0)));
    }
    let healthy_limit = rtt_median + 50.0;
    let probe_limit = PROBE_US + SLACK_US;
    let targets = vec![
        Target {
            item: "23.4 a fresh marker, the daemon answering: added to the first device creation"
                .into(),
            target: "published (next to the healthy figure)".into(),
            measured: format!(
                "{:.0} µs (without a marker: {:.0} µs)",
                with_marker.median(),
                healthy.median()
            ),
            met: true,
        },
        Target {
            item: "23.4 unresponsive daemon: the probe after one timeout".into(),
            target: format!(
                "≤ the probe's deadline ({:.0} ms) + {:.0} ms",
                PROBE_US / 1000.0,
                SLACK_US / 1000.0
            ),
            measured: format!(
                "{:.0} ms stopped, {:.0} ms silent (worst {:.0} / {:.0} ms)",
                stopped_probe.median() / 1000.0,
                silent_probe.median() / 1000.0,
                stopped_probe.max() / 1000.0,
                silent_probe.max() / 1000.0
            ),
            met: stopped_probe.max() <= probe_limit && silent_probe.max() <= probe_limit,
        },
        Target {
            item: "23.4 healthy daemon: added to the first device creation".into(),
            target: "≤ 1 check-in round trip + 50 µs".into(),
            measured: format!(
                "{:.0} µs (a fresh process's check-in round trip: {rtt_median:.0} µs; limit {healthy_limit:.0} µs)",
                healthy.median()
            ),
            met: healthy.median() <= healthy_limit,
        },
        Target {
            item: "23.4 daemon not running".into(),
            target: "≤ 1 ms".into(),
            measured: format!(
                "{:.0} µs (no socket), {:.0} µs (socket, no listener)",
                absent.median(),
                refused.median()
            ),
            met: absent.median() <= 1000.0 && refused.median() <= 1000.0,
        },
        Target {
            item: "23.4 unresponsive daemon: the first process".into(),
            target: format!(
                "≤ the deadline ({} ms) + {:.0} ms for the process around the wait",
                DEADLINE_MS,
                SLACK_US / 1000.0
            ),
            measured: format!(
                "{:.0} ms stopped, {:.0} ms silent (worst {:.0} / {:.0} ms)",
                stopped_first.median() / 1000.0,
                silent_first.median() / 1000.0,
                stopped_first.max() / 1000.0,
                silent_first.max() / 1000.0
            ),
            met: stopped_first.max() <= DEADLINE_US + SLACK_US
                && silent_first.max() <= DEADLINE_US + SLACK_US,
        },
        Target {
            item: "23.4 unresponsive daemon: each later process".into(),
            target: "≤ 5 ms".into(),
            measured: format!(
                "{:.0} µs stopped, {:.0} µs silent (p90 {:.0} / {:.0} µs)",
                stopped_next.median(),
                silent_next.median(),
                stopped_next.percentile(90.0),
                silent_next.percentile(90.0)
            ),
            met: stopped_next.percentile(90.0) <= 5000.0 && silent_next.percentile(90.0) <= 5000.0,
        },
        Target {
            item: "23.4 a second thread's device creation while the first waits".into(),
            target: "published".into(),
            measured: format!(
                "{:.0} µs healthy; {:.0} ms while the first waits out a stopped daemon",
                second_healthy.median(),
                second_stopped.median() / 1000.0
            ),
            met: true,
        },
    ];
    Ok(Section {
        title: "Stalls a daemon can cause (issue 23 item 4)".into(),
        body,
        targets,
    })
}
