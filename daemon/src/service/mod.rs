//! metaliftd's lifecycle, from flags to a clean stop.
//!
//! Start: bind the socket (refusing if another daemon answers on it), open the
//! audit log, record `daemon_start`, load the policy, start the watcher, serve.
//! SIGHUP re-reads the policy (audited with reason `sighup`); it never stops the
//! daemon. Stop (SIGTERM/SIGINT or the caller's future): stop accepting, let in-flight
//! check-ins finish, record `daemon_stop`, remove the socket. The audit log needs
//! no flush: every record is one `write(2)` of its own, already in the file.
//!
//! Its plumbing, one file each:
//!
//! - [`config`]: metaliftd's flags and defaults, resolved into a `Config`.
//! - [`signals`]: signal dispositions (SIGXFSZ ignored: a full log means stock, not death).
//! - [`memory`]: hands memory freed by a reload back to the system (glibc `malloc_trim`).
//! - [`oslog`]: a `tracing` layer into the system log (the unified log on macOS).
//! - [`status`]: the counters `metalift status` shows, and its client.
//! - [`health`]: whether the daemon can unlock as its policy says, cause first.
//! - [`error_chain`]: an error and its causes on one line, each said once.
//! - [`full_disk_access`]: whether the daemon can read what TCC guards (macOS).

pub mod config;
pub mod error_chain;
pub mod full_disk_access;
pub mod health;
pub mod memory;
pub mod oslog;
pub mod signals;
pub mod status;

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use metalift_policy::LoadOptions;

use crate::audit::{AuditLog, Record};
use crate::checkin::server::Core;
use crate::checkin::transport::{self, socket_file::BoundSocket};
use crate::live_policy::store::PolicyStore;
use crate::live_policy::watcher;
use crate::service::config::Config;

/// Runs the daemon until `shutdown` resolves with the reason to record (e.g.
/// `"SIGTERM"`). Must run inside a tokio runtime. Errors are start-up failures:
/// the socket is taken, the audit log cannot be opened or written.
pub async fn run(mut config: Config, shutdown: impl Future<Output = String>) -> anyhow::Result<()> {
    config.limits = fit_descriptor_limit(config.limits);
    crate::service::memory::limit_arenas();
    crate::service::signals::ignore_file_size_signal().context("ignoring SIGXFSZ")?;
    // Before anything else: SIGHUP's default action would kill the daemon.
    let hangups = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
        .context("installing the SIGHUP handler")?;
    let socket = transport::socket_file::bind(&config.socket)
        .map_err(|e| anyhow::Error::new(e).context(StartFailure::Socket))?;
    let (socket_path, socket_id) = (socket.path.clone(), socket.id());
    let served = serve(config, socket, hangups, shutdown).await;
    BoundSocket::remove(&socket_path, socket_id);
    served
}

/// What metaliftd could not set up at start. Each has its own exit status
/// (sysexits.h), so launchd's log and an admin's script tell them apart; the
/// message names the path (the error's cause).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFailure {
    /// The Unix socket could not be created (directory, permissions, in use).
    Socket,
    /// The audit log could not be opened for appending.
    AuditLog,
}

impl StartFailure {
    /// The exit status: 73 (`EX_CANTCREAT`) for the socket, 74 (`EX_IOERR`) for the log.
    #[must_use]
    pub fn exit_code(self) -> u8 {
        match self {
            StartFailure::Socket => 73,
            StartFailure::AuditLog => 74,
        }
    }
}

impl std::fmt::Display for StartFailure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            StartFailure::Socket => "cannot listen on the socket",
            StartFailure::AuditLog => "cannot open the audit log",
        })
    }
}

async fn serve(
    config: Config,
    socket: BoundSocket,
    hangups: tokio::signal::unix::Signal,
    shutdown: impl Future<Output = String>,
) -> anyhow::Result<()> {
    let audit = Arc::new(
        AuditLog::open(&config.audit_log, config.rotation).context(StartFailure::AuditLog)?,
    );
    // One daemon per audit log (taken once its directory exists, before this
    // daemon writes a record): held until serve returns, after daemon_stop.
    let _log_lock = crate::audit::log_lock::acquire(&config.audit_log)
        .map_err(anyhow::Error::new)
        .context(StartFailure::AuditLog)?;
    // The clone's name, before the first record (the watcher reads it again).
    audit.refresh_instance(&crate::audit::host::instance_path(&config.policy));
    audit.resume_gaps();
    audit
        .append(&Record::DaemonStart {
            time: std::time::SystemTime::now(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            policy: config.policy.display().to_string(),
            listen: config.socket.display().to_string(),
        })
        .context("writing daemon_start to the audit log")?;
    let opts = LoadOptions {
        allow_insecure_owner: config.allow_insecure_owner,
    };
    if config.allow_insecure_owner {
        tracing::warn!("--allow-insecure-owner: accepting a policy any user may have written");
    }
    let store = Arc::new(
        PolicyStore::load_initial_within(&config.policy, opts, config.max_policy_bytes, &audit)
            .context("writing the policy load to the audit log")?,
    );
    let core = Arc::new(Core::new(
        Arc::clone(&store),
        Arc::clone(&audit),
        config.cache_entries,
    ));
    // The forwarder reads the log back on its own thread: it never delays a verdict.
    let (forwarder, forwarder_thread) =
        crate::audit::forward::spawn(Arc::clone(&store), Arc::clone(&audit))
            .context("starting the audit forwarder thread")?;
    core.set_forwarder(Arc::clone(&forwarder));
    tracing::info!(socket = %config.socket.display(), policy = %config.policy.display(),
        audit_log = %config.audit_log.display(), "metaliftd serving");

    let (watcher_stop, watcher_stopped) = tokio::sync::watch::channel(());
    let watcher = {
        let mut stopped = watcher_stopped.clone();
        watcher::spawn(
            Arc::clone(&store),
            Arc::clone(&audit),
            watcher::Timing::default(),
            async move {
                let _ = stopped.changed().await;
            },
        )
    };
    let sighup = tokio::spawn(reload_on_sighup(
        Arc::clone(&store),
        Arc::clone(&audit),
        hangups,
        watcher_stopped,
    ));

    // One shutdown for every transport: `stopping` carries the reason. The Unix
    // accept loop runs as a task on the runtime's workers (not in `block_on` on
    // the main thread), so a check-in is accepted, read, decided and answered
    // without hopping between the main thread and the workers.
    let (stopping_tx, stopping) = tokio::sync::watch::channel(None::<String>);
    let unix_stop = {
        let mut stopping = stopping.clone();
        async move {
            let _ = stopping.changed().await;
        }
    };
    let identity: Arc<dyn crate::checkin::peer::IdentifyPeer> = if config.identify_on_blocking_pool
    {
        Arc::new(crate::checkin::peer::OnBlockingPool(
            crate::checkin::peer::KernelIdentity,
        ))
    } else {
        Arc::new(crate::checkin::peer::KernelIdentity)
    };
    let unix = tokio::spawn(transport::unix::run_with_identity(
        socket.listener,
        Arc::clone(&core),
        config.limits,
        identity,
        unix_stop,
    ));
    let transports = {
        let (core, stopping, mach_service) = (
            Arc::clone(&core),
            stopping.clone(),
            config.mach_service.clone(),
        );
        async move {
            let unix = async {
                if let Err(error) = unix.await {
                    tracing::error!(%error, "the Unix-socket transport task failed");
                }
            };
            match mach_service {
                None => unix.await,
                Some(service) => {
                    let xpc = serve_xpc(
                        &service,
                        core,
                        config.limits,
                        config.xpc_identities,
                        stopping,
                    );
                    tokio::join!(unix, xpc);
                }
            }
        }
    };
    tokio::pin!(transports);
    tokio::select! {
        reason = shutdown => {
            tracing::info!(%reason, "stopping");
            let _ = stopping_tx.send(Some(reason));
            transports.await;
        }
        () = &mut transports => {}
    }

    // No reload may slip in after daemon_stop.
    drop(watcher_stop);
    if let Err(error) = watcher.await {
        tracing::error!(%error, "policy watcher task failed");
    }
    if let Err(error) = sighup.await {
        tracing::error!(%error, "SIGHUP task failed");
    }
    let reason = stopping
        .borrow()
        .clone()
        .unwrap_or_else(|| "accept loop ended".to_owned());
    if let Err(error) = audit.append(&core.stop_record(&reason)) {
        tracing::error!(%error, "could not write daemon_stop to the audit log");
    }
    // daemon_stop is in the log; the forwarder sends what it can within a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_millis(500);
    while std::time::Instant::now() < deadline {
        let s = forwarder.status();
        if !s.configured || !s.connected || s.bytes_behind == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    forwarder.stop();
    // The thread drains for at most STOP_DRAIN once it sees the stop; a write it
    // began before (bounded only by the I/O timeout, against a collector that does
    // not read) is cut short after that, so a stop never waits for a collector.
    let deadline = std::time::Instant::now()
        + crate::audit::forward::STOP_DRAIN
        + std::time::Duration::from_millis(250);
    while !forwarder_thread.is_finished() && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    if !forwarder_thread.is_finished() {
        tracing::warn!(
            "the audit forwarder is still writing to its collector: closing the connection"
        );
        forwarder.abort();
    }
    if forwarder_thread.join().is_err() {
        tracing::error!("the audit forwarder thread panicked");
    }
    tracing::info!("stopped");
    Ok(())
}

/// Reloads the policy on every SIGHUP until `stop` changes (or its sender is
/// dropped). Signals arriving during a reload coalesce into one more reload.
async fn reload_on_sighup(
    store: Arc<PolicyStore>,
    audit: Arc<AuditLog>,
    mut hangups: tokio::signal::unix::Signal,
    mut stop: tokio::sync::watch::Receiver<()>,
) {
    loop {
        tokio::select! {
            received = hangups.recv() => {
                if received.is_none() {
                    return;
                }
                tracing::info!("SIGHUP: reloading the policy");
                let (store, audit) = (Arc::clone(&store), Arc::clone(&audit));
                let reloaded = tokio::task::spawn_blocking(move || {
                    store.reload_on(crate::live_policy::store::Trigger::Sighup, &audit)
                })
                .await;
                if let Err(error) = reloaded {
                    tracing::error!(%error, "SIGHUP reload panicked; the last good policy stays live");
                }
            }
            _ = stop.changed() => return,
        }
    }
}

/// Resolves with `"SIGTERM"` or `"SIGINT"`, whichever arrives first. The handlers
/// are installed when this is called, not when the future is first polled.
pub fn stop_signals() -> std::io::Result<impl Future<Output = String>> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => "SIGTERM".to_owned(),
            _ = int.recv() => "SIGINT".to_owned(),
        }
    })
}

/// Serves the XPC mach service until `stopping` changes. A failure to start is
/// logged, not fatal: the Unix socket still serves, and the shim falls back to it.
#[cfg(target_os = "macos")]
async fn serve_xpc(
    service: &str,
    core: Arc<Core>,
    limits: transport::Limits,
    identities: bool,
    mut stopping: tokio::sync::watch::Receiver<Option<String>>,
) {
    let stop = async move {
        let _ = stopping.changed().await;
    };
    if let Err(error) = transport::xpc::run(service, core, limits, identities, stop).await {
        tracing::error!(%error, service, "XPC transport not serving; the Unix socket still is");
    }
}

/// Only macOS has XPC; `Config::mach_service` is always `None` elsewhere.
#[cfg(not(target_os = "macos"))]
async fn serve_xpc(
    service: &str,
    _core: Arc<Core>,
    _limits: transport::Limits,
    _identities: bool,
    _stopping: tokio::sync::watch::Receiver<Option<String>>,
) {
    tracing::error!(service, "XPC is macOS only; serving the Unix socket only");
}

/// Descriptors kept for everything but connections: the audit log (and its
/// rotation), the watcher, stdio, the runtime, hashing, and on Linux the at
/// most 32 pidfds the ancestors cache holds at once, kept chains and walks in
/// progress together (`checkin::peer`'s `ancestry`, `PINS_MAX`).
const FD_RESERVE: u64 = 64;
/// Descriptors an active connection may hold at once: its socket, while being
/// identified a pidfd, and the executable opened for hashing. A connection
/// waiting for its outcome holds only its socket.
const FDS_PER_ACTIVE: u64 = 3;

/// Raises the open-file limit to the hard limit (macOS caps it at `OPEN_MAX`),
/// then fits the connection limits into it. Without this, idle shims waiting to
/// report could use up the descriptors, and every new check-in would wait in
/// `accept` behind them — the starvation the two caps exist to prevent.
fn fit_descriptor_limit(limits: transport::Limits) -> transport::Limits {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let before = getrlimit(Resource::Nofile);
    if before.current != before.maximum {
        let raise = |current| {
            setrlimit(
                Resource::Nofile,
                Rlimit {
                    current,
                    maximum: before.maximum,
                },
            )
        };
        const OPEN_MAX: u64 = 10240;
        if raise(before.maximum).is_err() {
            let capped = Some(before.maximum.map_or(OPEN_MAX, |m| m.min(OPEN_MAX)));
            if capped > before.current {
                let _ = raise(capped);
            }
        }
    }
    let soft = getrlimit(Resource::Nofile).current;
    let fitted = fit_limits(limits, soft);
    if fitted != limits {
        tracing::warn!(
            open_files = soft,
            max_connections = fitted.max_active,
            max_waiting_outcomes = fitted.max_waiting,
            max_pending_connections = fitted.max_pending,
            "connection limits lowered to fit the open-file limit"
        );
    }
    fitted
}

/// `limits` reduced so that they fit in `open_files` descriptors (`None`: unlimited).
fn fit_limits(limits: transport::Limits, open_files: Option<u64>) -> transport::Limits {
    let Some(open_files) = open_files else {
        return limits;
    };
    let budget = open_files.saturating_sub(FD_RESERVE);
    let active = (limits.max_active as u64)
        .min(budget / FDS_PER_ACTIVE)
        .max(1);
    let waiting = (limits.max_waiting as u64).min(budget.saturating_sub(active * FDS_PER_ACTIVE));
    // A pending connection holds only its socket; the rest of the budget.
    let pending = (limits.max_pending as u64)
        .min(budget.saturating_sub(active * FDS_PER_ACTIVE + waiting))
        .max(1);
    transport::Limits {
        max_pending: usize::try_from(pending).unwrap_or(usize::MAX),
        max_active: usize::try_from(active).unwrap_or(usize::MAX),
        max_waiting: usize::try_from(waiting).unwrap_or(usize::MAX),
        ..limits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_limits_fit_in_the_open_file_limit() {
        let asked = transport::Limits::default();
        assert_eq!(fit_limits(asked, None), asked);
        assert_eq!(fit_limits(asked, Some(1 << 20)), asked);

        // macOS launchd's default soft limit: 256.
        let fitted = fit_limits(asked, Some(256));
        assert_eq!(fitted.max_active, 64);
        assert_eq!(fitted.max_waiting, 256 - 64 - 3 * 64);

        let tiny = fit_limits(asked, Some(70));
        assert_eq!((tiny.max_active, tiny.max_waiting), (2, 0));
        assert_eq!(tiny.read_timeout, asked.read_timeout);
    }
}
