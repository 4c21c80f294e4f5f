//! The records still to forward, read back from the local audit log: the file the
//! cursor is in and every newer one, held by the log's [`Chain`] (by descriptor,
//! opened while walking, so a rename never loses the place). This module keeps what
//! is the forwarder's own: the cursor, batches, what is behind.
//!
//! The log is the queue: nothing is buffered in memory beyond one batch, so a
//! collector that is down for days costs disk the log already has, not memory.
//! For the same reason a held file that rotation deletes is let go, not read on:
//! it would hold its disk space. What it held unsent was counted by the writer
//! as it deleted it ([`Gaps`]): every batch is claimed there before it is sent.

use std::io::{self, Read, Seek, SeekFrom};
use std::path::Path;

use std::sync::Arc;

use super::count::{count_range, newlines};
use super::cursor::Cursor;
use super::gaps::Gaps;
use crate::audit::chain::{Chain, FileId};

/// What is counted of a held file for [`Source::records_behind`]: bytes from
/// the start, and the newlines in them, so each byte is counted once, not once a
/// second.
#[derive(Debug, Default)]
struct Counted {
    counted_to: u64,
    lines: u64,
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

/// A position in the held files: the cursor, and the newlines before it in its
/// file when known (kept so [`Source::records_behind`] need not count them again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mark {
    /// The file and offset (the end of a whole line).
    pub cursor: Cursor,
    /// Newlines before `cursor.offset` in its file; `None` until counted.
    lines: Option<u64>,
}

impl Mark {
    /// The mark `bytes` further on in the same file (`bytes` whole lines).
    #[must_use]
    pub fn after(self, bytes: &[u8]) -> Mark {
        Mark {
            cursor: Cursor {
                offset: self.cursor.offset + bytes.len() as u64,
                ..self.cursor
            },
            lines: self.lines.map(|n| n + newlines(bytes)),
        }
    }
}

/// Where sending has got to: a held file (0 is the front one) and an offset in it.
#[derive(Debug, Clone, Copy)]
struct Sent {
    index: usize,
    offset: u64,
    /// Newlines before `offset` in that file; `None` until counted.
    lines: Option<u64>,
}

/// The files still to forward, oldest (the cursor's) first.
///
/// Two positions: what was *delivered* (the front file and [`Source::cursor`], the
/// durable cursor: the collector is known to have it, as far as the transport can
/// tell) and what was *sent* (where the next batch starts). Between them lies what
/// was written to a connection and not yet known delivered: [`Source::rewind`]
/// sends it again after a connection ends (see `window.rs`). Files are let go only
/// once delivered past, so a rewind never needs a file already dropped.
#[derive(Debug)]
pub struct Source {
    held: Chain<Counted>,
    /// Offset delivered in the front file.
    offset: u64,
    /// Newlines before `offset` in the front file; `None` until counted (a cursor
    /// loaded at start-up).
    offset_lines: Option<u64>,
    /// Where the next batch starts.
    sent: Sent,
    /// Where each batch is claimed before it is sent, shared with the writer.
    gaps: Arc<Gaps>,
}

impl Source {
    /// Starts at `cursor` (or the oldest file of the log without one); `false`
    /// with the source when the cursor's file is gone (its unsent records were
    /// counted by the writer as it deleted them, unless no forwarder was
    /// configured then: nothing was owed). An error opening the log's files (not
    /// their absence) is returned: skipping a file would skip its records.
    pub fn open(
        log: &Path,
        keep: usize,
        cursor: Option<Cursor>,
        gaps: Arc<Gaps>,
    ) -> io::Result<(Source, bool)> {
        let mut source = Source {
            held: Chain::open(log, Some(keep))?,
            offset: 0,
            offset_lines: Some(0),
            sent: Sent {
                index: 0,
                offset: 0,
                lines: Some(0),
            },
            gaps,
        };
        let mut found = true;
        if let Some(c) = cursor {
            found = source.held.start_at(FileId {
                dev: c.dev,
                ino: c.ino,
            });
            if found {
                source.offset = c.offset;
                source.offset_lines = None;
            }
        }
        source.rewind();
        Ok((source, found))
    }

    /// Picks up files created by rotation since, and lets go of files deleted
    /// (their unsent records were counted by the writer as it deleted them).
    ///
    /// A deleted file wholly sent but not yet known delivered is let go all the
    /// same: it cannot be sent again (the space must be freed), and what it holds
    /// did go out; only a connection lost within the same moments loses it.
    pub fn rescan(&mut self) -> io::Result<()> {
        let gone = self.held.rescan()?;
        if gone.is_empty() {
            return Ok(());
        }
        let dropped = gone.len();
        // The front file changed: nothing of the new one is delivered or sent yet,
        // unless sending was already past the files that went.
        self.offset = 0;
        self.offset_lines = Some(0);
        if self.sent.index < dropped {
            self.sent = Sent {
                index: 0,
                offset: 0,
                lines: Some(0),
            };
        } else {
            self.sent.index -= dropped;
        }
        Ok(())
    }

    /// Claims `batch` (what [`Source::next_batch`] gave) with the writer before
    /// it is sent: `false` when the file it came from was deleted meanwhile (the
    /// writer counted it): then sending moves on to the next file and `batch`
    /// must not be sent.
    pub fn claim(&mut self, batch: &[u8]) -> bool {
        let end = self.sent.offset + batch.len() as u64;
        let Some(held) = self.held.iter().nth(self.sent.index) else {
            return false;
        };
        if self.gaps.claim(&held.file, held.id, end) {
            return true;
        }
        self.sent = Sent {
            index: self.sent.index + 1,
            offset: 0,
            lines: Some(0),
        };
        false
    }

    /// Up to `max` bytes of whole lines after the sending position, into `buf`
    /// (cleared first, its allocation reused across batches). Moves to the next
    /// file when the one being sent is finished (a newer one exists).
    pub fn next_batch(&mut self, max: usize, buf: &mut Vec<u8>) -> io::Result<Batch> {
        loop {
            let newer_exists = self.held.len() > self.sent.index + 1;
            let offset = self.sent.offset;
            let Some(front) = self.held.iter_mut().nth(self.sent.index) else {
                return Ok(Batch::CaughtUp);
            };
            buf.clear();
            front.file.seek(SeekFrom::Start(offset))?;
            (&mut front.file).take(max as u64).read_to_end(buf)?;
            let full = buf.len() == max;
            let whole = memchr::memrchr(b'\n', buf).map_or(0, |i| i + 1);
            if whole == 0 && full {
                // One line longer than a batch: take it whole.
                buf.clear();
                front.file.seek(SeekFrom::Start(offset))?;
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
            self.sent = Sent {
                index: self.sent.index + 1,
                offset: 0,
                lines: Some(0),
            };
        }
    }

    /// Marks `batch` (the bytes after the sending position that
    /// [`Source::next_batch`] gave) sent.
    pub fn sent(&mut self, batch: &[u8]) {
        self.sent.offset += batch.len() as u64;
        if let Some(n) = self.sent.lines.as_mut() {
            *n += newlines(batch);
        }
    }

    /// Where sending has got to (where the next batch starts), as a mark that
    /// [`Source::delivered`] accepts.
    #[must_use]
    pub fn sent_mark(&self) -> Option<Mark> {
        self.held.iter().nth(self.sent.index).map(|h| Mark {
            cursor: Cursor {
                dev: h.id.dev,
                ino: h.id.ino,
                offset: self.sent.offset,
            },
            lines: self.sent.lines,
        })
    }

    /// Notes that everything up to `mark` (a [`Source::sent_mark`], or a mark
    /// after it in the same file) was delivered: the cursor moves there and the
    /// files before it are let go. A mark in a file no longer held (rotated away)
    /// is ignored: everything held is after it.
    pub fn delivered(&mut self, mark: Mark) {
        let id = FileId {
            dev: mark.cursor.dev,
            ino: mark.cursor.ino,
        };
        let Some(i) = self.held.iter().position(|h| h.id == id) else {
            return;
        };
        for _ in 0..i {
            self.held.pop_front();
        }
        self.sent.index = self.sent.index.saturating_sub(i);
        self.offset = mark.cursor.offset;
        self.offset_lines = mark.lines;
    }

    /// Sends again from the delivered position: what was sent after it may not
    /// have reached the collector. The writer is told (what it deletes from here
    /// on counts as unsent).
    pub fn rewind(&mut self) {
        self.sent = Sent {
            index: 0,
            offset: self.offset,
            lines: self.offset_lines,
        };
        if let Some(front) = self.held.front() {
            self.gaps.claim(&front.file, front.id, self.offset);
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

    /// Where the log ends now: the newest held file and its length.
    #[must_use]
    pub fn end(&self) -> Option<Cursor> {
        let back = self.held.iter().next_back()?;
        let len = back.file.metadata().ok()?.len();
        Some(Cursor {
            dev: back.id.dev,
            ino: back.id.ino,
            offset: len,
        })
    }

    /// Whether everything up to `c` (a past [`Source::end`]) is done with: known
    /// delivered, or in a file let go (delivered past, or rotated away as a gap).
    #[must_use]
    pub fn is_delivered(&self, c: &Cursor) -> bool {
        let id = FileId {
            dev: c.dev,
            ino: c.ino,
        };
        match self.held.iter().position(|h| h.id == id) {
            None => true,
            Some(0) => c.offset <= self.offset,
            Some(_) => false,
        }
    }

    /// Bytes not yet known delivered, over every held file: those not sent, and
    /// those sent and in flight.
    #[must_use]
    pub fn bytes_undelivered(&self) -> u64 {
        let total: u64 = self
            .held
            .iter()
            .filter_map(|h| h.file.metadata().ok())
            .map(|m| m.len())
            .sum();
        total.saturating_sub(self.offset)
    }

    /// Bytes not yet sent, over every held file.
    #[must_use]
    pub fn bytes_behind(&self) -> u64 {
        let total: u64 = self
            .held
            .iter()
            .skip(self.sent.index)
            .filter_map(|h| h.file.metadata().ok())
            .map(|m| m.len())
            .sum();
        total.saturating_sub(self.sent.offset)
    }

    /// Whole records not yet sent. Reads only what was written since the last
    /// call (the first call after a start-up also counts the sending file up to
    /// the sending position); a read error leaves the count where it got to.
    #[must_use]
    pub fn records_behind(&mut self) -> u64 {
        let mut total = 0;
        for h in self.held.iter_mut().skip(self.sent.index) {
            let counted = &mut h.state;
            if let Ok((lines, end)) = count_range(&mut h.file, counted.counted_to, None) {
                counted.lines += lines;
                counted.counted_to = end;
            }
            total += counted.lines;
        }
        let before = match (self.sent.lines, self.held.iter_mut().nth(self.sent.index)) {
            (Some(n), _) => n,
            (None, Some(front)) => match count_range(&mut front.file, 0, Some(self.sent.offset)) {
                Ok((n, _)) => {
                    self.sent.lines = Some(n);
                    n
                }
                Err(_) => return 0,
            },
            (None, None) => 0,
        };
        total.saturating_sub(before)
    }
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
        let gaps = Arc::new(Gaps::open(&log, 5));
        let (mut source, found) = Source::open(&log, 5, None, Arc::clone(&gaps)).unwrap();
        assert!(found);
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
            source.sent(&buf);
            source.delivered(source.sent_mark().unwrap());
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
        let (mut source, _) = Source::open(&log, 5, Some(cursor), gaps).unwrap();
        assert_eq!(
            source.records_behind(),
            4,
            "6 in the live file, 2 delivered"
        );
    }
}
