//! The shim's unresponsive marker for this user (shim/c/unresponsive.c), read
//! the way the shim reads it: whether this user's Metal processes are probing
//! or skipping the daemon at a socket, and since when. Shown by `metalift
//! status` and `metalift doctor`, so "stock for a while" has a visible cause.
#![forbid(unsafe_code)]

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::check::{Check, Status};

/// unresponsive.c's ML_UNRESPONSIVE_MS: a marker is in force for its skip plus this.
const IN_FORCE_AFTER_SKIP: Duration = Duration::from_secs(10);
/// unresponsive.c's ML_UNRESPONSIVE_MAX_SKIP_MS.
const MAX_SKIP: Duration = Duration::from_secs(60);
/// unresponsive.c's ML_PROBE_MS.
const PROBE_MS: u64 = 300;

/// The variable that names the user's private directory, as the shim reads it.
#[cfg(target_os = "macos")]
const PRIVATE_DIR_VARIABLE: &str = "TMPDIR";
#[cfg(not(target_os = "macos"))]
const PRIVATE_DIR_VARIABLE: &str = "XDG_RUNTIME_DIR";

/// What the shim would make of this user's marker for one socket.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Marker {
    /// No usable private directory: the shim keeps no marker (why).
    NoDirectory(String),
    /// No marker in force: check-ins have the full deadline.
    None(PathBuf),
    /// A file there that the shim does not believe (why).
    Ignored(PathBuf, String),
    /// Timeouts in a row, the last `age` ago; `skip_left` is how long check-ins
    /// are still skipped (zero: they are short probes).
    InForce {
        /// The marker file.
        path: PathBuf,
        /// Check-ins in a row that timed out.
        count: u32,
        /// Since the last of them.
        age: Duration,
        /// How much longer check-ins are skipped (zero: probed).
        skip_left: Duration,
    },
}

/// unresponsive.c's ml_unresponsive_skip_ms.
fn skip(count: u32) -> Duration {
    if count < 2 {
        return Duration::ZERO;
    }
    let doublings = (count - 2).min(8);
    (IN_FORCE_AFTER_SKIP * 2u32.pow(doublings)).min(MAX_SKIP)
}

/// FNV-1a of the socket path: the marker's name, as the shim makes it.
fn name(uid: u32, socket: &Path) -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in socket.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("metalift-unresponsive-{uid}-{hash:016x}")
}

/// Reads this user's marker for `socket` in `dir` (the private directory), as
/// the shim would judge it at `now`.
#[must_use]
pub fn read(dir: Option<&Path>, uid: u32, socket: &Path, now: SystemTime) -> Marker {
    let Some(dir) = dir.filter(|d| d.is_absolute()) else {
        return Marker::NoDirectory(format!("${PRIVATE_DIR_VARIABLE} is not set"));
    };
    match std::fs::symlink_metadata(dir) {
        Ok(m) if m.is_dir() && m.uid() == uid && m.permissions().mode() & 0o022 == 0 => {}
        Ok(_) => {
            return Marker::NoDirectory(format!(
                "{} is not a directory of yours closed to others",
                dir.display()
            ))
        }
        Err(e) => return Marker::NoDirectory(format!("{}: {e}", dir.display())),
    }
    let path = dir.join(name(uid, socket));
    let meta = match std::fs::symlink_metadata(&path) {
        Ok(m) => m,
        Err(_) => return Marker::None(path),
    };
    if !meta.is_file()
        || meta.uid() != uid
        || meta.nlink() != 1
        || meta.permissions().mode() & 0o022 != 0
    {
        return Marker::Ignored(
            path,
            "not a regular file of yours with one link, closed to others".into(),
        );
    }
    let count = std::fs::read_to_string(&path)
        .ok()
        .and_then(|t| t.lines().next().and_then(|l| l.trim().parse::<u32>().ok()))
        .unwrap_or(1)
        .max(1);
    let Ok(age) = meta
        .modified()
        .map(|m| now.duration_since(m).unwrap_or(Duration::MAX))
    else {
        return Marker::None(path);
    };
    let skip = skip(count);
    if age >= skip + IN_FORCE_AFTER_SKIP {
        return Marker::None(path);
    }
    Marker::InForce {
        path,
        count,
        age,
        skip_left: skip.saturating_sub(age),
    }
}

/// This process's user's marker for `socket`.
#[must_use]
pub fn for_this_user(socket: &Path) -> Marker {
    let dir = std::env::var_os(PRIVATE_DIR_VARIABLE).map(PathBuf::from);
    read(
        dir.as_deref(),
        rustix::process::getuid().as_raw(),
        socket,
        SystemTime::now(),
    )
}

impl Marker {
    /// One sentence for `metalift status`; `None` when nothing is in force.
    #[must_use]
    pub fn in_force(&self) -> Option<String> {
        match self {
            Marker::InForce {
                path,
                count,
                age,
                skip_left,
            } => {
                let doing = if skip_left.is_zero() {
                    format!("your Metal processes probe it ({PROBE_MS} ms) before running stock")
                } else {
                    format!(
                        "your Metal processes skip the check-in (stock) for {} s more",
                        skip_left.as_millis().div_ceil(1000).max(1)
                    )
                };
                Some(format!(
                    "the shim found the daemon not answering {count} check-in(s) in a row, the \
                     last {} s ago: {doing} ({})",
                    age.as_secs(),
                    path.display()
                ))
            }
            _ => None,
        }
    }

    /// The `doctor` line.
    #[must_use]
    pub fn check(&self) -> Check {
        const NAME: &str = "unresponsive marker";
        match self {
            Marker::NoDirectory(why) => Check::new(
                NAME,
                Status::Ok,
                format!("none: the shim keeps no marker here ({why})"),
            ),
            Marker::None(_) => Check::new(NAME, Status::Ok, "none in force"),
            Marker::Ignored(path, why) => Check::new(
                NAME,
                Status::Warn,
                format!("{} is ignored by the shim: {why}", path.display()),
            )
            .fix(format!("remove {}", path.display())),
            Marker::InForce { path, .. } => {
                Check::new(NAME, Status::Warn, self.in_force().unwrap_or_default()).fix(format!(
                "once `metalift status` answers, remove {} (an answered check-in removes it too)",
                path.display()
            ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir() -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
        d
    }

    fn uid() -> u32 {
        rustix::process::getuid().as_raw()
    }

    #[test]
    fn given_one_timeout_then_the_marker_says_probe() {
        let d = dir();
        let socket = Path::new("/run/metalift/metalift.sock");
        let path = d.path().join(name(uid(), socket));
        std::fs::write(&path, "001\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let m = read(Some(d.path()), uid(), socket, SystemTime::now());
        let text = m.in_force().expect("in force");
        assert!(
            text.contains(&format!("probe it ({PROBE_MS} ms)")),
            "{text}"
        );
        assert_eq!(m.check().status, Status::Warn);
    }

    #[test]
    fn given_two_timeouts_then_the_marker_says_skip_and_for_how_long() {
        let d = dir();
        let socket = Path::new("/s.sock");
        let path = d.path().join(name(uid(), socket));
        std::fs::write(&path, "002\n").unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        let now = SystemTime::now() + Duration::from_secs(3);
        let text = read(Some(d.path()), uid(), socket, now).in_force().unwrap();
        assert!(
            text.contains("skip the check-in (stock) for 7 s more"),
            "{text}"
        );
        let later = SystemTime::now() + Duration::from_secs(21);
        assert!(matches!(
            read(Some(d.path()), uid(), socket, later),
            Marker::None(_)
        ));
    }

    #[test]
    fn given_a_hard_linked_marker_then_it_is_reported_as_ignored() {
        let d = dir();
        let socket = Path::new("/s.sock");
        let other = d.path().join("other");
        std::fs::write(&other, "001\n").unwrap();
        std::fs::hard_link(&other, d.path().join(name(uid(), socket))).unwrap();
        let m = read(Some(d.path()), uid(), socket, SystemTime::now());
        assert!(matches!(m, Marker::Ignored(..)), "{m:?}");
    }

    #[test]
    fn given_a_directory_others_can_write_then_there_is_no_marker() {
        let d = dir();
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
        let m = read(
            Some(d.path()),
            uid(),
            Path::new("/s.sock"),
            SystemTime::now(),
        );
        assert!(matches!(m, Marker::NoDirectory(_)), "{m:?}");
        assert_eq!(m.check().status, Status::Ok);
    }
}
