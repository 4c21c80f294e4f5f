//! What `metalift audit --log` reads: any number of paths, each a file or a
//! directory, as metaliftd or a collector left them.
//!
//! - A file is a log: its rotated siblings are read first (`PATH.N`, highest N
//!   first, and compressed ones `PATH.N.gz`/`.bz2`/`.zst` as logrotate and
//!   newsyslog leave them), then the file itself. A compressed file given by name is
//!   read alone, decompressed.
//! - A directory is walked in a stable order (by name, each rotation family oldest
//!   first, subdirectories in place); hidden entries, the daemon's own state beside
//!   the log (`*.lock`, `*.cursor`, `*.tmp`, `policies/`) are skipped.
//! - An export bundle (a directory with `manifest.json` and `audit.jsonl`, written
//!   by `metalift audit export`) is its `audit.jsonl`.
//!
//! Every line goes through the one line parser ([`metalift_daemon::audit::line`]),
//! which takes bare JSON and the syslog headers collectors keep. Whether a file is
//! compressed is decided by its name and checked by its content: a `.gz` that is
//! not gzip is an error naming the file, never read as text.

use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

use metalift_daemon::audit::chain::Chain;
use metalift_daemon::audit::reader::Item;

/// One line read, before it is parsed (so a reader can skip what cannot match
/// without parsing it), or what made it no line of text.
#[derive(Debug)]
pub enum Line<'a> {
    /// A line of text, without its newline.
    Text {
        /// The line.
        text: &'a str,
        /// The file it is in.
        file: &'a Path,
        /// Its 1-based number in that file.
        number: usize,
    },
    /// Not a line of text: not UTF-8, or the last line without its newline (rare:
    /// boxed so every line read is not the size of an item).
    Corrupt(Box<Item>),
}

/// Where lines go as they are read.
pub type LineSink<'a> = &'a mut dyn FnMut(Line<'_>) -> io::Result<()>;

/// One thing to read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Input {
    /// A log file with its uncompressed rotated siblings (`PATH.N`, oldest first).
    Log(PathBuf),
    /// One file read alone (a compressed rotation, or a file found in a directory).
    File(PathBuf),
}

impl Input {
    /// The path named in errors.
    #[must_use]
    pub fn path(&self) -> &Path {
        match self {
            Input::Log(p) | Input::File(p) => p,
        }
    }
}

/// How a file's bytes are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    None,
    Gzip,
    Bzip2,
    Zstd,
}

impl Compression {
    fn of(path: &Path) -> Compression {
        match path.extension().and_then(|e| e.to_str()) {
            Some("gz") => Compression::Gzip,
            Some("bz2") => Compression::Bzip2,
            Some("zst") => Compression::Zstd,
            _ => Compression::None,
        }
    }

    /// The magic number a file of this kind starts with.
    fn magic(self) -> &'static [u8] {
        match self {
            Compression::None => b"",
            Compression::Gzip => &[0x1f, 0x8b],
            Compression::Bzip2 => b"BZh",
            Compression::Zstd => &[0x28, 0xb5, 0x2f, 0xfd],
        }
    }
}

/// The inputs `paths` name, in the order they are read. A path that does not
/// exist or cannot be listed is an error naming it.
pub fn expand(paths: &[PathBuf]) -> io::Result<Vec<Input>> {
    let mut inputs = Vec::new();
    for path in paths {
        let meta = std::fs::metadata(path).map_err(|e| with_path(path, e))?;
        if meta.is_dir() {
            walk(path, &mut inputs)?;
        } else if Compression::of(path) != Compression::None {
            inputs.push(Input::File(path.clone()));
        } else {
            for sibling in compressed_siblings(path)? {
                inputs.push(Input::File(sibling));
            }
            inputs.push(Input::Log(path.clone()));
        }
    }
    Ok(inputs)
}

/// Whether `dir` is an export bundle: its records are `audit.jsonl`.
#[must_use]
pub fn is_bundle(dir: &Path) -> bool {
    dir.join("manifest.json").is_file() && dir.join("audit.jsonl").is_file()
}

fn walk(dir: &Path, inputs: &mut Vec<Input>) -> io::Result<()> {
    if is_bundle(dir) {
        inputs.push(Input::File(dir.join("audit.jsonl")));
        return Ok(());
    }
    let mut entries = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| with_path(dir, e))? {
        let entry = entry.map_err(|e| with_path(dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else {
            entries.push((order_key(""), entry.path()));
            continue;
        };
        let skipped = name.starts_with('.')
            || name == "policies"
            || [".lock", ".cursor", ".tmp"]
                .iter()
                .any(|s| name.ends_with(s));
        if !skipped {
            entries.push((order_key(name), entry.path()));
        }
    }
    entries.sort();
    for (_, path) in entries {
        let meta = std::fs::metadata(&path).map_err(|e| with_path(&path, e))?;
        if meta.is_dir() {
            walk(&path, inputs)?;
        } else if meta.is_file() {
            inputs.push(Input::File(path));
        }
    }
    Ok(())
}

/// Sorts a directory's names so each rotation family is read oldest first:
/// `a.log.2.gz`, `a.log.1`, `a.log`, then `b.log`, ...
fn order_key(name: &str) -> (String, u8, std::cmp::Reverse<u64>, String) {
    let plain = ["gz", "bz2", "zst"]
        .iter()
        .find_map(|ext| name.strip_suffix(&format!(".{ext}")))
        .unwrap_or(name);
    match plain.rsplit_once('.') {
        Some((base, n)) if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) => (
            base.to_owned(),
            0,
            std::cmp::Reverse(n.parse().unwrap_or(u64::MAX)),
            name.to_owned(),
        ),
        _ => (plain.to_owned(), 1, std::cmp::Reverse(0), name.to_owned()),
    }
}

/// `PATH.N.gz` (and `.bz2`, `.zst`) beside the log, highest N (oldest) first.
fn compressed_siblings(path: &Path) -> io::Result<Vec<PathBuf>> {
    let (Some(dir), Some(base)) = (path.parent(), path.file_name().and_then(|n| n.to_str())) else {
        return Ok(Vec::new());
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let mut found = Vec::new();
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => return Err(with_path(dir, e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| with_path(dir, e))?;
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix(base))
            .and_then(|n| n.strip_prefix('.'))
        else {
            continue;
        };
        let Some((n, ext)) = rest.split_once('.') else {
            continue;
        };
        if ["gz", "bz2", "zst"].contains(&ext)
            && !n.is_empty()
            && n.bytes().all(|b| b.is_ascii_digit())
        {
            found.push((n.parse::<u64>().unwrap_or(u64::MAX), entry.path()));
        }
    }
    found.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    Ok(found.into_iter().map(|(_, p)| p).collect())
}

/// Reads one input to its end into `sink`.
pub fn read(input: &Input, sink: LineSink<'_>) -> io::Result<()> {
    match input {
        Input::Log(path) => {
            // The one follower's walk (`audit::chain`): every file opened while
            // walking from the live file toward the oldest, held by descriptor, so
            // a rotation meanwhile neither skips nor repeats a file.
            let mut chain = Chain::<()>::open(path, None).map_err(|e| with_path(path, e))?;
            while let Some(held) = chain.pop_front() {
                read_file(&held.name, held.file, sink)?;
            }
            Ok(())
        }
        Input::File(path) => {
            let file = File::open(path).map_err(|e| with_path(path, e))?;
            read_file(path, file, sink)
        }
    }
}

fn read_file(path: &Path, mut file: File, sink: LineSink<'_>) -> io::Result<()> {
    let compression = Compression::of(path);
    let magic = compression.magic();
    let mut head = vec![0u8; magic.len()];
    let got = read_up_to(&mut file, &mut head).map_err(|e| with_path(path, e))?;
    if head[..got] != *magic {
        return Err(with_path(
            path,
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("named {compression:?} but its content is not (no magic number)"),
            ),
        ));
    }
    let whole = io::Cursor::new(head).chain(file);
    let decoded: Box<dyn Read> = match compression {
        Compression::None => Box::new(whole),
        Compression::Gzip => Box::new(flate2::read::MultiGzDecoder::new(whole)),
        Compression::Bzip2 => Box::new(bzip2::read::MultiBzDecoder::new(whole)),
        Compression::Zstd => Box::new(
            ruzstd::decoding::StreamingDecoder::new(whole)
                .map_err(|e| with_path(path, io::Error::new(io::ErrorKind::InvalidData, e)))?,
        ),
    };
    read_lines(decoded, path, sink).map_err(|e| with_path(path, e))
}

fn read_up_to(file: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match file.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// Bytes read at a time.
const CHUNK: usize = 1 << 20;

/// Each line of `reader` into `sink`; an unfinished last line is corrupt. Lines are
/// found with `memchr` in large chunks and passed without a copy (a fleet's day is
/// gigabytes: this loop is most of a skipped record's cost).
fn read_lines(mut reader: impl Read, name: &Path, sink: LineSink<'_>) -> io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    let mut filled = 0usize;
    let mut number = 0usize;
    loop {
        if filled == buf.len() {
            // One line longer than the buffer: let it grow.
            buf.resize(buf.len() * 2, 0);
        }
        let n = match reader.read(&mut buf[filled..]) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        let end = filled + n;
        let mut start = 0usize;
        for newline in memchr::memchr_iter(b'\n', &buf[filled..end]) {
            let at = filled + newline;
            number += 1;
            sink(line_of(&buf[start..at], name, number))?;
            start = at + 1;
        }
        if n == 0 {
            if start < end {
                number += 1;
                sink(Line::Corrupt(Box::new(Item::Corrupt {
                    file: name.to_owned(),
                    line: number,
                    error: "incomplete last line (no newline)".into(),
                })))?;
            }
            return Ok(());
        }
        buf.copy_within(start..end, 0);
        filled = end - start;
    }
}

fn line_of<'a>(raw: &'a [u8], name: &'a Path, number: usize) -> Line<'a> {
    match std::str::from_utf8(raw) {
        Ok(text) => Line::Text {
            text,
            file: name,
            number,
        },
        Err(e) => Line::Corrupt(Box::new(Item::Corrupt {
            file: name.to_owned(),
            line: number,
            error: format!("not UTF-8: {e}"),
        })),
    }
}

/// `e` with the file it is about, unless it names one already.
fn with_path(path: &Path, e: io::Error) -> io::Error {
    if e.to_string().contains(&*path.to_string_lossy()) {
        return e;
    }
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_reads_each_rotation_family_oldest_first() {
        let mut names = vec!["b.log", "a.log", "a.log.1", "a.log.10.gz", "a.log.2.bz2"];
        names.sort_by_key(|n| order_key(n));
        assert_eq!(
            names,
            ["a.log.10.gz", "a.log.2.bz2", "a.log.1", "a.log", "b.log"]
        );
    }
}
