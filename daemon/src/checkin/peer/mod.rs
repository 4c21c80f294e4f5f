//! Who is asking: the facts about a connected process that the kernel vouches for.
//!
//! Nothing here comes from the client's messages. Each platform module turns a
//! connected socket (or, on macOS, an XPC audit token) into [`PeerFacts`]:
//!
//! - `linux.rs`: `SO_PEERCRED` + `SO_PEERPIDFD`, `/proc/<pid>/exe`.
//! - `macos.rs`: audit token, `SecCode`.
//!
//! `user.rs` resolves user names (`getpwuid_r`) the same way on every Unix.
//!
//! The seam every platform provides, used by the Unix-socket transport and the
//! server core:
//!
//! - `facts_from_unix_stream(&tokio::net::UnixStream) -> Result<PeerFacts, PeerError>`
//! - `facts_for(BorrowedFd, Wants)`: the same for a connected socket, reading the
//!   optional facts (the open executable, the parent) only when [`Wants`] asks
//!   for them. Blocking: the transports run it through
//!   [`crate::checkin::blocking_pool::BlockingPool`], behind [`IdentifyPeer`] (the seam
//!   tests replace with a slow or failing identity).
//!
//! and on macOS `facts_from_audit_token(AuditToken)` for the XPC transport.

use std::fs::File;
use std::os::fd::BorrowedFd;
use std::path::PathBuf;
use std::sync::Arc;

pub mod signature;
mod user;
pub use user::user_name;

#[cfg(target_os = "linux")]
mod linux;
#[cfg(target_os = "linux")]
pub use linux::{facts_for, facts_from_unix_stream};

#[cfg(target_os = "macos")]
mod macos;
#[cfg(target_os = "macos")]
pub use macos::{facts_for, facts_from_audit_token, facts_from_unix_stream};

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod unsupported;
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub use unsupported::{facts_for, facts_from_unix_stream};

/// How the Unix-socket transport learns who is on the other end of a connection.
///
/// Called inline on the executor when [`IdentifyPeer::may_block`] says it cannot
/// wait on anything but kernel memory, on the transport's
/// [`crate::checkin::blocking_pool::BlockingPool`] otherwise.
pub trait IdentifyPeer: Send + Sync + std::fmt::Debug + 'static {
    /// The kernel's facts about the peer of the connected `socket`.
    fn identify(&self, socket: BorrowedFd<'_>, wants: Wants) -> Result<PeerFacts, PeerError>;

    /// Whether [`IdentifyPeer::identify`] may wait on something other than the
    /// kernel's memory (a disk, `securityd`, a directory service), so that it must
    /// run on the blocking pool. True unless an implementation knows better: a
    /// test's slow stand-in is exactly such an identity.
    fn may_block(&self, _wants: Wants) -> bool {
        true
    }
}

/// The real identity: this platform's `facts_for`.
///
/// On Linux it never blocks: `SO_PEERCRED`, `SO_PEERPIDFD`, `/proc/<pid>/stat`
/// and the readlink (and open) of `/proc/<pid>/exe` are answered from kernel
/// memory (procfs generates them; the executable's inode is mapped by the running
/// process, so opening it reads no disk). Handing that to the blocking pool cost
/// more than the work: the thread wake-ups made one check-in 1.6× slower (issue
/// 24 item 6; `metalift-bench identity-hop` measures both ways in one run). The
/// one step that reads a disk, hashing for `sha256` rules, goes through the
/// identity cache, which hops to the pool only on a miss. On macOS `SecCode` reads
/// the executable and may wait on `securityd`: always on the pool.
#[derive(Debug, Clone, Copy, Default)]
pub struct KernelIdentity;

impl IdentifyPeer for KernelIdentity {
    fn identify(&self, socket: BorrowedFd<'_>, wants: Wants) -> Result<PeerFacts, PeerError> {
        facts_for(socket, wants)
    }

    fn may_block(&self, _wants: Wants) -> bool {
        !cfg!(target_os = "linux")
    }
}

/// An identity always run on the blocking pool, whatever it says of itself:
/// metaliftd's `--identify-on-blocking-pool` (benchmarks only), so that
/// `metalift-bench identity-hop` can measure the hop against the inline path in
/// one run, on one machine.
#[derive(Debug, Clone, Copy, Default)]
pub struct OnBlockingPool<I>(pub I);

impl<I: IdentifyPeer> IdentifyPeer for OnBlockingPool<I> {
    fn identify(&self, socket: BorrowedFd<'_>, wants: Wants) -> Result<PeerFacts, PeerError> {
        self.0.identify(socket, wants)
    }

    fn may_block(&self, _wants: Wants) -> bool {
        true
    }
}

/// Which costly, optional facts a check-in needs: the live policy's
/// [`metalift_policy::Needs`], narrowed to what identification reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Wants {
    /// Open the executable (for `sha256` rules).
    pub exe_file: bool,
    /// Read the parent's executable (for `parent` rules; it is then also audited).
    pub parent: bool,
}

impl Wants {
    /// Every optional fact.
    pub const ALL: Wants = Wants {
        exe_file: true,
        parent: true,
    };

    /// What a policy with these needs reads.
    #[must_use]
    pub fn from_needs(needs: metalift_policy::Needs) -> Wants {
        Wants {
            exe_file: needs.sha256,
            parent: needs.parent,
        }
    }
}

/// A code signature as the OS verified it (macOS fills this; Linux has none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CodeSignature {
    /// What the signature is anchored at ([`signature::classify`]). Only when it
    /// chains to Apple may the identifiers below reach a
    /// [`metalift_policy::Subject`] ([`signature::trusted_ids`]).
    pub anchor: metalift_policy::Anchor,
    /// Team identifier, as recorded in the signature (a claim until the anchor
    /// says otherwise).
    pub team_id: Option<String>,
    /// Signing identifier, as recorded in the signature (likewise).
    pub signing_id: Option<String>,
    /// Code directory hash, from a signature that validated (ad hoc included:
    /// the hash pins the exact code, whoever signed it). `None` otherwise.
    pub cdhash: Option<Vec<u8>>,
}

/// The open executable file of a peer, for hashing the exact inode it runs.
///
/// Opaque on purpose: on Linux it is `/proc/<pid>/exe` opened while the pidfd
/// proved the process was still the asker, so a path swapped since then cannot
/// change what is hashed. Cheap to clone (shared).
#[derive(Debug, Clone)]
pub struct ExeFile(Arc<File>);

impl ExeFile {
    /// Wraps an already opened executable file.
    #[must_use]
    pub fn new(file: File) -> Self {
        ExeFile(Arc::new(file))
    }

    /// The open file.
    #[must_use]
    pub fn file(&self) -> &File {
        &self.0
    }
}

/// Kernel-verified facts about the process on the other end of a connection.
#[derive(Debug, Clone)]
pub struct PeerFacts {
    /// Process id.
    pub pid: u32,
    /// What makes `pid` unique over time: the pid version on macOS, the start
    /// time (clock ticks since boot) on Linux. Logged, not matched.
    pub pid_version: Option<u64>,
    /// User id the kernel recorded for the peer: the effective uid at `connect`
    /// (Linux `SO_PEERCRED`; macOS socket `LOCAL_PEERCRED`, checked against the
    /// audit token by [`socket_uid`]); over XPC the euid the kernel stamped on the
    /// message.
    pub uid: u32,
    /// The executable's path, as the kernel resolves the mapped file.
    pub exe: PathBuf,
    /// The parent process's executable, when it could be read without a race.
    pub parent_exe: Option<PathBuf>,
    /// The verified code signature (macOS).
    pub code_signature: Option<CodeSignature>,
    /// The executable, opened, for `sha256` rules. `None` when it could not be opened.
    pub exe_file: Option<ExeFile>,
    /// Why the executable could not be read when it was needed (e.g.
    /// `permission denied`: on macOS a daemon without Full Disk Access, for an
    /// executable in a TCC-protected folder). Decisions then say
    /// `identity unreadable: ...`, never "unsigned".
    pub unreadable: Option<String>,
    /// Why the executable's file must not be hashed for this process, although it
    /// could be read: on macOS the running code no longer matches its file
    /// ([`signature::file_hashes`]). `sha256` rules then cannot match, and the
    /// decision says why.
    pub hashes_withheld: Option<String>,
}

/// Why a peer could not be identified. The connection is then closed unanswered:
/// the shim treats that as "stay stock".
#[derive(Debug, thiserror::Error)]
pub enum PeerError {
    /// The kernel gave no credentials for the socket.
    #[error("reading the peer's credentials: {0}")]
    Credentials(#[source] std::io::Error),
    /// The peer's pid is not visible here (another pid namespace reports pid 0).
    #[error("the peer's pid is not visible in this pid namespace")]
    NoPid,
    /// The peer exited (or its pid was reused) while it was being identified.
    #[error("process {pid} exited while it was being identified")]
    Gone {
        /// The pid the kernel reported.
        pid: u32,
    },
    /// Reading `/proc` (or the platform equivalent) failed.
    #[error("reading {what} of process {pid}: {source}")]
    Proc {
        /// The pid.
        pid: u32,
        /// What was being read, e.g. `exe`.
        what: &'static str,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// This platform has no kernel identity for Unix-socket peers in this build.
    #[error("peer identity is not implemented on this platform")]
    Unsupported,
    /// macOS socket: the process that last used the socket runs with another
    /// effective uid than the one that connected ([`socket_uid`]). Refused and
    /// recorded: it is how a local user would get a decision recorded, and `uid`
    /// rules matched, as someone else (e.g. through a setuid program).
    #[error(
        "process {pid} runs as uid {token_euid}, but the socket was connected by uid {connect_uid}"
    )]
    UidChanged {
        /// The pid the socket's audit token names (its last user).
        pid: u32,
        /// The uid `LOCAL_PEERCRED` recorded at `connect`.
        connect_uid: u32,
        /// The effective uid in the `LOCAL_PEERTOKEN` audit token, computed when asked.
        token_euid: u32,
    },
}

impl PeerError {
    /// Whether this is a refusal worth an audit record (someone tried to be
    /// taken for someone else), not a peer that could not be identified.
    #[must_use]
    pub fn is_refusal(&self) -> bool {
        matches!(self, PeerError::UidChanged { .. })
    }
}

/// The uid a macOS socket check-in is decided with: `LOCAL_PEERCRED`'s, which xnu
/// records at `connect` (`unp_peercred`), and only when the audit token's
/// effective uid agrees with it. `LOCAL_PEERTOKEN` is computed when the daemon
/// asks, from the socket's `last_pid` with that process's *current* credentials
/// (xnu `bsd/kern/uipc_usrreq.c`, `uipc_ctloutput`), so a process that connected as
/// one user could let a setuid program touch the socket first and be taken for
/// root. The two disagreeing is refused, never resolved in either's favour.
/// Pure, so it is tested on every platform; `peer/macos.rs` feeds it.
pub fn socket_uid(pid: u32, connect_uid: u32, token_euid: u32) -> Result<u32, PeerError> {
    if connect_uid == token_euid {
        Ok(connect_uid)
    } else {
        Err(PeerError::UidChanged {
            pid,
            connect_uid,
            token_euid,
        })
    }
}

/// How a failed read of the executable is worded in decisions: the error kind
/// (`permission denied`, `not found`, ...), without the OS's errno suffix, so
/// every platform and every reader (`jq`, `metalift audit`) sees the same words.
#[must_use]
pub fn read_failure(error: &std::io::Error) -> String {
    error.kind().to_string()
}
