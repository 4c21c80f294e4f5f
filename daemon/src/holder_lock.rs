//! A lock file that names its holder: an exclusive advisory `flock(2)` on a file
//! that the holder writes a line about itself into, so whoever finds it taken can
//! say who has it. The kernel drops the lock when the holder exits, however it
//! exits. metaliftd's one-daemon-per-audit-log lock
//! ([`crate::audit::log_lock`]) and `metalift edit`'s one-editor-per-policy lock
//! are both this.

use std::fs::{File, OpenOptions};
use std::io::{self, Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use rustix::fs::{flock, FlockOperation};

/// A held lock; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct HolderLock {
    /// Kept open: closing it releases the lock.
    _file: File,
}

/// The lock is taken by someone else.
#[derive(Debug)]
pub struct Busy {
    file: File,
    /// What the holder wrote, trimmed (empty when it wrote nothing yet).
    pub holder: String,
}

impl Busy {
    /// Waits until the holder lets go, then holds it, naming `who`.
    pub fn wait(self, who: &str) -> io::Result<HolderLock> {
        flock(&self.file, FlockOperation::LockExclusive)?;
        held(self.file, who)
    }
}

/// Opens (creating it with `mode`) the lock file at `path` and tries to take
/// it: held, naming `who` (one line), or [`Busy`] with what its holder wrote.
pub fn try_take(path: &Path, mode: u32, who: &str) -> io::Result<Result<HolderLock, Busy>> {
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(mode)
        .open(path)?;
    match flock(&file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => held(file, who).map(Ok),
        Err(e) if e == rustix::io::Errno::WOULDBLOCK => {
            let mut holder = String::new();
            // Unreadable or half-written: the holder is then simply not named.
            let _ = file.read_to_string(&mut holder);
            Ok(Err(Busy {
                file,
                holder: holder.trim().to_owned(),
            }))
        }
        Err(e) => Err(e.into()),
    }
}

/// Writes `who` into the locked `file`.
fn held(mut file: File, who: &str) -> io::Result<HolderLock> {
    file.set_len(0)?;
    file.rewind()?;
    writeln!(file, "{who}")?;
    Ok(HolderLock { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_taker_is_told_the_holder_and_takes_it_once_it_is_free() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.lock");
        let first = try_take(&path, 0o600, "first").unwrap().expect("free");
        // flock locks belong to the open file description: a second open in this
        // process conflicts as another process's would.
        let busy = try_take(&path, 0o600, "second")
            .unwrap()
            .expect_err("taken");
        assert_eq!(busy.holder, "first");
        let waiter = std::thread::spawn(move || busy.wait("second").unwrap());
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(!waiter.is_finished(), "waits while the first holds it");
        drop(first);
        let second = waiter.join().unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "second\n");
        drop(second);
    }
}
