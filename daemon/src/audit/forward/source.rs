//! The records still to forward, read back from the local audit log: the file the
//! cursor is in and every newer one, held by the log's [`Chain`] (by descriptor,
//! opened while walking, so a rename never loses the place). This module keeps what
//! is the forwarder's own: the cursor, batches, what is behind, and the gaps.
//!
//! The log is the queue: nothing is buffered in memory beyond one batch, so a
//! collector that is down for days costs disk the log already has, not memory.
//! For the same reason a held file that rotation deletes is let go (its unsent
//! records counted as a gap), not read on: it would hold its disk space.

use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use super::cursor::Cursor;
use crate::audit::chain::{Chain, FileId};

/// What is counted of a held file for [`Source::records_behind`]: bytes from
/// the start, and the newlines in them, so each byte is counted once, not once a
/// second.
#[derive(Debug, Default)]
struct Counted {
    counted_to: u64,
    lines: u64,
}

/// Records rotated away (deleted) before they were forwarded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gap {
    /// The file's last name, or `dev:ino` when it was gone before it was opened.
    pub file: String,
    /// Whole records lost; `None` when the file was gone before it could be read
    /// (rotated away while the daemon was not running).
    pub records: Option<u64>,
}

/// What [`Source::next_batch`] found after the cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Batch {
    /// Nothing: every whole line is delivered.
    CaughtUp,
    /// Whole lines; `more` when there were more bytes than the batch took (or a
    /// newer file waits), so the next batch need not wait for the writer.
    Lines {
        /// Whether more is already waiting.
        more: bool,
    },
}

/// The files still to forward, oldest (the cursor's) first.
#[derive(Debug)]
pub struct Source {
    held: Chain<Counted>,
    /// Offset delivered in the front file.
    offset: u64,
    /// Newlines before `offset` in the front file; `None` until counted (a cursor
    /// loaded at start-up), then kept up by [`Source::advance`].
    offset_lines: Option<u64>,
}

impl Source {
    /// Starts at `cursor` (or the oldest file of the log without one). A cursor
    /// whose file is gone is a gap of unknown size, returned with the source.
    /// An error opening the log's files (not their absence) is returned: skipping
    /// a file would skip its records.
    pub fn open(log: &Path, keep: usize, cursor: Option<Cursor>) -> io::Result<(Source, Vec<Gap>)> {
        let mut source = Source {
            held: Chain::open(log, Some(keep))?,
            offset: 0,
            offset_lines: Some(0),
        };
        let mut gaps = Vec::new();
        if let Some(c) = cursor {
            if source.held.start_at(FileId {
                dev: c.dev,
                ino: c.ino,
            }) {
                source.offset = c.offset;
                source.offset_lines = None;
            } else {
                gaps.push(Gap {
                    file: format!("{}:{}", c.dev, c.ino),
                    records: None,
                });
            }
        }
        Ok((source, gaps))
    }

    /// Picks up files created by rotation since, and turns files deleted before
    /// they were wholly forwarded into gaps (counting their remaining records).
    pub fn rescan(&mut self) -> io::Result<Vec<Gap>> {
        let mut gaps = Vec::new();
        for mut gone in self.held.rescan()? {
            let records = count_lines_from(&mut gone.file, self.offset).ok();
            self.offset = 0;
            self.offset_lines = Some(0);
            if records != Some(0) {
                gaps.push(Gap {
                    file: gone.name.display().to_string(),
                    records,
                });
            }
        }
        Ok(gaps)
    }

    /// Up to `max` bytes of whole lines after the cursor, into `buf` (cleared first,
    /// its allocation reused across batches). Moves to the next file when the front
    /// one is finished (a newer one exists).
    pub fn next_batch(&mut self, max: usize, buf: &mut Vec<u8>) -> io::Result<Batch> {
        loop {
            let newer_exists = self.held.len() > 1;
            let Some(front) = self.held.front_mut() else {
                return Ok(Batch::CaughtUp);
            };
            buf.clear();
            front.file.seek(SeekFrom::Start(self.offset))?;
            (&mut front.file).take(max as u64).read_to_end(buf)?;
            let full = buf.len() == max;
            let whole = memchr::memrchr(b'\n', buf).map_or(0, |i| i + 1);
            if whole == 0 && full {
                // One line longer than a batch: take it whole.
                buf.clear();
                front.file.seek(SeekFrom::Start(self.offset))?;
                std::io::BufRead::read_until(&mut io::BufReader::new(&front.file), b'\n', buf)?;
                if buf.ends_with(b"\n") {
                    return Ok(Batch::Lines { more: true });
                }
                buf.clear();
            }
            if whole > 0 {
                buf.truncate(whole);
                return Ok(Batch::Lines {
                    more: full || newer_exists,
                });
            }
            if !newer_exists {
                buf.clear();
                return Ok(Batch::CaughtUp);
            }
            self.held.pop_front();
            self.offset = 0;
            self.offset_lines = Some(0);
        }
    }

    /// Marks `batch` (the bytes after the cursor that [`Source::next_batch`] gave)
    /// delivered.
    pub fn advance(&mut self, batch: &[u8]) {
        self.offset += batch.len() as u64;
        if let Some(n) = self.offset_lines.as_mut() {
            *n += newlines(batch);
        }
    }

    /// The cursor to save: the front file and the delivered offset.
    #[must_use]
    pub fn cursor(&self) -> Option<Cursor> {
        self.held.front().map(|h| Cursor {
            dev: h.id.dev,
            ino: h.id.ino,
            offset: self.offset,
        })
    }

    /// Bytes not yet delivered, over every held file.
    #[must_use]
    pub fn bytes_behind(&self) -> u64 {
        let total: u64 = self
            .held
            .iter()
            .filter_map(|h| h.file.metadata().ok())
            .map(|m| m.len())
            .sum();
        total.saturating_sub(self.offset)
    }

    /// Whole records not yet delivered. Reads only what was written since the last
    /// call (the first call after a start-up also counts the front file up to the
    /// cursor); a read error leaves the count where it got to.
    #[must_use]
    pub fn records_behind(&mut self) -> u64 {
        let mut total = 0;
        for h in self.held.iter_mut() {
            let counted = &mut h.state;
            if let Ok((lines, end)) = count_range(&mut h.file, counted.counted_to, None) {
                counted.lines += lines;
                counted.counted_to = end;
            }
            total += counted.lines;
        }
        let before = match (self.offset_lines, self.held.front_mut()) {
            (Some(n), _) => n,
            (None, Some(front)) => match count_range(&mut front.file, 0, Some(self.offset)) {
                Ok((n, _)) => {
                    self.offset_lines = Some(n);
                    n
                }
                Err(_) => return 0,
            },
            (None, None) => 0,
        };
        total.saturating_sub(before)
    }
}

fn newlines(bytes: &[u8]) -> u64 {
    memchr::memchr_iter(b'\n', bytes).count() as u64
}

/// Newlines in `file` from `from` up to `to` (or its end), and where that was.
fn count_range(file: &mut File, from: u64, to: Option<u64>) -> io::Result<(u64, u64)> {
    file.seek(SeekFrom::Start(from))?;
    let mut buf = vec![0u8; 64 * 1024];
    let (mut n, mut at) = (0u64, from);
    loop {
        let want = match to {
            Some(to) => usize::try_from(to.saturating_sub(at))
                .unwrap_or(usize::MAX)
                .min(buf.len()),
            None => buf.len(),
        };
        if want == 0 {
            return Ok((n, at));
        }
        let got = file.read(&mut buf[..want])?;
        if got == 0 {
            return Ok((n, at));
        }
        n += newlines(&buf[..got]);
        at += got as u64;
    }
}

/// Newlines in `file` after `offset`.
fn count_lines_from(file: &mut File, offset: u64) -> io::Result<u64> {
    count_range(file, offset, None).map(|(n, _)| n)
}

#[cfg(test)]
mod tests {
    use std::io::Write;
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::audit::rotation::rotated_path;

    fn append(path: &Path, lines: usize) {
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .create(true)
            .open(path)
            .unwrap();
        for _ in 0..lines {
            f.write_all(b"{\"kind\":\"x\"}\n").unwrap();
        }
    }

    #[test]
    fn records_behind_follows_writes_deliveries_rotated_files_and_a_loaded_cursor() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("audit.jsonl");
        append(&rotated_path(&log, 1), 2);
        append(&log, 3);
        let (mut source, gaps) = Source::open(&log, 5, None).unwrap();
        assert!(gaps.is_empty());
        assert_eq!(source.records_behind(), 5, "both files");
        append(&log, 2);
        assert_eq!(source.records_behind(), 7, "what was written since");
        let mut buf = Vec::new();
        // The rotated file, then the live one.
        for expect in [2, 5] {
            assert!(matches!(
                source.next_batch(1 << 20, &mut buf).unwrap(),
                Batch::Lines { .. }
            ));
            assert_eq!(newlines(&buf), expect);
            source.advance(&buf);
        }
        assert_eq!(source.records_behind(), 0);
        append(&log, 1);
        assert_eq!(source.records_behind(), 1);

        // A cursor loaded at start-up, two records into the live file.
        let live = std::fs::metadata(&log).unwrap();
        let cursor = Cursor {
            dev: live.dev(),
            ino: live.ino(),
            offset: 2 * b"{\"kind\":\"x\"}\n".len() as u64,
        };
        let (mut source, _) = Source::open(&log, 5, Some(cursor)).unwrap();
        assert_eq!(
            source.records_behind(),
            4,
            "6 in the live file, 2 delivered"
        );
    }
}
