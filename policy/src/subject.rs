//! The subject of a decision: who is asking, as the kernel (never the client) tells it.

use std::path::PathBuf;

/// Everything a rule may match on. Built by the daemon from kernel-verified sources
/// (peer credentials, `/proc/<pid>/exe`, the code signature); nothing a client says
/// about itself ever lands here.
///
/// Optional fields are `None` when unknown. The code-signing fields (`team_id`,
/// `signing_id`, `cdhash`) must only be filled from a *valid, non-ad-hoc* signature:
/// an unsigned or ad-hoc binary never satisfies a `team_id`/`signing_id` rule.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Subject {
    /// Absolute path of the executable (the mapped file, as the kernel resolves it).
    pub path: PathBuf,
    /// Real user id of the process.
    pub uid: u32,
    /// User name for `uid`, when it resolves.
    pub user: Option<String>,
    /// Absolute path of the parent process's executable, when known.
    pub parent_path: Option<PathBuf>,
    /// SHA-256 of the executable's contents; computed only when the policy needs it.
    pub sha256: Option<[u8; 32]>,
    /// Code directory hash (20 bytes on macOS), from a valid signature only.
    pub cdhash: Option<Vec<u8>>,
    /// Team identifier, from a valid non-ad-hoc signature only.
    pub team_id: Option<String>,
    /// Signing identifier, from a valid non-ad-hoc signature only.
    pub signing_id: Option<String>,
}
