//! A throw-away `metaliftd` of the CLI's own: a private policy, socket and audit
//! log in a temporary directory, stopped (SIGTERM, then SIGKILL) when done.
//!
//! `metalift demo` starts two (an enforcing and a monitoring one) to show the loop;
//! `metalift verify` starts one whose single rule unlocks `metalift-probe` with the
//! profile under verification (the system daemon would answer stock for a
//! `require_verified` profile that has no pass yet). The policy files live in a
//! directory the user owns, so the daemon runs with `--allow-insecure-owner` (a
//! development flag; a real install keeps `/etc/metalift/policy.toml` root-owned).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::exec::SHIM_FILE;

/// How long a daemon may take to start listening (a cold, loaded CI box).
const DAEMON_START: Duration = Duration::from_secs(30);

/// The binaries a scratch daemon run needs: `metaliftd`, `metalift-probe` and the
/// shim (`metalift demo` finds them in this executable's directory; `metalift
/// verify` as `find_tools` there says).
pub(crate) struct Tools {
    pub(crate) daemon: PathBuf,
    pub(crate) probe: PathBuf,
    pub(crate) shim: PathBuf,
    /// `--timeout-ms`, passed to the shim as METALIFT_TIMEOUT_MS.
    pub(crate) timeout_ms: Option<u64>,
}

impl Tools {
    pub(crate) fn find() -> anyhow::Result<Tools> {
        let exe = std::env::current_exe().context("locating this executable")?;
        let dir = exe.parent().context("this executable has no directory")?;
        let need = |name: &str| -> anyhow::Result<PathBuf> {
            [dir.join(name), dir.join("deps").join(name)]
                .into_iter()
                .find(|p| p.is_file())
                .with_context(|| {
                    format!(
                        "{name} not found next to {} (run `cargo build --workspace` first)",
                        exe.display()
                    )
                })
        };
        Ok(Tools {
            daemon: need("metaliftd")?,
            probe: need("metalift-probe")?,
            shim: need(SHIM_FILE)?,
            timeout_ms: None,
        })
    }
}

/// A running throw-away `metaliftd`.
pub(crate) struct Daemon {
    child: Child,
    pub(crate) socket: PathBuf,
    pub(crate) audit_log: PathBuf,
}

impl Daemon {
    pub(crate) fn start(
        tools: &Tools,
        dir: &Path,
        name: &str,
        policy: &str,
    ) -> anyhow::Result<Daemon> {
        let policy_path = dir.join(format!("{name}-policy.toml"));
        std::fs::write(&policy_path, policy).context("writing the scratch daemon's policy")?;
        let socket = dir.join(format!("{name}.sock"));
        let audit_log = dir.join(format!("{name}-audit.jsonl"));
        let stderr = std::fs::File::create(dir.join(format!("{name}-daemon.log")))
            .context("creating the daemon's log")?;
        let mut child = Command::new(&tools.daemon)
            .arg("--policy")
            .arg(&policy_path)
            .arg("--socket")
            .arg(&socket)
            .arg("--audit-log")
            .arg(&audit_log)
            .arg("--allow-insecure-owner")
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {}", tools.daemon.display()))?;
        let deadline = Instant::now() + DAEMON_START;
        while !socket.exists() {
            if let Some(status) = child.try_wait()? {
                let log = std::fs::read_to_string(dir.join(format!("{name}-daemon.log")))
                    .unwrap_or_default();
                bail!("metaliftd ({name}) exited with {status}:\n{log}");
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                bail!(
                    "metaliftd ({name}) did not listen on {} in time",
                    socket.display()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Daemon {
            child,
            socket,
            audit_log,
        })
    }

    /// SIGTERM (the daemon records `daemon_stop`), then wait; SIGKILL if it lingers.
    pub(crate) fn stop(mut self) {
        let pid = rustix::process::Pid::from_child(&self.child);
        let _ = rustix::process::kill_process(pid, rustix::process::Signal::TERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A private directory under the system temp dir, removed on drop.
pub(crate) struct TempDir(PathBuf);

impl TempDir {
    pub(crate) fn create() -> anyhow::Result<TempDir> {
        let base = std::env::temp_dir();
        for attempt in 0..100u32 {
            let path = base.join(format!("metalift-scratch-{}-{attempt}", std::process::id()));
            match std::fs::create_dir(&path) {
                Ok(()) => return Ok(TempDir(path)),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(e) => return Err(e).context("creating a temporary directory"),
            }
        }
        bail!("no free temporary directory name under {}", base.display())
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
