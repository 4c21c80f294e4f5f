//! Whether metaliftd can read what Full Disk Access guards, reported in
//! `metalift status` so `metalift doctor` can say so (doctor itself runs as
//! another process, with its own TCC grants, so it cannot test the daemon's).
//!
//! A root LaunchDaemon without Full Disk Access cannot read executables in
//! TCC-protected folders (`~/Desktop`, `~/Documents`, `~/Downloads`, removable
//! and network volumes): their signatures and hashes are then unknown, and each
//! decision says `identity unreadable: permission denied` (`../shared/REAL-METAL.md`;
//! Santa requires Full Disk Access for the same reason, granted by a PPPC
//! profile). The probe is the one tools commonly use: open the system TCC
//! database, `/Library/Application Support/com.apple.TCC/TCC.db`, which only a
//! process with Full Disk Access may read (TCC refuses even root with `EPERM`).
//! Checked once, when the daemon starts: macOS applies a new grant to a process
//! started after it, so the answer holds for the daemon's life.

use std::io;
use std::path::Path;

/// The file only Full Disk Access lets a process open.
pub const PROBE: &str = "/Library/Application Support/com.apple.TCC/TCC.db";

/// What opening `probe` says: `Some(true)` readable, `Some(false)` refused
/// (`EPERM`/`EACCES`), `None` when it tells nothing (missing, another error).
#[must_use]
pub fn probe_at(probe: &Path) -> Option<bool> {
    match std::fs::File::open(probe) {
        Ok(_) => Some(true),
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => Some(false),
        Err(_) => None,
    }
}

/// This daemon's Full Disk Access: [`probe_at`] [`PROBE`] on macOS, `None`
/// elsewhere (no TCC).
#[must_use]
pub fn probe() -> Option<bool> {
    if cfg!(target_os = "macos") {
        probe_at(Path::new(PROBE))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_readable_file_is_access_and_a_missing_one_says_nothing() {
        let f = tempfile::NamedTempFile::new().expect("temp file");
        assert_eq!(probe_at(f.path()), Some(true));
        assert_eq!(probe_at(Path::new("/nonexistent/metalift/TCC.db")), None);
        if !cfg!(target_os = "macos") {
            assert_eq!(probe(), None, "no TCC off macOS");
        }
    }
}
