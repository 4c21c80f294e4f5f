//! macOS peer identity: the kernel's audit token, then `SecCode`.
//!
//! Both transports end here: XPC hands over the audit token the kernel stamped on
//! the message itself (`xpc_dictionary_get_audit_token`); the Unix socket only
//! what `LOCAL_PEERTOKEN` says when the daemon asks, which is *not* a connect-time
//! credential: xnu computes it at `getsockopt` from the peer socket's `last_pid`,
//! whichever process last sent, received or polled on it
//! (apple-oss-distributions/xnu `bsd/kern/uipc_usrreq.c`, `uipc_ctloutput`;
//! `bsd/kern/uipc_socket.c`, `so_update_last_owner_locked`). So on the socket the
//! executable is "the process that last used the socket", and a client may hand
//! its descriptor to another process (or exec) before the daemon looks; the uid
//! (`LOCAL_PEERCRED`) is fixed at connect. That is why the shim checks in with the
//! LaunchDaemon over XPC (README, "Who is asking"). From the token, in this order:
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
//!    anchor is `unreadable` and the decision says why, never "unsigned".
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
    let token = AuditToken::of_unix_peer(stream).map_err(PeerError::Credentials)?;
    facts_from_audit_token(token)
}

/// Identifies the process on the other end of a connected Unix socket. On macOS
/// the optional facts come with the signature check at no extra cost worth
/// skipping, so `wants` is not consulted.
pub fn facts_for(
    socket: std::os::fd::BorrowedFd<'_>,
    _wants: super::Wants,
) -> Result<PeerFacts, PeerError> {
    let token = AuditToken::of_unix_peer(&socket).map_err(PeerError::Credentials)?;
    facts_from_audit_token(token)
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

    let code_signature = match code_identity::identify(&token) {
        Ok(identity) => {
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
        ancestors: crate::macos::audit_token::ancestors(pid, super::MAX_ANCESTORS),
        code_signature,
        exe_file,
        unreadable,
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
