//! The forwarder's durable cursor: which file (device and inode, not name: names
//! move on rotation) and the offset up to which its records were delivered.
//!
//! Saved at most every [`SAVE_EVERY`] while batches are being delivered, and once
//! more when the forwarder falls idle or stops ([`SaveSchedule`]): written to a
//! temporary file, `fsync`'d, then renamed over the cursor, so a `kill -9` or a
//! crash leaves the old cursor or the new one, never a torn one. A crash therefore
//! resends at most the records delivered in the last [`SAVE_EVERY`] (and the batch
//! in flight): still at least once. Saving after every batch made the forwarder's
//! `open`/`fdatasync`/`rename` of this file half of its CPU at 20 000 records/s
//! (perf, `metalift-bench forwarding`). The directory is not `fsync`'d each time:
//! after a power loss an older cursor at worst resends records (never loses any).

use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Longest a delivered position waits before it is saved.
pub const SAVE_EVERY: Duration = Duration::from_millis(100);

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
    save_atomically(
        path,
        format!("{} {} {}\n", cursor.dev, cursor.ino, cursor.offset).as_bytes(),
    )
}

/// Replaces the file at `path` with `contents` so that a crash leaves the old
/// contents or the new, never a torn file: written to `<path>.tmp`, `fsync`'d,
/// renamed over `path` (the forwarder's cursor, and the gap total of `gaps.rs`).
pub(crate) fn save_atomically(path: &Path, contents: &[u8]) -> io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = PathBuf::from(tmp);
    let mut file: File = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .open(&tmp)?;
    file.write_all(contents)?;
    file.sync_data()?;
    std::fs::rename(&tmp, path)
}

/// When to save the cursor: the first delivery at once, later ones at most every
/// `every`, and a position still unsaved as soon as `every` has passed since the
/// last save (whether or not more was delivered), so the saved cursor is never more
/// than `every` behind what was delivered, except for the batch being sent.
#[derive(Debug)]
pub struct SaveSchedule {
    every: Duration,
    last_save: Option<Instant>,
    /// The file (device, inode) of the last position saved (or tried).
    saved_file: Option<(u64, u64)>,
    pending: Option<Cursor>,
}

impl SaveSchedule {
    /// A schedule that saves at most every `every`.
    #[must_use]
    pub fn new(every: Duration) -> SaveSchedule {
        SaveSchedule {
            every,
            last_save: None,
            saved_file: None,
            pending: None,
        }
    }

    /// Notes that records up to `cursor` were delivered.
    pub fn delivered(&mut self, cursor: Cursor) {
        self.pending = Some(cursor);
    }

    /// The cursor to save now, if one is pending and due (taken: call [`saved`]
    /// or put it back with [`delivered`] when saving fails).
    ///
    /// [`saved`]: SaveSchedule::saved
    /// [`delivered`]: SaveSchedule::delivered
    ///
    /// A position in another file than the last one saved is due at once: a crash
    /// then never leaves the cursor in a file the forwarder had finished, which
    /// rotation could delete before a restart (a gap of unknown size reported for
    /// records that had all been sent).
    pub fn due(&mut self, now: Instant) -> Option<Cursor> {
        let new_file = self
            .pending
            .is_some_and(|p| self.saved_file != Some((p.dev, p.ino)));
        let due = new_file
            || self
                .last_save
                .is_none_or(|last| now.saturating_duration_since(last) >= self.every);
        if due {
            self.pending.take()
        } else {
            None
        }
    }

    /// The pending cursor whatever the time (the forwarder stops or starts over).
    pub fn take(&mut self) -> Option<Cursor> {
        self.pending.take()
    }

    /// Notes a save of `cursor` at `now` (or a failed try: the next is then due
    /// after the interval, not at once).
    pub fn saved(&mut self, now: Instant, cursor: Cursor) {
        self.last_save = Some(now);
        self.saved_file = Some((cursor.dev, cursor.ino));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(offset: u64) -> Cursor {
        Cursor {
            dev: 1,
            ino: 2,
            offset,
        }
    }

    #[test]
    fn the_first_delivery_is_saved_at_once_later_ones_at_most_every_interval() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = SaveSchedule::new(ms(100));
        assert_eq!(s.due(t0), None, "nothing delivered, nothing to save");
        s.delivered(at(10));
        assert_eq!(s.due(t0), Some(at(10)));
        s.saved(t0, at(0));
        s.delivered(at(20));
        s.delivered(at(30));
        assert_eq!(s.due(t0 + ms(50)), None, "within the interval: held");
        assert_eq!(
            s.due(t0 + ms(100)),
            Some(at(30)),
            "the newest position once the interval has passed"
        );
        s.saved(t0 + ms(100), at(0));
        assert_eq!(s.due(t0 + ms(300)), None, "nothing new: nothing to save");
    }

    #[test]
    fn a_position_delivered_just_before_the_forwarder_falls_idle_is_saved_when_due() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = SaveSchedule::new(ms(100));
        s.delivered(at(10));
        assert_eq!(s.due(t0), Some(at(10)));
        s.saved(t0, at(0));
        s.delivered(at(20));
        assert_eq!(s.due(t0 + ms(10)), None);
        // No further delivery: the idle forwarder asks again and gets it.
        assert_eq!(s.due(t0 + ms(110)), Some(at(20)));
        s.saved(t0 + ms(110), at(0));
        s.delivered(at(40));
        assert_eq!(s.take(), Some(at(40)), "at a stop, whatever the time");
        assert_eq!(s.take(), None);
    }

    #[test]
    fn a_position_in_another_file_is_saved_at_once() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut s = SaveSchedule::new(ms(100));
        s.delivered(at(10));
        let first = s.due(t0).expect("the first");
        s.saved(t0, first);
        s.delivered(at(20));
        assert_eq!(s.due(t0 + ms(10)), None, "the same file: held");
        // The forwarder finished that file (rotated away) and sent from the next.
        let next = Cursor {
            dev: 1,
            ino: 3,
            offset: 5,
        };
        s.delivered(next);
        assert_eq!(s.due(t0 + ms(20)), Some(next), "another file: at once");
        s.saved(t0 + ms(20), next);
        s.delivered(Cursor { offset: 9, ..next });
        assert_eq!(s.due(t0 + ms(30)), None, "then the interval again");
    }

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
