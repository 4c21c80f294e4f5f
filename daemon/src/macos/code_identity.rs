//! The code signature of a running process, from its audit token, through the
//! Security framework's `SecCode` API (bindings: `objc2-security`).
//!
//! The chain (`<Security/SecCode.h>`, `<Security/CSCommon.h>`):
//!
//! 1. `SecCodeCopyGuestWithAttributes(NULL, {kSecGuestAttributeAudit: token})`: the
//!    kernel, as code-signing host, names the running code of exactly that process
//!    (pid *and* pid version).
//! 2. `SecCodeCheckValidity(code, kSecCSNoNetworkAccess, NULL)`: the kernel's dynamic
//!    status is valid *and* the on-disk code still matches what runs
//!    (`errSecCSStaticCodeChanged` otherwise), so the information read next from
//!    disk describes the running code.
//! 3. When that passed: `SecCodeCheckValidity(code, flags, requirement)` for each of
//!    `crate::checkin::peer::signature::REQUIREMENTS` in order (`anchor apple`, Developer
//!    ID, Mac App Store, Apple Development/Distribution), until one is satisfied:
//!    without a requirement a self-signed certificate claiming any team id is
//!    "valid" (apple-oss-distributions/Security, `StaticCode.cpp`,
//!    `verifySignature`).
//! 4. `SecCodeCopyStaticCode` + `SecCodeCopySigningInformation(kSecCSSigningInformation)`:
//!    team id, signing id, cdhash (`kSecCodeInfoUnique`), flags (ad hoc or not).
//!
//! The result is a plain struct; which anchor it shows and whether its team id
//! and signing id count is decided by the pure `crate::checkin::peer::signature`
//! ([`CodeIdentity::facts`]), tested on every platform.

use std::ptr::NonNull;
use std::sync::OnceLock;

use metalift_policy::Anchor;
use objc2_core_foundation::{CFData, CFDictionary, CFNumber, CFRetained, CFString, CFType};
use objc2_security::{
    kSecCSSigningInformation, kSecCodeInfoFlags, kSecCodeInfoIdentifier,
    kSecCodeInfoTeamIdentifier, kSecCodeInfoUnique, kSecGuestAttributeAudit, SecCSFlags, SecCode,
    SecCodeSignatureFlags, SecRequirement, SecStaticCode,
};

use super::audit_token::AuditToken;
use crate::checkin::peer::signature::{SignatureFacts, REQUIREMENTS};

/// `errSecSuccess`.
const ERR_SEC_SUCCESS: i32 = 0;

/// What the Security framework says about a running process's code.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CodeIdentity {
    /// The `OSStatus` of the validity check without a requirement (0 when valid:
    /// signed, dynamically valid, on-disk code unchanged; e.g. -67062 unsigned).
    pub validity_status: i32,
    /// The first Apple-anchored requirement the code satisfies, if any.
    pub satisfied: Option<Anchor>,
    /// The signature is ad hoc (`kSecCodeSignatureAdhoc`): no signing identity,
    /// e.g. every linker-signed arm64 binary built locally.
    pub adhoc: bool,
    /// `kSecCodeInfoTeamIdentifier`, as recorded (not yet trusted).
    pub team_id: Option<String>,
    /// `kSecCodeInfoIdentifier`, as recorded (not yet trusted).
    pub signing_id: Option<String>,
    /// `kSecCodeInfoUnique`: the code directory hash (20 bytes).
    pub cdhash: Option<Vec<u8>>,
}

impl CodeIdentity {
    /// The facts `crate::checkin::peer::signature::classify` decides the anchor from.
    #[must_use]
    pub fn facts(&self) -> SignatureFacts {
        SignatureFacts {
            unreadable: None,
            validity_status: self.validity_status,
            adhoc: self.adhoc,
            satisfied: self.satisfied,
        }
    }
}

/// Why no identity could be read at all (the process is then treated as unsigned).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CodeIdentityError {
    /// `SecCodeCopyGuestWithAttributes` failed (e.g. -67065 no such code: exited).
    #[error("SecCodeCopyGuestWithAttributes failed with OSStatus {0}")]
    Guest(i32),
    /// `SecCodeCopyStaticCode` failed.
    #[error("SecCodeCopyStaticCode failed with OSStatus {0}")]
    StaticCode(i32),
    /// `SecCodeCopySigningInformation` failed.
    #[error("SecCodeCopySigningInformation failed with OSStatus {0}")]
    SigningInformation(i32),
    /// `SecRequirementCreateWithString` refused one of our own requirement texts.
    #[error("SecRequirementCreateWithString failed with OSStatus {0}")]
    Requirement(i32),
}

/// Reads the code identity of the process `token` names.
pub fn identify(token: &AuditToken) -> Result<CodeIdentity, CodeIdentityError> {
    let guest = guest_for(token)?;

    // No network: a guest VM without network must not stall a check-in on an
    // OCSP lookup (accepted for SecCode since macOS 11.3; guests are 12+).
    let flags = SecCSFlags::DefaultFlags | SecCSFlags::NoNetworkAccess;
    // SAFETY: `guest` is a valid SecCode; no requirement is passed.
    let validity_status = unsafe { guest.check_validity(flags, None) };
    let satisfied = if validity_status == ERR_SEC_SUCCESS {
        first_satisfied(&guest, flags)?
    } else {
        None
    };

    let mut static_code: *const SecStaticCode = std::ptr::null();
    // SAFETY: `static_code` is a valid out-pointer; `guest` is a valid SecCode.
    let status = unsafe {
        guest.copy_static_code(SecCSFlags::DefaultFlags, NonNull::from(&mut static_code))
    };
    let static_code = match NonNull::new(static_code.cast_mut()) {
        // SAFETY: a Copy-rule function returned this object at +1 on success.
        Some(ptr) if status == ERR_SEC_SUCCESS => unsafe { CFRetained::from_raw(ptr) },
        _ => return Err(CodeIdentityError::StaticCode(status)),
    };

    let mut info: *const CFDictionary = std::ptr::null();
    // SAFETY: `info` is a valid out-pointer; `static_code` is a valid SecStaticCode.
    let status = unsafe {
        SecCode::copy_signing_information(
            &static_code,
            SecCSFlags(kSecCSSigningInformation),
            NonNull::from(&mut info),
        )
    };
    let info = match NonNull::new(info.cast_mut()) {
        // SAFETY: a Copy-rule function returned this dictionary at +1 on success.
        Some(ptr) if status == ERR_SEC_SUCCESS => unsafe { CFRetained::from_raw(ptr) },
        _ => return Err(CodeIdentityError::SigningInformation(status)),
    };
    // SAFETY: the signing-information dictionary is keyed by CFString constants
    // and holds CF objects; it is immutable and kept alive by `info`.
    let info: &CFDictionary<CFString, CFType> = unsafe { info.cast_unchecked() };

    // SAFETY: reading an immutable `extern static` CFString constant.
    let flags_key = unsafe { kSecCodeInfoFlags };
    let flags = info
        .get(flags_key)
        .and_then(|v| v.downcast::<CFNumber>().ok())
        .and_then(|n| n.as_i64())
        .unwrap_or(0);
    let adhoc = flags & i64::from(SecCodeSignatureFlags::Adhoc.bits()) != 0;

    // SAFETY: reading immutable `extern static` CFString constants.
    let (team_key, id_key, unique_key) = unsafe {
        (
            kSecCodeInfoTeamIdentifier,
            kSecCodeInfoIdentifier,
            kSecCodeInfoUnique,
        )
    };
    let string = |key: &CFString| {
        info.get(key)
            .and_then(|v| v.downcast::<CFString>().ok())
            .map(|s| s.to_string())
    };
    let cdhash = info
        .get(unique_key)
        .and_then(|v| v.downcast::<CFData>().ok())
        .map(|d| d.to_vec());

    Ok(CodeIdentity {
        validity_status,
        satisfied,
        adhoc,
        team_id: string(team_key),
        signing_id: string(id_key),
        cdhash,
    })
}

/// Step 3: the first of [`REQUIREMENTS`] the running code satisfies.
/// `SecCodeCheckValidity` with a requirement re-checks the code's dynamic state
/// too, so the answer is about the process, not a file.
fn first_satisfied(
    guest: &SecCode,
    flags: SecCSFlags,
) -> Result<Option<Anchor>, CodeIdentityError> {
    for (anchor, requirement) in requirements()? {
        // SAFETY: `guest` is a valid SecCode and `requirement` a valid SecRequirement.
        let status = unsafe { guest.check_validity(flags, Some(requirement)) };
        if status == ERR_SEC_SUCCESS {
            return Ok(Some(*anchor));
        }
    }
    Ok(None)
}

/// [`REQUIREMENTS`] compiled, in order.
struct Compiled(Vec<(Anchor, CFRetained<SecRequirement>)>);

// SAFETY: a SecRequirement is an immutable CF object once created (the Security
// framework offers no call that changes one), and Core Foundation's immutable
// objects may be used from several threads at once; `Compiled` only hands out
// shared references, for `SecCodeCheckValidity` to read.
unsafe impl Send for Compiled {}
// SAFETY: as above.
unsafe impl Sync for Compiled {}

/// The requirements, compiled once per daemon, the first time a signature is
/// checked (issue 24 item 5: they were compiled at every check-in). A text our own
/// Security framework refuses stays refused: the error is kept, as the texts are
/// constants.
fn requirements() -> Result<&'static [(Anchor, CFRetained<SecRequirement>)], CodeIdentityError> {
    static COMPILED: OnceLock<Result<Compiled, CodeIdentityError>> = OnceLock::new();
    let compiled = COMPILED.get_or_init(|| {
        REQUIREMENTS
            .iter()
            .map(|(anchor, text)| Ok((*anchor, compile(text)?)))
            .collect::<Result<Vec<_>, _>>()
            .map(Compiled)
    });
    match compiled {
        Ok(c) => Ok(&c.0),
        Err(e) => Err(*e),
    }
}

/// `SecRequirementCreateWithString` for one of our constant texts.
fn compile(text: &str) -> Result<CFRetained<SecRequirement>, CodeIdentityError> {
    let text = CFString::from_str(text);
    let mut requirement: *mut SecRequirement = std::ptr::null_mut();
    // SAFETY: `text` is a valid CFString; `requirement` is a valid out-pointer.
    let status = unsafe {
        SecRequirement::create_with_string(
            &text,
            SecCSFlags::DefaultFlags,
            NonNull::from(&mut requirement),
        )
    };
    match NonNull::new(requirement) {
        // SAFETY: a Create-rule function returned this object at +1 on success.
        Some(ptr) if status == ERR_SEC_SUCCESS => Ok(unsafe { CFRetained::from_raw(ptr) }),
        _ => Err(CodeIdentityError::Requirement(status)),
    }
}

/// Step 1: the running code for an audit token, with the kernel as host.
fn guest_for(token: &AuditToken) -> Result<CFRetained<SecCode>, CodeIdentityError> {
    let token_data = CFData::from_bytes(&token.to_bytes());
    // SAFETY: reading an immutable `extern static` CFString constant.
    let audit_key = unsafe { kSecGuestAttributeAudit };
    let attributes =
        CFDictionary::<CFString, CFType>::from_slices(&[audit_key], &[token_data.as_ref()]);

    let mut guest: *mut SecCode = std::ptr::null_mut();
    // SAFETY: `attributes` is a CFDictionary of CFString → CFType as the API
    // expects; `guest` is a valid out-pointer; a NULL host means "the kernel".
    let status = unsafe {
        SecCode::copy_guest_with_attributes(
            None,
            Some(attributes.as_opaque()),
            SecCSFlags::DefaultFlags,
            NonNull::from(&mut guest),
        )
    };
    match NonNull::new(guest) {
        // SAFETY: a Copy-rule function returned this object at +1 on success.
        Some(ptr) if status == ERR_SEC_SUCCESS => Ok(unsafe { CFRetained::from_raw(ptr) }),
        _ => Err(CodeIdentityError::Guest(status)),
    }
}
