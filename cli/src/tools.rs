//! What `metalift demo`, `metalift verify` and `metalift gpu` run: the binaries
//! beside this executable ([`beside`]), and a private temporary directory for their throw-away daemons
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

/// The binaries a scratch daemon run needs: `metaliftd` and `metalift-probe`
/// beside this executable ([`beside`]), and the shim where `metalift exec` finds
/// it (`$METALIFT_SHIM`, `../lib/`, beside, the prefix).
pub(crate) struct Tools {
    pub(crate) daemon: PathBuf,
    pub(crate) probe: PathBuf,
    pub(crate) shim: PathBuf,
    /// `--timeout-ms`, passed to the shim as METALIFT_TIMEOUT_MS.
    pub(crate) timeout_ms: Option<u64>,
}

impl Tools {
    pub(crate) fn find(timeout_ms: Option<u64>) -> anyhow::Result<Tools> {
        Ok(Tools {
            daemon: beside("metaliftd")?,
            probe: beside("metalift-probe")?,
            shim: crate::exec::find_shim(None, std::env::var_os(crate::exec::SHIM_ENV).as_deref())?,
            timeout_ms,
        })
    }
}

/// `name` in this executable's directory: the installed `/usr/local/metalift/bin/`
/// or cargo's target directory. The executable's path is resolved first:
/// `metalift` may be a symlink on the PATH (`/usr/local/bin/metalift`).
pub(crate) fn beside(name: &str) -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()
        .and_then(|e| e.canonicalize())
        .context("locating this executable")?;
    let dir = exe.parent().context("this executable has no directory")?;
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{name} not found next to {} (reinstall metalift; in a checkout, `cargo build --workspace`)",
            exe.display()
        );
    }
    Ok(path)
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
