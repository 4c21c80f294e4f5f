//! The files of the rotated audit log, held open by descriptor, oldest first, and
//! kept up with as rotation renames them: the one follower of the log under both
//! `metalift audit` ([`super::reader`]) and the forwarder
//! ([`super::forward::source`]), which keep only what they do with the bytes.
//!
//! Rotation (`rotation::shift`, in the writer) renames every file one number up and
//! starts a new live file, in metaliftd, at any moment. So the files are never
//! listed and then opened by name: a name looked at and opened later may by then
//! be another file, and the file it named moved one number up, out of the list
//! (`13653c3`: the forwarder lost records at a restart that way). They are opened
//! while walking from the live file toward the oldest, and told apart by the
//! opened descriptors' device and inode. A rotation during the walk moves every
//! file one number further on, so a file can be met twice (held once), never
//! skipped, and the walk's order stays the order they were written in.

use std::collections::VecDeque;
use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::rotation::rotated_path;

/// A file's identity while a descriptor holds it (its inode cannot be reused then).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileId {
    /// `st_dev`.
    pub dev: u64,
    /// `st_ino`.
    pub ino: u64,
}

impl FileId {
    pub(crate) fn of(meta: &std::fs::Metadata) -> FileId {
        FileId {
            dev: meta.dev(),
            ino: meta.ino(),
        }
    }
}

/// One file of the log, held open, with what its reader keeps about it.
#[derive(Debug)]
pub struct Held<T> {
    /// Which file this is, whatever it is called now.
    pub id: FileId,
    /// Its name when the log was last walked (for messages: names move).
    pub name: PathBuf,
    /// The descriptor: reading it reads this file even after renames.
    pub file: File,
    /// The reader's own state for this file (position, partial line, counts).
    pub state: T,
}

/// How a walk opens a name: [`File::open`], or in tests one that rotates the log
/// first, to put a rotation between looking at the log and opening a file.
pub(crate) type Opener<'a> = &'a mut dyn FnMut(&Path) -> io::Result<File>;

/// The log's files from the oldest one still wanted to the newest, each held open.
#[derive(Debug)]
pub struct Chain<T> {
    /// The live file's path; rotated files are `<log>.1` (newest) and up.
    log: PathBuf,
    /// The writer's `keep`, when known: no other numbers are walked (files past it
    /// are left over from a larger setting and never rotated away). `None` (a
    /// reader that does not know the setting): every number the directory shows.
    keep: Option<usize>,
    /// Oldest first; the back one is the newest held (the live file, normally).
    held: VecDeque<Held<T>>,
}

impl<T: Default> Chain<T> {
    /// Holds every file of the log at `log` that exists now, oldest first (none
    /// when there is no log yet: a later [`rescan`](Chain::rescan) finds it).
    pub fn open(log: &Path, keep: Option<usize>) -> io::Result<Chain<T>> {
        Chain::open_with(log, keep, &mut |p| File::open(p))
    }

    /// [`open`](Chain::open), opening each name with `open`.
    pub(crate) fn open_with(
        log: &Path,
        keep: Option<usize>,
        open: Opener<'_>,
    ) -> io::Result<Chain<T>> {
        let mut chain = Chain {
            log: log.to_owned(),
            keep,
            held: VecDeque::new(),
        };
        chain.held = chain.walk(None, open)?.into();
        Ok(chain)
    }

    /// Catches up with rotations: holds the files created since (newer than the
    /// newest held), and gives back the held files that were rotated away
    /// (deleted) meanwhile, oldest first, still open: whether what is left in them
    /// is read or counted as lost is the caller's choice.
    ///
    /// A rotation always puts a new file at the live path, so while the live path
    /// still names the newest held file nothing changed, and this is one `stat`.
    pub fn rescan(&mut self) -> io::Result<Vec<Held<T>>> {
        if let Some(newest) = self.held.back() {
            if live_id(&self.log)? == Some(newest.id) {
                return Ok(Vec::new());
            }
        }
        let oldest = self.held.front().map(|h| h.id);
        let walked = self.walk(oldest, &mut |p| File::open(p))?;
        let mut gone = Vec::new();
        while let Some(front) = self.held.front() {
            if walked.iter().any(|w| w.id == front.id) {
                break;
            }
            gone.extend(self.held.pop_front());
        }
        for held in &mut self.held {
            if let Some(w) = walked.iter().find(|w| w.id == held.id) {
                held.name.clone_from(&w.name);
            }
        }
        // Only files newer than the newest held one: the older ones are held.
        let from = match self.held.back() {
            None => 0,
            Some(newest) => match walked.iter().position(|w| w.id == newest.id) {
                Some(i) => i + 1,
                // The newest held file is gone while an older one is not: nothing
                // newer can be told apart; look again next time.
                None => return Ok(gone),
            },
        };
        self.held.extend(walked.into_iter().skip(from));
        Ok(gone)
    }

    /// The files that exist now, oldest first, each opened as it is met.
    ///
    /// Walked from the live file toward the oldest (see the module doc), up to
    /// `keep`, or without it up to the highest number listed and on while files
    /// exist (a rotation during the walk moves the oldest one past the listing).
    /// Stops early at `stop_at` (the oldest held file): older ones are not wanted.
    fn walk(&self, stop_at: Option<FileId>, open: Opener<'_>) -> io::Result<Vec<Held<T>>> {
        let last = match self.keep {
            Some(keep) => keep,
            None => rotated_numbers(&self.log)?.into_iter().max().unwrap_or(0),
        };
        let mut newest_first: Vec<Held<T>> = Vec::new();
        for n in 0.. {
            if self.keep.is_some() && n > last {
                break;
            }
            let name = if n == 0 {
                self.log.clone()
            } else {
                rotated_path(&self.log, n)
            };
            let file = match open(&name) {
                Ok(file) => file,
                Err(e) if e.kind() == io::ErrorKind::NotFound && n >= last => break,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => return Err(with_name(&name, e)),
            };
            let id = FileId::of(&file.metadata().map_err(|e| with_name(&name, e))?);
            if let Some(met) = newest_first.iter_mut().find(|h| h.id == id) {
                // Met again one number further on: a rotation during the walk.
                met.name = name;
                continue;
            }
            newest_first.push(Held {
                id,
                name,
                file,
                state: T::default(),
            });
            if Some(id) == stop_at {
                break;
            }
        }
        newest_first.reverse();
        Ok(newest_first)
    }
}

impl<T> Chain<T> {
    /// How many files are held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.held.len()
    }

    /// Whether no file is held (no log yet, or every held file rotated away).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// The oldest held file: where reading has got to.
    #[must_use]
    pub fn front(&self) -> Option<&Held<T>> {
        self.held.front()
    }

    /// The oldest held file, to read.
    pub fn front_mut(&mut self) -> Option<&mut Held<T>> {
        self.held.front_mut()
    }

    /// The newest held file (the live one, normally), to read.
    pub fn back_mut(&mut self) -> Option<&mut Held<T>> {
        self.held.back_mut()
    }

    /// Lets go of the oldest held file (read to its end, or not wanted).
    pub fn pop_front(&mut self) -> Option<Held<T>> {
        self.held.pop_front()
    }

    /// Every held file, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = &Held<T>> {
        self.held.iter()
    }

    /// Every held file, oldest first.
    pub fn iter_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut Held<T>> {
        self.held.iter_mut()
    }

    /// Lets go of the files older than `id`; `false` (and nothing dropped) when
    /// `id` is not held.
    pub fn start_at(&mut self, id: FileId) -> bool {
        let Some(i) = self.held.iter().position(|h| h.id == id) else {
            return false;
        };
        self.held.drain(..i);
        true
    }
}

/// The log's files in the order they were written: the highest-numbered rotated
/// file first, the live file last. Only names that exist are listed, gaps skipped.
/// A listing for display (`metalift doctor`): by the time a name is opened it may
/// be another file; readers use a [`Chain`].
pub fn log_files(path: &Path) -> io::Result<Vec<PathBuf>> {
    let mut numbers = rotated_numbers(path)?;
    numbers.sort_unstable_by(|a, b| b.cmp(a));
    let mut files: Vec<PathBuf> = numbers.into_iter().map(|n| rotated_path(path, n)).collect();
    if path.exists() {
        files.push(path.to_owned());
    }
    Ok(files)
}

/// The numbers `n` of the `<path>.n` files in the log's directory, unordered.
fn rotated_numbers(path: &Path) -> io::Result<Vec<usize>> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_owned(),
        _ => PathBuf::from("."),
    };
    let Some(base) = path.file_name().and_then(|n| n.to_str()) else {
        return Ok(Vec::new());
    };
    let entries = match std::fs::read_dir(&dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(with_name(&dir, e)),
    };
    let mut numbers = Vec::new();
    for entry in entries {
        let name = entry.map_err(|e| with_name(&dir, e))?.file_name();
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
    Ok(numbers)
}

/// The identity the live path names now, `None` while it does not exist.
fn live_id(path: &Path) -> io::Result<Option<FileId>> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(Some(FileId::of(&meta))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(with_name(path, e)),
    }
}

/// `e`, saying which file it is about (the kind kept for callers that match on it).
fn with_name(path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}
