//! Writing the verification file beside the policy: whole or not at all. The new
//! line is added by writing the old contents and it to a temporary file in the
//! same directory, syncing it, and renaming it over the file (rename(2) is
//! atomic), so a verification cut short (`--timeout`, a kill, a full disk) never
//! leaves a half-written line for metaliftd to read.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use anyhow::Context;
use metalift_daemon::audit::verification::VerificationRecord;

/// `file` with `record` as one more line, replaced atomically; created 0644
/// (root's when root runs it, as the daemon requires).
pub(crate) fn append_atomically(file: &Path, record: &VerificationRecord) -> anyhow::Result<()> {
    let mut bytes = match std::fs::read(file) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(e) => return Err(e).with_context(|| format!("reading {}", file.display())),
    };
    if !bytes.is_empty() && !bytes.ends_with(b"\n") {
        // A line cut short by an older writer: end it, so ours stays whole.
        bytes.push(b'\n');
    }
    bytes.extend(serde_json::to_vec(record)?);
    bytes.push(b'\n');
    let name = file
        .file_name()
        .with_context(|| format!("{} has no file name", file.display()))?;
    let tmp = file.with_file_name(format!(
        ".{}.tmp-{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&tmp)
        .and_then(|mut f| {
            f.write_all(&bytes)?;
            f.sync_all()
        })
        .and_then(|()| std::fs::rename(&tmp, file));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(e).with_context(|| format!("writing {}", file.display()));
    }
    Ok(())
}
