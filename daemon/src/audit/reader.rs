//! Reading the audit log back: rotated files oldest first, then the live file, and
//! following the live file across rotations. Each line becomes an [`Item`]
//! (see [`super::line`]: the writer's own typed records, one definition of the format).
//! Which files, in which order, held how: [`super::chain`]; this module splits them
//! into lines.

use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

pub use super::chain::log_files;
use super::chain::{Chain, Held};
pub use super::line::{parse_line, Entry, Item};

/// Where a reader sends each item as it is read.
pub type Sink<'a> = &'a mut dyn FnMut(Item) -> io::Result<()>;

/// Bytes read at a time: a log of any size is read in bounded memory.
const CHUNK: usize = 64 * 1024;

/// How many times one poll catches up with rotations while they keep happening
/// (the rest is read at the next poll).
const MAX_RESCANS: usize = 16;

/// Reads the whole log (rotated files, then the live file) and, when asked again,
/// what has been appended since, following the live file across rotations.
///
/// Every file is held open (by the [`Chain`]) before any is read, so a rotation
/// during the first read neither skips nor repeats records: the open handles keep
/// pointing at the same files.
#[derive(Debug)]
pub struct LogReader {
    /// The files not read to their end yet; the newest one is followed.
    chain: Chain<Lines>,
}

/// Where reading one file has got to, beyond its descriptor's position.
#[derive(Debug, Default)]
struct Lines {
    /// Bytes of an unfinished last line, kept until its newline arrives.
    pending: Vec<u8>,
    /// Lines completed so far.
    line: usize,
}

impl Held<Lines> {
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
            let lines = &mut self.state;
            lines.pending.extend_from_slice(&chunk[..n]);
            let Some(last_newline) = lines.pending.iter().rposition(|&b| b == b'\n') else {
                continue;
            };
            let rest = lines.pending.split_off(last_newline + 1);
            let complete = std::mem::replace(&mut lines.pending, rest);
            for raw in complete[..complete.len() - 1].split(|&b| b == b'\n') {
                lines.line += 1;
                sink(match std::str::from_utf8(raw) {
                    Ok(text) => parse_line(text, &self.name, lines.line),
                    Err(e) => Item::Corrupt {
                        file: self.name.clone(),
                        line: lines.line,
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
            self.state = Lines::default();
        }
        Ok(())
    }

    /// Called when nothing more will be appended: an unfinished line is corrupt.
    fn finish(&mut self, sink: Sink<'_>) -> io::Result<()> {
        if self.state.pending.is_empty() {
            return Ok(());
        }
        self.state.line += 1;
        self.state.pending.clear();
        sink(Item::Corrupt {
            file: self.name.clone(),
            line: self.state.line,
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
        Ok(LogReader {
            chain: Chain::open(path, None)?,
        })
    }

    /// Opens the log to follow it from its end, ready to pass the last `n` lines
    /// that `wanted` accepts first (`n = 0`: only what comes next). History is not
    /// replayed: the files are read backwards from the end of the newest (and
    /// into older ones while they hold fewer than `n`), and the files before that
    /// point are let go.
    pub fn open_tail(
        path: &Path,
        n: usize,
        wanted: &mut dyn FnMut(&Item) -> bool,
    ) -> io::Result<LogReader> {
        let mut chain = Chain::<Lines>::open(path, None)?;
        let mut remaining = n;
        let mut unwanted = chain.len();
        // Newest first. The newest is kept even with nothing to show from it: it
        // is where following starts.
        for (i, held) in chain.iter_mut().rev().enumerate() {
            if remaining == 0 && i > 0 {
                break;
            }
            let (start, found) =
                super::tail::start_of_last(&mut held.file, &held.name, remaining, wanted)?;
            held.file.seek(SeekFrom::Start(start))?;
            remaining -= found;
            unwanted -= 1;
        }
        for _ in 0..unwanted {
            chain.pop_front();
        }
        Ok(LogReader { chain })
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
        match self.chain.back_mut() {
            Some(newest) => newest.finish(sink),
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
    /// its end first, then every file rotated since (oldest first), then the new
    /// one from its start. An error from `sink` stops reading and is returned.
    ///
    /// A held file is read to its end even if rotation deletes it meanwhile; a
    /// record is lost only if its file is deleted (rotated past `keep`) before a
    /// poll holds it.
    pub fn poll_each(&mut self, sink: Sink<'_>) -> io::Result<()> {
        self.read_held(sink)?;
        for _ in 0..MAX_RESCANS {
            let before = self.chain.len();
            let gone = self.chain.rescan()?;
            let rotated = !gone.is_empty() || self.chain.len() > before;
            for mut old in gone {
                old.drain(sink)?;
            }
            if !rotated {
                break;
            }
            self.read_held(sink)?;
        }
        Ok(())
    }

    /// Reads every held file but the newest to its end (a newer one exists, so
    /// they are finished) and lets go of it, then what the newest holds now.
    fn read_held(&mut self, sink: Sink<'_>) -> io::Result<()> {
        while self.chain.len() > 1 {
            if let Some(old) = self.chain.front_mut() {
                old.drain(sink)?;
            }
            self.chain.pop_front();
        }
        if let Some(newest) = self.chain.back_mut() {
            newest.restart_if_truncated()?;
            newest.read_available(sink)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::rotation::rotated_path;
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

    /// The forwarder's record loss of `13653c3`, for the reader: a rotation
    /// between looking at the log and opening its files moves `.1` to `.2`, so
    /// files opened by a list taken before (`.1`, live) are the old live file and
    /// the new one, and the file that moved is never read.
    #[test]
    fn a_rotation_between_looking_at_the_log_and_opening_it_loses_no_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("audit.jsonl");
        std::fs::write(rotated_path(&path, 1), line(1) + &line(2)).unwrap();
        std::fs::write(&path, line(3) + &line(4)).unwrap();
        let mut rotated = false;
        let mut open = |name: &Path| {
            if !rotated {
                // What AuditLog does when the live file is full, as the first
                // file is about to be opened.
                rotated = true;
                crate::audit::rotation::shift(&path, 5).unwrap();
                std::fs::write(&path, line(5)).unwrap();
            }
            std::fs::File::open(name)
        };
        let chain = Chain::open_with(&path, None, &mut open).unwrap();
        let mut reader = LogReader { chain };
        assert_eq!(ids(reader.read_to_end().unwrap()), vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn a_log_created_after_the_reader_opened_is_read_by_the_next_poll() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("audit.jsonl");
        let mut reader = LogReader::open(&path).unwrap();
        assert!(reader.poll().unwrap().is_empty());
        std::fs::write(&path, line(1)).unwrap();
        assert_eq!(ids(reader.poll().unwrap()), vec![1]);
    }

    #[test]
    fn following_from_the_end_while_the_live_file_is_missing_replays_no_rotated_file() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("audit.jsonl");
        std::fs::write(rotated_path(&path, 2), line(1)).unwrap();
        std::fs::write(rotated_path(&path, 1), line(2)).unwrap();
        // Between a rotation's rename and the new live file.
        let mut reader = LogReader::open_tail(&path, 0, &mut |_| true).unwrap();
        assert!(reader.poll().unwrap().is_empty(), "history is not replayed");
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
