//! Reading a policy from disk: the main file plus `policy.d/*.toml` in name order,
//! each refused unless root owns it and only root can write it.
//!
//! This is the crate's only I/O, and it reads only the files it is asked to load.
//! In `policy.d/`, only regular files named `*.toml` whose names do not start with
//! `.` are read (editor backups and lock files are skipped).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use crate::diagnostic::{Diagnostic, Severity, Source};
use crate::policy::{compile_sources, Loaded};

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
    #[error("{}: refused: {reason} (pass the development override to accept it)", path.display())]
    Permission {
        /// The offending file or directory.
        path: PathBuf,
        /// What is wrong, e.g. "owned by uid 1000, not root".
        reason: String,
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

/// Reads `policy_path` and `<its directory>/policy.d/*.toml` (in file-name order),
/// checks their ownership unless `opts` says otherwise, and compiles them.
pub fn load(policy_path: &Path, opts: &LoadOptions) -> Result<Loaded, LoadError> {
    let io_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source: io::Error| LoadError::Io { path, source }
    };
    let meta = match fs::metadata(policy_path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Err(LoadError::NotFound {
                path: policy_path.to_path_buf(),
            })
        }
        other => other.map_err(io_err(policy_path))?,
    };
    check_owner(policy_path, &meta, opts)?;
    let mut files = vec![policy_path.to_path_buf()];

    let dir = policy_path
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("policy.d");
    match fs::metadata(&dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
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
        Ok(meta) => {
            check_owner(&dir, &meta, opts)?;
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
                check_owner(&path, &meta, opts)?;
                entries.push(path);
            }
            entries.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
            files.extend(entries);
        }
    }

    let mut sources = Vec::with_capacity(files.len());
    let mut encoding_errors = Vec::new();
    for path in &files {
        let bytes = fs::read(path).map_err(io_err(path))?;
        let name = path.display().to_string();
        match String::from_utf8(bytes) {
            Ok(text) => sources.push(Source { name, text }),
            Err(e) => {
                let valid = e.utf8_error().valid_up_to();
                let text = String::from_utf8_lossy(e.as_bytes()).into_owned();
                let source = Source { name, text };
                encoding_errors.push(Diagnostic::at(
                    Severity::Error,
                    &source,
                    valid..valid + 1,
                    "file is not valid UTF-8",
                ));
                sources.push(source);
            }
        }
    }
    if !encoding_errors.is_empty() {
        return Err(LoadError::Invalid {
            diagnostics: encoding_errors,
            sources,
        });
    }
    compile_sources(sources)
}

#[cfg(unix)]
fn check_owner(path: &Path, meta: &fs::Metadata, opts: &LoadOptions) -> Result<(), LoadError> {
    use std::os::unix::fs::MetadataExt;
    if opts.allow_insecure_owner {
        return Ok(());
    }
    let refuse = |reason: String| {
        Err(LoadError::Permission {
            path: path.to_path_buf(),
            reason,
        })
    };
    if meta.uid() != 0 {
        return refuse(format!("owned by uid {}, not root", meta.uid()));
    }
    let mode = meta.mode() & 0o7777;
    if mode & 0o022 != 0 {
        return refuse(format!("writable by group or other (mode {mode:04o})"));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_owner(_path: &Path, _meta: &fs::Metadata, _opts: &LoadOptions) -> Result<(), LoadError> {
    Ok(())
}
