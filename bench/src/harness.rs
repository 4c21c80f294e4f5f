//! What every benchmark needs: the built artifacts, a real metaliftd on a
//! temporary socket, a raw-protocol client, and the kernel's view of a process
//! (RSS, CPU time).
#![forbid(unsafe_code)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use metalift_daemon::scratch::{ScratchDaemon, ScratchDir};
use metalift_policy::wire::{self, CheckIn, Client, ClientError, Message, VerdictMsg};

/// How long any single exchange may take before the harness calls it a hang.
pub const HANG_GUARD: Duration = Duration::from_secs(30);

/// The binaries the benchmarks run, all from one build.
#[derive(Debug, Clone)]
pub struct Artifacts {
    /// `metaliftd`.
    pub daemon: PathBuf,
    /// `metalift-probe` (linked to the simulated Metal on Linux).
    pub probe: PathBuf,
    /// `libmetalift.so`.
    pub shim: PathBuf,
    /// This benchmark binary (copied and padded into the 100 MB executable).
    pub bench: PathBuf,
}

impl Artifacts {
    /// Finds the artifacts next to this binary (`target/release/`), or in
    /// `$METALIFT_BENCH_BIN_DIR`. They must have been built first:
    /// `cargo build --release -p metalift-daemon -p metalift-probe -p metalift-shim`.
    pub fn locate() -> anyhow::Result<Artifacts> {
        let bench = std::env::current_exe()
            .context("locating this binary")?
            .canonicalize()?;
        let dir = match std::env::var_os("METALIFT_BENCH_BIN_DIR") {
            Some(dir) => PathBuf::from(dir),
            None => bench
                .parent()
                .context("binary has no directory")?
                .to_owned(),
        };
        let find = |name: &str| -> anyhow::Result<PathBuf> {
            let path = dir.join(name);
            path.canonicalize().with_context(|| {
                format!(
                    "{} is missing: build it first (cargo build --release -p metalift-daemon \
                     -p metalift-probe -p metalift-shim), or set METALIFT_BENCH_BIN_DIR",
                    path.display()
                )
            })
        };
        Ok(Artifacts {
            daemon: find("metaliftd")?,
            probe: find("metalift-probe")?,
            shim: find("libmetalift.so")?,
            bench,
        })
    }
}

/// The policy text of a single-rule policy (`[profile.apple7]` plus one rule).
#[must_use]
pub fn one_rule_policy(rule_id: &str, matcher: &str, action: &str) -> String {
    format!(
        "version = 1\nmode = \"enforce\"\n\n[profile.apple7]\napple_family_max = 7\n\
         max_threadgroup_memory = 32768\n\n[[rule]]\nid = \"{rule_id}\"\n{matcher}\n{action}\n"
    )
}

/// `path = "<exact path>"` as a TOML matcher line.
#[must_use]
pub fn path_matcher(path: &Path) -> String {
    format!("path = {}", toml_string(&path.display().to_string()))
}

/// A TOML basic string (quotes and backslashes escaped).
#[must_use]
pub fn toml_string(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Replaces `path` the way an editor's atomic save does: write a temporary file
/// beside it (mode 0644), then `rename(2)` it over.
pub fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("toml.tmp");
    std::fs::write(&tmp, text)?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644))?;
    std::fs::rename(&tmp, path)
}

/// A real metaliftd on a temporary directory (the one scratch daemon,
/// `metalift_daemon::scratch`); killed on drop.
#[derive(Debug)]
pub struct Daemon {
    process: ScratchDaemon,
    /// Its socket.
    pub socket: PathBuf,
    /// Its policy file.
    pub policy: PathBuf,
    /// Its audit log.
    pub audit_log: PathBuf,
    dir: ScratchDir,
}

impl Daemon {
    /// Writes `policy` into `dir/etc/policy.toml` and starts `artifacts.daemon` on
    /// `dir/run/metalift.sock`, logging to `dir/log/audit.jsonl` (rotation past 1 GiB only,
    /// so a benchmark reads back every record), with `extra` flags.
    pub fn start(
        artifacts: &Artifacts,
        dir: &Path,
        policy: &str,
        extra: &[&str],
    ) -> anyhow::Result<Daemon> {
        let dir = ScratchDir::new(dir)?;
        dir.write_policy(policy)?;
        let mut flags = vec!["--audit-max-bytes", "1073741824"];
        flags.extend_from_slice(extra);
        let process = dir.start(&artifacts.daemon, &flags, &[("RUST_LOG", "info")])?;
        Ok(Daemon {
            process,
            socket: dir.socket(),
            policy: dir.policy(),
            audit_log: dir.audit_log(),
            dir,
        })
    }

    /// The daemon's pid.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// Every audit record, parsed.
    pub fn records(&self) -> anyhow::Result<Vec<serde_json::Value>> {
        Ok(self.dir.records()?)
    }
}

/// The frame a shim sends (precomputed once by callers that loop).
#[must_use]
pub fn check_in_frame() -> Vec<u8> {
    wire::encode_frame(&Message::CheckIn(CheckIn {
        shim_version: "bench".into(),
        arch: std::env::consts::ARCH.into(),
        claimed_executable: None,
        job: None,
    }))
}

/// One check-in as a shim makes it: connect, send, read the verdict, close.
pub fn check_in(socket: &Path) -> Result<VerdictMsg, ClientError> {
    check_in_with(socket, &check_in_frame())
}

/// [`check_in`] with a prebuilt frame (so a timed loop does not time the encoding).
pub fn check_in_with(socket: &Path, frame: &[u8]) -> Result<VerdictMsg, ClientError> {
    check_in_on(&mut Client::connect(socket, HANG_GUARD)?, socket, frame)
}

/// Sends a prebuilt check-in frame on `client` (connected to `socket`) and reads the verdict.
pub fn check_in_on(
    client: &mut Client,
    socket: &Path,
    frame: &[u8],
) -> Result<VerdictMsg, ClientError> {
    client.send_bytes(frame)?;
    match client.receive()? {
        Some(Message::Verdict(v)) => Ok(v),
        Some(other) => Err(ClientError::Unexpected {
            socket: socket.to_owned(),
            expected: "verdict",
            got: Box::new(other),
        }),
        None => Err(ClientError::Closed {
            socket: socket.to_owned(),
        }),
    }
}

/// Asks for the status (the daemon is up when this succeeds).
pub fn status(socket: &Path) -> Result<String, ClientError> {
    Client::status(socket, HANG_GUARD)
}

/// Resident memory of a process, from `/proc/<pid>/status`.
#[derive(Debug, Clone, Copy)]
pub struct Memory {
    /// `VmRSS`, KiB: resident now.
    pub rss_kib: u64,
    /// `VmHWM`, KiB: the peak resident size so far.
    pub hwm_kib: u64,
}

/// Reads `VmRSS` and `VmHWM` of `pid`.
pub fn memory(pid: u32) -> anyhow::Result<Memory> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    let field = |name: &str| -> anyhow::Result<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .with_context(|| format!("no {name} in /proc/{pid}/status"))
    };
    Ok(Memory {
        rss_kib: field("VmRSS:")?,
        hwm_kib: field("VmHWM:")?,
    })
}

/// User + system CPU time a process (all its threads) has used, from `/proc/<pid>/stat`.
pub fn cpu_time(pid: u32) -> anyhow::Result<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // The command name may hold spaces and parentheses: fields start after the last ')'.
    let rest = text
        .rsplit_once(')')
        .map(|(_, r)| r)
        .context("malformed stat")?;
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3 of stat(5), so utime (14) and stime (15) are at 11 and 12.
    let ticks = |i: usize| -> anyhow::Result<u64> {
        fields
            .get(i)
            .and_then(|f| f.parse().ok())
            .context("malformed stat")
    };
    // USER_HZ is 100 in the Linux ABI on every architecture rustc targets.
    Ok(Duration::from_millis((ticks(11)? + ticks(12)?) * 10))
}

/// Facts about this machine for the report header.
#[must_use]
pub fn machine_facts() -> Vec<(String, String)> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let cpu = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown".into());
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let kernel = read("/proc/sys/kernel/osrelease").trim().to_owned();
    let load = read("/proc/loadavg")
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ");
    let rustc = Command::new("rustc")
        .arg("--version")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
        .unwrap_or_else(|_| "unknown".into());
    vec![
        ("CPUs (nproc)".into(), cpus.to_string()),
        ("CPU model".into(), cpu),
        ("kernel".into(), kernel),
        ("rustc".into(), rustc),
        ("load average at start (1/5/15 min)".into(), load),
    ]
}

/// The 1-minute load average now.
#[must_use]
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .next()
        .unwrap_or("?")
        .to_owned()
}

/// Runs `cmd` once with its output discarded and returns its wall time; a
/// failing command is an error (a benchmark of a broken run means nothing).
pub fn time(mut cmd: Command) -> anyhow::Result<Duration> {
    cmd.stdout(Stdio::null()).stderr(Stdio::null());
    let start = Instant::now();
    let status = cmd.status()?;
    let elapsed = start.elapsed();
    if !status.success() {
        bail!("benchmark command failed: {status}");
    }
    Ok(elapsed)
}

/// The highest Apple family `metalift-probe --json` (the command given) reports.
pub fn apple_family(mut cmd: Command) -> anyhow::Result<i64> {
    let out = cmd.arg("--json").output()?;
    let json: serde_json::Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("probe output: {}", String::from_utf8_lossy(&out.stdout)))?;
    json["apple_family"].as_i64().context("no apple_family")
}

/// `program` with no METALIFT_* or preload variables inherited from the
/// benchmark's own environment, stdin from /dev/null.
#[must_use]
pub fn clean(program: &Path) -> Command {
    let mut cmd = Command::new(program);
    for (key, _) in std::env::vars_os() {
        let key = key.to_string_lossy().into_owned();
        if key.starts_with("METALIFT_") || key == "LD_PRELOAD" || key == "LD_LIBRARY_PATH" {
            cmd.env_remove(key);
        }
    }
    cmd.stdin(Stdio::null());
    cmd
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn toml_strings_escape_quotes_and_backslashes() {
        assert_eq!(toml_string(r#"/a "b"\c"#), r#""/a \"b\"\\c""#);
    }

    #[test]
    fn a_one_rule_policy_is_accepted_by_the_policy_engine() {
        let text = one_rule_policy(
            "r",
            &path_matcher(Path::new("/opt/x y")),
            "unlock = \"apple7\"",
        );
        let sources = vec![metalift_policy::Source::new("policy.toml", &text)];
        let loaded = metalift_policy::compile_sources(sources)
            .unwrap_or_else(|e| panic!("refused: {e}\n{text}"));
        assert_eq!(loaded.policy.rule_count(), 1);
    }

    #[test]
    fn this_process_has_a_resident_size_and_cpu_time() {
        let me = std::process::id();
        let mem = memory(me).expect("memory");
        assert!(mem.rss_kib > 0 && mem.hwm_kib >= mem.rss_kib);
        let spin = Instant::now();
        while spin.elapsed() < Duration::from_millis(30) {
            std::hint::black_box(0u64);
        }
        cpu_time(me).expect("cpu time");
    }
}
