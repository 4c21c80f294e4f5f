//! The forwarder's durable cursor: which file (device and inode, not name: names
//! move on rotation) and the offset up to which its records were delivered.
//!
//! Saved after each delivered batch: written to a temporary file, `fsync`'d, then
//! renamed over the cursor, so a `kill -9` or a crash leaves the old cursor or the
//! new one, never a torn one. The directory is not `fsync`'d each time: after a
//! power loss an older cursor at worst resends records (at least once, never lost).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// A file by identity, and a byte offset in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Cursor {
    /// `st_dev` of the file.
    pub dev: u64,
    /// `st_ino` of the file.
    pub ino: u64,
    /// Bytes of the file delivered (always the end of a whole line).
    pub offset: u64,
}

impl Cursor {
    /// Whether `meta` is this cursor's file.
    #[must_use]
    pub fn is_file(&self, meta: &std::fs::Metadata) -> bool {
        self.dev == meta.dev() && self.ino == meta.ino()
    }
}

/// Where the cursor of the audit log at `log` is kept: beside it.
#[must_use]
pub fn path_for(log: &Path) -> PathBuf {
    log.with_file_name("forward.cursor")
}

/// Reads the saved cursor; `Ok(None)` when none was saved yet.
pub fn load(path: &Path) -> io::Result<Option<Cursor>> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let bad = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("not a cursor: {text:?}"),
        )
    };
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    let mut next = || fields.next().and_then(Result::ok).ok_or_else(bad);
    Ok(Some(Cursor {
        dev: next()?,
        ino: next()?,
        offset: next()?,
    }))
}

/// Saves `cursor` durably (see the module's note on crashes).
pub fn save(path: &Path, cursor: Cursor) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file: File = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .open(&tmp)?;
    writeln!(file, "{} {} {}", cursor.dev, cursor.ino, cursor.offset)?;
    file.sync_data()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_saved_cursor_loads_back_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("forward.cursor");
        assert_eq!(load(&path).unwrap(), None);
        let c = Cursor {
            dev: 7,
            ino: 99,
            offset: 1234,
        };
        save(&path, c).unwrap();
        assert_eq!(load(&path).unwrap(), Some(c));
    }

    #[test]
    fn a_torn_cursor_is_an_error_not_a_zero() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("forward.cursor");
        std::fs::write(&path, "7 99").unwrap();
        assert!(load(&path).is_err());
    }
}
