//! The forwarder thread runs below the verdict path: when the CPUs are saturated
//! the check-ins' verdicts (and their local records) win, and forwarding catches up
//! when there is room. The local log is the queue, so a forwarder that falls behind
//! costs disk the log already has, never a verdict.
//!
//! - Linux: `setpriority(PRIO_PROCESS, gettid(), NICE)`. The nice value is a
//!   per-thread attribute on Linux (setpriority(2), NOTES: "under the current
//!   Linux/NPTL implementation of POSIX threads, the nice value is a per-thread
//!   attribute"), so only this thread moves.
//! - macOS: `pthread_set_qos_class_self_np(QOS_CLASS_UTILITY, 0)`. Apple's
//!   apple-oss-distributions/libpthread `include/sys/qos.h` describes
//!   `QOS_CLASS_UTILITY` as work "the user is unlikely to be immediately waiting
//!   for", run "at a priority below critical user-interactive and user-initiated
//!   work"; `include/pthread/qos.h` (`pthread_set_qos_class_self_np`) sets it for
//!   the calling thread and returns an errno value. Verify on a Mac.
#![allow(unsafe_code)]

use std::io;

/// The forwarder's nice value on Linux: 10 gives it about a tenth of the CPU
/// share of a thread at 0 while both want a CPU (the kernel's weight table,
/// `sched_prio_to_weight`: 110 against 1024), and all of an idle CPU.
#[cfg(target_os = "linux")]
pub const NICE: i32 = 10;

/// Lowers the calling thread's scheduling priority (see the module's note).
#[cfg(target_os = "linux")]
pub fn lower_this_thread() -> io::Result<()> {
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    let tid = libc::id_t::try_from(tid).map_err(|_| io::Error::other("negative thread id"))?;
    // SAFETY: getpriority takes plain integers; `tid` is this thread's id.
    let now = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
    if now >= NICE {
        // Already as low (a daemon started under `nice`): raising it back would
        // need privilege and is not the point.
        return Ok(());
    }
    // SAFETY: setpriority takes plain integers; `tid` is this thread's id.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, NICE) };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Lowers the calling thread's scheduling priority (see the module's note).
#[cfg(target_os = "macos")]
pub fn lower_this_thread() -> io::Result<()> {
    // SAFETY: takes a QOS class and a relative priority in [QOS_MIN_RELATIVE_PRIORITY,
    // 0] by value and affects only the calling thread.
    let rc =
        unsafe { libc::pthread_set_qos_class_self_np(libc::qos_class_t::QOS_CLASS_UTILITY, 0) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    #[test]
    fn only_the_calling_thread_is_lowered() {
        // SAFETY: getpriority takes plain integers; `who` 0 is the calling thread.
        let nice_of_this_thread = || unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        let before = nice_of_this_thread();
        let lowered = std::thread::spawn(move || {
            lower_this_thread().unwrap();
            nice_of_this_thread()
        })
        .join()
        .unwrap();
        assert_eq!(lowered, NICE.max(before));
        assert_eq!(
            nice_of_this_thread(),
            before,
            "the spawning thread keeps its priority"
        );
    }
}
