//! Linux peer identity: `SO_PEERCRED`, a pidfd, and `/proc/<pid>`.
//!
//! The pid from `SO_PEERCRED` alone is a race: the asker may exit and its pid be
//! reused before `/proc/<pid>` is read. A pidfd pins the exact process, so the
//! order is:
//!
//! 1. `SO_PEERCRED` → pid, uid (recorded by the kernel at `connect`).
//! 2. `SO_PEERPIDFD` (Linux ≥ 6.5) → a pidfd for the process that connected.
//! 3. Read the main thread's `/proc/<pid>/task/<pid>/stat` (one `read(2)` into a stack buffer), `/proc/<pid>/exe`
//!    (readlink for the path; opened for the inode only when a `sha256` rule needs
//!    it) and, only when a `parent` rule needs it, the parent's `exe`.
//! 4. Check the pidfd's process has not exited. While it lives its pid cannot be
//!    reused, so everything read in step 3 was about the asker.
//!
//! Fallback when `SO_PEERPIDFD` is missing (older kernels): `pidfd_open(pid)`,
//! then after step 3 check that the socket's other end is still open. The
//! residual race, documented: the asker forks a child that inherits the socket,
//! exits, and its pid is reused by an unrelated process before step 2 — the
//! reused process would then be identified. It needs the asker's cooperation
//! and a pid wrap inside microseconds.
//!
//! What is identified is the process that connected, as it is when its check-in
//! is read: if it `exec`ed in between, the new executable is the one decided
//! for, which is also the code that will read the verdict.
//!
//! The ancestors every check-in records are kept per parent while they live
//! ([`ancestry`]). All unsafe code of peer identity is in this file, one
//! operation per block.
#![allow(unsafe_code)]

mod ancestry;

use std::fs::File;
use std::io;
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::LazyLock;

use super::{ExeFile, PeerError, PeerFacts, Wants};

/// Identifies the process on the other end of `stream` (see the module doc for the
/// order), with every optional fact.
pub fn facts_from_unix_stream(stream: &tokio::net::UnixStream) -> Result<PeerFacts, PeerError> {
    facts_for(stream.as_fd(), Wants::ALL)
}

/// Identifies the process on the other end of the connected `socket`, reading
/// only the optional facts `wants` asks for.
pub fn facts_for(socket: BorrowedFd<'_>, wants: Wants) -> Result<PeerFacts, PeerError> {
    identify(socket, PidfdSource::Socket, wants, &|_| {})
}

/// Where the pidfd that pins the asker comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PidfdSource {
    /// `SO_PEERPIDFD`, falling back to `pidfd_open` on kernels without it.
    Socket,
    /// `pidfd_open` only: the fallback, forced (tests exercise it on new kernels).
    #[cfg_attr(not(test), allow(dead_code))]
    Open,
}

/// `after_reads` runs once everything about the pid has been read, just before
/// the check that the process did not exit meanwhile: the seam through which the
/// tests make a peer exit (and its pid become free for reuse) at the worst moment.
fn identify(
    sock: BorrowedFd<'_>,
    source: PidfdSource,
    wants: Wants,
    after_reads: &dyn Fn(u32),
) -> Result<PeerFacts, PeerError> {
    let cred = peer_cred(sock).map_err(PeerError::Credentials)?;
    let pid = u32::try_from(cred.pid)
        .ok()
        .filter(|p| *p != 0)
        .ok_or(PeerError::NoPid)?;
    let socket_pidfd = match source {
        PidfdSource::Socket => match peer_pidfd(sock) {
            Ok(fd) => Some(fd),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOPROTOOPT | libc::EINVAL)) => None,
            Err(e) => return Err(PeerError::Credentials(e)),
        },
        PidfdSource::Open => None,
    };
    let (pidfd, from_socket) = match socket_pidfd {
        Some(fd) => (fd, true),
        None => (
            pidfd_open(cred.pid).map_err(|_| PeerError::Gone { pid })?,
            false,
        ),
    };

    let proc_err = |what| move |source| PeerError::Proc { pid, what, source };
    let stat = ProcStat::read(pid).map_err(proc_err("stat"))?;
    let exe_link = format!("/proc/{pid}/exe");
    let exe = std::fs::read_link(&exe_link).map_err(proc_err("exe"))?;
    // Opening may fail where readlink did not (e.g. no read permission on the
    // binary): then only `sha256` rules cannot match, and the decision says why.
    let mut unreadable = None;
    let exe_file = if wants.exe_file {
        match File::open(&exe_link) {
            Ok(f) => Some(ExeFile::new(f)),
            Err(e) => {
                tracing::debug!(pid, error = %e, "cannot open the peer's executable for hashing");
                unreadable = Some(super::read_failure(&e));
                None
            }
        }
    } else {
        None
    };
    let parent_exe = if wants.parent {
        parent_exe(pid, stat.ppid)
    } else {
        None
    };
    after_reads(pid);

    if has_exited(pidfd.as_fd()).map_err(proc_err("pidfd"))? {
        return Err(PeerError::Gone { pid });
    }
    if !from_socket && peer_hung_up(sock).map_err(PeerError::Credentials)? {
        return Err(PeerError::Gone { pid });
    }
    Ok(PeerFacts {
        pid,
        pid_version: Some(stat.start_time),
        uid: cred.uid,
        exe,
        parent_exe,
        ancestors: ancestors(stat.ppid),
        code_signature: None,
        exe_file,
        unreadable,
        hashes_withheld: None,
    })
}

/// The parent's executable, only when the parent provably did not change while
/// it was read: a child's ppid changes the moment its parent exits, so an
/// unchanged ppid after the readlink means that pid was still our parent.
fn parent_exe(pid: u32, ppid: u32) -> Option<PathBuf> {
    if ppid == 0 {
        return None;
    }
    let path = std::fs::read_link(format!("/proc/{ppid}/exe")).ok()?;
    let again = ProcStat::read(pid).ok()?;
    (again.ppid == ppid).then_some(path)
}

/// The chains of ancestors kept for every check-in's parent.
static ANCESTRY: LazyLock<ancestry::Ancestry> = LazyLock::new(ancestry::Ancestry::default);

/// `ppid`, its parent, … (see [`ancestry::Ancestry::ancestors`]).
fn ancestors(ppid: u32) -> Vec<u32> {
    ANCESTRY.ancestors(ppid)
}

/// The two fields of `/proc/<pid>/stat` we use.
struct ProcStat {
    ppid: u32,
    /// Field 22: start time in clock ticks since boot.
    start_time: u64,
}

/// Room for `/proc/<pid>/stat`: 52 numeric fields and a 16-byte command name fit
/// in well under 1 KiB; only fields up to 22 are used, so a longer line would
/// still parse.
const STAT_BUF: usize = 1024;

impl ProcStat {
    /// One `open`, one `read(2)` into a stack buffer: procfs generates the whole
    /// line on the first read.
    ///
    /// The process's main thread's line (`/proc/<pid>/task/<pid>/stat`), not
    /// the process's: both print that task's `real_parent` and start time
    /// (`fs/proc/array.c`, `do_task_stat`), but the process's line also sums the
    /// CPU times and faults of every thread (`thread_group_cputime_adjusted`), a
    /// cost that grows with the peer's threads and that we never read.
    fn read(pid: u32) -> io::Result<Self> {
        use std::io::Read;
        let mut file = File::open(format!("/proc/{pid}/task/{pid}/stat"))?;
        let mut buf = [0u8; STAT_BUF];
        let n = file.read(&mut buf)?;
        Self::parse(buf.get(..n).unwrap_or_default()).ok_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidData, "unexpected /proc/<pid>/stat")
        })
    }

    /// The command name (field 2) may hold spaces and parentheses: fields are
    /// counted after its last `)`.
    fn parse(line: &[u8]) -> Option<Self> {
        let close = line.iter().rposition(|b| *b == b')')?;
        let mut fields = line
            .get(close + 1..)?
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty());
        // The fields after `)` start at field 3 (state).
        let ppid = number(fields.nth(4 - 3)?)?;
        let start_time = number(fields.nth(22 - 4 - 1)?)?;
        Some(ProcStat {
            ppid: u32::try_from(ppid).ok()?,
            start_time,
        })
    }
}

/// A decimal field of `/proc/<pid>/stat`.
fn number(field: &[u8]) -> Option<u64> {
    std::str::from_utf8(field).ok()?.parse().ok()
}

fn peer_cred(sock: BorrowedFd<'_>) -> io::Result<libc::ucred> {
    let mut cred = MaybeUninit::<libc::ucred>::zeroed();
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `sock` is a live socket fd; `cred` and `len` point to writable memory of
    // the announced size, which the kernel fills.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            cred.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: getsockopt succeeded; `ucred` is plain integers and was zero-initialised,
    // so it is fully initialised whatever length the kernel wrote.
    Ok(unsafe { cred.assume_init() })
}

fn peer_pidfd(sock: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut fd: libc::c_int = -1;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: `sock` is a live socket fd; `fd` and `len` are writable and sized as announced.
    let rc = unsafe {
        libc::getsockopt(
            sock.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERPIDFD,
            (&mut fd as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    owned(fd)
}

fn pidfd_open(pid: libc::pid_t) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags by value and returns a new fd or -1.
    let rc = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = RawFd::try_from(rc)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "pidfd out of range"))?;
    owned(fd)
}

/// Takes ownership of a fd the kernel just returned to us.
fn owned(fd: RawFd) -> io::Result<OwnedFd> {
    if fd < 0 {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "negative fd"));
    }
    // SAFETY: `fd` was just returned by the kernel to this function's caller, is open,
    // and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A pidfd polls readable once its process has exited.
fn has_exited(pidfd: BorrowedFd<'_>) -> io::Result<bool> {
    Ok(poll_now(pidfd, libc::POLLIN)? & libc::POLLIN != 0)
}

/// Whether any of the pidfds' processes has exited (one `poll(2)` for all, at
/// most [`super::MAX_ANCESTORS`] of them: a chain's; on the stack, since every
/// check-in polls its chain).
fn any_exited<F: AsFd>(pidfds: &[F]) -> io::Result<bool> {
    let unused = libc::pollfd {
        fd: -1,
        events: 0,
        revents: 0,
    };
    let mut fds = [unused; super::MAX_ANCESTORS];
    if pidfds.len() > fds.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "more pidfds than a chain holds",
        ));
    }
    for (slot, pidfd) in fds.iter_mut().zip(pidfds) {
        *slot = libc::pollfd {
            fd: pidfd.as_fd().as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
    }
    let count = pidfds.len() as libc::nfds_t; // at most MAX_ANCESTORS (checked above)
                                              // SAFETY: `fds` is a valid, writable array of at least `count` pollfds;
                                              // timeout 0 never blocks.
    let rc = unsafe { libc::poll(fds.as_mut_ptr(), count, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(rc > 0)
}

/// The other end of the socket was closed (its process exited or closed it).
fn peer_hung_up(sock: BorrowedFd<'_>) -> io::Result<bool> {
    let revents = poll_now(sock, libc::POLLRDHUP)?;
    Ok(revents & (libc::POLLRDHUP | libc::POLLHUP) != 0)
}

/// `poll(2)` one fd without waiting; returns `revents`.
fn poll_now(fd: BorrowedFd<'_>, events: libc::c_short) -> io::Result<libc::c_short> {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events,
        revents: 0,
    };
    // SAFETY: `pfd` is one valid, writable pollfd and the count says 1; timeout 0 never blocks.
    let rc = unsafe { libc::poll(&mut pfd, 1, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(pfd.revents)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_fields_are_counted_after_the_last_parenthesis() {
        let line = "4242 (evil) 1 2 (x) S 17 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
        let stat = ProcStat::parse(line.as_bytes()).expect("parses");
        assert_eq!(stat.ppid, 17);
        assert_eq!(stat.start_time, 987654);
    }

    #[test]
    fn a_connected_peer_in_this_process_is_identified_as_this_executable() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        rt.block_on(async {
            let (a, _b) = tokio::net::UnixStream::pair().expect("pair");
            let facts = facts_from_unix_stream(&a).expect("identified");
            assert_eq!(facts.pid, std::process::id());
            assert_eq!(facts.exe, std::env::current_exe().expect("current exe"));
            // SAFETY: geteuid has no preconditions and cannot fail.
            assert_eq!(facts.uid, unsafe { libc::geteuid() });
            assert!(facts.exe_file.is_some());
            assert!(facts.parent_exe.is_some());
            // The chain starts at this process's parent and never names pid 1.
            assert_eq!(
                facts.ancestors.first(),
                Some(&std::os::unix::process::parent_id())
            );
            assert!(!facts.ancestors.contains(&1), "{:?}", facts.ancestors);
        });
    }

    #[test]
    fn the_pidfd_open_fallback_identifies_the_same_process() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let by_socket =
            identify(a.as_fd(), PidfdSource::Socket, Wants::ALL, &|_| {}).expect("SO_PEERPIDFD");
        let by_open =
            identify(a.as_fd(), PidfdSource::Open, Wants::ALL, &|_| {}).expect("fallback path");
        assert_eq!(by_open.pid, by_socket.pid);
        assert_eq!(by_open.exe, by_socket.exe);
        assert_eq!(by_open.pid_version, by_socket.pid_version);
    }

    #[test]
    fn a_peer_that_hung_up_is_not_identified_through_the_fallback() {
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        drop(b);
        assert!(matches!(
            identify(a.as_fd(), PidfdSource::Open, Wants::ALL, &|_| {}),
            Err(PeerError::Gone { .. })
        ));
    }

    /// Not a test: a peer process for the test below (run with `--ignored --exact`).
    #[test]
    #[ignore = "child-process helper, run by other tests"]
    fn peer_child_connects_and_waits() {
        let socket = std::env::var_os("METALIFT_PEER_SOCKET").expect("METALIFT_PEER_SOCKET");
        let _stream = std::os::unix::net::UnixStream::connect(socket).expect("connect");
        // Until the test kills it.
        std::thread::sleep(std::time::Duration::from_secs(120));
    }

    /// A peer that exits after its pid was read, before the check: its pid may
    /// already name another process, so nothing read about it may be used.
    #[test]
    fn a_peer_that_exits_between_connect_and_identification_is_gone_not_misidentified() {
        for source in [PidfdSource::Socket, PidfdSource::Open] {
            let dir = tempfile::tempdir().expect("temp dir");
            let path = dir.path().join("peer.sock");
            let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
            let child = std::process::Command::new(std::env::current_exe().expect("exe"))
                .args([
                    "--ignored",
                    "--exact",
                    "checkin::peer::linux::tests::peer_child_connects_and_waits",
                ])
                .env("METALIFT_PEER_SOCKET", &path)
                .stdout(std::process::Stdio::null())
                .spawn()
                .expect("spawn peer");
            let child = std::sync::Mutex::new(child);
            // Bounded: a child that never connects (say, a test filter that no
            // longer names its test) fails here instead of hanging the suite.
            listener.set_nonblocking(true).expect("nonblocking");
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
            let stream = loop {
                match listener.accept() {
                    Ok((stream, _)) => break stream,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        let exited = child.lock().expect("child").try_wait().expect("wait");
                        assert!(
                            exited.is_none() && std::time::Instant::now() < deadline,
                            "the peer child never connected (exited: {exited:?})"
                        );
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                    Err(e) => panic!("accept: {e}"),
                }
            };
            stream.set_nonblocking(false).expect("blocking");
            let exit_now = |pid: u32| {
                let mut child = child.lock().expect("child");
                assert_eq!(child.id(), pid, "identified the wrong process");
                child.kill().expect("kill the peer");
                // Reaped: from here on the kernel may hand its pid to anyone.
                child.wait().expect("reap the peer");
            };
            let result = identify(stream.as_fd(), source, Wants::ALL, &exit_now);
            assert!(
                matches!(result, Err(PeerError::Gone { .. })),
                "{source:?}: {result:?}"
            );
        }
    }

    #[test]
    fn only_the_facts_a_policy_needs_are_read() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().expect("pair");
        let none = Wants {
            exe_file: false,
            parent: false,
        };
        let facts = identify(a.as_fd(), PidfdSource::Socket, none, &|_| {}).expect("facts");
        assert!(facts.exe_file.is_none());
        assert!(facts.parent_exe.is_none());
        assert_eq!(facts.exe, std::env::current_exe().expect("exe"));
    }
}
