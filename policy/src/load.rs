//! Reading a policy from disk: the main file plus `policy.d/*.toml` in name order,
//! each refused unless root owns it and only root can write it.
//!
//! This is the crate's only I/O, and it reads only the files it is asked to load.
//! In `policy.d/`, only regular files named `*.toml` whose names do not start with
//! `.` are read (editor backups and lock files are skipped).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::chip::CompileOptions;
use crate::diagnostic::{Diagnostic, Severity, Source};
use crate::policy::{compile_sources_with, Loaded};

/// The most bytes a policy may hold, `policy.toml` and every `policy.d/` drop-in
/// together, unless metaliftd's `--max-policy-bytes` says otherwise: 4 MiB, some
/// 40,000 rules, four times the largest fleet policy the benchmarks load. The
/// limit is on the whole policy, not per file, because what it bounds is the
/// daemon's memory and reload time, which grow with the total (a 50 MB policy
/// took metaliftd from 11 to 545 MB). Checked on the files' sizes before reading,
/// and again while reading (a file growing meanwhile).
pub const DEFAULT_MAX_POLICY_BYTES: u64 = 4 * 1024 * 1024;

/// How strictly [`load`] checks file ownership.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LoadOptions {
    /// Accept files not owned by root or writable by group/other. A development
    /// override only, off by default and never implied.
    pub allow_insecure_owner: bool,
}

/// Why a policy could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The main policy file does not exist: the daemon runs with no rules (all stock).
    #[error("{}: no such policy file", path.display())]
    NotFound {
        /// The main policy file's path.
        path: PathBuf,
    },
    /// A file or `policy.d/` could not be read.
    #[error("{}: {source}", path.display())]
    Io {
        /// What could not be read.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A file or `policy.d/` is not owned by root or is writable by group/other.
    #[error("{}: refused: {reason}: metaliftd accepts only files owned by root and not writable by group or other (fix: `sudo chown root {} && sudo chmod go-w {}`; for development only, metaliftd --allow-insecure-owner)", path.display(), path.display(), path.display())]
    Permission {
        /// The offending file or directory.
        path: PathBuf,
        /// What is wrong, e.g. "owned by uid 1000, not root".
        reason: String,
    },
    /// The policy (all its files together) is larger than the limit; nothing of it
    /// was parsed.
    #[error("{}: the policy is {bytes} bytes (policy.toml and policy.d/*.toml together), over the {limit}-byte limit: refused unread (metaliftd --max-policy-bytes sets the limit)", path.display())]
    TooLarge {
        /// The main policy file (or the candidate file checked).
        path: PathBuf,
        /// Its size with every drop-in, at least (reading stops past the limit).
        bytes: u64,
        /// The limit.
        limit: u64,
    },
    /// The policy has errors; every error and warning found is listed.
    #[error("{}", invalid_summary(diagnostics))]
    Invalid {
        /// Every problem, errors and warnings, in file order.
        diagnostics: Vec<Diagnostic>,
        /// The texts they point into, for [`Diagnostic::render`].
        sources: Vec<Source>,
    },
}

fn invalid_summary(diagnostics: &[Diagnostic]) -> String {
    let errors = diagnostics.iter().filter(|d| d.is_error()).count();
    match diagnostics.iter().find(|d| d.is_error()) {
        Some(first) if errors == 2 => format!("{first} (and 1 more error)"),
        Some(first) if errors > 2 => format!("{first} (and {} more errors)", errors - 1),
        Some(first) => first.to_string(),
        None => "invalid policy".to_owned(),
    }
}

/// A file (or `policy.d/`) metaliftd would refuse for its owner or mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PermissionProblem {
    /// The offending file or directory.
    pub path: PathBuf,
    /// What is wrong, e.g. "owned by uid 1000, not root".
    pub reason: String,
}

/// The policy's files as read from disk, before compiling: what [`load`] compiles,
/// and what `metalift validate` checks without refusing a candidate for its owner.
#[derive(Debug, Clone)]
pub struct ReadPolicy {
    /// Main file first, then `policy.d/*.toml` in file-name order.
    pub sources: Vec<Source>,
    /// Every ownership or mode problem: metaliftd refuses the policy if there is one.
    pub permission_problems: Vec<PermissionProblem>,
    /// Files that are not valid UTF-8 (their text is decoded lossily in `sources`).
    pub encoding_errors: Vec<Diagnostic>,
}

/// Reads `policy_path` and `<its directory>/policy.d/*.toml` (in file-name order),
/// checks their ownership unless `opts` says otherwise, and compiles them.
pub fn load(policy_path: &Path, opts: &LoadOptions) -> Result<Loaded, LoadError> {
    load_with(policy_path, opts, &CompileOptions::default())
}

/// As [`load`], resolving `apple_family_max = "host"` with `compile`.
pub fn load_with(
    policy_path: &Path,
    opts: &LoadOptions,
    compile: &CompileOptions,
) -> Result<Loaded, LoadError> {
    load_within(policy_path, opts, compile, DEFAULT_MAX_POLICY_BYTES)
}

/// As [`load_with`], refusing a policy larger than `max_bytes` (all files together)
/// with [`LoadError::TooLarge`] before parsing any of it.
pub fn load_within(
    policy_path: &Path,
    opts: &LoadOptions,
    compile: &CompileOptions,
    max_bytes: u64,
) -> Result<Loaded, LoadError> {
    let read = read_policy_within(policy_path, max_bytes)?;
    if !opts.allow_insecure_owner {
        if let Some(p) = read.permission_problems.into_iter().next() {
            return Err(LoadError::Permission {
                path: p.path,
                reason: p.reason,
            });
        }
    }
    if !read.encoding_errors.is_empty() {
        return Err(LoadError::Invalid {
            diagnostics: read.encoding_errors,
            sources: read.sources,
        });
    }
    compile_sources_with(read.sources, compile)
}

/// Reads the main file and its `policy.d/` without judging them: ownership and mode
/// problems are listed, not refused (see [`load`] for the refusing version).
pub fn read_policy(policy_path: &Path) -> Result<ReadPolicy, LoadError> {
    read_policy_within(policy_path, DEFAULT_MAX_POLICY_BYTES)
}

/// The files of the policy at `policy_path` (main file first, then `policy.d/`
/// in name order) and their total size, without reading them: what `metalift
/// status` compares against the daemon's limit instead of parsing a large file.
pub fn policy_files(policy_path: &Path) -> Result<(Vec<PathBuf>, u64), LoadError> {
    let meta = match fs::metadata(policy_path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LoadError::NotFound {
                path: policy_path.to_path_buf(),
            })
        }
        other => other.map_err(|source| LoadError::Io {
            path: policy_path.to_path_buf(),
            source,
        })?,
    };
    let mut total = meta.len();
    let mut files = vec![policy_path.to_path_buf()];
    for path in drop_in_files(policy_path, &mut Vec::new())? {
        total = total.saturating_add(fs::metadata(&path).map(|m| m.len()).unwrap_or(0));
        files.push(path);
    }
    Ok((files, total))
}

/// As [`read_policy`], refusing a policy larger than `max_bytes` (all files together).
pub fn read_policy_within(policy_path: &Path, max_bytes: u64) -> Result<ReadPolicy, LoadError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| LoadError::Io { path, source }
    };
    let mut problems = Vec::new();
    let meta = match fs::metadata(policy_path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LoadError::NotFound {
                path: policy_path.to_path_buf(),
            })
        }
        other => other.map_err(io_err(policy_path))?,
    };
    problems.extend(owner_problem(policy_path, &meta));
    let mut files = vec![policy_path.to_path_buf()];
    files.extend(drop_in_files(policy_path, &mut problems)?);
    let too_large = |bytes| LoadError::TooLarge {
        path: policy_path.to_path_buf(),
        bytes,
        limit: max_bytes,
    };
    let sizes: u64 = files
        .iter()
        .map(|f| fs::metadata(f).map(|m| m.len()).unwrap_or(0))
        .fold(0, u64::saturating_add);
    if sizes > max_bytes {
        return Err(too_large(sizes));
    }

    let mut sources = Vec::with_capacity(files.len());
    let mut encoding_errors = Vec::new();
    let mut total = 0u64;
    for path in &files {
        let (source, error) = read_source_within(path, max_bytes.saturating_sub(total))
            .map_err(|e| e.unwrap_or_else(|read| too_large(total + read)))?;
        total = total.saturating_add(source.text.len() as u64);
        sources.push(source);
        encoding_errors.extend(error);
    }
    Ok(ReadPolicy {
        sources,
        permission_problems: problems,
        encoding_errors,
    })
}

/// Reads one policy file (say, a candidate drop-in) under its display path, with its
/// ownership problem if any, and a diagnostic if it is not UTF-8; within the
/// compiled default limit (see [`read_file_within`] for the daemon's).
pub fn read_file(
    path: &Path,
) -> Result<(Source, Option<PermissionProblem>, Option<Diagnostic>), LoadError> {
    read_file_within(path, DEFAULT_MAX_POLICY_BYTES)
}

/// As [`read_file`], refusing a file larger than `max_bytes` (a daemon's
/// `--max-policy-bytes`, as its status reports it) before reading it.
pub fn read_file_within(
    path: &Path,
    max_bytes: u64,
) -> Result<(Source, Option<PermissionProblem>, Option<Diagnostic>), LoadError> {
    let meta = match fs::metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LoadError::NotFound {
                path: path.to_path_buf(),
            })
        }
        Err(source) => {
            return Err(LoadError::Io {
                path: path.to_path_buf(),
                source,
            })
        }
        Ok(m) => m,
    };
    let problem = owner_problem(path, &meta);
    if meta.len() > max_bytes {
        return Err(LoadError::TooLarge {
            path: path.to_path_buf(),
            bytes: meta.len(),
            limit: max_bytes,
        });
    }
    let (source, error) = read_source_within(path, max_bytes).map_err(|e| {
        e.unwrap_or_else(|bytes| LoadError::TooLarge {
            path: path.to_path_buf(),
            bytes,
            limit: max_bytes,
        })
    })?;
    Ok((source, problem, error))
}

/// The `policy.d/*.toml` files beside `policy_path`, in file-name order.
fn drop_in_files(
    policy_path: &Path,
    problems: &mut Vec<PermissionProblem>,
) -> Result<Vec<PathBuf>, LoadError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| LoadError::Io { path, source }
    };
    let dir = policy_path
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("policy.d");
    let meta = match fs::metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(LoadError::Io {
                path: dir,
                source: e,
            })
        }
        Ok(meta) if !meta.is_dir() => {
            return Err(LoadError::Io {
                path: dir,
                source: io::Error::other("policy.d is not a directory"),
            })
        }
        Ok(meta) => meta,
    };
    problems.extend(owner_problem(&dir, &meta));
    let mut entries = Vec::new();
    for entry in fs::read_dir(&dir).map_err(io_err(&dir))? {
        let entry = entry.map_err(io_err(&dir))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if name.starts_with('.') || !name.ends_with(".toml") {
            continue;
        }
        let path = entry.path();
        let meta = fs::metadata(&path).map_err(io_err(&path))?;
        if !meta.is_file() {
            continue;
        }
        problems.extend(owner_problem(&path, &meta));
        entries.push(path);
    }
    entries.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    Ok(entries)
}

/// Reads one file, at most `max_bytes` of it: `Err(Err(n))` when it holds more
/// (`n`: what was read, past the limit), `Err(Ok(e))` when it cannot be read.
fn read_source_within(
    path: &Path,
    max_bytes: u64,
) -> Result<(Source, Option<Diagnostic>), Result<LoadError, u64>> {
    use std::io::Read;
    let io = |source| {
        Ok(LoadError::Io {
            path: path.to_path_buf(),
            source,
        })
    };
    let mut bytes = Vec::new();
    fs::File::open(path)
        .and_then(|f| f.take(max_bytes.saturating_add(1)).read_to_end(&mut bytes))
        .map_err(io)?;
    if bytes.len() as u64 > max_bytes {
        return Err(Err(bytes.len() as u64));
    }
    let name = path.display().to_string();
    if let Some(what) = binary_content(&bytes) {
        let text = String::from_utf8_lossy(&bytes).into_owned();
        let source = Source { name, text };
        let d = Diagnostic::at(
            Severity::Error,
            &source,
            0..0,
            format!("not a policy file: {what}; a policy is TOML text"),
        );
        return Ok((source, Some(d)));
    }
    Ok(match String::from_utf8(bytes) {
        Ok(text) => (Source { name, text }, None),
        Err(e) => {
            let valid = e.utf8_error().valid_up_to();
            let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
            let source = Source { name, text };
            let d = Diagnostic::at(
                Severity::Error,
                &source,
                valid..valid + 1,
                "file is not valid UTF-8",
            );
            (source, Some(d))
        }
    })
}

/// What a file holding binary data is, described so the admin recognises it (the
/// wrong file given, an executable copied over the policy), or `None` for text. A
/// NUL byte never occurs in a TOML document (the spec forbids control characters
/// but tab in it), so one among the first bytes means binary.
fn binary_content(bytes: &[u8]) -> Option<String> {
    let head = bytes.get(..8192).unwrap_or(bytes);
    let nul = head.iter().position(|&b| b == 0)?;
    let kind = match bytes {
        [0x7f, b'E', b'L', b'F', ..] => "an ELF executable or library",
        [0xcf | 0xce, 0xfa, 0xed, 0xfe, ..] => "a Mach-O executable or library",
        [0xca, 0xfe, 0xba, 0xbe, ..] => "a universal (fat) Mach-O binary",
        [0x1f, 0x8b, ..] => "gzip-compressed data",
        [b'P', b'K', 3, 4, ..] => "a zip archive",
        [b'b', b'p', b'l', b'i', b's', b't', ..] => "a binary property list",
        _ => "binary data",
    };
    Some(format!(
        "it holds {kind} ({} bytes, a NUL byte at offset {nul})",
        bytes.len()
    ))
}

#[cfg(unix)]
fn owner_problem(path: &Path, meta: &fs::Metadata) -> Option<PermissionProblem> {
    use std::os::unix::fs::MetadataExt;
    let problem = |reason: String| {
        Some(PermissionProblem {
            path: path.to_path_buf(),
            reason,
        })
    };
    if meta.uid() != 0 {
        return problem(format!("owned by uid {}, not root", meta.uid()));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return problem(format!("writable by group or other (mode {mode:04o})"));
    }
    None
}

#[cfg(not(unix))]
fn owner_problem(_path: &Path, _meta: &fs::Metadata) -> Option<PermissionProblem> {
    None
}
