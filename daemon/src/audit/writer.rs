//! [`AuditLog`]: appends records, one `write(2)` each, and rotates by size.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use super::forward::gaps::{Counted, Gaps};
use super::record::Record;
use super::rotation::{self, Rotation};
use super::stamp::Stamper;
use super::AuditError;

/// Mode of a directory the log creates: root (or the daemon's user) and its group read.
pub const DIR_MODE: u32 = 0o750;
/// Mode of a log file the log creates: decisions name executables and users.
pub const FILE_MODE: u32 = 0o640;

/// The audit log: an append-only JSON Lines file, rotated by size.
///
/// Each [`append`](AuditLog::append) is one `write(2)` on an `O_APPEND` descriptor,
/// so a record is either wholly in the file or not at all, even if the daemon is
/// killed mid-way, and concurrent appends never interleave. `Send + Sync`: share it
/// in an `Arc`.
#[derive(Debug)]
pub struct AuditLog {
    /// The live file's path; rotated files are `<path>.1` … `<path>.<keep>`.
    path: PathBuf,
    /// When to rotate.
    rotation: Rotation,
    /// The open file and its size. A std `Mutex`, not tokio's: it is held only for
    /// one `write(2)` (or a rotation's renames), never across an `.await`, and
    /// `append` is called from sync code too. The same lock guards writes and the
    /// renames of a rotation, so no record goes to a file that is being moved.
    live: Mutex<LiveFile>,
    /// The `schema`/`id`/`host` every line carries: the host part is computed once
    /// at open, its labels replaced on each policy load ([`AuditLog::set_labels`]).
    stamper: Stamper,
    /// The last error reading the instance file, said once ([`AuditLog::refresh_instance`]).
    instance_error: Mutex<Option<String>>,
    /// Records a rotation deletes before the forwarder sent them, counted as it
    /// deletes them (shared with the forwarder, which claims what it sends there).
    gaps: Arc<Gaps>,
}

/// The file records are appended to now.
#[derive(Debug)]
struct LiveFile {
    /// Opened with `O_APPEND`.
    file: File,
    /// Bytes in the file, tracked so rotation needs no `fstat` per record.
    size: u64,
    /// How the last append ended: `None` when it wrote its record (or nothing was
    /// written yet), else why not. Kept under the same lock as the write, so it is
    /// always the result of the latest append (`metalift status` reports it: the
    /// daemon answers stock while it is a failure).
    last_failure: Option<WriteFailure>,
    /// The records not written since the last one that was: said by a
    /// `records_lost` record before the next record the log takes.
    lost: Option<Lost>,
}

/// A run of records the log could not take.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Lost {
    count: u64,
    first_at: SystemTime,
    last_at: SystemTime,
    first_decision_id: Option<u64>,
    last_decision_id: Option<u64>,
    error: String,
}

impl Lost {
    /// `self` (or a new run) with `record`, which failed with `error`, added.
    fn with(run: Option<Lost>, record: &Record, error: &AuditError) -> Lost {
        let now = SystemTime::now();
        let id = match record {
            Record::Decision(d) => Some(d.decision_id),
            _ => None,
        };
        let mut run = run.unwrap_or_else(|| Lost {
            count: 0,
            first_at: now,
            last_at: now,
            first_decision_id: None,
            last_decision_id: None,
            error: error.to_string(),
        });
        run.count += 1;
        run.last_at = now;
        if let Some(id) = id {
            run.first_decision_id = Some(run.first_decision_id.map_or(id, |f| f.min(id)));
            run.last_decision_id = Some(run.last_decision_id.map_or(id, |l| l.max(id)));
        }
        run
    }

    fn record(&self) -> Record {
        Record::RecordsLost {
            time: SystemTime::now(),
            count: self.count,
            first_at: self.first_at,
            last_at: self.last_at,
            first_decision_id: self.first_decision_id,
            last_decision_id: self.last_decision_id,
            error: self.error.clone(),
            pid: std::process::id(),
        }
    }
}

/// An append that did not put its record in the log, as [`AuditLog::last_failure`] reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WriteFailure {
    /// When it failed.
    pub at: SystemTime,
    /// The error, as displayed (e.g. `cannot write audit log …: No space left on device (os error 28)`).
    pub error: String,
}

impl AuditLog {
    /// Opens (or creates) the log at `path`. A missing parent directory is created
    /// with mode 0750, a missing file with mode 0640; existing ones keep their modes.
    pub fn open(path: &Path, rotation: Rotation) -> Result<AuditLog, AuditError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(dir)
                .map_err(|source| AuditError::CreateDir {
                    path: dir.to_owned(),
                    source,
                })?;
        }
        let gaps = Gaps::open(path, rotation.keep);
        let live = open_live(path)?;
        Ok(AuditLog {
            path: path.to_owned(),
            rotation,
            live: Mutex::new(live),
            stamper: Stamper::new(),
            instance_error: Mutex::new(None),
            gaps: Arc::new(gaps),
        })
    }

    /// The daemon's writer takes over the gap count ([`Gaps::resume`]): a
    /// daemon killed between a deletion's count and its `forward_gap` record
    /// has the record written now (the total was saved before the deletion).
    /// Only the daemon calls this: another writer (`metalift verify`) counts
    /// nothing.
    pub fn resume_gaps(&self) {
        if let Some(counted) = self.gaps.resume() {
            let mut live = self.lock();
            self.append_gap(&mut live, &counted);
        }
    }

    /// The count of records rotated away unsent, shared with the forwarder.
    #[must_use]
    pub fn gaps(&self) -> &Arc<Gaps> {
        &self.gaps
    }

    /// The live file's path.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The rotation settings.
    #[must_use]
    pub fn rotation(&self) -> Rotation {
        self.rotation
    }

    /// Appends `record` as one line with exactly one `write(2)`, rotating first when
    /// the line would push the live file past [`Rotation::max_bytes`].
    ///
    /// An error means the record is **not** in the log: a short write is an error,
    /// and its partial line is truncated away. A failed rotation is not an error: the
    /// record goes into the current file, since losing it would be worse than an
    /// oversize file; the failure is reported through `tracing` and retried next time.
    ///
    /// A record that could not be written is counted; the first append that
    /// succeeds after such a gap writes a `records_lost` record first, saying how
    /// many, over which time and decision ids (a gap record that cannot be written
    /// leaves the run counting, this record in it).
    pub fn append(&self, record: &Record) -> Result<(), AuditError> {
        let line = self.stamper.line(record).map_err(AuditError::Serialize)?;
        let mut live = self.lock();
        let mut result = Ok(());
        if let Some(gap) = live.lost.as_ref().map(Lost::record) {
            let gap_line = self.stamper.line(&gap).map_err(AuditError::Serialize)?;
            result = self.append_locked(&mut live, &gap_line);
            if result.is_ok() {
                live.lost = None;
            }
        }
        if result.is_ok() {
            result = self.append_locked(&mut live, &line);
        }
        if let Err(error) = &result {
            live.lost = Some(Lost::with(live.lost.take(), record, error));
        }
        live.last_failure = result.as_ref().err().map(|error| WriteFailure {
            at: SystemTime::now(),
            error: error.to_string(),
        });
        result
    }

    /// After a failed append, tries the log again now by writing the pending
    /// `records_lost` record (it goes before the next record anyway, so nothing is
    /// written that would not be): what `metalift status` does, so a log that was
    /// fixed (space freed, permissions mended) stops making the daemon answer
    /// stock at the first status, not at the next check-in. Nothing to do when the
    /// last append succeeded. A retry that fails is the last failure.
    pub fn retry_failed(&self) {
        let mut live = self.lock();
        if live.last_failure.is_none() {
            return;
        }
        let Some(gap) = live.lost.as_ref().map(Lost::record) else {
            return;
        };
        let Ok(line) = self.stamper.line(&gap) else {
            return;
        };
        match self.append_locked(&mut live, &line) {
            Ok(()) => {
                live.lost = None;
                live.last_failure = None;
            }
            Err(error) => {
                live.last_failure = Some(WriteFailure {
                    at: SystemTime::now(),
                    error: error.to_string(),
                });
            }
        }
    }

    /// How many records were lost since the log last took one (0: none).
    #[must_use]
    pub fn lost(&self) -> u64 {
        self.lock().lost.as_ref().map_or(0, |l| l.count)
    }

    /// Sets the `[audit.labels]` every later record's `host` carries (the live
    /// policy's; called before its `policy_loaded` record is written).
    pub fn set_labels(&self, labels: &std::collections::BTreeMap<String, String>) {
        self.stamper.set_labels(labels);
    }

    /// Reads the clone's name from the instance file at `path`
    /// ([`super::host::read_instance`]) for every later record: what the daemon
    /// does at start, at each policy reload and at each watcher re-check. A file
    /// that cannot be read or holds no valid name leaves the name as it was, and
    /// says so (once per change of the error).
    pub fn refresh_instance(&self, path: &std::path::Path) {
        match super::host::read_instance(path) {
            Ok(name) => {
                if self.stamper.host().instance != name {
                    tracing::info!(instance = ?name, path = %path.display(), "the clone's name for audit records");
                }
                self.stamper.set_instance(name);
            }
            Err(error) => {
                let said = error.to_string();
                let mut last = self
                    .instance_error
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if last.as_deref() != Some(said.as_str()) {
                    tracing::warn!(%error, path = %path.display(), "cannot read the clone's name: records keep the one they had");
                    *last = Some(said);
                }
            }
        }
    }

    /// The `host` part records carry now.
    #[must_use]
    pub fn host(&self) -> std::sync::Arc<super::host::Host> {
        self.stamper.host()
    }

    /// The last append's failure, `None` when it succeeded: what the daemon
    /// experiences now (a write after space came back clears it).
    #[must_use]
    pub fn last_failure(&self) -> Option<WriteFailure> {
        self.lock().last_failure.clone()
    }

    /// The open live file, for questions about the file system it is on (free
    /// space): the file records go to, even if its path was since replaced.
    pub fn with_file<T>(&self, f: impl FnOnce(&File) -> T) -> T {
        f(&self.lock().file)
    }

    fn append_locked(&self, live: &mut LiveFile, line: &[u8]) -> Result<(), AuditError> {
        if self.rotation.needs_rotation(live.size, line.len() as u64) {
            match self.rotate(live) {
                (None, Ok(())) => {}
                // First in the fresh file: after every record the deleted file
                // held, before this one. The line goes in after it even if the
                // two make the file larger than max_bytes: rotating again here
                // could delete the gap record itself.
                (Some(counted), Ok(())) => self.append_gap(live, &counted),
                (counted, Err(error)) => {
                    // A rename after the deletion failed: the gap is still said.
                    if let Some(counted) = counted {
                        self.append_gap(live, &counted);
                    }
                    tracing::error!(
                        path = %self.path.display(),
                        %error,
                        "audit log rotation failed; appending to the current file"
                    );
                }
            }
        }
        let written = write_once(&live.file, line).map_err(|source| AuditError::Write {
            path: self.path.clone(),
            source,
        })?;
        if written != line.len() {
            // Take the partial line back out so the log holds only whole records,
            // unless something else (another process) appended after it.
            let end = live.size + written as u64;
            let truncated = live.file.metadata().is_ok_and(|m| m.len() == end)
                && live.file.set_len(live.size).is_ok();
            if !truncated {
                tracing::error!(path = %self.path.display(), "a partial audit record stays in the log");
                live.size = end;
            }
            return Err(AuditError::ShortWrite {
                path: self.path.clone(),
                written,
                expected: line.len(),
            });
        }
        live.size += written as u64;
        Ok(())
    }

    /// Writes the `forward_gap` record of a deletion (into a file that is never
    /// rotated by it: the fresh one, or the one just opened). A record that
    /// cannot be written leaves the deletion unrecorded: the next start writes it.
    fn append_gap(&self, live: &mut LiveFile, counted: &Counted) {
        tracing::error!(file = %counted.file, records = counted.records, total = counted.total,
            "audit records rotated away before they were forwarded");
        let record = Record::ForwardGap {
            time: SystemTime::now(),
            file: counted.file.clone(),
            records: Some(counted.records),
            total: Some(counted.total),
        };
        let written = self
            .stamper
            .line(&record)
            .map_err(AuditError::Serialize)
            .and_then(|line| self.append_locked(live, &line));
        match written {
            Ok(()) => self.gaps.recorded(counted.total),
            Err(error) => tracing::error!(%error, "cannot record a forwarding gap"),
        }
    }

    /// Moves the live file to `.1` (shifting older ones, deleting the oldest)
    /// and opens a fresh one. The records the deletion takes before the
    /// forwarder sent them are counted first ([`Gaps::delete`]): `Some` then.
    fn rotate(&self, live: &mut LiveFile) -> (Option<Counted>, Result<(), AuditError>) {
        let rotate_err = |source| AuditError::Rotate {
            path: self.path.clone(),
            source,
        };
        let (counted, shifted) = match self.gaps.delete(&self.gaps.doomed_name(), || {
            rotation::shift(&self.path, self.rotation.keep)
        }) {
            Ok(done) => done,
            Err(error) => return (None, Err(rotate_err(io::Error::other(error)))),
        };
        let reopened = shifted.map_err(rotate_err).and_then(|()| {
            let fresh = open_live(&self.path)?;
            *live = LiveFile {
                last_failure: live.last_failure.take(),
                lost: live.lost.take(),
                ..fresh
            };
            Ok(())
        });
        (counted, reopened)
    }

    fn lock(&self) -> MutexGuard<'_, LiveFile> {
        // A panic while holding the lock leaves a valid file handle and at worst a
        // stale size (which only moves the next rotation): keep logging.
        self.live
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

fn open_live(path: &Path) -> Result<LiveFile, AuditError> {
    let file = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(FILE_MODE)
        .open(path)
        .map_err(|source| AuditError::Open {
            path: path.to_owned(),
            source,
        })?;
    let size = file
        .metadata()
        .map_err(|source| AuditError::Open {
            path: path.to_owned(),
            source,
        })?
        .len();
    Ok(LiveFile {
        file,
        size,
        last_failure: None,
        lost: None,
    })
}

/// One `write(2)`: retried only when interrupted before writing anything.
fn write_once(mut file: &File, buf: &[u8]) -> io::Result<usize> {
    loop {
        match file.write(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}
