//! Item 2: what libmetalift adds to a Metal-using process that the policy
//! unlocks, next to one Unix-socket round trip measured in the same run.
//!
//! Interleaved per iteration, so machine load hits every case alike:
//!
//! - `metalift-probe` uninjected;
//! - `metalift-probe` with libmetalift, `METALIFT_DISABLE=1` (the cost of loading
//!   the library alone);
//! - `metalift-probe` with libmetalift and a real metaliftd whose policy unlocks
//!   it (check-in, wait for the verdict, hooks, outcome report);
//! - one check-in round trip to that metaliftd from this process (connect, frame,
//!   verdict: the exchange the shim cannot avoid);
//! - one round trip to the transport-only baseline server (the socket alone).
//!
//! Besides the whole process, the probe times its own first device creation
//! (`MTLCreateSystemDefaultDevice`, `device_creation_us` in its JSON): with the
//! shim that is where the check-in and the verdict wait now happen.
//!
//! The added time is computed per iteration (injected minus uninjected, paired)
//! so its spread is the spread of the difference.
#![forbid(unsafe_code)]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::bail;

use crate::baseline::BaselineServer;
use crate::harness::{self, apple_family, clean, Artifacts, Daemon};
use crate::stats::Samples;
use crate::{Section, Target};

/// Round trips sampled per iteration (cheap next to a process start).
const ROUND_TRIPS_PER_ITERATION: usize = 5;

fn injected(art: &Artifacts, socket: &Path) -> Command {
    let mut cmd = clean(&art.probe);
    cmd.env("LD_PRELOAD", &art.shim)
        .env("METALIFT_SOCKET", socket);
    cmd
}

/// The samples of every case, one of each per iteration.
#[derive(Default)]
struct Cases {
    plain: Samples,
    disabled: Samples,
    unlock: Samples,
    /// Unlocked minus uninjected, per iteration.
    added: Samples,
    /// Disabled minus uninjected, per iteration.
    loading: Samples,
    /// Unlocked minus disabled, per iteration.
    asking: Samples,
    rtt_daemon: Samples,
    rtt_socket: Samples,
    /// The first device creation inside the process, uninjected and unlocked.
    create_plain: Samples,
    create_unlock: Samples,
    /// Unlocked minus uninjected device creation, per iteration.
    create_added: Samples,
}

/// Runs the probe with `--json`: its wall time and its own device creation time.
fn time_probe(mut cmd: Command) -> anyhow::Result<(std::time::Duration, f64)> {
    cmd.arg("--json").stderr(Stdio::null());
    let start = Instant::now();
    let out = cmd.output()?;
    let elapsed = start.elapsed();
    if !out.status.success() {
        bail!("benchmark command failed: {}", out.status);
    }
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let Some(create) = json["device_creation_us"].as_f64() else {
        bail!("the probe reported no device_creation_us");
    };
    Ok((elapsed, create))
}

impl Cases {
    fn round(
        &mut self,
        art: &Artifacts,
        daemon: &Path,
        baseline: &Path,
        frame: &[u8],
    ) -> anyhow::Result<()> {
        let (p, create_p) = time_probe(clean(&art.probe))?;
        let mut off = injected(art, daemon);
        off.env("METALIFT_DISABLE", "1");
        let (d, _) = time_probe(off)?;
        let (u, create_u) = time_probe(injected(art, daemon))?;
        self.create_plain.push(create_p);
        self.create_unlock.push(create_u);
        self.create_added.push(create_u - create_p);
        self.plain.push_micros(p);
        self.disabled.push_micros(d);
        self.unlock.push_micros(u);
        self.added.push((u.as_secs_f64() - p.as_secs_f64()) * 1e6);
        self.loading.push((d.as_secs_f64() - p.as_secs_f64()) * 1e6);
        self.asking.push((u.as_secs_f64() - d.as_secs_f64()) * 1e6);
        for _ in 0..ROUND_TRIPS_PER_ITERATION {
            let t = Instant::now();
            harness::check_in_with(daemon, frame)?;
            self.rtt_daemon.push_micros(t.elapsed());
            let t = Instant::now();
            harness::check_in_with(baseline, frame)?;
            self.rtt_socket.push_micros(t.elapsed());
        }
        Ok(())
    }
}

/// Runs item 2 for `iterations` interleaved rounds.
pub fn run(art: &Artifacts, iterations: usize) -> anyhow::Result<Section> {
    let dir = tempfile::tempdir()?;
    let policy = harness::one_rule_policy(
        "probe",
        &harness::path_matcher(&art.probe),
        "unlock = \"apple7\"",
    );
    let daemon = Daemon::start(art, dir.path(), &policy, &[])?;
    let baseline = BaselineServer::start(&art.bench, dir.path())?;

    // The cases measure what they claim only if the verdict really unlocks.
    let stock = apple_family(clean(&art.probe))?;
    let unlocked = apple_family(injected(art, &daemon.socket))?;
    if (stock, unlocked) != (5, 7) {
        bail!("expected Apple5 uninjected and Apple7 unlocked, got {stock} and {unlocked}");
    }

    let frame = harness::check_in_frame();
    let mut warm = Cases::default();
    for _ in 0..10 {
        warm.round(art, &daemon.socket, &baseline.socket, &frame)?;
    }
    let load_before = harness::load_average();
    let mut c = Cases::default();
    for _ in 0..iterations {
        c.round(art, &daemon.socket, &baseline.socket, &frame)?;
    }
    let load_after = harness::load_average();
    let Cases {
        mut plain,
        mut disabled,
        mut unlock,
        mut added,
        mut loading,
        mut asking,
        mut rtt_daemon,
        mut rtt_socket,
        mut create_plain,
        mut create_unlock,
        mut create_added,
    } = c;
    let ratio_create = create_added.median() / rtt_daemon.median();

    let ratio = added.median() / rtt_daemon.median();
    let ratio_asking = asking.median() / rtt_daemon.median();
    let ratio_socket = added.median() / rtt_socket.median();
    let mut body = format!(
        "{iterations} interleaved iterations ({ROUND_TRIPS_PER_ITERATION} round trips of each kind per \
         iteration); metaliftd's policy unlocks `metalift-probe` by exact path (verified: the probe \
         reports Apple{stock} uninjected, Apple{unlocked} injected). 1-min load average \
         {load_before} before, {load_after} after.\n\n\
         | case | wall time, µs: median (p10–p90) |\n|---|---|\n"
    );
    for (name, s) in [
        ("metalift-probe, uninjected", &mut plain),
        (
            "metalift-probe + libmetalift, `METALIFT_DISABLE=1`",
            &mut disabled,
        ),
        (
            "metalift-probe + libmetalift, unlocked by metaliftd",
            &mut unlock,
        ),
        (
            "**added by libmetalift (unlocked − uninjected, paired)**",
            &mut added,
        ),
        (
            "of which loading the library (disabled − uninjected, paired)",
            &mut loading,
        ),
        (
            "of which asking: check-in, verdict, hooks, outcome (unlocked − disabled, paired)",
            &mut asking,
        ),
        (
            "first device creation inside the probe, uninjected",
            &mut create_plain,
        ),
        (
            "first device creation inside the probe, unlocked (check-in, verdict wait, patch)",
            &mut create_unlock,
        ),
        (
            "**added to the first device creation (unlocked − uninjected, paired)**",
            &mut create_added,
        ),
        (
            "one check-in round trip to metaliftd (connect, check-in, verdict)",
            &mut rtt_daemon,
        ),
        (
            "one round trip to the transport-only baseline (same framing)",
            &mut rtt_socket,
        ),
    ] {
        body.push_str(&format!("| {name} | {} |\n", s.summary(0)));
    }
    body.push_str(&format!(
        "\nAdded time = **{ratio:.2} metaliftd check-in round trips** ({ratio_socket:.2} bare socket \
         round trips); the asking part alone = {ratio_asking:.2} check-in round trips. The shim \
         checks in at the first device creation (not when Metal is mapped), so that creation \
         waits for the whole round trip: {:.0} µs added to it = **{ratio_create:.2} check-in round \
         trips**.\n",
        create_added.median()
    ));
    let target = Target {
        item: "2. Metal process (probe, allowed): added time".into(),
        target: "≤ 2 round trips".into(),
        measured: format!(
            "{:.0} µs added = {ratio:.2} × a {:.0} µs check-in round trip from this long-lived process ({ratio_socket:.2} × a {:.0} µs \
             bare socket round trip); without the library's loading, {:.0} µs = {ratio_asking:.2} round trips",
            added.median(),
            rtt_daemon.median(),
            rtt_socket.median(),
            asking.median()
        ),
        met: ratio <= 2.0,
    };
    let create_target = Target {
        item: "17.4 first device creation (probe, allowed): added time".into(),
        target: "published, beside the check-in round trip".into(),
        measured: format!(
            "{:.0} µs added = {ratio_create:.2} × a {:.0} µs check-in round trip from this long-lived process",
            create_added.median(),
            rtt_daemon.median()
        ),
        met: true,
    };
    Ok(Section {
        title: "Metal process cost (item 2)".into(),
        body,
        targets: vec![target, create_target],
    })
}
