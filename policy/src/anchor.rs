//! What a code signature chains to: the one fact that makes its team id and
//! signing id worth anything.
//!
//! `SecStaticCodeCheckValidity` without a requirement accepts a signature that
//! chains to any root, self-signed included, and the CodeDirectory's team id is
//! compared with the signing certificate only for Apple-issued certificates
//! (apple-oss-distributions/Security, `StaticCode.cpp`, `verifySignature`). So a
//! team id or signing id is only the developer's when the signature satisfies a
//! requirement anchored at Apple. The daemon classifies every signature into an
//! [`Anchor`] (on macOS, `daemon/src/checkin/peer/signature.rs` holds the requirement
//! texts and the classification), puts a team id or signing id into the
//! [`Subject`](crate::Subject) only when [`Anchor::chains_to_apple`], and records
//! the anchor in every decision.

use std::fmt;
use std::str::FromStr;

/// What a code signature is anchored at, checked in this order by the daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Anchor {
    /// Apple's own code: the signature satisfies `anchor apple` (Apple's own
    /// signing certificates: the binaries macOS ships; Apple's syspolicyd calls
    /// this authority "Apple System"). Such code has no team id; a rule names it
    /// with `platform = true` and its `signing_id` (e.g. `com.apple.ls`).
    Apple,
    /// Developer ID: `anchor apple generic` with the Developer ID CA marker on
    /// the intermediate (1.2.840.113635.100.6.2.6) and the Developer ID
    /// Application marker on the leaf (1.2.840.113635.100.6.1.13).
    DeveloperId,
    /// Mac App Store: `anchor apple generic` with the Mac App Store marker on
    /// the leaf (1.2.840.113635.100.6.1.9): code Apple re-signed for the store.
    AppStore,
    /// Apple Development or Apple Distribution (and their older names, Mac
    /// Developer and 3rd Party Mac Developer Application): `anchor apple generic`
    /// with one of the leaf markers 1.2.840.113635.100.6.1.12, .1.2, .1.7 or .1.4.
    /// Issued to a team by Apple, so its team id is the team's.
    AppleDevelopment,
    /// Ad hoc: signed with no identity at all (every locally linked arm64
    /// binary). Its cdhash still pins the code; it has no team.
    AdHoc,
    /// Validly signed, but not by a certificate Apple issued for code (e.g. a
    /// self-signed certificate claiming someone's team id). Its team id and
    /// signing id are claims anyone can make.
    Untrusted,
    /// A signature is there but does not verify (the code was modified, or the
    /// signature is malformed).
    Invalid,
    /// No signature.
    Unsigned,
    /// The executable could not be read (on macOS, typically a daemon without
    /// Full Disk Access and an executable in a TCC-protected folder): nothing is
    /// known about its signature, which is not the same as unsigned.
    Unreadable,
}

impl Anchor {
    /// Every anchor, in the order the daemon checks them.
    pub const ALL: [Anchor; 9] = [
        Anchor::Apple,
        Anchor::DeveloperId,
        Anchor::AppStore,
        Anchor::AppleDevelopment,
        Anchor::AdHoc,
        Anchor::Untrusted,
        Anchor::Invalid,
        Anchor::Unsigned,
        Anchor::Unreadable,
    ];

    /// The word the audit log, `explain` and the CLI use.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Anchor::Apple => "apple",
            Anchor::DeveloperId => "developer-id",
            Anchor::AppStore => "app-store",
            Anchor::AppleDevelopment => "apple-development",
            Anchor::AdHoc => "ad-hoc",
            Anchor::Untrusted => "untrusted",
            Anchor::Invalid => "invalid",
            Anchor::Unsigned => "unsigned",
            Anchor::Unreadable => "unreadable",
        }
    }

    /// Whether the signature satisfies a requirement anchored at Apple: only
    /// then do its team id and signing id name a developer.
    #[must_use]
    pub fn chains_to_apple(self) -> bool {
        matches!(
            self,
            Anchor::Apple | Anchor::DeveloperId | Anchor::AppStore | Anchor::AppleDevelopment
        )
    }
}

impl fmt::Display for Anchor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An anchor word that is not one of [`Anchor::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown anchor `{0}` (expected one of: apple, developer-id, app-store, apple-development, ad-hoc, untrusted, invalid, unsigned, unreadable)")]
pub struct UnknownAnchor(pub String);

impl FromStr for Anchor {
    type Err = UnknownAnchor;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Anchor::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownAnchor(s.to_owned()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_anchor_reads_back_from_its_word() {
        for a in Anchor::ALL {
            assert_eq!(a.as_str().parse::<Anchor>(), Ok(a));
        }
        assert!("self-signed".parse::<Anchor>().is_err());
    }

    #[test]
    fn only_apple_issued_signatures_chain_to_apple() {
        let chained: Vec<_> = Anchor::ALL
            .into_iter()
            .filter(|a| a.chains_to_apple())
            .collect();
        assert_eq!(
            chained,
            [
                Anchor::Apple,
                Anchor::DeveloperId,
                Anchor::AppStore,
                Anchor::AppleDevelopment
            ]
        );
    }
}
