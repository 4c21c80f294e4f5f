//! Which [`Anchor`] a code signature has, and so whether its team id and signing
//! id may reach a [`Subject`](metalift_policy::Subject): pure logic, built and
//! tested on every platform; the macOS module (`crate::macos::code_identity`)
//! only asks the Security framework the questions listed here.
//!
//! `SecCodeCheckValidity` without a requirement accepts a signature that chains
//! to any root, a self-signed one included, and the team id in the CodeDirectory
//! is checked against the certificate only for Apple-issued certificates
//! (apple-oss-distributions/Security, `OSX/libsecurity_codesigning/lib/StaticCode.cpp`,
//! `SecStaticCode::verifySignature`). So each signature that validates is also
//! checked against the requirements below, in order, and the first it satisfies
//! names its anchor. The requirement texts are Apple's own:
//!
//! - `anchor apple`: Apple's own code (syspolicyd's authority "Apple System";
//!   Apple, "Code Signing Requirement Language", TN2206 / Code Signing Guide).
//! - Developer ID: `anchor apple generic and certificate 1[field.1.2.840.113635.100.6.2.6]
//!   exists and certificate leaf[field.1.2.840.113635.100.6.1.13] exists` — the
//!   Developer ID CA marker on the intermediate, the Developer ID Application
//!   marker on the leaf (the designated requirement Xcode writes for Developer ID
//!   apps; syspolicyd's "Developer ID" authority; Santa's MOLCodesignChecker
//!   validates with such a requirement, `validateWithRequirement:`).
//! - Mac App Store: `anchor apple generic and certificate
//!   leaf[field.1.2.840.113635.100.6.1.9] exists` (syspolicyd's "Mac App Store").
//! - Apple Development / Distribution: `anchor apple generic` and one of the leaf
//!   markers 1.2.840.113635.100.6.1.12 (Mac Development), .1.2 (iPhone/Apple
//!   Development), .1.7 (Mac App Submission, i.e. Apple Distribution / 3rd Party
//!   Mac Developer Application) or .1.4 (iPhone Distribution), the OIDs Apple's
//!   certificate policy assigns to the certificates its WWDR CA issues to teams.
//!
//! A signature that validates but satisfies none of them is [`Anchor::Untrusted`]:
//! its identifiers are claims anyone can make (fail closed: an Apple certificate
//! kind not listed here is untrusted until it is added).

use metalift_policy::Anchor;

/// `errSecCSUnsigned` (`<Security/CSCommon.h>`): the code has no signature.
pub const ERR_SEC_CS_UNSIGNED: i32 = -67062;

/// `errSecCSStaticCodeChanged` (`<Security/CSCommon.h>`, apple-oss-distributions/
/// Security `OSX/libsecurity_codesigning/lib/CSCommon.h`: "the code on disk does
/// not match what is running"): what `SecCodeCheckValidity` on a running guest
/// returns when its file was replaced or rewritten since it started
/// (Security `Code.cpp`, `SecCode::checkValidity`).
pub const ERR_SEC_CS_STATIC_CODE_CHANGED: i32 = -67034;

/// Whether hashes read from the executable's *file* — its sha256, and the cdhash
/// of the signature on disk — describe the code that runs, judged from the
/// validity check's status. `Err` says why not, for the decision record: the file
/// at the path is no longer the code that was loaded, so a `sha256` (or `cdhash`)
/// rule matching the file would match code that is not running.
///
/// Only `errSecCSStaticCodeChanged` proves the mismatch: an unsigned file
/// (`errSecCSUnsigned`) gives the kernel nothing to compare, and `sha256` rules
/// exist for exactly such binaries; the open file is then pinned by inode
/// (`peer/macos.rs`, `same_file`).
pub fn file_hashes(validity_status: i32) -> Result<(), &'static str> {
    if validity_status == ERR_SEC_CS_STATIC_CODE_CHANGED {
        Err("the running code no longer matches its file (errSecCSStaticCodeChanged)")
    } else {
        Ok(())
    }
}

/// The requirement every Apple-chained kind is checked with, in the order
/// [`classify`] tries them. Compiled by `SecRequirementCreateWithString`.
pub const REQUIREMENTS: [(Anchor, &str); 4] = [
    (Anchor::Apple, "anchor apple"),
    (
        Anchor::DeveloperId,
        "anchor apple generic and certificate 1[field.1.2.840.113635.100.6.2.6] exists \
         and certificate leaf[field.1.2.840.113635.100.6.1.13] exists",
    ),
    (
        Anchor::AppStore,
        "anchor apple generic and certificate leaf[field.1.2.840.113635.100.6.1.9] exists",
    ),
    (
        Anchor::AppleDevelopment,
        "anchor apple generic and (certificate leaf[field.1.2.840.113635.100.6.1.12] exists \
         or certificate leaf[field.1.2.840.113635.100.6.1.2] exists \
         or certificate leaf[field.1.2.840.113635.100.6.1.7] exists \
         or certificate leaf[field.1.2.840.113635.100.6.1.4] exists)",
    ),
];

/// What the Security framework said about one running process's code.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SignatureFacts {
    /// Why the executable could not be read by the daemon, if it could not (on
    /// macOS: `open` refused, e.g. by TCC without Full Disk Access). Decides
    /// before anything else: an unread signature is unknown, not absent.
    pub unreadable: Option<String>,
    /// The `OSStatus` of the validity check without a requirement (0: valid).
    pub validity_status: i32,
    /// `kSecCodeSignatureAdhoc` is set.
    pub adhoc: bool,
    /// The first of [`REQUIREMENTS`] the code satisfies, if any.
    pub satisfied: Option<Anchor>,
}

/// The anchor these facts show (see the module doc for the order).
#[must_use]
pub fn classify(facts: &SignatureFacts) -> Anchor {
    if facts.unreadable.is_some() {
        Anchor::Unreadable
    } else if facts.validity_status == ERR_SEC_CS_UNSIGNED {
        Anchor::Unsigned
    } else if facts.validity_status != 0 {
        Anchor::Invalid
    } else if facts.adhoc {
        Anchor::AdHoc
    } else {
        // Only the Apple-chained kinds are ever recorded as satisfied.
        facts
            .satisfied
            .filter(|a| a.chains_to_apple())
            .unwrap_or(Anchor::Untrusted)
    }
}

/// The team id and signing id a subject may carry: those of a signature that
/// chains to Apple, none otherwise. The one place that decides it, so the
/// matcher, `explain` and the audit record all see the same thing.
#[must_use]
pub fn trusted_ids(
    anchor: Anchor,
    team_id: Option<&str>,
    signing_id: Option<&str>,
) -> (Option<String>, Option<String>) {
    if anchor.chains_to_apple() {
        (team_id.map(str::to_owned), signing_id.map(str::to_owned))
    } else {
        (None, None)
    }
}

/// Whether a signature with this anchor pins its code by cdhash: any signature
/// that validated (ad hoc and untrusted included: the hash names the exact code,
/// whoever signed it).
#[must_use]
pub fn cdhash_counts(anchor: Anchor) -> bool {
    !matches!(
        anchor,
        Anchor::Unsigned | Anchor::Invalid | Anchor::Unreadable
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn valid(satisfied: Option<Anchor>) -> SignatureFacts {
        SignatureFacts {
            satisfied,
            ..SignatureFacts::default()
        }
    }

    #[test]
    fn given_a_valid_signature_satisfying_no_apple_requirement_then_it_is_untrusted() {
        // A self-signed certificate claiming a team id: valid, and nothing more.
        assert_eq!(classify(&valid(None)), Anchor::Untrusted);
        assert_eq!(
            trusted_ids(
                Anchor::Untrusted,
                Some("ABCDE12345"),
                Some("com.example.runner")
            ),
            (None, None)
        );
    }

    #[test]
    fn given_each_apple_requirement_then_its_anchor_and_the_ids_count() {
        for (anchor, _) in REQUIREMENTS {
            assert_eq!(classify(&valid(Some(anchor))), anchor);
            assert_eq!(
                trusted_ids(anchor, Some("ABCDE12345"), Some("com.example.runner")),
                (Some("ABCDE12345".into()), Some("com.example.runner".into()))
            );
        }
    }

    #[test]
    fn given_an_unreadable_executable_then_it_is_unreadable_never_unsigned() {
        let facts = SignatureFacts {
            unreadable: Some("permission denied".into()),
            validity_status: ERR_SEC_CS_UNSIGNED,
            ..SignatureFacts::default()
        };
        assert_eq!(classify(&facts), Anchor::Unreadable);
    }

    #[test]
    fn given_no_signature_a_broken_one_or_an_ad_hoc_one_then_it_says_which() {
        let status = |validity_status| SignatureFacts {
            validity_status,
            ..SignatureFacts::default()
        };
        assert_eq!(classify(&status(ERR_SEC_CS_UNSIGNED)), Anchor::Unsigned);
        assert_eq!(classify(&status(-67061)), Anchor::Invalid); // errSecCSSignatureFailed
        let adhoc = SignatureFacts {
            adhoc: true,
            satisfied: Some(Anchor::DeveloperId),
            ..SignatureFacts::default()
        };
        assert_eq!(classify(&adhoc), Anchor::AdHoc, "ad hoc never chains");
        assert!(cdhash_counts(Anchor::AdHoc) && cdhash_counts(Anchor::Untrusted));
        assert!(!cdhash_counts(Anchor::Unsigned) && !cdhash_counts(Anchor::Unreadable));
    }

    #[test]
    fn given_code_that_changed_on_disk_then_no_file_hash_counts_and_the_reason_says_why() {
        let why = file_hashes(ERR_SEC_CS_STATIC_CODE_CHANGED).unwrap_err();
        assert!(why.contains("errSecCSStaticCodeChanged"), "{why}");
        let changed = SignatureFacts {
            validity_status: ERR_SEC_CS_STATIC_CODE_CHANGED,
            ..SignatureFacts::default()
        };
        assert_eq!(classify(&changed), Anchor::Invalid);
        assert!(!cdhash_counts(classify(&changed)));
        // Unsigned or valid code: the file's hashes describe what runs.
        assert_eq!(file_hashes(ERR_SEC_CS_UNSIGNED), Ok(()));
        assert_eq!(file_hashes(0), Ok(()));
    }

    #[test]
    fn every_requirement_is_anchored_at_apple() {
        for (anchor, text) in REQUIREMENTS {
            assert!(anchor.chains_to_apple(), "{anchor}");
            assert!(text.starts_with("anchor apple"), "{text}");
        }
    }
}
