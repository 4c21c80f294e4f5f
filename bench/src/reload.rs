//! Item 4: the time from writing a policy to the first verdict decided under it.
//!
//! Each iteration writes a policy whose only matching rule has a new id
//! (`gen-<i>`, matching this benchmark binary by exact path), the way an editor
//! saves (temporary file, `rename(2)` over `policy.toml`), then checks in over
//! and over until a verdict names `gen-<i>`. The clock starts before the
//! temporary file is written and stops when that verdict is read. Iterations are
//! spaced so each write is its own reload (metaliftd debounces events for 50 ms).
//!
//! The in-run baseline is the plain check-in round trip of the polling itself.
#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::harness::{self, Artifacts, Daemon};
use crate::stats::Samples;
use crate::{Section, Target};

/// metaliftd's debounce (`watcher::DEFAULT_DEBOUNCE`), restated: the benchmark
/// measures the binary, not the library, so it does not link the daemon crate.
const DAEMON_DEBOUNCE_MS: u64 = 50;

/// Pause between iterations: longer than the daemon's debounce, so writes never merge.
const GAP: Duration = Duration::from_millis(150);

fn policy(artifacts: &Artifacts, generation: usize, filler_rules: usize) -> String {
    let mut text = harness::one_rule_policy(
        &format!("gen-{generation}"),
        &harness::path_matcher(&artifacts.bench),
        "unlock = \"apple7\"",
    );
    for i in 0..filler_rules {
        text.push_str(&format!(
            "\n[[rule]]\nid = \"filler-{i}\"\npath = \"/opt/tool-{i}/bin/*\"\nunlock = \"apple7\"\n"
        ));
    }
    text
}

struct Series {
    reload: Samples,
    polls: Samples,
    check_in: Samples,
}

fn series(art: &Artifacts, iterations: usize, filler_rules: usize) -> anyhow::Result<Series> {
    let dir = tempfile::tempdir()?;
    let daemon = Daemon::start(art, dir.path(), &policy(art, 0, filler_rules), &[])?;
    let frame = harness::check_in_frame();
    let mut s = Series {
        reload: Samples::new(),
        polls: Samples::new(),
        check_in: Samples::new(),
    };
    // Let the watcher's own start-up reload pass.
    std::thread::sleep(GAP);
    for generation in 1..=iterations {
        std::thread::sleep(GAP);
        let want = format!("gen-{generation}");
        let text = policy(art, generation, filler_rules);
        let start = Instant::now();
        harness::write_atomically(&daemon.policy, &text)?;
        let mut polls = 0u32;
        loop {
            let t = Instant::now();
            let v = harness::check_in_with(&daemon.socket, &frame)?;
            s.check_in.push_micros(t.elapsed());
            polls += 1;
            if v.rule.as_deref() == Some(want.as_str()) {
                break;
            }
            if start.elapsed() > harness::HANG_GUARD {
                bail!("policy generation {generation} never became live");
            }
        }
        s.reload.push(start.elapsed().as_secs_f64() * 1e3);
        s.polls.push(f64::from(polls));
    }
    Ok(s)
}

/// Runs item 4: `iterations` reloads of a one-rule policy, and half as many of a
/// 1,001-rule one.
pub fn run(art: &Artifacts, iterations: usize) -> anyhow::Result<Section> {
    let load_before = harness::load_average();
    let mut small = series(art, iterations, 0)?;
    let mut large = series(art, iterations.div_ceil(2), 1000)?;
    let load_after = harness::load_average();
    let mut table = String::from(
        "| policy | reloads | write → first verdict under it, ms: p50 / p99 / max | p10–p90 | check-ins polled per reload (median) | plain check-in round trip while polling, µs: median (p10–p90) |\n|---|---|---|---|---|---|\n",
    );
    for (name, s) in [("1 rule", &mut small), ("1,001 rules", &mut large)] {
        table.push_str(&format!(
            "| {name} | {} | {:.1} / {:.1} / {:.1} | {:.1}–{:.1} | {:.0} | {} |\n",
            s.reload.len(),
            s.reload.median(),
            s.reload.percentile(99.0),
            s.reload.max(),
            s.reload.percentile(10.0),
            s.reload.percentile(90.0),
            s.polls.median(),
            s.check_in.summary(0),
        ));
    }
    let body = format!(
        "Each reload: write a temporary file and `rename(2)` it over `policy.toml`, then check in \
         until the verdict names the new rule. metaliftd's watcher waits for {} ms without events \
         before reloading (its debounce), so that is the floor. 1-min load average {load_before} \
         before, {load_after} after.\n\n{table}",
        DAEMON_DEBOUNCE_MS
    );
    let target = Target {
        item: "4. reload: write → first verdict under it".into(),
        target: "p99 ≤ 100 ms".into(),
        measured: format!(
            "p99 {:.1} ms (p50 {:.1} ms) over {} reloads of a 1-rule policy; p99 {:.1} ms at 1,001 rules",
            small.reload.percentile(99.0),
            small.reload.median(),
            small.reload.len(),
            large.reload.percentile(99.0),
        ),
        met: small.reload.percentile(99.0) <= 100.0,
    };
    Ok(Section {
        title: "Reload latency (item 4)".into(),
        body,
        targets: vec![target],
    })
}
