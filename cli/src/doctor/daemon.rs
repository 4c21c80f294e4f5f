//! The daemon side of `metalift doctor`: is metaliftd reachable, is the policy on
//! disk readable, secure and valid, and is it the one live.

use std::path::Path;

use metalift_policy::wire::ClientError;
use metalift_policy::{load_within, CompileOptions, HostFamily, LoadError, LoadOptions, Loaded};

use super::check::{Check, Status};
use crate::daemon_args::DaemonArgs;
use crate::judgement::Judgement;
use metalift_daemon::service::status::{StatusError, StatusReport};

/// How to start the daemon that is to answer on `socket` (the one this doctor
/// was pointed at, not always the system's).
fn start_fix(socket: &Path) -> String {
    let system = Path::new(metalift_daemon::service::config::DEFAULT_ROOT_SOCKET);
    if socket != system {
        return format!(
            "start metaliftd --socket {} (or point doctor at the daemon's own: --socket PATH)",
            socket.display()
        );
    }
    if cfg!(target_os = "macos") {
        "start it: sudo launchctl bootstrap system /Library/LaunchDaemons/com.metalift.metaliftd.plist"
            .to_owned()
    } else {
        format!(
            "start metaliftd (as root it listens on {})",
            system.display()
        )
    }
}

/// Is a daemon answering on `socket`? With the judgement of its state every tool shares.
pub fn reachable(daemon: &DaemonArgs, socket: &Path) -> (Check, Judgement) {
    let answer = daemon.status(socket);
    let check = match &answer {
        Ok(report) => Check::new(
            "daemon",
            Status::Ok,
            format!(
                "metaliftd {} (pid {}) answers on {} (Unix socket, as the shim asks)",
                report.version,
                report.pid,
                socket.display()
            ),
        ),
        Err(StatusError::Client(ClientError::Connect { source, .. })) if !socket.exists() => {
            Check::new(
                "daemon",
                Status::Fail,
                format!(
                    "no socket at {} ({source}): every process runs stock",
                    socket.display()
                ),
            )
            .fix(start_fix(socket))
        }
        Err(e) => Check::new(
            "daemon",
            Status::Fail,
            format!("{e}: every process runs stock"),
        )
        .fix(format!(
            "a stale socket or a hung daemon: restart it; {}",
            start_fix(socket)
        )),
    };
    (check, crate::judgement::judge(answer, socket))
}

/// Is the policy readable, secure and valid, within the daemon's size limit
/// `max_bytes` and for the daemon's host chip `chip` (both from its status; this
/// machine's chip when it reported none)?
pub fn policy(
    path: &Path,
    allow_insecure_owner: bool,
    max_bytes: u64,
    chip: Option<String>,
) -> (Check, Option<Loaded>) {
    let opts = LoadOptions {
        allow_insecure_owner,
    };
    let compile = CompileOptions {
        host: HostFamily {
            brand: chip.or_else(metalift_daemon::live_policy::host_chip::machine_brand),
        },
        now: Some(std::time::SystemTime::now()),
    };
    let shown = path.display();
    let loaded = load_within(path, &opts, &compile, max_bytes);
    // What is still a warning once `"host"` on an unknown chip weighs what it
    // weighs in every tool (a note: [`crate::host_severity`]).
    let warnings: Vec<String> = match &loaded {
        Ok(l) => crate::host_severity::warnings(&l.warnings)
            .iter()
            .map(ToString::to_string)
            .collect(),
        Err(_) => Vec::new(),
    };
    let notes = match &loaded {
        Ok(l) => l.warnings.len() - warnings.len(),
        Err(_) => 0,
    };
    let notes = match notes {
        0 => String::new(),
        1 => " (1 note: `metalift validate` shows it)".to_owned(),
        n => format!(" ({n} notes: `metalift validate` shows them)"),
    };
    match loaded {
        Ok(loaded) if warnings.is_empty() => (
            Check::new(
                "policy",
                Status::Ok,
                format!(
                    "{shown}: valid, {} rules, mode {}, sha256 {}{notes}",
                    loaded.policy.rule_count(),
                    loaded.policy.mode().as_str(),
                    &loaded.policy.sha256_hex()[..12]
                ),
            ),
            Some(loaded),
        ),
        Ok(loaded) => (
            Check::new(
                "policy",
                Status::Warn,
                format!(
                    "{shown}: valid with {} warnings, first: {}",
                    warnings.len(),
                    warnings[0]
                ),
            )
            .fix(format!("metalift validate {shown}")),
            Some(loaded),
        ),
        Err(LoadError::NotFound { .. }) => (
            Check::new(
                "policy",
                Status::Warn,
                format!(
                    "{shown} does not exist: a running metaliftd keeps its last good policy \
                     (and reports itself degraded); one starting now has no rules, everything stock"
                ),
            )
            .fix(format!("sudo metalift edit --policy {shown}")),
            None,
        ),
        Err(e @ LoadError::Permission { .. }) => (
            Check::new("policy", Status::Fail, e.to_string()).fix(format!(
                "sudo chown root:{} {shown} && sudo chmod 644 {shown} (metaliftd refuses it until then)",
                if cfg!(target_os = "macos") { "wheel" } else { "root" }
            )),
            None,
        ),
        Err(e @ LoadError::Invalid { .. }) => (
            Check::new(
                "policy",
                Status::Fail,
                format!("{shown}: invalid: {e} (metaliftd keeps the last good policy)"),
            )
            .fix(format!("metalift validate {shown}, then sudo metalift edit")),
            None,
        ),
        Err(e) => (
            Check::new("policy", Status::Fail, e.to_string())
                .fix("run doctor as root, or check the file's permissions"),
            None,
        ),
    }
}

/// Is the policy on disk the one live?
pub fn live_matches(path: &Path, report: Option<&StatusReport>, loaded: Option<&Loaded>) -> Check {
    let Some(report) = report else {
        return Check::new(
            "live policy",
            Status::Warn,
            "cannot compare: no daemon answers",
        );
    };
    if !super::paths::same_file(Path::new(&report.policy_path), path) {
        return Check::new(
            "live policy",
            Status::Warn,
            format!(
                "metaliftd serves {}, not {}",
                report.policy_path,
                path.display()
            ),
        )
        .fix("pass doctor the daemon's --policy, or fix the daemon's flags");
    }
    let live = &report.policy_sha256;
    match loaded {
        Some(l) if l.policy.sha256_hex() == live => Check::new(
            "live policy",
            Status::Ok,
            format!(
                "the live policy is the file on disk (sha256 {})",
                &live[..12.min(live.len())]
            ),
        ),
        Some(l) => Check::new(
            "live policy",
            Status::Fail,
            format!(
                "metaliftd serves sha256 {}, the disk has {}{}",
                &live[..12.min(live.len())],
                &l.policy.sha256_hex()[..12],
                report
                    .last_reload_error
                    .as_deref()
                    .map(|e| format!("; last reload error: {}", e.lines().next().unwrap_or("")))
                    .unwrap_or_default()
            ),
        )
        .fix("metalift status shows why; touching the file makes metaliftd reload it"),
        None => Check::new(
            "live policy",
            Status::Fail,
            format!(
                "the file on disk is not loadable; metaliftd serves sha256 {}",
                &live[..12.min(live.len())]
            ),
        )
        .fix("fix the policy (see the policy check)"),
    }
}
