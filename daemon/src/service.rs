//! metaliftd's lifecycle, from flags to a clean stop.
//!
//! Start: bind the socket (refusing if another daemon answers on it), open the
//! audit log, record `daemon_start`, load the policy, start the watcher, serve.
//! Stop (SIGTERM/SIGINT or the caller's future): stop accepting, let in-flight
//! check-ins finish, record `daemon_stop`, remove the socket. The audit log needs
//! no flush: every record is one `write(2)` of its own, already in the file.

use std::future::Future;
use std::sync::Arc;

use anyhow::Context;
use metalift_policy::LoadOptions;

use crate::audit::{AuditLog, Record};
use crate::config::Config;
use crate::policy_store::PolicyStore;
use crate::server::Core;
use crate::transport::{self, socket_file::BoundSocket};
use crate::watcher;

/// Runs the daemon until `shutdown` resolves with the reason to record (e.g.
/// `"SIGTERM"`). Must run inside a tokio runtime. Errors are start-up failures:
/// the socket is taken, the audit log cannot be opened or written.
pub async fn run(config: Config, shutdown: impl Future<Output = String>) -> anyhow::Result<()> {
    let socket = transport::socket_file::bind(&config.socket)?;
    let (socket_path, socket_id) = (socket.path.clone(), socket.id());
    let served = serve(config, socket, shutdown).await;
    BoundSocket::remove(&socket_path, socket_id);
    served
}

async fn serve(
    config: Config,
    socket: BoundSocket,
    shutdown: impl Future<Output = String>,
) -> anyhow::Result<()> {
    let audit = Arc::new(
        AuditLog::open(&config.audit_log, config.rotation).context("opening the audit log")?,
    );
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
        PolicyStore::load_initial(&config.policy, opts, &audit)
            .context("writing the policy load to the audit log")?,
    );
    let core = Arc::new(Core::new(
        Arc::clone(&store),
        Arc::clone(&audit),
        config.cache_entries,
    ));
    tracing::info!(socket = %config.socket.display(), policy = %config.policy.display(),
        audit_log = %config.audit_log.display(), "metaliftd serving");

    let (watcher_stop, mut watcher_stopped) = tokio::sync::watch::channel(());
    let watcher = watcher::spawn(
        Arc::clone(&store),
        Arc::clone(&audit),
        watcher::DEFAULT_DEBOUNCE,
        async move {
            let _ = watcher_stopped.changed().await;
        },
    );

    // One shutdown for every transport: the first future to see `shutdown`
    // resolve records the reason and wakes the others through `stopping`.
    let (stopping_tx, stopping) = tokio::sync::watch::channel(None::<String>);
    let stop = {
        let mut stopping = stopping.clone();
        async move {
            tokio::select! {
                reason = shutdown => {
                    tracing::info!(%reason, "stopping");
                    let _ = stopping_tx.send(Some(reason));
                }
                _ = stopping.changed() => {}
            }
        }
    };
    let unix = transport::unix::run(socket.listener, Arc::clone(&core), config.limits, stop);
    match &config.mach_service {
        None => unix.await,
        Some(service) => {
            let xpc = serve_xpc(service, Arc::clone(&core), config.limits, stopping.clone());
            tokio::join!(unix, xpc);
        }
    }

    // No reload may slip in after daemon_stop.
    drop(watcher_stop);
    if let Err(error) = watcher.await {
        tracing::error!(%error, "policy watcher task failed");
    }
    let reason = stopping
        .borrow()
        .clone()
        .unwrap_or_else(|| "accept loop ended".to_owned());
    if let Err(error) = audit.append(&core.stop_record(&reason)) {
        tracing::error!(%error, "could not write daemon_stop to the audit log");
    }
    tracing::info!("stopped");
    Ok(())
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
    mut stopping: tokio::sync::watch::Receiver<Option<String>>,
) {
    let stop = async move {
        let _ = stopping.changed().await;
    };
    if let Err(error) = transport::xpc::run(service, core, limits, stop).await {
        tracing::error!(%error, service, "XPC transport not serving; the Unix socket still is");
    }
}

/// Only macOS has XPC; `Config::mach_service` is always `None` elsewhere.
#[cfg(not(target_os = "macos"))]
async fn serve_xpc(
    service: &str,
    _core: Arc<Core>,
    _limits: transport::Limits,
    _stopping: tokio::sync::watch::Receiver<Option<String>>,
) {
    tracing::error!(service, "XPC is macOS only; serving the Unix socket only");
}
