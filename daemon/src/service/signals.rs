//! Process-wide signal dispositions metaliftd needs before it serves.
//!
//! `SIGXFSZ`: when the audit log reaches a file-size limit (`ulimit -f`, launchd's
//! `HardResourceLimits`/`FileSize`), the kernel sends it on the next `write(2)`, and
//! its default action kills the process. Ignored, the write fails with `EFBIG`
//! instead, which the audit writer already turns into an error and the core into
//! a stock verdict. A platform module: the one `signal(2)` call is its only unsafe
//! operation.
#![allow(unsafe_code)]

/// Makes writes past a file-size limit fail with `EFBIG` instead of killing the daemon.
pub fn ignore_file_size_signal() -> std::io::Result<()> {
    // SAFETY: SIG_IGN is a valid disposition for SIGXFSZ, and no handler of ours
    // is replaced (the daemon installs none for it).
    let previous = unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    if previous == libc::SIG_ERR {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}
