//! The outcome of evaluating a policy for one subject.

use crate::ceiling::FamilyCap;
use crate::profile::Capabilities;

/// Whether the policy changes anything, or only says what it would do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// Unlock rules take effect.
    #[default]
    Enforce,
    /// Decide and log "would unlock", but always answer stock.
    Monitor,
}

impl Mode {
    /// The word used in the policy file and the audit log.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Enforce => "enforce",
            Mode::Monitor => "monitor",
        }
    }
}

/// What the shim is told to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Install the capability hooks with these answers.
    Unlock {
        /// The profile's name in the policy (`[profile.NAME]`).
        profile: String,
        /// The answers that profile gives.
        capabilities: Capabilities,
    },
    /// Leave the paravirtual answers alone.
    Stock,
}

impl Action {
    /// `"unlock"` or `"stock"`, as the audit log spells it.
    #[must_use]
    pub fn as_str(&self) -> &'static str {
        match self {
            Action::Unlock { .. } => "unlock",
            Action::Stock => "stock",
        }
    }
}

/// One rule the evaluator looked at, and what it concluded about it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Considered {
    /// The rule's id.
    pub rule: String,
    /// Where the rule is defined, `file:line`.
    pub location: String,
    /// Whether every matcher of the rule held.
    pub matched: bool,
    /// Human-readable reason: which matcher held or failed, or why it lost.
    pub why: String,
}

/// A decision for one subject. `#[must_use]`: dropping a verdict unread is a bug.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verdict {
    /// What the shim applies. Always [`Action::Stock`] in monitor mode.
    pub action: Action,
    /// The id of the winning rule; `None` when no rule matched.
    pub rule: Option<String>,
    /// The policy's mode when it decided.
    pub mode: Mode,
    /// In monitor mode, the profile the winning rule would have unlocked.
    pub would_unlock: Option<String>,
    /// When the unlocked (or, in monitor mode, would-be) profile asked more Apple
    /// family than the host chip has: what it asked and what is applied. The action's
    /// capabilities already hold the applied value; this says why they differ from
    /// the profile's text.
    pub family_cap: Option<FamilyCap>,
    /// Why an unlock was answered stock because its profile sets
    /// `require_verified = true` and no passing verification covers this host chip
    /// and macOS build (decided by the daemon, which knows the verifications).
    pub unverified: Option<String>,
    /// The winning rule's window (`from`/`until`), when it has one: the record
    /// names it, so a reader sees the grant was limited in time.
    pub window: Option<crate::window::Window>,
    /// Every rule of the policy, in file order, with why it matched, failed or lost.
    /// Filled by `Policy::explain`; empty from the fast `Policy::evaluate`.
    pub trace: Vec<Considered>,
}

impl Verdict {
    /// The verdict for "nothing applies": stock, no rule.
    pub fn stock(mode: Mode) -> Self {
        Verdict {
            action: Action::Stock,
            rule: None,
            mode,
            would_unlock: None,
            family_cap: None,
            unverified: None,
            window: None,
            trace: Vec::new(),
        }
    }

    /// The Apple family the winning profile asked for: its `apple_family_max` as
    /// written (`"host"` resolved), before any cap. `None` for a stock verdict.
    #[must_use]
    pub fn requested_family(&self) -> Option<u8> {
        match (&self.action, &self.family_cap) {
            (_, Some(cap)) => Some(cap.requested),
            (Action::Unlock { capabilities, .. }, None) => Some(capabilities.apple_family_max),
            (Action::Stock, None) => None,
        }
    }
}
