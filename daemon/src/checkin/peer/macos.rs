//! macOS peer identity: the kernel's audit token, then `SecCode`.
//!
//! What each transport proves (docs/src/security.md, "Who is asking"):
//!
//! - **XPC** hands over the audit token the kernel stamped on the message itself
//!   (`xpc_dictionary_get_audit_token`): pid, pid version and euid of the process
//!   that sent *this* message, when it sent it. A message without its own token
//!   is refused (`metalift_xpc::exchange::Refusal::NoAuditToken`); the
//!   connection's token is never used.
//! - **The Unix socket** proves less. The uid is `LOCAL_PEERCRED`'s, which xnu
//!   records at `connect` (`unp_peercred`) and never changes. The process (pid,
//!   executable, signature) is `LOCAL_PEERTOKEN`'s, which is *not* a connect-time
//!   credential: xnu computes it at `getsockopt` from the peer socket's
//!   `last_pid`, whichever process last sent, received or polled on it, with that
//!   process's *current* credentials (apple-oss-distributions/xnu
//!   `bsd/kern/uipc_usrreq.c`, `uipc_ctloutput`; `bsd/kern/uipc_socket.c`,
//!   `so_update_last_owner_locked`). So on the socket the executable is "the
//!   process that last used the socket", and a client may hand its descriptor to
//!   another process (or exec) before the daemon looks. A token whose euid differs
//!   from the connect-time uid (a setuid program touched the socket) is refused
//!   and recorded ([`super::socket_uid`]); never decided as that euid. That is why
//!   the shim checks in with the LaunchDaemon over XPC.
//!
//! From the token, in this order:
//!
//! 1. pid, pid version, euid: libbsm's accessors.
//! 2. The executable: `proc_pidpath_audittoken`, which fails (`ESRCH`) if the pid
//!    now names another process — never a pid-based lookup. It is opened at once
//!    for `sha256` rules.
//! 3. The code signature: `SecCode` from the same token (see
//!    `crate::macos::code_identity`), classified into an anchor
//!    (`super::signature`). Team id and signing id only from a signature that
//!    chains to Apple. If the daemon cannot open the executable (a LaunchDaemon
//!    without Full Disk Access, an executable in a TCC-protected folder), the
//!    anchor is `unreadable` and the decision says why, never "unsigned". If the
//!    running code no longer matches its file (`errSecCSStaticCodeChanged`), the
//!    file's hashes describe other code: neither `sha256` nor the file's cdhash is
//!    used, and the decision says why ([`super::signature::file_hashes`]).
//! 4. The executable again through the token: if the process exited or exec'd
//!    meanwhile, or the path changed, the peer is `Gone`; and the opened file must
//!    still be the one at that path (same device and inode) to be kept for hashing.
//! 5. The parent's executable, read between two checks of the parent's unique id.
//!
//! A process that `exec`ed between the token's computation and the checks above is
//! `Gone` here (the kernel bumps the pid version at exec). But a client that
//! execs, or passes its socket on, *before* the daemon asks gets the token of
//! whoever used the socket last: the socket identity cannot rule that out (the
//! shim's own socket is close-on-exec, a hostile client's need not be). XPC
//! tokens are per message, and the outcome must come from the check-in's pid and
//! pid version (`metalift_xpc::exchange`).
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use metalift_policy::Anchor;

use super::signature::{self, SignatureFacts};
use super::{CodeSignature, ExeFile, PeerError, PeerFacts};
use crate::macos::audit_token::AuditToken;
use crate::macos::code_identity;

/// Identifies the process on the other end of a Unix-socket connection.
pub fn facts_from_unix_stream(stream: &tokio::net::UnixStream) -> Result<PeerFacts, PeerError> {
    use std::os::fd::AsFd;
    facts_for(stream.as_fd(), super::Wants::ALL)
}

/// Identifies the process on the other end of a connected Unix socket: the uid
/// fixed at `connect`, the process from `LOCAL_PEERTOKEN`, refused when the
/// token's euid is not that uid (see the module doc). On macOS the optional facts
/// come with the signature check at no extra cost worth skipping, so `wants` is
/// not consulted.
pub fn facts_for(
    socket: std::os::fd::BorrowedFd<'_>,
    _wants: super::Wants,
) -> Result<PeerFacts, PeerError> {
    let connect_uid = connect_uid(socket).map_err(PeerError::Credentials)?;
    let token = AuditToken::of_unix_peer(&socket).map_err(PeerError::Credentials)?;
    let uid = super::socket_uid(token.pid(), connect_uid, token.euid())?;
    let facts = facts_from_audit_token(token)?;
    Ok(PeerFacts { uid, ..facts })
}

/// `LOCAL_PEERCRED` (`<sys/un.h>`): the peer's credentials as xnu recorded them
/// at `connect` (`unp_peercred`), never recomputed.
fn connect_uid(socket: std::os::fd::BorrowedFd<'_>) -> io::Result<u32> {
    use std::os::fd::AsRawFd;
    let mut cred = std::mem::MaybeUninit::<libc::xucred>::zeroed();
    let mut len = std::mem::size_of::<libc::xucred>() as libc::socklen_t;
    // SAFETY: `cred` is writable for `len` bytes; the fd is a live socket we borrow.
    let rc = unsafe {
        libc::getsockopt(
            socket.as_raw_fd(),
            libc::SOL_LOCAL,
            libc::LOCAL_PEERCRED,
            cred.as_mut_ptr().cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: zeroed first, then filled by the kernel; plain integers only.
    let cred = unsafe { cred.assume_init() };
    if cred.cr_version != libc::XUCRED_VERSION {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("LOCAL_PEERCRED returned xucred version {}", cred.cr_version),
        ));
    }
    Ok(cred.cr_uid)
}

/// Identifies the process an audit token names (see the module doc for the order).
/// Blocking (the Security framework reads the executable): call it off the async
/// executor's worker threads where latency matters.
pub fn facts_from_audit_token(token: AuditToken) -> Result<PeerFacts, PeerError> {
    let pid = token.pid();
    if pid == 0 {
        return Err(PeerError::NoPid);
    }
    let exe = token.executable().map_err(|e| gone_or(pid, "path", e))?;
    let opened = File::open(&exe);
    let mut unreadable = opened.as_ref().err().map(super::read_failure);

    let mut hashes_withheld = None;
    let code_signature = match code_identity::identify(&token) {
        Ok(identity) => {
            hashes_withheld = signature::file_hashes(identity.validity_status)
                .err()
                .map(str::to_owned);
            let facts = SignatureFacts {
                unreadable: unreadable.clone(),
                ..identity.facts()
            };
            let anchor = signature::classify(&facts);
            Some(CodeSignature {
                anchor,
                team_id: identity.team_id,
                signing_id: identity.signing_id,
                cdhash: identity.cdhash.filter(|_| signature::cdhash_counts(anchor)),
            })
        }
        Err(error) => {
            tracing::debug!(pid, %error, "no code identity: recorded as unreadable");
            unreadable.get_or_insert_with(|| error.to_string());
            Some(CodeSignature {
                anchor: Anchor::Unreadable,
                team_id: None,
                signing_id: None,
                cdhash: None,
            })
        }
    };

    // Still the same process, still the same executable path?
    let again = token.executable().map_err(|e| gone_or(pid, "path", e))?;
    if again != exe {
        return Err(PeerError::Gone { pid });
    }
    let exe_file = match opened {
        Ok(_) if hashes_withheld.is_some() => None,
        Ok(file) if same_file(&file, &exe) => Some(ExeFile::new(file)),
        Ok(_) => {
            tracing::debug!(pid, exe = %exe.display(), "executable replaced on disk: not hashing");
            None
        }
        Err(error) => {
            tracing::debug!(pid, %error, "cannot open the peer's executable for hashing");
            None
        }
    };

    Ok(PeerFacts {
        pid,
        pid_version: Some(u64::from(token.pid_version())),
        uid: token.euid(),
        exe,
        parent_exe: token.parent_executable(),
        code_signature,
        exe_file,
        unreadable,
        hashes_withheld,
    })
}

/// `ESRCH` means the token's process is gone; anything else is a read failure.
fn gone_or(pid: u32, what: &'static str, source: io::Error) -> PeerError {
    if source.raw_os_error() == Some(libc::ESRCH) {
        PeerError::Gone { pid }
    } else {
        PeerError::Proc { pid, what, source }
    }
}

/// Whether the open `file` is the file now at `path`.
fn same_file(file: &File, path: &Path) -> bool {
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}
