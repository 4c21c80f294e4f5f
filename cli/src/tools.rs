//! What `metalift demo` and `metalift verify` run: the binaries beside this
//! executable, and a private temporary directory for their throw-away daemons
//! (`metalift_daemon::scratch`, the one scratch daemon).
//!
//! `metalift demo` starts two (an enforcing and a monitoring one) to show the loop;
//! `metalift verify` starts one whose single rule unlocks `metalift-probe` with the
//! profile under verification (the system daemon would answer stock for a
//! `require_verified` profile that has no pass yet). The policy files live in a
//! directory the user owns, so the daemon runs with `--allow-insecure-owner` (a
//! development flag; a real install keeps `/etc/metalift/policy.toml` root-owned).

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

use metalift_daemon::scratch::{ScratchDaemon, ScratchDir};

use crate::exec::SHIM_FILE;

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

/// Starts a scratch daemon on `policy` in `dir/<name>/` (its diagnostics at warn
/// level, in `daemon.log` there).
pub(crate) fn start_daemon(
    tools: &Tools,
    dir: &Path,
    name: &str,
    policy: &str,
) -> anyhow::Result<(ScratchDir, ScratchDaemon)> {
    let scratch = ScratchDir::new(dir.join(name))?;
    scratch.write_policy(policy)?;
    let daemon = scratch
        .start(&tools.daemon, &[] as &[&str], &[("RUST_LOG", "warn")])
        .with_context(|| format!("starting the {name} daemon"))?;
    Ok((scratch, daemon))
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
