//! `metalift audit flush`: waits until every record written before it was sent to
//! the syslog collector (`[audit.forward]`) and acknowledged: over TCP and TLS by
//! the collector's TCP stack (the daemon's socket send queue is empty), which says
//! the collector's kernel has the bytes, not that the collector wrote them out;
//! over RELP by the collector itself (every message answered). See
//! docs/src/operations/forwarding.md.
//!
//! It asks the daemon's status socket (any user may) and looks at the audit log's
//! live file (device, inode, size) when it starts: that needs the log directory's
//! group (the admin decides who may flush). Exit 0 when delivered, or when no
//! forwarder is configured; 1 on a timeout, saying how far behind; 2 when it cannot ask.

use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use metalift_daemon::audit::forward::cursor::Cursor;
use metalift_daemon::audit::forward::ForwarderStatus;
use metalift_daemon::audit::rotation::rotated_path;

/// Arguments of `metalift audit flush`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Exit status:
  0  every record written before the flush was sent and acknowledged (RELP:
     by the collector; TCP, TLS: by the collector's TCP stack), or no
     forwarder is configured
  1  the timeout passed first (how far behind is printed)
  2  the daemon or the audit log could not be asked")]
pub struct Args {
    /// Where the daemon is (as for `metalift status`).
    #[command(flatten)]
    pub daemon: crate::daemon_args::DaemonArgs,
    /// Give up after this many seconds.
    #[arg(long, value_name = "S", default_value_t = 30.0)]
    pub timeout: f64,
}

/// Where the log's live file ended when the flush began.
#[derive(Debug, Clone, Copy)]
struct Target {
    dev: u64,
    ino: u64,
    size: u64,
}

/// Runs `metalift audit flush`.
pub fn run(args: &Args, out: &mut dyn Write) -> anyhow::Result<ExitCode> {
    let socket = args.daemon.socket()?;
    let ask = || args.daemon.status(&socket);
    let report = ask().with_context(|| "metalift audit flush: cannot ask the daemon")?;
    let Some(forwarder) = report.forwarder.as_ref().filter(|f| f.configured) else {
        writeln!(out, "no forwarder configured: nothing to flush")?;
        return Ok(ExitCode::SUCCESS);
    };
    let log = PathBuf::from(
        report
            .audit_log
            .as_deref()
            .context("the daemon names no audit log")?,
    );
    let meta = std::fs::metadata(&log).with_context(|| {
        format!(
            "cannot look at the audit log {} (flush needs the log directory's group, or root)",
            log.display()
        )
    })?;
    let target = Target {
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.len(),
    };
    let timeout = Duration::try_from_secs_f64(args.timeout).context("--timeout")?;
    let deadline = Instant::now() + timeout;
    let mut last: ForwarderStatus = forwarder.clone();
    loop {
        if delivered(&last, target, &log) {
            writeln!(
                out,
                "flushed: every record up to {} bytes of {} sent to {} and {}",
                target.size,
                log.display(),
                last.address.as_deref().unwrap_or("?"),
                acknowledged_by(&last),
            )?;
            return Ok(ExitCode::SUCCESS);
        }
        if Instant::now() >= deadline {
            writeln!(
                out,
                "audit flush: timed out after {}s: {}",
                args.timeout,
                undelivered(&last)
            )?;
            return Ok(ExitCode::from(1));
        }
        std::thread::sleep(Duration::from_millis(50));
        last = ask()
            .with_context(|| "metalift audit flush: cannot ask the daemon")?
            .forwarder
            .unwrap_or_default();
    }
}

/// Who acknowledged what a flush waited for: over RELP the collector itself
/// (it answered every message); over TCP and TLS only the collector's TCP stack
/// can (the bytes reached its kernel; whether the collector wrote them out, TCP
/// cannot tell).
fn acknowledged_by(f: &ForwarderStatus) -> &'static str {
    if matches!(f.transport.as_deref(), Some("relp" | "relp-tls")) {
        "acknowledged by the collector (RELP)"
    } else {
        "acknowledged by the collector's TCP stack"
    }
}

/// What is not delivered, in words, and what to do: the timeout's message.
/// Nothing is guessed: a figure the daemon could not measure is said to be unknown.
fn undelivered(f: &ForwarderStatus) -> String {
    let address = f.address.as_deref().unwrap_or("the collector");
    let unsent = if f.bytes_behind == 0 {
        "nothing left to send".to_owned()
    } else {
        format!(
            "{} records ({} bytes) not yet sent",
            f.records_behind, f.bytes_behind
        )
    };
    let state = if !f.connected {
        format!("not connected to {address}: nothing in flight; {unsent}")
    } else {
        match f.unacknowledged_bytes {
            Some(0) => {
                format!("connected to {address}: everything sent was acknowledged; {unsent}")
            }
            Some(n) => format!(
                "connected to {address}: {n} bytes sent and not {} yet; {unsent}",
                acknowledged_by(f)
            ),
            None => format!(
                "connected to {address}: whether what was sent was acknowledged is not known \
                 (the daemon could not read its socket's send queue); {unsent}"
            ),
        }
    };
    let error = f
        .last_error
        .as_deref()
        .map_or_else(String::new, |e| format!(" (last error: {e})"));
    format!(
        "{state}{error}. The records are safe in the local log and are sent once the \
         collector takes them; to hand them over another way now, `metalift audit export --to DIR`"
    )
}

/// Whether the forwarder's cursor is at or past `target` and nothing waits for
/// the collector's acknowledgement.
fn delivered(f: &ForwarderStatus, target: Target, log: &Path) -> bool {
    let Some(pos) = f.position else { return false };
    if f.unacknowledged_bytes != Some(0) {
        return false;
    }
    if pos.dev == target.dev && pos.ino == target.ino {
        return pos.offset >= target.size;
    }
    // Another file: delivered when it is newer than the target's (lower in the chain).
    let place = |c: (u64, u64)| {
        (0..1000).find_map(|n| {
            let p = if n == 0 {
                log.to_owned()
            } else {
                rotated_path(log, n)
            };
            let m = std::fs::metadata(p).ok()?;
            (m.dev() == c.0 && m.ino() == c.1).then_some(n)
        })
    };
    let _: &Cursor = &pos;
    match (place((pos.dev, pos.ino)), place((target.dev, target.ino))) {
        (Some(p), Some(t)) => p < t,
        (Some(_), None) => true,
        _ => false,
    }
}
