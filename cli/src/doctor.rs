//! `metalift doctor`: is this installation able to unlock anything? Each check is
//! one line, `ok` / `warn` / `fail` (or `n/a`), with the fix: the daemon and its
//! socket, the policy (readable, secure, valid, live), the audit log, the shim and
//! its architectures, SIP, the daemon's Full Disk Access, a macOS 14 guest's mmap
//! problem, where `DYLD_INSERT_LIBRARIES` is configured, whether any rule unlocks
//! (a failure under `--bake`), the labels and forwarder a fleet image requires
//! (`--require-label`, `--require-forward`), and the executables exact-path rules
//! name (with `metalift exec`'s checks).

mod bake;
pub mod check;
mod daemon;
mod files;
mod forward;
mod gpu;
mod guest;
mod health;
mod launchd;
pub mod marker;
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
use crate::judgement::{Judgement, Level};
use metalift_daemon::audit::DEFAULT_LOG_PATH;
use metalift_daemon::service::config::DEFAULT_POLICY;

/// Arguments of `metalift doctor`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("socket", |a| a.help(
    "The daemon's socket [default: as `metalift status`; under --root, the system socket there]"
)))]
#[command(after_help = "\
Exit status:
  0  no check fails: it can unlock (warnings are advice and exit 0)
  1  with --strict: warnings (it works, but something will surprise you)
  2  failures: processes will run stock (the shim, the injection, the policy file)
  3  the daemon's state fails as `metalift status` exits: the file on disk is not live
  4  the daemon's state fails as `metalift status` exits: degraded
  5  the daemon's state fails as `metalift status` exits: it unlocks nothing

--bake prints one line per check for a build log, `ok|warn|FAIL <check>: <message>`
(a fix after \" -- fix: \"), and exits 0 only when no line says FAIL; with --strict
a warning is printed and counted as FAIL.")]
pub struct Args {
    // Where the daemon is (under --root, the socket defaults to the system socket there).
    #[command(flatten)]
    pub daemon: crate::daemon_args::DaemonArgs,
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
    /// The shim [default: $METALIFT_SHIM, as `metalift exec` finds it; else
    /// /usr/local/metalift/lib/libmetalift.dylib (.so) under --root].
    #[arg(long, value_name = "PATH", env = "METALIFT_SHIM")]
    pub shim: Option<PathBuf>,
    /// Look at an installation under DIR instead of / (tests, mounted images).
    #[arg(long, value_name = "DIR", default_value = "/")]
    pub root: PathBuf,
    /// Accept a policy not owned by root (development, as metaliftd's flag).
    #[arg(long)]
    pub allow_insecure_owner: bool,
    /// Print one JSON object.
    #[arg(long, conflicts_with = "bake")]
    pub json: bool,
    /// Warnings fail too (exit 1 when some check warns and none fails).
    #[arg(long)]
    pub strict: bool,
    /// For image bakes (Packer, CI): one line per check, `ok|warn|FAIL <check>: <message>`;
    /// exit 0 only when no line says FAIL.
    #[arg(long)]
    pub bake: bool,
    /// Fail unless the policy's [audit.labels] has KEY (repeatable), for fleet images.
    #[arg(long = "require-label", value_name = "KEY")]
    pub require_labels: Vec<String>,
    /// Fail unless [audit.forward] is live and the forwarder is connected to its collector.
    #[arg(long)]
    pub require_forward: bool,
    /// With --require-forward: the collector cannot be reached from the build network;
    /// configured is enough, and records waiting for it (forward_behind) do not fail.
    #[arg(long, requires = "require_forward")]
    pub forward_unreachable_ok: bool,
}

fn install(args: &Args) -> Install {
    let root = args.root.clone();
    let at_root = |p: &str| Install::under(&root, p);
    let (socket, socket_given) = match args.daemon.given() {
        Some(s) => (s.to_owned(), true),
        None if root != std::path::Path::new("/") => {
            (at_root(metalift_policy::socket_path::SYSTEM_SOCKET), false)
        }
        None => (
            args.daemon
                .socket()
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
        // The shim `metalift exec` would inject ($METALIFT_SHIM reaches here as
        // --shim), found the same way on this system; under --root, the installed one.
        shim: args.shim.clone().unwrap_or_else(|| {
            if root == std::path::Path::new("/") {
                crate::exec::find_shim(None, None).unwrap_or_else(|_| Install::default_shim(&root))
            } else {
                Install::default_shim(&root)
            }
        }),
        socket,
        socket_given,
        root,
    }
}

/// Runs every check, in the order an admin fixes things.
#[must_use]
pub fn checks(args: &Args) -> Vec<Check> {
    checks_judged(args).0
}

/// The checks, and the judgement of the daemon they were made with.
#[must_use]
pub fn checks_judged(args: &Args) -> (Vec<Check>, Judgement) {
    let install = install(args);
    let (daemon, judged) = daemon::reachable(&args.daemon, &install.socket);
    // Told the collector is out of reach from here: its backlog is expected.
    let judged = if args.forward_unreachable_ok {
        judged.without(metalift_daemon::service::health::code::FORWARD_BEHIND)
    } else {
        judged
    };
    let report = judged.report.clone();
    // The limit and the host chip as the daemon has them (its status), not as
    // this CLI was compiled.
    let (policy, loaded) = daemon::policy(
        &install.policy,
        args.allow_insecure_owner,
        judged.max_policy_bytes(),
        report.as_ref().and_then(|r| r.host_chip_brand.clone()),
    );
    let live = daemon::live_matches(&install.policy, report.as_ref(), loaded.as_ref());
    let mut shim = files::shim(&install.shim);
    if shim.status == Status::Fail && !install.shim.exists() {
        shim = shim.fix(launchd::missing_shim_fix(&install));
    }
    let shim_ok = shim.status == Status::Ok;
    let verified = verified::profiles(
        loaded.as_ref(),
        &install.policy,
        report.as_ref(),
        args.allow_insecure_owner,
    );
    let mut all = vec![
        daemon,
        health::daemon_health(&judged),
        marker::for_this_user(&install.socket).check(),
        policy,
        live,
        audit_log(&install.audit_log, report.as_ref()),
        forward::forwarder(report.as_ref(), &judged),
        shim,
    ];
    all.extend(verified);
    all.push(system::sip(&install.root));
    all.push(tcc::full_disk_access(&install.root, report.as_ref()));
    all.push(guest::metal_mmap(&install.root));
    all.push(gpu::stock(loaded.as_ref()));
    all.extend(launchd::injection(&install));
    all.push(launchd::session(&install));
    all.push(bake::unlocking_rule(loaded.as_ref(), args.bake));
    all.extend(bake::labels(loaded.as_ref(), &args.require_labels));
    if args.require_forward {
        all.push(bake::forward(report.as_ref(), args.forward_unreachable_ok));
    }
    all.extend(rules::executables(loaded.as_ref(), &install.shim, shim_ok));
    (all, judged)
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

/// The exit status for a set of checks: 0 when none fails (warnings are advice),
/// the daemon's ladder code ([`crate::judgement`]: 3, 4, 5) when its state is what
/// fails, [`FAILURES`] when another check fails; with `strict`, [`WARNINGS`] when
/// some warns and none fails.
#[must_use]
pub fn exit_status(checks: &[Check], judged: &Judgement, strict: bool) -> u8 {
    match checks.iter().map(|c| c.status).max() {
        Some(Status::Fail) if judged.level > Level::Healthy => judged.exit_code(),
        Some(Status::Fail) => FAILURES,
        Some(Status::Warn) if strict => WARNINGS,
        _ => 0,
    }
}

/// One `--bake` line: `ok|warn|FAIL <check>: <message>[ -- fix: <fix>]`; a
/// warning under `strict` is a `FAIL`, and `n/a` is `ok` (it says n/a after the colon).
#[must_use]
pub fn bake_line(check: &Check, strict: bool) -> String {
    let word = match check.status {
        Status::Fail => "FAIL",
        Status::Warn if strict => "FAIL",
        Status::Warn => "warn",
        Status::Ok | Status::NotApplicable => "ok",
    };
    let na = if check.status == Status::NotApplicable {
        "n/a: "
    } else {
        ""
    };
    // One line each, whatever the message holds.
    let message = check.message.replace('\n', " ");
    let mut line = format!("{word} {}: {na}{message}", check.name);
    if !check.fix.is_empty() {
        line.push_str(" -- fix: ");
        line.push_str(&check.fix.replace('\n', " "));
    }
    line
}

/// Runs `metalift doctor`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let (checks, judged) = checks_judged(&args);
    let code = exit_status(&checks, &judged, args.strict);
    let mut out = std::io::stdout().lock();
    if args.bake {
        for check in &checks {
            writeln!(out, "{}", bake_line(check, args.strict))?;
        }
    } else if args.json {
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
