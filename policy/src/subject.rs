//! The subject of a decision: who is asking, as the kernel (never the client) tells it.

use std::path::PathBuf;

use crate::anchor::Anchor;

/// Everything a rule may match on. Built by the daemon from kernel-verified sources
/// (peer credentials, `/proc/<pid>/exe`, the code signature); nothing a client says
/// about itself ever lands here.
///
/// Optional fields are `None` when unknown. `team_id` and `signing_id` must only be
/// filled from a signature whose [`Anchor`] chains to Apple
/// ([`Anchor::chains_to_apple`]): an unsigned, ad-hoc or self-signed binary never
/// satisfies a `team_id`/`signing_id` rule. The rules trust these fields as given;
/// the one place that decides what reaches them is the daemon's subject builder.
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
    /// Team identifier, from a signature that chains to Apple only.
    pub team_id: Option<String>,
    /// Signing identifier, from a signature that chains to Apple only.
    pub signing_id: Option<String>,
    /// What the code signature is anchored at (macOS); `None` where the platform
    /// has no code signatures (Linux). `platform = true` rules match
    /// [`Anchor::Apple`] only.
    pub anchor: Option<Anchor>,
    /// Why the executable could not be read (e.g. `permission denied`), when it
    /// could not: the facts read from it (sha256, signature) are then unknown,
    /// not absent, and explanations say so.
    pub unreadable: Option<String>,
}
