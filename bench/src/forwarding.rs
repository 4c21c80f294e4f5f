//! Issues 30 and 42: what forwarding the audit log costs. Check-ins/s at 64 clients
//! with `[audit.forward]` on and off, in alternating rounds of one run, once per
//! transport: plain TCP (to a real rsyslogd this benchmark starts on a loopback
//! port, with `examples/collectors/rsyslog.conf`) and RELP (rsyslogd's imrelp, with
//! `examples/collectors/rsyslog-relp.conf`: every record waits for rsyslogd's
//! answer before the forwarder's cursor passes it); and the daemon's resident
//! memory while the collector is down through 100,000 records (the backlog is the
//! local file, so memory should stay flat).
//!
//! Per transport, two daemons run side by side with the same rules, one forwarding and one not,
//! so the rounds alternate without a reload between them. The forwarder runs below
//! the verdict path, so under saturation it may fall behind during a round: after
//! each forwarding round the benchmark waits until rsyslogd has every record before
//! the next round starts (so no round pays for another's forwarding; the rows
//! alternate off, on, on, off, … so neither always follows the other), and prints
//! how far behind it was, how long catching up took, and the CPU per check-in of
//! the daemons and rsyslogd over the rounds and the catching up. Nothing here
//! asserts a time: a missed target is printed as missed.
#![forbid(unsafe_code)]

use std::cell::Cell;
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::harness::{self, Artifacts, Daemon};
use crate::stats::thousands;
use crate::throughput::{realistic_policy, round, Client, Level};
use crate::{Section, Target};

/// A transport the benchmark forwards over, with the shipped collector
/// configuration that receives it (the forwarding tests run the same files).
#[derive(Clone, Copy)]
struct Transport {
    /// The policy's `transport` value.
    name: &'static str,
    /// How the text names it.
    heading: &'static str,
    /// The configuration's file name in `examples/collectors/`.
    conf_file: &'static str,
    /// That file, with `@DIR@`/`@PORT@`.
    conf: &'static str,
    /// The target's name in the summary: issue 30 asked it for TCP, issue 42 for RELP.
    item: &'static str,
}

/// `transport = "tcp"` (the default), to rsyslog's imtcp.
const TCP: Transport = Transport {
    name: "tcp",
    heading: "over TCP",
    conf_file: "rsyslog.conf",
    conf: include_str!("../../examples/collectors/rsyslog.conf"),
    item: "issue 30: check-ins/s at 64 clients, forwarding on vs off over TCP (same run, median of per-round ratios)",
};

/// `transport = "relp"`, to rsyslog's imrelp (Debian's rsyslog-relp, which
/// scripts/setup.sh installs).
const RELP: Transport = Transport {
    name: "relp",
    heading: "over RELP",
    conf_file: "rsyslog-relp.conf",
    conf: include_str!("../../examples/collectors/rsyslog-relp.conf"),
    item: "issue 42: check-ins/s at 64 clients, forwarding on vs off over RELP (same run, median of per-round ratios)",
};

/// Debian's rsyslogd (scripts/setup.sh installs the `rsyslog` package).
const RSYSLOGD: &str = "/usr/sbin/rsyslogd";

/// A foreground rsyslogd on a loopback port; killed on drop.
struct Rsyslog {
    child: Child,
    /// Where it writes every message it received, one per line.
    out: PathBuf,
    /// Bytes of `out` counted so far, and the lines in them.
    counted: Cell<(u64, usize)>,
}

impl Drop for Rsyslog {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Rsyslog {
    fn start(dir: &Path, port: u16, transport: Transport) -> anyhow::Result<Rsyslog> {
        if !Path::new(RSYSLOGD).exists() {
            bail!("{RSYSLOGD} is not installed: run scripts/setup.sh (Debian packages rsyslog, rsyslog-relp)");
        }
        let work = dir.join("rsyslog");
        std::fs::create_dir_all(&work)?;
        let conf = work.join("rsyslog.conf");
        let work_str = work.to_str().context("temp dir is not UTF-8")?;
        std::fs::write(
            &conf,
            transport
                .conf
                .replace("@DIR@", work_str)
                .replace("@PORT@", &port.to_string()),
        )?;
        let child = Command::new(RSYSLOGD)
            .arg("-n")
            .arg("-f")
            .arg(&conf)
            .arg("-i")
            .arg(work.join("rsyslogd.pid"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(work.join("stderr"))?)
            .spawn()
            .with_context(|| format!("starting {RSYSLOGD}"))?;
        let collector = Rsyslog {
            child,
            out: work.join("metalift-audit.log"),
            counted: Cell::new((0, 0)),
        };
        let start = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if start.elapsed() > harness::HANG_GUARD {
                bail!("rsyslogd did not listen on 127.0.0.1:{port}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(collector)
    }

    /// Messages received so far (counting only what was added since the last call).
    fn received(&self) -> usize {
        let (mut offset, mut lines) = self.counted.get();
        if let Ok(mut f) = std::fs::File::open(&self.out) {
            let mut buf = Vec::new();
            if f.seek(SeekFrom::Start(offset)).is_ok() && f.read_to_end(&mut buf).is_ok() {
                offset += buf.len() as u64;
                lines += buf.iter().filter(|&&c| c == b'\n').count();
            }
        }
        self.counted.set((offset, lines));
        lines
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }
}

/// Waits until the forwarder has sent every byte of the log and rsyslogd has
/// written every record it was sent; how long that took.
fn catch_up(socket: &Path, collector: &Rsyslog) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        let fwd = forwarder(socket)?;
        let sent_all = fwd["bytes_behind"].as_u64() == Some(0);
        let delivered = fwd["delivered_records"].as_u64().unwrap_or(u64::MAX);
        if sent_all && collector.received() as u64 >= delivered {
            return Ok(start.elapsed());
        }
        if start.elapsed() > Duration::from_secs(120) {
            bail!("the forwarder did not catch up within 120 s: {fwd}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// CPU time and check-ins over the rounds of one row (and its catching up).
#[derive(Default)]
struct Cost {
    daemon: Duration,
    collector: Duration,
    /// This process: the 64 clients.
    load: Duration,
    checkins: u64,
}

impl Cost {
    fn per_checkin(d: Duration, n: u64) -> f64 {
        d.as_secs_f64() * 1e6 / n.max(1) as f64
    }
}

fn free_port() -> anyhow::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// The daemon's `forwarder` object from `metalift status --json`.
fn forwarder(socket: &Path) -> anyhow::Result<serde_json::Value> {
    let json: serde_json::Value = serde_json::from_str(&harness::status(socket)?)?;
    Ok(json["forwarder"].clone())
}

fn forwarding_policy(port: u16, transport: Transport) -> String {
    format!(
        "{}\n[audit.forward]\naddress = \"127.0.0.1:{port}\"\ntransport = \"{}\"\n",
        realistic_policy(),
        transport.name
    )
}

/// Runs every part: per transport, `rounds` alternating rounds of `length`; then
/// `records` check-ins with the collector down.
pub fn run(
    art: &Artifacts,
    rounds: usize,
    length: Duration,
    records: u64,
) -> anyhow::Result<Section> {
    let dir = tempfile::tempdir()?;
    let mut parts = Vec::new();
    let mut targets = Vec::new();
    for transport in [TCP, RELP] {
        let c = compare(
            art,
            &dir.path().join(transport.name),
            transport,
            rounds,
            length,
        )?;
        parts.push(c.body);
        targets.push(c.target);
    }
    let down = collector_down(art, &dir.path().join("down"), records)?;
    parts.push(down.body);
    targets.push(down.target);
    Ok(Section {
        title: "Audit forwarding (issues 30 and 42)".into(),
        body: parts.join("\n"),
        targets,
    })
}

/// One transport's comparison: its text and its target.
struct Comparison {
    body: String,
    target: Target,
}

/// `rounds` alternating rounds of `length` per row, forwarding over `transport`
/// and not, each daemon and the collector under `dir`.
fn compare(
    art: &Artifacts,
    dir: &Path,
    transport: Transport,
    rounds: usize,
    length: Duration,
) -> anyhow::Result<Comparison> {
    let port = free_port()?;
    let collector = Rsyslog::start(dir, port, transport)?;
    let off = Daemon::start(art, &dir.join("off"), &realistic_policy(), &[])?;
    let on = Daemon::start(
        art,
        &dir.join("on"),
        &forwarding_policy(port, transport),
        &[],
    )?;
    let load_before = harness::load_average();

    round(&off.socket, off.pid(), 64, length / 4, Client::CheckIn)?;
    round(&on.socket, on.pid(), 64, length / 4, Client::CheckIn)?;
    catch_up(&on.socket, &collector)?;
    let mut lo = Level::default();
    let mut ln = Level::default();
    let (mut cost_off, mut cost_on) = (Cost::default(), Cost::default());
    let (mut most_behind, mut longest_catch_up) = (0u64, Duration::ZERO);
    let me = std::process::id();
    // Rounds 2k and 2k+1 are one off and one on, next to each other: their ratio is
    // taken before the load moves on (the ratios BENCHMARKS.md's other same-run
    // figures use: the median of per-round ratios).
    let mut pair_ratios = crate::stats::Samples::new();
    let mut pending: Option<(bool, f64)> = None;
    // Off, on, on, off, off, on, …: whatever a round leaves behind for the next one
    // (the kernel writing back rsyslogd's output, say) falls on both rows alike.
    for forwarding in (0..rounds * 2).map(|i| matches!(i % 4, 1 | 2)) {
        if !forwarding {
            let before = (harness::cpu_time(off.pid())?, harness::cpu_time(me)?);
            let r = round(&off.socket, off.pid(), 64, length, Client::CheckIn)?;
            cost_off.daemon += harness::cpu_time(off.pid())?.saturating_sub(before.0);
            cost_off.load += harness::cpu_time(me)?.saturating_sub(before.1);
            cost_off.checkins += r.latencies.len() as u64;
            pair(&mut pending, &mut pair_ratios, false, r.per_second);
            lo.add(r);
            continue;
        }
        let before = (
            harness::cpu_time(on.pid())?,
            harness::cpu_time(collector.pid())?,
            harness::cpu_time(me)?,
        );
        let r = round(&on.socket, on.pid(), 64, length, Client::CheckIn)?;
        // The clients' CPU is the round's; the waiting below is the benchmark's.
        cost_on.load += harness::cpu_time(me)?.saturating_sub(before.2);
        let behind = forwarder(&on.socket)?["bytes_behind"].as_u64().unwrap_or(0);
        most_behind = most_behind.max(behind);
        longest_catch_up = longest_catch_up.max(catch_up(&on.socket, &collector)?);
        cost_on.daemon += harness::cpu_time(on.pid())?.saturating_sub(before.0);
        cost_on.collector += harness::cpu_time(collector.pid())?.saturating_sub(before.1);
        cost_on.checkins += r.latencies.len() as u64;
        pair(&mut pending, &mut pair_ratios, true, r.per_second);
        ln.add(r);
    }
    // Every record the forwarding daemon wrote reaches the collector.
    let written = on.records()?.len();
    let start = Instant::now();
    while collector.received() < written && start.elapsed() < Duration::from_secs(120) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let caught_up = start.elapsed();
    let received = collector.received();
    let fwd = forwarder(&on.socket)?;
    let load_after = harness::load_average();

    let mut table = String::from(
        "| forwarding, 64 clients | check-ins/s: median (p10–p90 of rounds) | latency µs p50 / p99 / p99.9 | errors | CPU cores used: server / load generator | check-ins per server CPU-second | server RSS / peak (VmRSS / VmHWM), MiB |\n\
         |---|---|---|---|---|---|---|\n",
    );
    let (rate_off, rate_on) = (lo.rates.median(), ln.rates.median());
    table.push_str(&lo.row("off", Some(harness::memory(off.pid())?)));
    table.push_str(&ln.row(
        &format!("on, {} to rsyslogd on 127.0.0.1:{port}", transport.heading),
        Some(harness::memory(on.pid())?),
    ));
    let of_medians = rate_on / rate_off.max(1e-9);
    let ratio = pair_ratios.median();
    let (ratio_p10, ratio_p90) = (pair_ratios.percentile(10.0), pair_ratios.percentile(90.0));
    let cpu_ratio = Cost::per_checkin(
        cost_on.daemon + cost_on.collector + cost_on.load,
        cost_on.checkins,
    ) / Cost::per_checkin(cost_off.daemon + cost_off.load, cost_off.checkins)
        .max(1e-9);
    // The same without rsyslogd's part: in a fleet the collector is another
    // machine, and only the daemon's forwarder is the guest's.
    let guest_cpu_ratio = Cost::per_checkin(cost_on.daemon + cost_on.load, cost_on.checkins)
        / Cost::per_checkin(cost_off.daemon + cost_off.load, cost_off.checkins).max(1e-9);
    drop(on);
    drop(off);
    drop(collector);

    let body = format!(
        "**Forwarding {}** (`examples/collectors/{}`): \
         {rounds} rounds of {:.1} s per row (off, on, on, off, …), two daemons with the same four rules \
         (one with `[audit.forward]`, one without), each connection one check-in; load generator \
         on the same CPUs. 1-min load average {load_before} before, {load_after} after.\n\n{table}\n\
         on / off, the median of the {} per-round-pair ratios: **{ratio:.3}×** (p10–p90 \
         {ratio_p10:.3}–{ratio_p90:.3}×; the ratio of the two rows' medians: {of_medians:.3}×). \
         The forwarding daemon wrote {written} records; rsyslogd had \
         received {received} of them {:.1} s after the last round (forwarder: {} delivered, {} \
         behind, last error {}).\n\n\
         The forwarder runs below the verdict path (nice 10): at the end of a forwarding round \
         it was at most {:.1} MiB of log behind, and rsyslogd had every record at most {:.2} s \
         later (the next round waits for that). CPU per check-in over the rounds and that \
         catching up: daemon without forwarding {:.1} µs; with forwarding {:.1} µs, and \
         rsyslogd {:.1} µs; the 64 clients {:.1} / {:.1} µs. \
         All of it, on / off: {:.3}× the CPU per check-in (so {:.3}× the check-ins/s if the \
         CPUs did nothing else); without rsyslogd's part (in a fleet the collector is another \
         machine): {:.3}× (so {:.3}×).\n",
        transport.heading,
        transport.conf_file,
        length.as_secs_f64(),
        pair_ratios.len(),
        caught_up.as_secs_f64(),
        fwd["delivered_records"],
        fwd["records_behind"],
        fwd["last_error"],
        most_behind as f64 / (1024.0 * 1024.0),
        longest_catch_up.as_secs_f64(),
        Cost::per_checkin(cost_off.daemon, cost_off.checkins),
        Cost::per_checkin(cost_on.daemon, cost_on.checkins),
        Cost::per_checkin(cost_on.collector, cost_on.checkins),
        Cost::per_checkin(cost_off.load, cost_off.checkins),
        Cost::per_checkin(cost_on.load, cost_on.checkins),
        cpu_ratio,
        1.0 / cpu_ratio.max(1e-9),
        guest_cpu_ratio,
        1.0 / guest_cpu_ratio.max(1e-9),
    );
    let target = Target {
        item: transport.item.into(),
        target: "≥ 0.95×".into(),
        measured: format!(
            "{ratio:.3}× (p10–p90 {ratio_p10:.3}–{ratio_p90:.3}×; medians {} /s on vs {} /s off; \
             from the CPU per check-in {:.3}×, {:.3}× without the collector's)",
            thousands(rate_on),
            thousands(rate_off),
            1.0 / cpu_ratio.max(1e-9),
            1.0 / guest_cpu_ratio.max(1e-9),
        ),
        met: ratio >= 0.95,
    };
    Ok(Comparison { body, target })
}

/// Pairs a round's rate with the round before it when that one was of the other
/// kind (off with on), pushing on / off; otherwise keeps it for the next round.
fn pair(
    pending: &mut Option<(bool, f64)>,
    ratios: &mut crate::stats::Samples,
    on: bool,
    rate: f64,
) {
    match pending.take() {
        Some((was_on, before)) if was_on != on => {
            let (on_rate, off_rate) = if on { (rate, before) } else { (before, rate) };
            ratios.push(on_rate / off_rate.max(1e-9));
        }
        _ => *pending = Some((on, rate)),
    }
}

struct Down {
    body: String,
    target: Target,
}

/// `records` check-ins against a daemon whose collector never listens; RSS sampled
/// after every round.
fn collector_down(art: &Artifacts, dir: &Path, records: u64) -> anyhow::Result<Down> {
    // A port nothing listens on: bound, then closed.
    let port = free_port()?;
    let daemon = Daemon::start(art, dir, &forwarding_policy(port, TCP), &[])?;
    let start_mem = harness::memory(daemon.pid())?;
    let mut done = 0u64;
    let mut peak_rss = start_mem.rss_kib;
    let started = Instant::now();
    while done < records {
        let r = round(
            &daemon.socket,
            daemon.pid(),
            64,
            Duration::from_millis(500),
            Client::CheckIn,
        )?;
        done += r.latencies.len() as u64;
        peak_rss = peak_rss.max(harness::memory(daemon.pid())?.rss_kib);
    }
    let elapsed = started.elapsed();
    let end = harness::memory(daemon.pid())?;
    let fwd = forwarder(&daemon.socket)?;
    let log_bytes = std::fs::metadata(&daemon.audit_log).map_or(0, |m| m.len());
    let mib = |k: u64| k as f64 / 1024.0;
    let growth = mib(peak_rss.saturating_sub(start_mem.rss_kib));
    let body = format!(
        "Collector down (nothing listens on 127.0.0.1:{port}) through {} check-ins (as many \
         decision records, {:.1} MiB of log unsent) in {:.1} s: daemon RSS at the start **{:.1} MiB**, highest sampled after a round \
         **{:.1} MiB**, at the end **{:.1} MiB** (VmHWM {:.1} MiB); forwarder {} records behind, \
         last error {}.\n",
        thousands(done as f64),
        log_bytes as f64 / (1024.0 * 1024.0),
        elapsed.as_secs_f64(),
        mib(start_mem.rss_kib),
        mib(peak_rss),
        mib(end.rss_kib),
        mib(end.hwm_kib),
        fwd["records_behind"],
        fwd["last_error"],
    );
    // Bounded: the backlog is the file, so growth should not follow the record
    // count. 16 MiB leaves room for the runtime's threads and buffers under 64
    // clients and is well below the size of the backlog (printed beside it).
    let target = Target {
        item: format!(
            "issue 30: daemon RSS, collector down, {} records",
            thousands(done as f64)
        ),
        target: "bounded (growth < 16 MiB)".into(),
        measured: format!(
            "start {:.1} / peak {:.1} / end {:.1} MiB",
            mib(start_mem.rss_kib),
            mib(peak_rss),
            mib(end.rss_kib)
        ),
        met: growth < 16.0,
    };
    Ok(Down { body, target })
}

#[cfg(test)]
mod tests {
    use super::pair;
    use crate::stats::Samples;

    #[test]
    fn each_off_round_is_paired_with_the_on_round_beside_it() {
        let mut ratios = Samples::new();
        let mut pending = None;
        // off, on, on, off, off, on: three pairs, whichever comes first.
        for (on, rate) in [
            (false, 100.0),
            (true, 95.0),
            (true, 90.0),
            (false, 100.0),
            (false, 50.0),
            (true, 49.0),
        ] {
            pair(&mut pending, &mut ratios, on, rate);
        }
        assert_eq!(ratios.len(), 3);
        assert!((ratios.percentile(0.0) - 0.90).abs() < 1e-9);
        assert!((ratios.median() - 0.95).abs() < 1e-9);
        assert!((ratios.percentile(100.0) - 0.98).abs() < 1e-9);
        assert!(pending.is_none());
    }
}
