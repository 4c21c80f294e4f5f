//! The kernel's audit token: who sent a message, including the pid *version*, so a
//! recycled pid can never be mistaken for the asker.
//!
//! Every lookup here goes through the token (libbsm accessors, `proc_pidpath_audittoken`)
//! except the parent's executable, which macOS only offers by pid: that one is read
//! between two checks of the parent's 64-bit unique id, so a recycled pid yields
//! `None` rather than a wrong path.

use std::ffi::{c_int, c_void, OsStr};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use metalift_xpc::sys::audit_token_t;

/// `PROC_PIDPATHINFO_MAXSIZE` (`<sys/proc_info.h>`): 4 × `MAXPATHLEN`.
const PROC_PIDPATHINFO_MAXSIZE: usize = 4 * 1024;
/// `PROC_PIDT_BSDINFOWITHUNIQID` (xnu `bsd/sys/proc_info.h`, private flavor 18):
/// `proc_bsdinfo` and `proc_uniqidentifierinfo` in one call, so the ppid and the
/// unique ids are read atomically.
const PROC_PIDT_BSDINFOWITHUNIQID: c_int = 18;

/// `struct proc_uniqidentifierinfo` (xnu `bsd/sys/proc_info_private.h`): 56 bytes.
/// Kernels before ~2021 left `p_idversion` reserved (0); the checks below then
/// fail closed (no parent path) instead of trusting an unverified pid.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct ProcUniqIdentifierInfo {
    p_uuid: [u8; 16],
    p_uniqueid: u64,
    p_puniqueid: u64,
    p_idversion: i32,
    p_orig_ppidversion: i32,
    p_reserve2: u64,
    p_reserve3: u64,
}

/// `struct proc_bsdinfowithuniqid` (same header).
#[repr(C)]
#[derive(Clone, Copy)]
struct ProcBsdInfoWithUniqId {
    pbsd: libc::proc_bsdinfo,
    p_uniqidentifier: ProcUniqIdentifierInfo,
}

const _: () = assert!(std::mem::size_of::<ProcUniqIdentifierInfo>() == 56);
const _: () = assert!(std::mem::size_of::<audit_token_t>() == 32);

#[link(name = "bsm")]
extern "C" {
    // <bsm/libbsm.h> (libbsm.0.dylib). Each takes the token by value.
    fn audit_token_to_pid(atoken: audit_token_t) -> libc::pid_t;
    fn audit_token_to_pidversion(atoken: audit_token_t) -> c_int;
    fn audit_token_to_euid(atoken: audit_token_t) -> libc::uid_t;
}

extern "C" {
    // <libproc.h>, macOS 11+: fails with ESRCH when the token's pid version is stale.
    fn proc_pidpath_audittoken(
        audittoken: *mut audit_token_t,
        buffer: *mut c_void,
        buffersize: u32,
    ) -> c_int;
}

/// An audit token as the kernel attached it to a message or socket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AuditToken(audit_token_t);

impl AuditToken {
    /// Wraps a token the kernel filled (XPC message, `LOCAL_PEERTOKEN`).
    #[must_use]
    pub fn from_raw(raw: audit_token_t) -> Self {
        AuditToken(raw)
    }

    /// The raw token.
    #[must_use]
    pub fn raw(&self) -> audit_token_t {
        self.0
    }

    /// The token's 32 bytes in memory order: the value `kSecGuestAttributeAudit`
    /// expects inside a `CFData`.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        for (chunk, word) in out.chunks_exact_mut(4).zip(self.0.val) {
            chunk.copy_from_slice(&word.to_ne_bytes());
        }
        out
    }

    /// The process id.
    #[must_use]
    pub fn pid(&self) -> u32 {
        // SAFETY: a pure accessor over a by-value struct.
        let pid = unsafe { audit_token_to_pid(self.0) };
        u32::try_from(pid).unwrap_or(0)
    }

    /// The pid version: bumped by the kernel at every exec and pid reuse.
    #[must_use]
    pub fn pid_version(&self) -> u32 {
        // SAFETY: a pure accessor over a by-value struct.
        let version = unsafe { audit_token_to_pidversion(self.0) };
        version as u32
    }

    /// The effective uid in the token: for an XPC message, the sender's when it
    /// sent it; for `LOCAL_PEERTOKEN`, the socket's last user's *now* (not the
    /// connect-time uid: that is `LOCAL_PEERCRED`'s, see `checkin/peer/macos.rs`).
    #[must_use]
    pub fn euid(&self) -> u32 {
        // SAFETY: a pure accessor over a by-value struct.
        unsafe { audit_token_to_euid(self.0) }
    }

    /// The executable the token's process runs, resolved by the kernel.
    ///
    /// Fails with `ESRCH` when the process has exited or exec'd since the token was
    /// taken (the pid version no longer matches), so the path is always the asker's.
    pub fn executable(&self) -> io::Result<PathBuf> {
        let mut token = self.0;
        let mut buf = vec![0u8; PROC_PIDPATHINFO_MAXSIZE];
        // SAFETY: `token` is a valid, writable audit_token_t and `buf` is writable
        // for the size passed.
        let n = unsafe {
            proc_pidpath_audittoken(&mut token, buf.as_mut_ptr().cast(), buf.len() as u32)
        };
        if n <= 0 {
            return Err(io::Error::last_os_error());
        }
        buf.truncate(n as usize);
        Ok(PathBuf::from(OsStr::from_bytes(&buf)))
    }

    /// The audit token of a connected Unix-socket peer (`LOCAL_PEERTOKEN`,
    /// `<sys/un.h>`). Not recorded at `connect`: xnu computes it now, from the
    /// peer socket's `last_pid`, the process that last used that socket, with
    /// that process's current credentials (xnu `bsd/kern/uipc_usrreq.c`,
    /// `uipc_ctloutput`), so it names whoever holds the descriptor lately, not
    /// necessarily who connected. Its pid, pid version and executable say which
    /// process; its euid is trusted only where it equals `LOCAL_PEERCRED`'s
    /// connect-time uid (`checkin/peer/macos.rs`).
    pub fn of_unix_peer(socket: &impl AsRawFd) -> io::Result<Self> {
        let mut raw = audit_token_t::default();
        let mut len = std::mem::size_of::<audit_token_t>() as libc::socklen_t;
        // SAFETY: `raw` is writable for `len` bytes; the fd is a live socket we borrow.
        let rc = unsafe {
            libc::getsockopt(
                socket.as_raw_fd(),
                libc::SOL_LOCAL,
                libc::LOCAL_PEERTOKEN,
                (&mut raw as *mut audit_token_t).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        if len as usize != std::mem::size_of::<audit_token_t>() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("LOCAL_PEERTOKEN returned {len} bytes"),
            ));
        }
        Ok(AuditToken(raw))
    }

    /// The executable of the token's parent process, when it can be read without a
    /// race: `None` if the asker or its parent exited, was reparented, or the
    /// kernel does not report pid versions in `proc_uniqidentifierinfo`.
    #[must_use]
    pub fn parent_executable(&self) -> Option<PathBuf> {
        let me = bsd_info_with_uniqid(self.pid())?;
        // The pid still names the asker only if its pid version is the token's.
        if me.p_uniqidentifier.p_idversion as u32 != self.pid_version() {
            return None;
        }
        let ppid = me.pbsd.pbi_ppid;
        let parent_id = me.p_uniqidentifier.p_puniqueid;
        let before = bsd_info_with_uniqid(ppid)?;
        if before.p_uniqidentifier.p_uniqueid != parent_id {
            return None; // reparented, or the ppid was recycled
        }
        let path = pid_path(ppid)?;
        let after = bsd_info_with_uniqid(ppid)?;
        (after.p_uniqidentifier.p_uniqueid == parent_id).then_some(path)
    }
}

/// `proc_pidinfo(PROC_PIDT_BSDINFOWITHUNIQID)`; same-user or root callers only.
fn bsd_info_with_uniqid(pid: u32) -> Option<ProcBsdInfoWithUniqId> {
    let mut info = std::mem::MaybeUninit::<ProcBsdInfoWithUniqId>::zeroed();
    let size = std::mem::size_of::<ProcBsdInfoWithUniqId>() as c_int;
    let pid = c_int::try_from(pid).ok()?;
    // SAFETY: `info` is writable for `size` bytes.
    let n = unsafe {
        libc::proc_pidinfo(
            pid,
            PROC_PIDT_BSDINFOWITHUNIQID,
            0,
            info.as_mut_ptr().cast(),
            size,
        )
    };
    if n != size {
        return None;
    }
    // SAFETY: the kernel filled all `size` bytes; every bit pattern is valid for
    // these plain-integer structs (and it was zeroed first).
    Some(unsafe { info.assume_init() })
}

/// `proc_pidpath` by pid: only called between two unique-id checks.
fn pid_path(pid: u32) -> Option<PathBuf> {
    let mut buf = vec![0u8; PROC_PIDPATHINFO_MAXSIZE];
    let pid = c_int::try_from(pid).ok()?;
    // SAFETY: `buf` is writable for the size passed.
    let n = unsafe { libc::proc_pidpath(pid, buf.as_mut_ptr().cast(), buf.len() as u32) };
    if n <= 0 {
        return None;
    }
    buf.truncate(n as usize);
    Some(PathBuf::from(OsStr::from_bytes(&buf)))
}
