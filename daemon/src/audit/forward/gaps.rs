//! Records rotation deletes before the forwarder sent them, counted by the writer
//! at the moment it deletes them: [`Gaps`], the one handle the writer
//! ([`crate::audit::AuditLog`]) and the forwarder ([`super::source`]) share.
//!
//! The forwarder cannot count what it never saw: a file created and deleted
//! between two of its rescans, or a file deleted while its thread waits for the
//! CPU. The writer can: it deletes the oldest file itself, under its lock, and
//! here it learns where the forwarder is. So the forwarder *claims* each batch
//! (the file and the offset it sends up to) before writing it to a connection,
//! and the writer, about to delete a file, counts the whole records in it after
//! the claimed position (all of them when the forwarder has not reached the file,
//! none when it is past it), adds them to a running total, saves the total
//! durably ([`STATE_FILE`], written to a temporary file, `fsync`'d, renamed), and
//! only then deletes the file. Both happen under one mutex, and a claim checks that
//! its file still has a name (`st_nlink`): a batch read from a file the writer
//! has counted is never sent, so no record is both delivered and counted.
//!
//! The writer then writes a `forward_gap` record (the cumulative `total`) as the
//! first line of the fresh live file: after everything the deleted file held,
//! before anything written later. That record is a record like any other: if it is
//! rotated away unsent in turn, the next one's total counts it. So at the
//! collector, distinct records delivered + the latest `total` = records written.
//!
//! The cost falls on the verdict path only at a rotation that deletes records
//! still owed: one read of the doomed file from the claimed position and two
//! small saves (the total before the deletion, then that its `forward_gap`
//! record is written), under the writer's lock. A rotation that deletes a file
//! wholly sent opens and `fstat`s it, nothing more. Only the daemon's writer
//! counts ([`Gaps::resume`]): another writer of the log (`metalift verify`)
//! opens its own `Gaps` and never turns counting on.

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use super::count::count_range;
use super::cursor::{self, Cursor};
use crate::audit::chain::FileId;
use crate::audit::rotation::rotated_path;

/// The running total's file, beside the log.
pub const STATE_FILE: &str = "forward.gaps";

/// The shared count of records rotated away unsent, and the forwarder's claimed position.
#[derive(Debug)]
pub struct Gaps {
    /// [`STATE_FILE`] beside the log.
    path: PathBuf,
    /// The live file's path (rotated files are numbered after it).
    log: PathBuf,
    /// The writer's `keep`: which file rotation deletes, and the files
    /// `bytes_behind` walks.
    keep: usize,
    /// A std `Mutex`: held by the writer for one rotation's count, save and
    /// renames, by the forwarder for one `fstat` per batch; never across an await.
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Whether records are owed to a collector (`[audit.forward]` is live): with
    /// no forwarder nothing is counted. Off until the daemon says (a writer
    /// that is not the daemon, `metalift verify`, never counts).
    forwarding: bool,
    /// Whether a forwarder ran with this log (its cursor exists): what
    /// [`Gaps::resume`] turns counting on by, until the policy is loaded.
    forwarded_before: bool,
    /// Where the forwarder has claimed up to; `None` when nothing in the log's
    /// files was sent (no claim yet, or the file it was in was deleted).
    sent: Option<Cursor>,
    /// Records rotated away unsent since the log began (durable).
    total: u64,
    /// The `total` the last `forward_gap` record written said (durable): less
    /// than `total` after a crash between the save and the record.
    recorded: u64,
}

/// A deletion's count: what the `forward_gap` record written after it says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counted {
    /// The deleted file's name.
    pub file: String,
    /// Records in it never sent.
    pub records: u64,
    /// The running total, this deletion included.
    pub total: u64,
}

/// What went wrong counting or saving a gap: the deletion is not done.
#[derive(Debug, thiserror::Error)]
pub enum GapError {
    /// Reading the file about to be deleted failed.
    #[error("cannot count the records of {}: {source}", path.display())]
    Count {
        /// The file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// Saving the running total failed.
    #[error("cannot save the forwarding gap total to {}: {source}", path.display())]
    Save {
        /// [`STATE_FILE`].
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

impl Gaps {
    /// The gaps of the log at `log` (rotated with `keep` files): the saved total,
    /// and the saved forwarding cursor as the claimed position (what a restarted
    /// forwarder sends from). Nothing is counted until [`Gaps::resume`] or
    /// [`Gaps::set_forwarding`].
    ///
    /// Neither file stops the log from opening (that would stop every verdict):
    /// an unreadable cursor is no cursor, as the forwarder takes it (it sends
    /// from the oldest file); an unreadable total starts from 0, said loudly.
    /// Both are written only by rename, so only something else breaks them.
    #[must_use]
    pub fn open(log: &Path, keep: usize) -> Gaps {
        let path = log.with_file_name(STATE_FILE);
        let (total, recorded) = load(&path).unwrap_or_else(|error| {
            tracing::error!(%error, "the forwarding gap total is unreadable: counting from 0");
            (0, 0)
        });
        let cursor_path = cursor::path_for(log);
        let saved = cursor::load(&cursor_path).unwrap_or_else(|error| {
            tracing::error!(%error, path = %cursor_path.display(), "the forwarding cursor is unreadable");
            None
        });
        let sent = saved.filter(|c| log_files(log, keep).iter().any(|(_, m)| c.is_file(m)));
        Gaps {
            path,
            log: log.to_owned(),
            keep,
            inner: Mutex::new(Inner {
                forwarding: false,
                forwarded_before: saved.is_some(),
                sent,
                total,
                recorded,
            }),
        }
    }

    /// The daemon's writer takes over: counting is on if a forwarder ran with
    /// this log (until the loaded policy says, [`Gaps::set_forwarding`]), and a
    /// deletion counted and saved whose `forward_gap` record was never written
    /// (the daemon was killed in between) is returned, to be written now.
    pub fn resume(&self) -> Option<Counted> {
        let mut inner = self.lock();
        inner.forwarding = inner.forwarded_before;
        (inner.recorded < inner.total).then(|| Counted {
            file: self.doomed_name().display().to_string(),
            records: inner.total - inner.recorded,
            total: inner.total,
        })
    }

    /// Whether records are owed to a collector from now on.
    pub fn set_forwarding(&self, on: bool) {
        self.lock().forwarding = on;
    }

    /// Records rotated away unsent since the log began.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.lock().total
    }

    /// The forwarder is about to send the records of `file` (held open, `id`) up
    /// to `offset`: `false` when the file no longer has a name (the writer deleted
    /// it and counted what was not claimed): then nothing of it may be sent.
    pub fn claim(&self, file: &File, id: FileId, offset: u64) -> bool {
        let mut inner = self.lock();
        let alive = file.metadata().is_ok_and(|m| m.nlink() > 0);
        inner.sent = alive.then_some(Cursor {
            dev: id.dev,
            ino: id.ino,
            offset,
        });
        alive
    }

    /// Runs `delete` (a rotation's renames, which delete `doomed` if it exists)
    /// after counting the records in `doomed` not claimed and saving the new
    /// total. `Some`: records were deleted unsent (the `forward_gap` record to
    /// write next says so), with `delete`'s own result (renames after the one
    /// that deleted may have failed). An error counting or saving: nothing is
    /// deleted.
    pub fn delete(
        &self,
        doomed: &Path,
        delete: impl FnOnce() -> io::Result<()>,
    ) -> Result<(Option<Counted>, io::Result<()>), GapError> {
        let mut inner = self.lock();
        let mut file = match File::open(doomed) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((None, delete())),
            Err(source) => {
                return Err(GapError::Count {
                    path: doomed.to_owned(),
                    source,
                })
            }
        };
        let count_err = |source| GapError::Count {
            path: doomed.to_owned(),
            source,
        };
        let meta = file.metadata().map_err(count_err)?;
        let claimed_here = inner.sent.filter(|c| c.is_file(&meta));
        let from = match (inner.sent, claimed_here) {
            (_, Some(c)) => Some(c.offset),
            // Nothing claimed in the log: this file is unsent.
            (None, None) => Some(0),
            // Claimed in a newer file (the deleted one is always the oldest).
            (Some(_), None) => None,
        };
        let records = match from {
            Some(from) if inner.forwarding => {
                count_range(&mut file, from, None).map_err(count_err)?.0
            }
            _ => 0,
        };
        let before = inner.total;
        if records > 0 {
            inner.total += records;
            if let Err(source) = save(&self.path, inner.total, inner.recorded) {
                inner.total = before;
                return Err(GapError::Save {
                    path: self.path.clone(),
                    source,
                });
            }
        }
        let deleted = delete();
        let gone = file.metadata().is_ok_and(|m| m.nlink() == 0);
        if gone && claimed_here.is_some() {
            // Everything left in the log is newer than the claimed position.
            inner.sent = None;
        }
        if records > 0 && !gone {
            // Not deleted after all: the records are still there to send.
            inner.total = before;
            if let Err(error) = save(&self.path, inner.total, inner.recorded) {
                tracing::error!(%error, path = %self.path.display(), "cannot save the forwarding gap total");
            }
        }
        let counted = (records > 0 && gone).then(|| Counted {
            file: doomed.display().to_string(),
            records,
            total: inner.total,
        });
        Ok((counted, deleted))
    }

    /// Notes (durably) that a `forward_gap` record saying `total` is in the
    /// log, so a restart does not write it again. A failed save is logged: the
    /// restart then writes one more `forward_gap` with the same total (a record
    /// like any other, so the sums still hold).
    pub fn recorded(&self, total: u64) {
        let mut inner = self.lock();
        inner.recorded = inner.recorded.max(total);
        if let Err(error) = save(&self.path, inner.total, inner.recorded) {
            tracing::error!(%error, path = %self.path.display(), "cannot save the forwarding gap total");
        }
    }

    /// The name of the file rotation deletes: the oldest rotated one, or with
    /// `keep = 0` the live file itself.
    #[must_use]
    pub fn doomed_name(&self) -> PathBuf {
        if self.keep == 0 {
            self.log.clone()
        } else {
            rotated_path(&self.log, self.keep)
        }
    }

    /// Bytes of the log not claimed by the forwarder, from the files as they are
    /// now: right while a write to the collector blocks, as the files grow.
    #[must_use]
    pub fn bytes_behind(&self) -> u64 {
        let sent = self.lock().sent;
        // Newest first; sum until the claimed file.
        let mut behind = 0;
        for (_, meta) in log_files(&self.log, self.keep) {
            match sent {
                Some(c) if c.is_file(&meta) => return behind + meta.len().saturating_sub(c.offset),
                _ => behind += meta.len(),
            }
        }
        behind
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic under the lock leaves numbers that are at worst one deletion
        // behind: keep counting.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// The log's files that exist now, newest (the live file) first, with their metadata.
fn log_files(log: &Path, keep: usize) -> Vec<(PathBuf, std::fs::Metadata)> {
    (0..=keep)
        .map(|n| {
            if n == 0 {
                log.to_owned()
            } else {
                rotated_path(log, n)
            }
        })
        .filter_map(|p| std::fs::metadata(&p).ok().map(|m| (p, m)))
        .collect()
}

/// The saved `total` and `recorded`; zeros when nothing was saved yet.
fn load(path: &Path) -> io::Result<(u64, u64)> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((0, 0)),
        Err(e) => return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display()))),
    };
    let mut fields = text.split_whitespace().map(str::parse::<u64>);
    match (fields.next(), fields.next()) {
        (Some(Ok(total)), Some(Ok(recorded))) => Ok((total, recorded)),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: not a gap total: {text:?}", path.display()),
        )),
    }
}

fn save(path: &Path, total: u64, recorded: u64) -> io::Result<()> {
    cursor::save_atomically(path, format!("{total} {recorded}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::audit::chain::Chain;
    use crate::audit::{AuditLog, Record, Rotation};
    use serde_json::Value;

    fn stop_record() -> Record {
        Record::DaemonStop {
            time: SystemTime::UNIX_EPOCH,
            reason: "test".into(),
            checkins: 0,
            unlocks: 0,
            pid: 1,
        }
    }

    /// A log of `keep` rotated files, a few records per file.
    fn log(dir: &Path, keep: usize) -> AuditLog {
        let rotation = Rotation {
            max_bytes: 1200,
            keep,
        };
        AuditLog::open(&dir.join("audit.jsonl"), rotation).unwrap()
    }

    fn records(path: &Path) -> Vec<Value> {
        std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    /// Every line written, of every file that was ever in the log: the
    /// test holds each file open as rotation creates it.
    fn written(audit: &AuditLog, appends: usize, chain: &mut Chain<()>) -> u64 {
        let mut read = 0;
        for _ in 0..appends {
            audit.append(&stop_record()).unwrap();
            for mut held in chain.rescan().unwrap() {
                read += count_range(&mut held.file, 0, None).unwrap().0;
            }
        }
        read
    }

    #[test]
    fn records_rotated_away_unsent_are_counted_as_they_are_deleted_and_said_first_in_the_fresh_file(
    ) {
        let dir = tempfile::tempdir().unwrap();
        let audit = log(dir.path(), 1);
        audit.gaps().set_forwarding(true);
        let mut chain: Chain<()> = Chain::open(audit.path(), Some(1)).unwrap();
        let deleted = written(&audit, 40, &mut chain);
        assert!(deleted > 0, "files were deleted");
        assert_eq!(
            audit.gaps().total(),
            deleted,
            "nothing was sent: every deleted line counted"
        );
        let fresh = records(audit.path());
        let first = &fresh[0];
        assert_eq!(first["kind"], "forward_gap", "{fresh:?}");
        assert_eq!(first["total"], deleted);
        assert_eq!(
            first["file"],
            dir.path().join("audit.jsonl.1").display().to_string(),
            "the deleted file's name"
        );
        // Durable: a new writer (a restart, a kill -9) counts on from it.
        drop(audit);
        let audit = log(dir.path(), 1);
        assert_eq!(audit.gaps().total(), deleted);
    }

    #[test]
    fn what_the_forwarder_claimed_is_not_counted_and_a_deleted_file_cannot_be_claimed() {
        let dir = tempfile::tempdir().unwrap();
        let audit = log(dir.path(), 1);
        audit.gaps().set_forwarding(true);
        for _ in 0..3 {
            audit.append(&stop_record()).unwrap();
        }
        // The forwarder claims the first two records of the live file.
        let mut live = File::open(audit.path()).unwrap();
        let meta = live.metadata().unwrap();
        let text = std::fs::read(audit.path()).unwrap();
        let two = text
            .iter()
            .enumerate()
            .filter(|(_, &b)| b == b'\n')
            .nth(1)
            .unwrap()
            .0
            + 1;
        let id = FileId::of(&meta);
        assert!(audit.gaps().claim(&live, id, two as u64));
        // Rotated twice: that file goes, with what was not claimed in it.
        let in_log = |p: PathBuf| std::fs::metadata(p).is_ok_and(|m| m.ino() == meta.ino());
        let mut appended = 0;
        while in_log(audit.path().to_owned()) || in_log(dir.path().join("audit.jsonl.1")) {
            audit.append(&stop_record()).unwrap();
            appended += 1;
            assert!(appended < 100);
        }
        let in_file = count_range(&mut live, 0, None).unwrap().0;
        assert_eq!(audit.gaps().total(), in_file - 2, "all but the two claimed");
        assert!(
            !audit.gaps().claim(&live, id, two as u64 + 1),
            "a deleted file is counted: nothing more of it may be sent"
        );
    }

    #[test]
    fn a_torn_cursor_or_total_does_not_stop_the_log_from_opening() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("forward.cursor"), "7 9").unwrap();
        std::fs::write(dir.path().join(STATE_FILE), "x").unwrap();
        let audit = log(dir.path(), 1);
        audit.append(&stop_record()).unwrap();
        assert_eq!(audit.gaps().total(), 0);
    }

    #[test]
    fn a_restart_writes_a_gap_record_only_for_a_count_saved_without_its_record() {
        let dir = tempfile::tempdir().unwrap();
        let gap_records = |audit: &AuditLog| {
            records(audit.path())
                .iter()
                .filter(|r| r["kind"] == "forward_gap")
                .count()
        };
        let audit = log(dir.path(), 1);
        audit.gaps().set_forwarding(true);
        for _ in 0..40 {
            audit.append(&stop_record()).unwrap();
        }
        let total = audit.gaps().total();
        assert!(total > 0);
        let before = gap_records(&audit);
        drop(audit);
        let audit = log(dir.path(), 1);
        audit.resume_gaps();
        assert_eq!(gap_records(&audit), before, "every count was recorded");
        drop(audit);

        // Killed after saving a total of total + 4, before its record.
        std::fs::write(
            dir.path().join(STATE_FILE),
            format!("{} {total}\n", total + 4),
        )
        .unwrap();
        let audit = log(dir.path(), 1);
        audit.resume_gaps();
        let last = records(audit.path()).pop().unwrap();
        assert_eq!(last["kind"], "forward_gap");
        assert_eq!(
            (last["records"].as_u64(), last["total"].as_u64()),
            (Some(4), Some(total + 4))
        );
    }

    #[test]
    fn with_no_forwarder_nothing_is_counted() {
        let dir = tempfile::tempdir().unwrap();
        let audit = log(dir.path(), 0);
        for _ in 0..40 {
            audit.append(&stop_record()).unwrap();
        }
        assert_eq!(audit.gaps().total(), 0);
        assert!(!dir.path().join(STATE_FILE).exists());
    }
}
