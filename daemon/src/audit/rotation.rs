//! Size-based rotation: `audit.jsonl` → `audit.jsonl.1` → … → `audit.jsonl.<keep>`, oldest dropped.

use std::io;
use std::path::{Path, PathBuf};

/// When to rotate and how many rotated files to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Rotate before a record would make the live file larger than this. A single
    /// record larger than the limit still goes into a fresh file whole.
    pub max_bytes: u64,
    /// Rotated files kept (`audit.jsonl.1` newest … `audit.jsonl.<keep>` oldest).
    /// With 0 the live file is simply started afresh, and older records are gone.
    pub keep: usize,
}

impl Default for Rotation {
    /// 10 MiB per file, 5 rotated files: at most 60 MiB of audit log.
    fn default() -> Self {
        Rotation {
            max_bytes: 10 * 1024 * 1024,
            keep: 5,
        }
    }
}

impl Rotation {
    /// Whether a record of `len` bytes must go into a fresh file, given the live file's size.
    #[must_use]
    pub fn needs_rotation(&self, current_size: u64, len: u64) -> bool {
        current_size > 0 && current_size.saturating_add(len) > self.max_bytes
    }
}

/// The path of rotated file number `n` (1 = newest) of the log at `path`.
#[must_use]
pub fn rotated_path(path: &Path, n: usize) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

/// Shifts every rotated file one number up (dropping the one past `keep`) and moves the
/// live file to `.1`. The caller holds the writer's lock and opens a fresh live file
/// afterwards; until then records written to the old handle land in `.1`, not lost.
pub(crate) fn shift(path: &Path, keep: usize) -> io::Result<()> {
    if keep == 0 {
        return match std::fs::remove_file(path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        };
    }
    // rename(2) replaces its target, so the oldest file is dropped by the first rename.
    for n in (1..keep).rev() {
        match std::fs::rename(rotated_path(path, n), rotated_path(path, n + 1)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    std::fs::rename(path, rotated_path(path, 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_empty_file_never_rotates_and_a_full_one_does() {
        let r = Rotation {
            max_bytes: 100,
            keep: 2,
        };
        assert!(!r.needs_rotation(0, 1000));
        assert!(!r.needs_rotation(50, 50));
        assert!(r.needs_rotation(50, 51));
    }

    #[test]
    fn rotated_names_append_the_number() {
        assert_eq!(
            rotated_path(Path::new("/var/log/metalift/audit.jsonl"), 3),
            PathBuf::from("/var/log/metalift/audit.jsonl.3")
        );
    }
}
