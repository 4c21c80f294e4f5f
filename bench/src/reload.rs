//! Item 4: the time from writing a policy to the first verdict decided under it.
//!
//! Each iteration writes a policy whose only matching rule has a new id
//! (`gen-<i>`, matching this benchmark binary by exact path), the way an editor
//! saves (temporary file, `rename(2)` over `policy.toml`), then checks in over
//! and over until a verdict names `gen-<i>`. The clock starts before the
//! temporary file is written and stops when that verdict is read. Iterations are
//! spaced so each write is its own reload (metaliftd debounces events for 5 ms).
//!
//! The in-run baseline is the plain check-in round trip of the polling itself.
//!
//! Issue 12 adds the same measurement at 10,000 rules (2,000 path globs, 8,000
//! exact paths), once per way a file gets replaced ([`Style`]), and the daemon's
//! resident size after those reloads. Issue 19 runs all of it for two spreads of the
//! same 2,000 globs ([`GlobSpread`]): the daemon's memory must not depend on it.
#![forbid(unsafe_code)]

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;

use crate::harness::{self, Artifacts, Daemon};
use crate::stats::Samples;
use crate::{Section, Target};

/// metaliftd's debounce (`watcher::DEFAULT_DEBOUNCE`), restated: the benchmark
/// measures the binary, not the library, so it does not link the daemon crate.
const DAEMON_DEBOUNCE_MS: u64 = 5;

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
    let (styles_body, mut style_targets) = styles_at_10k(art, iterations.max(10))?;
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
    let mut targets = vec![target];
    targets.append(&mut style_targets);
    Ok(Section {
        title: "Reload latency (item 4; issue 12 items 2 and 8)".into(),
        body: format!(
            "{body}
{styles_body}"
        ),
        targets,
    })
}

/// Every way a policy file gets replaced (issue 12, item 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Style {
    /// `open(O_TRUNC)` + write on the same inode (`echo >`, `cp` over).
    InPlace,
    /// Write a temporary file beside it, `rename(2)` over (most editors).
    Rename,
    /// vim's `backupcopy=no`: rename the old file away, write a new one, delete the backup.
    VimBackup,
    /// `mv` from another directory (only the arrival is seen in etc/).
    MvFromElsewhere,
    /// A drop-in added to `policy.d/` and the previous one removed.
    DropIn,
    /// `policy.toml` is a symlink, re-pointed with `ln -sfn` (a new link renamed over).
    SymlinkSwap,
    /// Kubernetes ConfigMap: `policy.toml -> ..data/policy.toml`, `..data` swapped.
    DataSwap,
    /// `etc/` deleted and created again with the new file.
    DirRecreate,
}

impl Style {
    const ALL: [Style; 8] = [
        Style::InPlace,
        Style::Rename,
        Style::VimBackup,
        Style::MvFromElsewhere,
        Style::DropIn,
        Style::SymlinkSwap,
        Style::DataSwap,
        Style::DirRecreate,
    ];

    fn name(self) -> &'static str {
        match self {
            Style::InPlace => "in-place write / cp over",
            Style::Rename => "temp file + rename (editors)",
            Style::VimBackup => "vim backup dance",
            Style::MvFromElsewhere => "mv from another directory",
            Style::DropIn => "policy.d drop-in added + old removed",
            Style::SymlinkSwap => "symlinked policy, ln -sfn",
            Style::DataSwap => "Kubernetes ..data swap",
            Style::DirRecreate => "etc/ deleted and re-created",
        }
    }
}

/// How the 10,000-rule filler spreads its 2,000 path globs over directories (issue 19,
/// item 3): the daemon's matcher groups globs by their literal directory, so the
/// same number of globs can cost different memory depending on how many directories
/// they name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum GlobSpread {
    /// 40 globs in each of 50 directories (`/opt/tool-<i % 50>/bin/t<i>-*`).
    FiftyDirs,
    /// Each glob in its own directory (`/opt/fleet<i>/bin/*`): one rule per tool.
    OwnDirEach,
}

impl GlobSpread {
    const ALL: [GlobSpread; 2] = [GlobSpread::FiftyDirs, GlobSpread::OwnDirEach];

    fn name(self) -> &'static str {
        match self {
            GlobSpread::FiftyDirs => "50 directories",
            GlobSpread::OwnDirEach => "2,000 directories",
        }
    }

    /// Glob `i` of the filler.
    fn glob(self, i: usize) -> String {
        match self {
            GlobSpread::FiftyDirs => format!("/opt/tool-{}/bin/t{i}-*", i % 50),
            GlobSpread::OwnDirEach => format!("/opt/fleet{i}/bin/*"),
        }
    }
}

/// The 10,000-rule filler: 8,000 exact paths and 2,000 globs spread the `spread`
/// way, none matching the benchmark binary.
fn filler_10k(spread: GlobSpread) -> String {
    let mut text = String::with_capacity(1 << 20);
    for i in 0..8000 {
        text.push_str(&format!(
            "\n[[rule]]\nid = \"exact-{i}\"\npath = \"/opt/exact-{i}/bin/tool\"\nunlock = \"apple7\"\n"
        ));
    }
    for i in 0..2000 {
        text.push_str(&format!(
            "\n[[rule]]\nid = \"glob-{i}\"\npath = \"{}\"\nunlock = \"apple7\"\n",
            spread.glob(i)
        ));
    }
    text
}

/// Replaces the policy the `style` way so that rule `gen-<generation>` (or, for
/// drop-ins, the drop-in of that generation) is the one matching the benchmark.
fn replace(
    style: Style,
    root: &Path,
    art: &Artifacts,
    filler: &str,
    generation: usize,
) -> std::io::Result<()> {
    use std::os::unix::fs::symlink;
    let etc = root.join("etc");
    let policy = etc.join("policy.toml");
    let gen_rule = |g: usize| {
        format!(
            "[[rule]]\nid = \"gen-{g}\"\n{}\nunlock = \"apple7\"\n",
            harness::path_matcher(&art.bench)
        )
    };
    let full = |g: usize| {
        let mut t = harness::one_rule_policy(
            &format!("gen-{g}"),
            &harness::path_matcher(&art.bench),
            "unlock = \"apple7\"",
        );
        t.push_str(filler);
        t
    };
    match style {
        Style::InPlace => std::fs::write(&policy, full(generation)),
        Style::Rename => harness::write_atomically(&policy, &full(generation)),
        Style::VimBackup => {
            let backup = etc.join("policy.toml~");
            std::fs::rename(&policy, &backup)?;
            std::fs::write(&policy, full(generation))?;
            std::fs::remove_file(&backup)
        }
        Style::MvFromElsewhere => {
            let staged = root.join("staging.toml");
            std::fs::write(&staged, full(generation))?;
            std::fs::rename(&staged, &policy)
        }
        Style::DropIn => {
            let dir = etc.join("policy.d");
            std::fs::create_dir_all(&dir)?;
            if generation <= 1 {
                // The main file: the filler only (the generations live in policy.d).
                let mut main = harness::one_rule_policy(
                    "never",
                    "name = \"never-this\"",
                    "unlock = \"apple7\"",
                );
                main.push_str(filler);
                harness::write_atomically(&policy, &main)?;
            }
            let staged = dir.join(format!(".gen-{generation}.part"));
            std::fs::write(&staged, gen_rule(generation))?;
            std::fs::rename(&staged, dir.join(format!("{generation:06}.toml")))?;
            if generation > 1 {
                std::fs::remove_file(dir.join(format!("{:06}.toml", generation - 1)))?;
            }
            Ok(())
        }
        Style::SymlinkSwap => {
            let versions = root.join("versions");
            std::fs::create_dir_all(&versions)?;
            let target = versions.join(format!("v{generation}.toml"));
            std::fs::write(&target, full(generation))?;
            let link = etc.join(".policy.toml.new");
            symlink(&target, &link)?;
            std::fs::rename(&link, &policy)
        }
        Style::DataSwap => {
            let version = etc.join(format!("..v{generation}"));
            std::fs::create_dir_all(&version)?;
            std::fs::write(version.join("policy.toml"), full(generation))?;
            symlink(format!("..v{generation}"), etc.join("..data_tmp"))?;
            std::fs::rename(etc.join("..data_tmp"), etc.join("..data"))?;
            if generation <= 1 {
                symlink("..data/policy.toml", etc.join(".policy.toml.new"))?;
                std::fs::rename(etc.join(".policy.toml.new"), &policy)?;
            } else {
                // kubelet removes the old version after the swap.
                std::fs::remove_dir_all(etc.join(format!("..v{}", generation - 1)))?;
            }
            Ok(())
        }
        Style::DirRecreate => {
            std::fs::remove_dir_all(&etc)?;
            std::fs::create_dir(&etc)?;
            std::fs::write(&policy, full(generation))
        }
    }
}

/// Checks in until the verdict names `gen-<generation>`.
fn until_live(daemon: &Daemon, generation: usize, polls: &mut Samples) -> anyhow::Result<()> {
    let frame = harness::check_in_frame();
    let want = format!("gen-{generation}");
    let start = Instant::now();
    let mut n = 0u32;
    loop {
        let v = harness::check_in_with(&daemon.socket, &frame)?;
        n += 1;
        if v.rule.as_deref() == Some(want.as_str()) {
            polls.push(f64::from(n));
            return Ok(());
        }
        if start.elapsed() > harness::HANG_GUARD {
            bail!("generation {generation} never became live");
        }
    }
}

/// What one glob spread measured over every style's daemon.
#[derive(Debug, Default)]
struct SpreadFigures {
    /// The worst style's p99 reload latency, ms.
    worst_p99: f64,
    /// The largest `VmRSS` right after a daemon started, MiB.
    start_rss: f64,
    /// The largest `VmRSS` after a style's reloads, MiB.
    worst_rss: f64,
    /// The largest `VmHWM` (start-up and every reload's compile included), MiB.
    worst_peak: f64,
}

/// Issue 12 items 2 and 8, issue 19 item 3: reload latency per replacement style at
/// 10,000 rules, and the daemon's RSS after start, after those reloads and at its
/// peak, for each [`GlobSpread`]. Returns the Markdown and the targets.
fn styles_at_10k(art: &Artifacts, iterations: usize) -> anyhow::Result<(String, Vec<Target>)> {
    let mut table = String::from(
        "| 2,000 globs in | replacement style (10,000 rules: 2,000 globs, 8,000 exact) | reloads | write → first verdict under it, ms: p50 / p99 / max | daemon RSS after them / peak, MiB |\n|---|---|---|---|---|\n",
    );
    let mut figures = Vec::new();
    for spread in GlobSpread::ALL {
        figures.push((spread, spread_rows(art, iterations, spread, &mut table)?));
    }
    let start_rss: Vec<String> = figures
        .iter()
        .map(|(spread, f)| format!("{:.1} MiB ({})", f.start_rss, spread.name()))
        .collect();
    let body = format!(
        "At 10,000 rules, one fresh metaliftd per glob spread and style; generation 1 sets the \
         layout up, then {iterations} measured reloads each ({} ms apart); p99 is the nearest \
         rank (of 100 reloads, the 99th fastest), the slowest one is the max beside it. The \
         clock starts before the first write of a replacement and stops at the first verdict \
         naming the new rule; the daemon serves throughout, since that verdict is polled by \
         checking in back to back. An in-place write is read once its writer closes the file \
         (inotify's close-after-write), then the debounce applies as for every style. The \
         2,000 globs are either 40 in each of 50 directories (`/opt/tool-<i % 50>/bin/t<i>-*`) \
         or each in its own directory (`/opt/fleet<i>/bin/*`, one rule per tool). The peak is \
         `VmHWM`: start-up and every reload's compile, while the old policy is still live. \
         metaliftd's RSS right after start with this policy (the largest of the {} daemons of \
         a spread): {}.\n\n{table}",
        GAP.as_millis(),
        Style::ALL.len(),
        start_rss.join(", "),
    );
    let worst_p99 = figures.iter().map(|(_, f)| f.worst_p99).fold(0.0, f64::max);
    let p99s: Vec<String> = figures
        .iter()
        .map(|(spread, f)| format!("{:.1} ms ({})", f.worst_p99, spread.name()))
        .collect();
    let mut targets = vec![Target {
        item: "12.2 reload at 10,000 rules, every replacement style".into(),
        target: "p99 ≤ 100 ms".into(),
        measured: format!("worst style's p99 {}", p99s.join(", ")),
        met: worst_p99 <= 100.0,
    }];
    for (spread, f) in &figures {
        targets.push(Target {
            item: format!(
                "12.8, 19.3 RSS at 10,000 rules (2,000 globs in {}) after start and reloads",
                spread.name()
            ),
            target: "≤ 30 MiB".into(),
            measured: format!(
                "{:.1} MiB after start; at most {:.1} MiB after {} reloads",
                f.start_rss,
                f.worst_rss,
                iterations + 1
            ),
            met: f.start_rss <= 30.0 && f.worst_rss <= 30.0,
        });
        targets.push(Target {
            item: format!(
                "19.3 peak RSS at 10,000 rules (2,000 globs in {}) while reloads compile",
                spread.name()
            ),
            target: "≤ 40 MiB".into(),
            measured: format!("VmHWM at most {:.1} MiB", f.worst_peak),
            met: f.worst_peak <= 40.0,
        });
    }
    Ok((body, targets))
}

/// Every style's reloads at 10,000 rules whose globs are spread the `spread` way: one
/// row each appended to `table`.
fn spread_rows(
    art: &Artifacts,
    iterations: usize,
    spread: GlobSpread,
    table: &mut String,
) -> anyhow::Result<SpreadFigures> {
    let filler = filler_10k(spread);
    let mut f = SpreadFigures::default();
    let mib = |kib: u64| kib as f64 / 1024.0;
    for style in Style::ALL {
        let dir = tempfile::tempdir()?;
        let root = dir.path();
        let mut first = harness::one_rule_policy(
            "gen-0",
            &harness::path_matcher(&art.bench),
            "unlock = \"apple7\"",
        );
        first.push_str(&filler);
        let daemon = Daemon::start(art, root, &first, &[])?;
        f.start_rss = f.start_rss.max(mib(harness::memory(daemon.pid())?.rss_kib));
        let mut polls = Samples::new();
        // Generation 1 sets the style's layout up (links, policy.d); not measured.
        std::thread::sleep(GAP);
        replace(style, root, art, &filler, 1)?;
        until_live(&daemon, 1, &mut polls)?;
        let mut reload = Samples::new();
        for generation in 2..iterations + 2 {
            std::thread::sleep(GAP);
            let start = Instant::now();
            replace(style, root, art, &filler, generation)?;
            until_live(&daemon, generation, &mut polls)?;
            reload.push(start.elapsed().as_secs_f64() * 1e3);
        }
        std::thread::sleep(GAP);
        let mem = harness::memory(daemon.pid())?;
        let p99 = reload.percentile(99.0);
        f.worst_p99 = f.worst_p99.max(p99);
        f.worst_rss = f.worst_rss.max(mib(mem.rss_kib));
        f.worst_peak = f.worst_peak.max(mib(mem.hwm_kib));
        table.push_str(&format!(
            "| {} | {} | {} | {:.1} / {:.1} / {:.1} | {:.1} / {:.1} |\n",
            spread.name(),
            style.name(),
            reload.len(),
            reload.median(),
            p99,
            reload.max(),
            mib(mem.rss_kib),
            mib(mem.hwm_kib),
        ));
    }
    Ok(f)
}
