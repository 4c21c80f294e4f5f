//! Item 5: a 100 MB executable under a `sha256` rule, its first decision (the
//! daemon hashes the file) against every later one (served from the identity
//! cache), next to a plain check-in measured in the same run.
//!
//! The executables are copies of this benchmark binary: `big/` holds one padded
//! with pseudo-random bytes to 100 MiB (an ELF file runs with trailing bytes; they
//! are real data, not a sparse hole, so hashing reads 100 MiB), `plain/` an
//! unpadded copy. Both are run as `<copy> check-in-once --socket S`, which times
//! connect → verdict inside the child, so process start-up is not in the figure.
//!
//! Two metaliftd instances run side by side: one whose policy unlocks the big
//! file by `sha256` (so every check-in needs the hash), one whose policy unlocks
//! the plain copy by path (no hashing at all: the plain check-in). A first
//! decision is repeated by `touch`ing the big file, which changes its mtime and
//! ctime and so its identity-cache key. The file is in the page cache (it was
//! just written), so the first-decision figure is hashing, not disk reads.
#![forbid(unsafe_code)]

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use sha2::{Digest, Sha256};

use crate::harness::{self, Artifacts, Daemon};
use crate::stats::Samples;
use crate::{Section, Target};

/// The big executable's size.
pub const BIG_SIZE: u64 = 100 * 1024 * 1024;

/// Copies `from` to `to` (mode 0755), padded with pseudo-random bytes to `size`.
fn padded_copy(from: &Path, to: &Path, size: u64) -> anyhow::Result<()> {
    let mut bytes = std::fs::read(from)?;
    let target = usize::try_from(size)?.max(bytes.len());
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    while bytes.len() < target {
        // xorshift64: cheap, incompressible enough for a hash benchmark.
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        bytes.extend_from_slice(&x.to_le_bytes());
    }
    bytes.truncate(target);
    let mut f = std::fs::File::create(to)?;
    f.write_all(&bytes)?;
    f.sync_all()?;
    std::fs::set_permissions(to, std::fs::Permissions::from_mode(0o755))?;
    Ok(())
}

/// The body of `check-in-once`: one check-in, printed as `VERDICT <rule|-> <ns>`.
pub fn check_in_once(socket: &Path) -> anyhow::Result<()> {
    let frame = harness::check_in_frame();
    let t = std::time::Instant::now();
    let v = harness::check_in_with(socket, &frame)?;
    let ns = t.elapsed().as_nanos();
    println!("VERDICT {} {ns}", v.rule.as_deref().unwrap_or("-"));
    Ok(())
}

/// Runs `exe check-in-once` against `socket`; returns the rule and the round trip.
pub(crate) fn child_check_in(exe: &Path, socket: &Path) -> anyhow::Result<(String, Duration)> {
    let out = Command::new(exe)
        .arg("check-in-once")
        .arg("--socket")
        .arg(socket)
        .output()
        .with_context(|| format!("running {}", exe.display()))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.strip_prefix("VERDICT "))
        .with_context(|| {
            format!(
                "no verdict from {}: {stdout}{}",
                exe.display(),
                String::from_utf8_lossy(&out.stderr)
            )
        })?;
    let (rule, ns) = line.split_once(' ').context("malformed VERDICT line")?;
    Ok((rule.to_owned(), Duration::from_nanos(ns.parse()?)))
}

fn touch(path: &Path) -> anyhow::Result<()> {
    let f = std::fs::File::options().write(true).open(path)?;
    f.set_modified(SystemTime::now())?;
    Ok(())
}

/// The daemon-side `latency_us` of every decision for `exe`, in log order.
fn daemon_latencies(daemon: &Daemon, exe: &Path) -> anyhow::Result<Vec<f64>> {
    let exe = exe.display().to_string();
    Ok(daemon
        .records()?
        .iter()
        .filter(|r| r["kind"] == "decision" && r["exe"] == exe.as_str())
        .filter_map(|r| r["latency_us"].as_f64())
        .collect())
}

/// Runs item 5: `firsts` first decisions, then `laters` interleaved later and plain ones.
pub fn run(art: &Artifacts, firsts: usize, laters: usize) -> anyhow::Result<Section> {
    let dir = tempfile::tempdir_in(std::env::temp_dir())?;
    let big_dir = dir.path().join("big");
    let plain_dir = dir.path().join("plain");
    std::fs::create_dir_all(&big_dir)?;
    std::fs::create_dir_all(&plain_dir)?;
    let big: PathBuf = big_dir.join("metalift-bench-100mb");
    let plain: PathBuf = plain_dir.join("metalift-bench-plain");
    padded_copy(&art.bench, &big, BIG_SIZE)?;
    std::fs::copy(&art.bench, &plain)?;
    let digest = hex::encode(Sha256::digest(std::fs::read(&big)?));
    let size_mib = std::fs::metadata(&big)?.len() as f64 / (1024.0 * 1024.0);

    let hashed = Daemon::start(
        art,
        &big_dir,
        &harness::one_rule_policy(
            "big",
            &format!("sha256 = \"{digest}\""),
            "unlock = \"apple7\"",
        ),
        &[],
    )?;
    let by_path = Daemon::start(
        art,
        &plain_dir,
        &harness::one_rule_policy(
            "plain",
            &harness::path_matcher(&plain),
            "unlock = \"apple7\"",
        ),
        &[],
    )?;

    let load_before = harness::load_average();
    let mut first = Samples::new();
    for _ in 0..firsts {
        touch(&big)?;
        let (rule, t) = child_check_in(&big, &hashed.socket)?;
        if rule != "big" {
            bail!("the 100 MB executable was not matched by its sha256 rule (rule {rule})");
        }
        first.push_micros(t);
        // Later decisions below must all hit the cache of the last touch.
    }
    let mut later = Samples::new();
    let mut plain_rt = Samples::new();
    for _ in 0..laters {
        let (rule, t) = child_check_in(&big, &hashed.socket)?;
        if rule != "big" {
            bail!("later decision not matched (rule {rule})");
        }
        later.push_micros(t);
        let (rule, t) = child_check_in(&plain, &by_path.socket)?;
        if rule != "plain" {
            bail!("plain check-in not matched (rule {rule})");
        }
        plain_rt.push_micros(t);
    }
    let load_after = harness::load_average();

    // The daemon's own decision latency (received → decided, hashing included).
    let big_daemon = daemon_latencies(&hashed, &big)?;
    let mut first_daemon = Samples::new();
    let mut later_daemon = Samples::new();
    for (i, us) in big_daemon.iter().enumerate() {
        if i < firsts {
            first_daemon.push(*us);
        } else {
            later_daemon.push(*us);
        }
    }
    let mut plain_daemon = Samples::new();
    for us in daemon_latencies(&by_path, &plain)? {
        plain_daemon.push(us);
    }

    let ratio = later.median() / plain_rt.median();
    let hash_rate = size_mib / (first_daemon.median() / 1e6);
    let mut table = String::from(
        "| decision | n | check-in round trip in the child, µs: median (p10–p90) | metaliftd decision latency (`latency_us`), µs: median (p10–p90) |\n|---|---|---|---|\n",
    );
    for (name, rt, d) in [
        (
            "100 MiB executable, **first** decision (hash computed)",
            &mut first,
            &mut first_daemon,
        ),
        (
            "100 MiB executable, **later** decisions (identity cache)",
            &mut later,
            &mut later_daemon,
        ),
        (
            "plain check-in (small copy, path rule, no hashing)",
            &mut plain_rt,
            &mut plain_daemon,
        ),
    ] {
        table.push_str(&format!(
            "| {name} | {} | {} | {} |\n",
            rt.len(),
            rt.summary(0),
            d.summary(0)
        ));
    }
    let body = format!(
        "A {size_mib:.0} MiB executable (this benchmark binary padded with pseudo-random bytes) \
         under a `sha256` rule; {firsts} first decisions (each after a `touch`, which changes the \
         identity-cache key), then {laters} later decisions interleaved with {laters} plain \
         check-ins to a second metaliftd whose policy matches by path. The file is in the page \
         cache, so hashing runs at about {hash_rate:.0} MiB/s; a file read cold from disk adds its \
         read time to the first decision only. 1-min load average {load_before} before, \
         {load_after} after.\n\n{table}\n\
         Later / plain = **{ratio:.2}×**.\n"
    );
    let target = Target {
        item: "5. 100 MB executable under a sha256 rule".into(),
        target: "later decisions ≤ 2× a plain check-in".into(),
        measured: format!(
            "later {:.0} µs = {ratio:.2}× plain {:.0} µs (first decision {:.0} µs)",
            later.median(),
            plain_rt.median(),
            first.median()
        ),
        met: ratio <= 2.0,
    };
    Ok(Section {
        title: "100 MB executable under a sha256 rule (item 5)".into(),
        body,
        targets: vec![target],
    })
}
