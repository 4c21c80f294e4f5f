//! The policy archive: the text of every policy metaliftd made live, by its hash, so
//! `metalift explain --live` and `--decision ID` can explain with the policy that
//! actually decided, not with whatever is on disk now.
//!
//! Layout: `<dir of the audit log>/policies/<sha256>.json`, each a JSON array of
//! `{"name": file name, "contents": text}` in load order (main file first, then
//! `policy.d/` files by name). Names are file names, not paths: the policy hash is
//! over contents and drop-in file names only, so the archived sources hash to the
//! file's own name.
//!
//! - Written atomically (a temp file in the same directory, then `rename`), so a
//!   reader never sees half an entry.
//! - Bounded: after each store, only the newest [`KEEP`] entries (by modification
//!   time) are kept. Storing a hash that is already there only refreshes its time.
//! - Readable by whoever can read the audit log's directory (mode 0644, directory
//!   0755): a policy is no secret from those who can read every decision made
//!   under it. The daemon's umask may narrow this further.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

/// How many archived policies are kept.
pub const KEEP: usize = 50;

/// One archived file.
#[derive(Debug, Serialize, Deserialize)]
struct Entry {
    name: String,
    contents: String,
}

/// The archive directory for the audit log at `audit_log`:
/// `<its directory>/policies`.
#[must_use]
pub fn dir_for(audit_log: &Path) -> PathBuf {
    audit_log
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or_else(|| Path::new("."))
        .join("policies")
}

/// A hash as a file name: exactly 64 lowercase hex digits, or refused (the hash
/// may come from a log line or a daemon; it must not name another path).
fn entry_path(dir: &Path, sha256: &str) -> io::Result<PathBuf> {
    if sha256.len() != 64
        || !sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("`{sha256}` is not a sha256 (64 lowercase hex digits)"),
        ));
    }
    Ok(dir.join(format!("{sha256}.json")))
}

/// Stores `sources` (`(file name, contents)`, load order) under `sha256` in `dir`,
/// creating `dir` if needed, then prunes to the newest [`KEEP`].
pub fn store(dir: &Path, sha256: &str, sources: &[(String, String)]) -> io::Result<()> {
    let path = entry_path(dir, sha256)?;
    fs::create_dir_all(dir)?;
    if path.exists() {
        // Same hash, same contents: only mark it recent, so pruning keeps it.
        let file = fs::OpenOptions::new().append(true).open(&path)?;
        file.set_modified(SystemTime::now())?;
    } else {
        let entries: Vec<Entry> = sources
            .iter()
            .map(|(name, contents)| Entry {
                name: name.clone(),
                contents: contents.clone(),
            })
            .collect();
        let json = serde_json::to_vec(&entries).map_err(io::Error::other)?;
        let tmp = dir.join(format!(".{sha256}.{}.tmp", std::process::id()));
        let written = (|| {
            let mut f = fs::File::create(&tmp)?;
            set_readable(&f)?;
            // No fsync: this runs on the reload path, and a torn entry after a
            // crash only makes `explain` say the text is unreadable.
            f.write_all(&json)?;
            fs::rename(&tmp, &path)
        })();
        if written.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        written?;
    }
    prune(dir, KEEP)
}

#[cfg(unix)]
fn set_readable(f: &fs::File) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    f.set_permissions(fs::Permissions::from_mode(0o644))
}

#[cfg(not(unix))]
fn set_readable(_f: &fs::File) -> io::Result<()> {
    Ok(())
}

/// The sources archived under `sha256`, `None` when the archive does not hold it.
pub fn load(dir: &Path, sha256: &str) -> io::Result<Option<Vec<(String, String)>>> {
    let path = entry_path(dir, sha256)?;
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let entries: Vec<Entry> = serde_json::from_slice(&bytes).map_err(|e| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("{}: {e}", path.display()),
        )
    })?;
    Ok(Some(
        entries.into_iter().map(|e| (e.name, e.contents)).collect(),
    ))
}

/// Copies the entry for `sha256` from the archive `from` into the archive `to`
/// (created if missing), as it is: an export bundle's `policies/` is an archive
/// of this same layout, so `explain --decision` reads it with [`load`].
/// `Ok(false)` when `from` has no such entry. Nothing is pruned in `to`.
pub fn copy_entry(from: &Path, to: &Path, sha256: &str) -> io::Result<bool> {
    let source = entry_path(from, sha256)?;
    let bytes = match fs::read(&source) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    fs::create_dir_all(to)?;
    fs::write(entry_path(to, sha256)?, bytes)?;
    Ok(true)
}

/// Removes all but the newest `keep` entries of `dir`.
fn prune(dir: &Path, keep: usize) -> io::Result<()> {
    let mut entries = Vec::new();
    for entry in fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        if name.len() != 64 + ".json".len() || !name.ends_with(".json") {
            continue;
        }
        let modified = entry
            .metadata()
            .and_then(|m| m.modified())
            .unwrap_or(SystemTime::UNIX_EPOCH);
        entries.push((modified, entry.path()));
    }
    if entries.len() <= keep {
        return Ok(());
    }
    entries.sort_by_key(|e| std::cmp::Reverse(e.0));
    for (_, path) in entries.into_iter().skip(keep) {
        match fs::remove_file(&path) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
    }
    Ok(())
}

/// The archive's view of loaded sources: `(file name, contents)` in load order.
#[must_use]
pub fn named(sources: &[metalift_policy::Source]) -> Vec<(String, String)> {
    sources
        .iter()
        .map(|s| {
            (
                metalift_policy::file_name(&s.name).to_owned(),
                s.text.clone(),
            )
        })
        .collect()
}

/// Archives a policy the daemon just loaded, keyed by its hash, beside `audit_log`.
/// What the policy store calls on every successful load.
pub fn store_loaded(audit_log: &Path, loaded: &metalift_policy::Loaded) -> io::Result<()> {
    store(
        &dir_for(audit_log),
        loaded.policy.sha256_hex(),
        &named(&loaded.sources),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(n: u8) -> String {
        format!("{n:064x}")
    }

    #[test]
    fn a_stored_policy_loads_back_in_order_and_a_missing_one_is_none() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sources = vec![
            ("policy.toml".to_owned(), "version = 1\n".to_owned()),
            ("10-a.toml".to_owned(), "# a\n".to_owned()),
        ];
        store(dir.path(), &sha(1), &sources).expect("store");
        assert_eq!(load(dir.path(), &sha(1)).expect("load"), Some(sources));
        assert_eq!(load(dir.path(), &sha(2)).expect("load"), None);
        // No temp file is left behind.
        let names: Vec<_> = fs::read_dir(dir.path())
            .expect("ls")
            .map(|e| e.expect("entry").file_name())
            .collect();
        assert_eq!(names.len(), 1, "{names:?}");
    }

    #[test]
    fn a_hash_that_is_not_64_hex_digits_names_no_file() {
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(store(dir.path(), "../../etc/passwd", &[]).is_err());
        assert!(load(dir.path(), "ABC").is_err());
        assert!(load(dir.path(), &"a".repeat(63)).is_err());
        assert!(load(dir.path(), &"a".repeat(65)).is_err());
        assert!(load(dir.path(), &"A".repeat(64)).is_err());
        assert_eq!(
            load(dir.path(), &"a".repeat(64)).expect("a valid name"),
            None
        );
    }

    #[test]
    fn the_archive_keeps_only_the_newest_entries() {
        let dir = tempfile::tempdir().expect("tempdir");
        for n in 0..(KEEP as u8 + 5) {
            store(
                dir.path(),
                &sha(n),
                &[("policy.toml".into(), format!("{n}"))],
            )
            .expect("store");
            // Distinct modification times, oldest first.
            let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000 + u64::from(n));
            fs::File::options()
                .append(true)
                .open(dir.path().join(format!("{}.json", sha(n))))
                .and_then(|f| f.set_modified(t))
                .expect("touch");
        }
        prune(dir.path(), KEEP).expect("prune");
        assert_eq!(fs::read_dir(dir.path()).expect("ls").count(), KEEP);
        assert_eq!(load(dir.path(), &sha(0)).expect("load"), None);
        assert!(load(dir.path(), &sha(KEEP as u8 + 4))
            .expect("load")
            .is_some());
    }

    #[test]
    fn the_archive_sits_beside_the_audit_log() {
        assert_eq!(
            dir_for(Path::new("/var/log/metalift/audit.jsonl")),
            Path::new("/var/log/metalift/policies")
        );
        assert_eq!(dir_for(Path::new("audit.jsonl")), Path::new("./policies"));
    }
}
