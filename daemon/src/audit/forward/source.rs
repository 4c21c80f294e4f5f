//! The records still to forward, read back from the local audit log: the file the
//! cursor is in and every newer one (rotated by rename), each held open by
//! descriptor so a rename never loses the place.
//!
//! The log is the queue: nothing is buffered in memory beyond one batch, so a
//! collector that is down for days costs disk the log already has, not memory.

use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Seek, SeekFrom};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::cursor::Cursor;
use crate::audit::rotation::rotated_path;

/// A file of the log, held open.
#[derive(Debug)]
struct Held {
    dev: u64,
    ino: u64,
    /// Where it was last seen (for the gap record).
    name: PathBuf,
    file: File,
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

/// The files still to forward, oldest (the cursor's) first.
#[derive(Debug)]
pub struct Source {
    log: PathBuf,
    keep: usize,
    held: VecDeque<Held>,
    /// Offset delivered in the front file.
    offset: u64,
}

impl Source {
    /// Starts at `cursor` (or the oldest file of the log without one). A cursor
    /// whose file is gone is a gap of unknown size, returned with the source.
    pub fn open(log: &Path, keep: usize, cursor: Option<Cursor>) -> (Source, Vec<Gap>) {
        let mut source = Source {
            log: log.to_owned(),
            keep,
            held: VecDeque::new(),
            offset: 0,
        };
        let mut gaps = Vec::new();
        let chain = source.chain();
        let start = match cursor {
            None => 0,
            Some(c) => match chain.iter().position(|(_, m)| c.is_file(m)) {
                Some(i) => {
                    source.offset = c.offset;
                    i
                }
                None => {
                    gaps.push(Gap {
                        file: format!("{}:{}", c.dev, c.ino),
                        records: None,
                    });
                    0
                }
            },
        };
        for (path, _) in chain.into_iter().skip(start) {
            source.hold(&path);
        }
        (source, gaps)
    }

    /// The log's files that exist now, oldest first, with their metadata.
    fn chain(&self) -> Vec<(PathBuf, std::fs::Metadata)> {
        let mut paths: Vec<PathBuf> = (1..=self.keep)
            .rev()
            .map(|n| rotated_path(&self.log, n))
            .collect();
        paths.push(self.log.clone());
        paths
            .into_iter()
            .filter_map(|p| std::fs::metadata(&p).ok().map(|m| (p, m)))
            .collect()
    }

    fn hold(&mut self, path: &Path) {
        let Ok(file) = File::open(path) else { return };
        let Ok(meta) = file.metadata() else { return };
        if self
            .held
            .iter()
            .any(|h| h.dev == meta.dev() && h.ino == meta.ino())
        {
            return;
        }
        self.held.push_back(Held {
            dev: meta.dev(),
            ino: meta.ino(),
            name: path.to_owned(),
            file,
        });
    }

    /// Picks up files created by rotation since, and turns files deleted before
    /// they were wholly forwarded into gaps (counting their remaining records).
    pub fn rescan(&mut self) -> Vec<Gap> {
        let chain = self.chain();
        let mut gaps = Vec::new();
        // Oldest first: a held file no longer in the chain was rotated away.
        while let Some(front) = self.held.front() {
            if chain
                .iter()
                .any(|(_, m)| m.dev() == front.dev && m.ino() == front.ino)
            {
                break;
            }
            let mut front = self.held.pop_front().expect("front exists");
            let records = count_lines_from(&mut front.file, self.offset).ok();
            self.offset = 0;
            if records != Some(0) {
                gaps.push(Gap {
                    file: front.name.display().to_string(),
                    records,
                });
            }
        }
        for (path, meta) in chain {
            let newer = self
                .held
                .back()
                .is_none_or(|b| !(b.dev == meta.dev() && b.ino == meta.ino()));
            let known = self
                .held
                .iter()
                .any(|h| h.dev == meta.dev() && h.ino == meta.ino());
            if newer && !known {
                // Only files newer than the held ones: older ones were forwarded.
                let position = self.chain_position(&meta);
                if position.is_some() {
                    self.hold(&path);
                }
            }
        }
        gaps
    }

    /// Whether `meta` comes after every held file in the chain (so it is new).
    fn chain_position(&self, meta: &std::fs::Metadata) -> Option<()> {
        let chain = self.chain();
        let idx = chain
            .iter()
            .position(|(_, m)| m.dev() == meta.dev() && m.ino() == meta.ino())?;
        let last_held = self.held.back().and_then(|b| {
            chain
                .iter()
                .position(|(_, m)| m.dev() == b.dev && m.ino() == b.ino)
        });
        match last_held {
            Some(l) if idx <= l => None,
            _ => Some(()),
        }
    }

    /// Up to `max` bytes of whole lines after the cursor, or `None` when caught up.
    /// Moves to the next file when the front one is finished (a newer one exists).
    pub fn next_batch(&mut self, max: usize) -> io::Result<Option<Vec<u8>>> {
        loop {
            let newer_exists = self.held.len() > 1;
            let Some(front) = self.held.front_mut() else {
                return Ok(None);
            };
            let mut buf = Vec::new();
            front.file.seek(SeekFrom::Start(self.offset))?;
            (&mut front.file).take(max as u64).read_to_end(&mut buf)?;
            let whole = buf.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
            if whole == 0 && buf.len() == max {
                // One line longer than a batch: take it whole.
                let mut rest = Vec::new();
                front.file.seek(SeekFrom::Start(self.offset))?;
                std::io::BufRead::read_until(
                    &mut io::BufReader::new(&front.file),
                    b'\n',
                    &mut rest,
                )?;
                if rest.ends_with(b"\n") {
                    return Ok(Some(rest));
                }
            }
            if whole > 0 {
                buf.truncate(whole);
                return Ok(Some(buf));
            }
            if !newer_exists {
                return Ok(None);
            }
            self.held.pop_front();
            self.offset = 0;
        }
    }

    /// Marks `n` bytes after the cursor delivered.
    pub fn advance(&mut self, n: usize) {
        self.offset += n as u64;
    }

    /// The cursor to save: the front file and the delivered offset.
    #[must_use]
    pub fn cursor(&self) -> Option<Cursor> {
        self.held.front().map(|h| Cursor {
            dev: h.dev,
            ino: h.ino,
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

    /// Whole records not yet delivered (reads them: call it rarely when far behind).
    #[must_use]
    pub fn records_behind(&mut self) -> u64 {
        let mut n = 0;
        let mut offset = self.offset;
        for h in &mut self.held {
            n += count_lines_from(&mut h.file, offset).unwrap_or(0);
            offset = 0;
        }
        n
    }
}

/// Newlines in `file` after `offset`.
fn count_lines_from(file: &mut File, offset: u64) -> io::Result<u64> {
    file.seek(SeekFrom::Start(offset))?;
    let mut buf = vec![0u8; 64 * 1024];
    let mut n = 0u64;
    loop {
        let got = file.read(&mut buf)?;
        if got == 0 {
            return Ok(n);
        }
        n += buf[..got].iter().filter(|&&b| b == b'\n').count() as u64;
    }
}
