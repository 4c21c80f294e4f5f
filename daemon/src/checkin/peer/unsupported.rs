//! Platforms without a kernel-identity implementation for Unix-socket peers yet.
//!
//! Every check-in is refused (the connection closes, the shim stays stock): a
//! daemon that cannot tell who is asking must never unlock. The macOS module
//! (`macos.rs`, SecCode + `LOCAL_PEERTOKEN`) replaces this one there.

use super::{PeerError, PeerFacts};

/// Always [`PeerError::Unsupported`].
pub fn facts_from_unix_stream(_stream: &tokio::net::UnixStream) -> Result<PeerFacts, PeerError> {
    Err(PeerError::Unsupported)
}

/// Always [`PeerError::Unsupported`].
pub fn facts_for(
    _socket: std::os::fd::BorrowedFd<'_>,
    _wants: super::Wants,
) -> Result<PeerFacts, PeerError> {
    Err(PeerError::Unsupported)
}
