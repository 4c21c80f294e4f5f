//! `metalift doctor`: is this installation able to unlock anything? Each check is
//! one line, `ok` / `warn` / `fail` (or `n/a`), with the fix: the daemon and its
//! socket, the policy (readable, secure, valid, live), the audit log, the shim and
//! its architectures, SIP, the daemon's Full Disk Access, a macOS 14 guest's mmap
//! problem, where `DYLD_INSERT_LIBRARIES` is configured, and the executables
//! exact-path rules name (with `metalift exec`'s checks).

pub mod check;
mod daemon;
mod files;
mod forward;
mod guest;
mod health;
mod launchd;
pub mod paths;
mod rules;
mod system;
mod tcc;
mod verified;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use self::check::{Check, Status};
use self::paths::Install;
use metalift_daemon::audit::DEFAULT_LOG_PATH;
use metalift_daemon::service::config::DEFAULT_POLICY;

/// Arguments of `metalift doctor`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Exit status:
  0  every check ok (or n/a)
  1  warnings: it works, but something will surprise you
  2  failures: processes will run stock, or the live policy is not the file")]
pub struct Args {
    /// The daemon's socket [default: as `metalift status`; under --root, the system socket there].
    #[arg(long, value_name = "PATH", env = "METALIFT_SOCKET")]
    pub socket: Option<PathBuf>,
    /// The main policy file [default: /etc/metalift/policy.toml under --root].
    #[arg(long, value_name = "PATH", env = "METALIFT_POLICY")]
    pub policy: Option<PathBuf>,
    /// The audit log [default: /var/log/metalift/audit.jsonl under --root].
    #[arg(
        long,
        visible_alias = "audit-log",
        value_name = "PATH",
        env = "METALIFT_AUDIT_LOG"
    )]
    pub log: Option<PathBuf>,
    /// The shim [default: /usr/local/metalift/lib/libmetalift.dylib (.so) under --root].
    #[arg(long, value_name = "PATH")]
    pub shim: Option<PathBuf>,
    /// Look at an installation under DIR instead of / (tests, mounted images).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// Accept a policy not owned by root (development, as metaliftd's flag).
    #[arg(long)]
    pub allow_insecure_owner: bool,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
}

fn install(args: &Args) -> Install {
    let root = args.root.clone();
    let at_root = |p: &str| Install::under(&root, p);
    let (socket, socket_given) = match &args.socket {
        Some(s) => (s.clone(), true),
        None if root != std::path::Path::new("/") => {
            (at_root(metalift_policy::socket_path::SYSTEM_SOCKET), false)
        }
        None => (
            metalift_daemon::service::config::default_client_socket()
                .unwrap_or_else(|_| PathBuf::from(metalift_policy::socket_path::SYSTEM_SOCKET)),
            false,
        ),
    };
    Install {
        policy: args
            .policy
            .clone()
            .unwrap_or_else(|| at_root(DEFAULT_POLICY)),
        audit_log: args
            .log
            .clone()
            .unwrap_or_else(|| at_root(DEFAULT_LOG_PATH)),
        shim: args
            .shim
            .clone()
            .unwrap_or_else(|| Install::default_shim(&root)),
        socket,
        socket_given,
        root,
    }
}

/// Runs every check, in the order an admin fixes things.
#[must_use]
pub fn checks(args: &Args) -> Vec<Check> {
    let install = install(args);
    let (daemon, report) = daemon::reachable(&install.socket);
    let (policy, loaded) = daemon::policy(&install.policy, args.allow_insecure_owner);
    let live = daemon::live_matches(&install.policy, report.as_ref(), loaded.as_ref());
    let shim = files::shim(&install.shim);
    let shim_ok = shim.status == Status::Ok;
    let verified = verified::profiles(
        loaded.as_ref(),
        &install.policy,
        report.as_ref(),
        args.allow_insecure_owner,
    );
    let mut all = vec![
        daemon,
        health::daemon_health(report.as_ref()),
        policy,
        live,
        audit_log(&install.audit_log, report.as_ref()),
        forward::forwarder(report.as_ref()),
        shim,
    ];
    all.extend(verified);
    all.push(system::sip(&install.root));
    all.push(tcc::full_disk_access(&install.root, report.as_ref()));
    all.push(guest::metal_mmap(&install.root));
    all.extend(launchd::injection(&install));
    all.push(launchd::session(&install));
    all.extend(rules::executables(loaded.as_ref(), &install.shim, shim_ok));
    all
}

/// The audit log as the daemon experiences it: the file's permissions (from
/// here), then the free space on its file system, and whether it is the log the
/// daemon writes. "writable" is never the last word while the disk is full.
fn audit_log(
    path: &std::path::Path,
    report: Option<&metalift_daemon::service::status::StatusReport>,
) -> Check {
    let check = files::audit_log(path);
    if check.status == Status::Fail {
        return check;
    }
    if let Some(full) = health::low_space(path, health::free_bytes_at(path)) {
        return full;
    }
    match report.and_then(|r| r.audit_log.as_deref()) {
        Some(daemon_log) if !paths::same_file(std::path::Path::new(daemon_log), path) => {
            Check::new(
                "audit log",
                Status::Warn,
                format!(
                    "metaliftd writes {daemon_log}, not {} (checked here)",
                    path.display()
                ),
            )
            .fix("pass doctor the daemon's --audit-log (or METALIFT_AUDIT_LOG)")
        }
        _ => check,
    }
}

/// Exit status: some check warns (and none fails).
pub const WARNINGS: u8 = 1;
/// Exit status: some check fails.
pub const FAILURES: u8 = 2;

/// The exit status for a set of checks: 0 ok, [`WARNINGS`], [`FAILURES`].
#[must_use]
pub fn exit_status(checks: &[Check]) -> u8 {
    match checks.iter().map(|c| c.status).max() {
        Some(Status::Fail) => FAILURES,
        Some(Status::Warn) => WARNINGS,
        _ => 0,
    }
}

/// Runs `metalift doctor`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let checks = checks(&args);
    let code = exit_status(&checks);
    let mut out = std::io::stdout().lock();
    if args.json {
        let worst = checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok);
        serde_json::to_writer(
            &mut out,
            &serde_json::json!({
                "ok": code == 0,
                "status": worst,
                "code": code,
                "checks": checks,
            }),
        )?;
        writeln!(out)?;
    } else {
        for check in &checks {
            writeln!(
                out,
                "{:<5} {:<12} {}",
                check.status.word(),
                check.name,
                check.message
            )?;
            if !check.fix.is_empty() {
                writeln!(out, "{:<18} fix: {}", "", check.fix)?;
            }
        }
        let (warns, fails) = (
            checks.iter().filter(|c| c.status == Status::Warn).count(),
            checks.iter().filter(|c| c.status == Status::Fail).count(),
        );
        writeln!(out, "\n{fails} failed, {warns} warnings")?;
    }
    Ok(ExitCode::from(code))
}
