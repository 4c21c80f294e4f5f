//! Reading the audit log back: rotated files oldest first, then the live file, and
//! following the live file across rotations. Each line becomes an [`Item`]
//! (see [`super::line`]: the writer's own typed records, one definition of the format).

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

pub use super::line::{parse_line, Entry, Item};
use super::rotation::rotated_path;

/// Where a reader sends each item as it is read.
pub type Sink<'a> = &'a mut dyn FnMut(Item) -> io::Result<()>;

/// Bytes read at a time: a log of any size is read in bounded memory.
const CHUNK: usize = 64 * 1024;

/// The log's files in the order they were written: the highest-numbered rotated file
/// first, the live file last. Only files that exist are listed; gaps are skipped.
pub fn log_files(path: &Path) -> io::Result<Vec<PathBuf>> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let Some(base) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(vec![path.to_owned()]);
    };
    let mut numbers: Vec<usize> = Vec::new();
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let name = entry?.file_name();
        let Some(suffix) = name
            .to_str()
            .and_then(|n| n.strip_prefix(base))
            .and_then(|n| n.strip_prefix('.'))
        else {
            continue;
        };
        if !suffix.is_empty() && suffix.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(n) = suffix.parse() {
                numbers.push(n);
            }
        }
    }
    numbers.sort_unstable_by(|a, b| b.cmp(a));
    let mut files: Vec<PathBuf> = numbers.into_iter().map(|n| rotated_path(path, n)).collect();
    if path.exists() {
        files.push(path.to_owned());
    }
    Ok(files)
}

/// Reads the whole log (rotated files, then the live file) and, when asked again,
/// what has been appended since, following the live file across rotations.
///
/// Every file is opened before any is read, so a rotation during the first read
/// neither skips nor repeats records: the open handles keep pointing at the same files.
#[derive(Debug)]
pub struct LogReader {
    /// The live file's path, re-checked on each [`poll`](LogReader::poll) for rotation.
    path: PathBuf,
    /// Rotated files not yet read, oldest first.
    backlog: Vec<OpenFile>,
    /// The live file (as of the last rotation seen), if it existed.
    live: Option<OpenFile>,
    /// Rotated files already read to their end. A rotated file never changes again,
    /// so (device, inode, size, mtime) names it even after further renames, and a
    /// new file that reuses a freed inode does not match. Bounded: the oldest go.
    finished: VecDeque<Fingerprint>,
}

/// A rotated file's identity: device, inode, size and modification time.
type Fingerprint = (u64, u64, u64, i64, i64);

/// How many finished files to remember: far more than a log keeps.
const FINISHED_MEMORY: usize = 256;

/// How many times one poll re-lists the log while rotations keep happening.
const MAX_LISTINGS: usize = 16;

/// An open log file and where reading it has got to.
#[derive(Debug)]
struct OpenFile {
    /// Shown in corrupt-line reports.
    name: PathBuf,
    file: File,
    /// Device and inode: the identity that tells a rotated-away file from a new one.
    id: (u64, u64),
    /// Bytes of an unfinished last line, kept until its newline arrives.
    pending: Vec<u8>,
    /// Lines completed so far.
    line: usize,
}

impl OpenFile {
    fn open(path: &Path) -> io::Result<Option<OpenFile>> {
        match File::open(path) {
            Ok(file) => {
                let meta = file.metadata()?;
                Ok(Some(OpenFile {
                    name: path.to_owned(),
                    file,
                    id: (meta.dev(), meta.ino()),
                    pending: Vec::new(),
                    line: 0,
                }))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// This file's [`Fingerprint`] and modification time, as it is now.
    fn fingerprint(&self) -> io::Result<Fingerprint> {
        let meta = self.file.metadata()?;
        Ok((
            meta.dev(),
            meta.ino(),
            meta.len(),
            meta.mtime(),
            meta.mtime_nsec(),
        ))
    }

    /// Reads what is there now, in bounded chunks; complete lines go to `sink`, a
    /// trailing partial line waits in `pending`.
    fn read_available(&mut self, sink: Sink<'_>) -> io::Result<()> {
        let mut chunk = vec![0u8; CHUNK];
        loop {
            let n = match self.file.read(&mut chunk) {
                Ok(0) => return Ok(()),
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            self.pending.extend_from_slice(&chunk[..n]);
            let Some(last_newline) = self.pending.iter().rposition(|&b| b == b'\n') else {
                continue;
            };
            let rest = self.pending.split_off(last_newline + 1);
            let complete = std::mem::replace(&mut self.pending, rest);
            for raw in complete[..complete.len() - 1].split(|&b| b == b'\n') {
                self.line += 1;
                sink(match std::str::from_utf8(raw) {
                    Ok(text) => parse_line(text, &self.name, self.line),
                    Err(e) => Item::Corrupt {
                        file: self.name.clone(),
                        line: self.line,
                        error: format!("not UTF-8: {e}"),
                    },
                })?;
            }
        }
    }

    /// Starts over from the beginning if the file was truncated in place under us
    /// (an outside tool's "copytruncate" rotation), instead of waiting forever past its end.
    fn restart_if_truncated(&mut self) -> io::Result<()> {
        let position = self.file.stream_position()?;
        if self.file.metadata()?.len() < position {
            self.file.seek(SeekFrom::Start(0))?;
            self.pending.clear();
            self.line = 0;
        }
        Ok(())
    }

    /// Called when nothing more will be appended: an unfinished line is corrupt.
    fn finish(&mut self, sink: Sink<'_>) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        self.line += 1;
        self.pending.clear();
        sink(Item::Corrupt {
            file: self.name.clone(),
            line: self.line,
            error: "incomplete last line (no newline)".into(),
        })
    }

    /// Reads a file that will not grow any more to its end.
    fn drain(&mut self, sink: Sink<'_>) -> io::Result<()> {
        self.read_available(sink)?;
        self.finish(sink)
    }
}

impl LogReader {
    /// Opens every file of the log at `path`. A log that does not exist yet reads as
    /// empty (and is picked up by [`poll`](LogReader::poll) once created).
    pub fn open(path: &Path) -> io::Result<LogReader> {
        let mut backlog = Vec::new();
        let mut live = None;
        for file in log_files(path)? {
            let Some(open) = OpenFile::open(&file)? else {
                continue;
            };
            if file == path {
                live = Some(open);
            } else {
                backlog.push(open);
            }
        }
        Ok(LogReader {
            path: path.to_owned(),
            backlog,
            live,
            finished: VecDeque::new(),
        })
    }

    /// Opens the log to follow it from its end, ready to pass the last `n` lines
    /// that `wanted` accepts first (`n = 0`: only what comes next). History is not
    /// replayed: the files are read backwards from the end of the live file (and
    /// into the rotated files when it holds fewer than `n`), and the rotated files
    /// before that point count as read.
    pub fn open_tail(
        path: &Path,
        n: usize,
        wanted: &mut dyn FnMut(&Item) -> bool,
    ) -> io::Result<LogReader> {
        let mut remaining = n;
        let mut live = None;
        let mut backlog = Vec::new();
        let mut finished = VecDeque::new();
        // Newest first: the live file, then .1, .2, ...
        for name in log_files(path)?.into_iter().rev() {
            let Some(mut open) = OpenFile::open(&name)? else {
                continue;
            };
            let is_live = name == path;
            if remaining == 0 && !is_live {
                finished.push_back(open.fingerprint()?);
                continue;
            }
            let (start, found) =
                super::tail::start_of_last(&mut open.file, &open.name, remaining, wanted)?;
            open.file.seek(SeekFrom::Start(start))?;
            remaining -= found;
            if is_live {
                live = Some(open);
            } else {
                backlog.push(open);
            }
        }
        backlog.reverse();
        Ok(LogReader {
            path: path.to_owned(),
            backlog,
            live,
            finished,
        })
    }

    /// [`read_to_end_each`](LogReader::read_to_end_each), collected.
    pub fn read_to_end(&mut self) -> io::Result<Vec<Item>> {
        let mut items = Vec::new();
        self.read_to_end_each(&mut |item| {
            items.push(item);
            Ok(())
        })?;
        Ok(items)
    }

    /// Reads everything written so far into `sink`, for a one-shot listing: an
    /// unfinished last line of the live file is reported as corrupt.
    pub fn read_to_end_each(&mut self, sink: Sink<'_>) -> io::Result<()> {
        self.poll_each(sink)?;
        match &mut self.live {
            Some(live) => live.finish(sink),
            None => Ok(()),
        }
    }

    /// [`poll_each`](LogReader::poll_each), collected.
    pub fn poll(&mut self) -> io::Result<Vec<Item>> {
        let mut items = Vec::new();
        self.poll_each(&mut |item| {
            items.push(item);
            Ok(())
        })?;
        Ok(items)
    }

    /// Passes `sink` the items written since the previous call (the whole log on the
    /// first call), one at a time, so memory stays bounded however big the log is.
    /// Follows rotation: when the live path names a new file, the old one is read to
    /// its end first, then every rotated file not read yet (oldest first), then the
    /// new one from its start. An error from `sink` stops reading and is returned.
    ///
    /// Rotation renames files while this runs (metaliftd is another process), so
    /// the rotated files are told apart by identity, not by name: the log is listed
    /// again until a listing finds nothing unread and the live file did not change
    /// meanwhile, and what was found is read in the order it was written (by
    /// modification time). A record is lost only if its file is deleted (rotated
    /// past `keep`) before a poll sees it.
    pub fn poll_each(&mut self, sink: Sink<'_>) -> io::Result<()> {
        for mut old in std::mem::take(&mut self.backlog) {
            old.drain(sink)?;
            self.remember_finished(&old)?;
        }
        if let Some(live) = &mut self.live {
            live.restart_if_truncated()?;
            live.read_available(sink)?;
        }
        let rotated = match (&self.live, live_id(&self.path)?) {
            (Some(live), Some(id)) => live.id != id,
            (None, Some(_)) => true,
            (_, None) => false,
        };
        if !rotated {
            return Ok(());
        }
        let mut unread = self.unread_files()?;
        if let Some(mut old) = self.live.take() {
            if let Some(name) = self.current_name(old.id)? {
                old.name = name;
            }
            unread.push(old);
        }
        let live_now = live_id(&self.path)?;
        let (new_live, rotated_away): (Vec<_>, Vec<_>) = unread
            .into_iter()
            .partition(|f| Some(f.id) == live_now && f.name == self.path);
        // Written order: by modification time, and (the clock is coarse) among
        // equal times the higher rotation number first.
        let mut by_age = Vec::with_capacity(rotated_away.len());
        for file in rotated_away {
            let modified = file.file.metadata()?.modified()?;
            let number = rotation_number(&self.path, &file.name);
            by_age.push((modified, std::cmp::Reverse(number), file));
        }
        by_age.sort_by_key(|(modified, number, _)| (*modified, *number));
        for (_, _, mut old) in by_age {
            old.drain(sink)?;
            self.remember_finished(&old)?;
        }
        self.live = new_live.into_iter().next();
        if let Some(live) = &mut self.live {
            live.read_available(sink)?;
        }
        Ok(())
    }
}

impl LogReader {
    /// Every file of the log not read to its end yet, except the live one held
    /// already: listed again while rotations move files under the listing.
    fn unread_files(&self) -> io::Result<Vec<OpenFile>> {
        let held = self.live.as_ref().map(|f| f.id);
        let mut found: Vec<OpenFile> = Vec::new();
        for _ in 0..MAX_LISTINGS {
            let before = live_id(&self.path)?;
            let mut new_this_time = false;
            for name in log_files(&self.path)? {
                let Some(file) = OpenFile::open(&name)? else {
                    continue;
                };
                let seen = Some(file.id) == held
                    || found.iter().any(|f| f.id == file.id)
                    || self.finished.contains(&file.fingerprint()?);
                if !seen {
                    new_this_time = true;
                    found.push(file);
                } else if let Some(earlier) = found.iter_mut().find(|f| f.id == file.id) {
                    // The same file under its current name (the live one may have
                    // been renamed since it was first listed).
                    earlier.name = file.name;
                }
            }
            if !new_this_time && live_id(&self.path)? == before {
                break;
            }
        }
        Ok(found)
    }

    /// The name the file `id` has in the log now, if it is still there.
    fn current_name(&self, id: (u64, u64)) -> io::Result<Option<PathBuf>> {
        for name in log_files(&self.path)? {
            if let Some(file) = OpenFile::open(&name)? {
                if file.id == id {
                    return Ok(Some(name));
                }
            }
        }
        Ok(None)
    }

    fn remember_finished(&mut self, file: &OpenFile) -> io::Result<()> {
        // Remember more than the log holds, so no file still listed is forgotten.
        let listed = log_files(&self.path)?.len();
        while self.finished.len() >= FINISHED_MEMORY.max(2 * listed) {
            self.finished.pop_front();
        }
        self.finished.push_back(file.fingerprint()?);
        Ok(())
    }
}

/// `n` for `path.n`, 0 for the live file (or any other name).
fn rotation_number(path: &Path, name: &Path) -> usize {
    let (Some(base), Some(name)) = (path.to_str(), name.to_str()) else {
        return 0;
    };
    name.strip_prefix(base)
        .and_then(|rest| rest.strip_prefix('.'))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The (device, inode) the live path names now, `None` while it does not exist.
fn live_id(path: &Path) -> io::Result<Option<(u64, u64)>> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(Some((meta.dev(), meta.ino()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::Record;

    fn line(id: u64) -> String {
        format!(
            "{{\"kind\":\"daemon_stop\",\"time\":\"2026-01-01T00:00:00Z\",\"reason\":\"x\",\"checkins\":{id},\"unlocks\":0}}\n"
        )
    }

    fn ids(items: Vec<Item>) -> Vec<u64> {
        items
            .into_iter()
            .map(|item| match item {
                Item::Entry(Entry {
                    record: Some(Record::DaemonStop { checkins, .. }),
                    ..
                }) => checkins,
                other => panic!("not a daemon_stop: {other:?}"),
            })
            .collect()
    }

    #[test]
    fn a_partial_line_waits_for_its_newline_and_a_truncated_file_is_read_again() {
        use std::io::Write;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("audit.jsonl");
        std::fs::write(&path, line(1)).unwrap();
        let mut reader = LogReader::open(&path).unwrap();
        assert_eq!(ids(reader.poll().unwrap()), vec![1]);

        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap();
        let two = line(2);
        f.write_all(&two.as_bytes()[..10]).unwrap();
        assert!(
            reader.poll().unwrap().is_empty(),
            "half a line is not a record yet"
        );
        f.write_all(&two.as_bytes()[10..]).unwrap();
        assert_eq!(ids(reader.poll().unwrap()), vec![2]);

        // Truncated in place and rewritten shorter: read from the start again.
        std::fs::write(&path, line(3)).unwrap();
        assert_eq!(ids(reader.poll().unwrap()), vec![3]);
    }

    #[test]
    fn following_while_another_process_rotates_fast_loses_and_repeats_nothing() {
        use std::io::Write;
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("audit.jsonl");
        std::fs::write(&path, line(0)).unwrap();
        let mut reader = LogReader::open(&path).unwrap();
        let total = 1000u64;
        let writer = {
            let path = path.clone();
            std::thread::spawn(move || {
                // What AuditLog does: append, and shift the files once the live one
                // passes a (here tiny) size, so rotations race the reader's listing.
                let mut file = std::fs::OpenOptions::new()
                    .append(true)
                    .open(&path)
                    .unwrap();
                for id in 1..=total {
                    if file.metadata().unwrap().len() > 300 {
                        crate::audit::rotation::shift(&path, 10_000).unwrap();
                        file = std::fs::OpenOptions::new()
                            .create(true)
                            .append(true)
                            .open(&path)
                            .unwrap();
                    }
                    file.write_all(line(id).as_bytes()).unwrap();
                }
            })
        };
        let mut seen = Vec::new();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        while seen.len() < total as usize + 1 && std::time::Instant::now() < deadline {
            seen.extend(ids(reader.poll().unwrap()));
        }
        writer.join().unwrap();
        seen.extend(ids(reader.poll().unwrap()));
        assert_eq!(seen, (0..=total).collect::<Vec<_>>());
    }
}
