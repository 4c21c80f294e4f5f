//! When the file changed during the edit (someone else replaced, wrote, removed
//! or created it): the admin's copy is kept beside it, the message says what
//! happened and how to compare and retry, and at a terminal the admin may edit
//! the new file instead.

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context as _};
use serde_json::json;

use super::seen::Change;
use super::Args;
use metalift_daemon::service::config::DEFAULT_POLICY;

/// Exit status: not installed, because the file changed during the edit.
pub const NOT_INSTALLED: u8 = 5;

/// Writes `edited` to `NAME.kept-PID` beside `target` (not `.toml`, so neither
/// metaliftd's loader nor its policy.d/ scan reads it), readable by its owner only.
pub fn keep(target: &Path, edited: &[u8]) -> anyhow::Result<PathBuf> {
    let name = target
        .file_name()
        .map_or_else(|| "policy.toml".into(), |n| n.to_string_lossy());
    let pid = std::process::id();
    for n in 0..100 {
        let suffix = if n == 0 {
            String::new()
        } else {
            format!("-{n}")
        };
        let path = target.with_file_name(format!("{name}.kept-{pid}{suffix}"));
        let context = || format!("cannot keep your edit in {}", path.display());
        let mut file = match OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
        {
            Ok(file) => file,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(e).with_context(context),
        };
        file.write_all(edited)
            .and_then(|()| file.sync_all())
            .with_context(context)?;
        return Ok(path);
    }
    bail!(
        "cannot keep your edit beside {}: 100 kept copies exist",
        target.display()
    )
}

/// Says that `target` changed and nothing was installed, where the copy is
/// (`kept`), how to see the difference and how to retry.
pub fn report(args: &Args, target: &Path, kept: &Path, change: Change) {
    let message = format!(
        "{} changed during the edit ({}): nothing installed",
        target.display(),
        change.describe()
    );
    // A deleted file compares as empty.
    let theirs = if target.symlink_metadata().is_ok() {
        target.display().to_string()
    } else {
        "/dev/null".to_owned()
    };
    let diff = format!("diff -u {theirs} {}", kept.display());
    let mut retry = "metalift edit".to_owned();
    if args.policy != Path::new(DEFAULT_POLICY) {
        retry += &format!(" --policy {}", args.policy.display());
    }
    if let Some(name) = &args.dropin {
        retry += &format!(" --dropin {name}");
    }
    if args.json {
        println!(
            "{}",
            json!({"ok": false, "error": message, "code": NOT_INSTALLED,
                   "path": target.display().to_string(),
                   "kept": kept.display().to_string(), "diff": diff})
        );
    } else {
        eprintln!("metalift: {message}");
        eprintln!("metalift: your edit is kept in {}", kept.display());
        eprintln!("metalift: see the difference: {diff}");
        eprintln!("metalift: then run `{retry}` again and make your change on top of the new file");
    }
}

/// At a terminal: `true` to edit the new file now (the kept copy stays).
pub fn ask_edit_new_file() -> anyhow::Result<bool> {
    super::ask_edit_or("What now? [e]dit the new file, [q]uit: ", "q", "quit")
}
