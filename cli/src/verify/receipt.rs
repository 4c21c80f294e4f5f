//! The receipt's facts about this machine and the files that ran: sha256 of the
//! shim and the probe, the OS product version, and whether the stock device
//! already answers the profile's claim.

use std::path::Path;

use metalift_daemon::audit::receipt::DeviceAnswers;
use metalift_policy::Capabilities;
use sha2::{Digest, Sha256};

/// The sha256 of `path`'s bytes, hex (`None`: unreadable).
pub(crate) fn sha256_file(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    Some(hex::encode(Sha256::digest(&bytes)))
}

/// `sw_vers -productVersion` on macOS (e.g. `15.3.1`); `None` elsewhere or when
/// it does not answer.
pub(crate) fn os_product_version() -> Option<String> {
    if !cfg!(target_os = "macos") {
        return None;
    }
    let out = std::process::Command::new("/usr/bin/sw_vers")
        .arg("-productVersion")
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !text.is_empty()).then_some(text)
}

/// Whether the unlock changes anything the profile claims: `false` when the stock
/// device already answers the family, the threadgroup memory and the llama.cpp
/// flags the unlocked one does.
pub(crate) fn unlock_needed(
    stock: &DeviceAnswers,
    effective: &DeviceAnswers,
    caps: &Capabilities,
) -> bool {
    let claims_ok = crate::gpu::short_of(stock, caps).is_empty();
    let flags_ok = (stock.has_simdgroup_reduction || !effective.has_simdgroup_reduction)
        && (stock.has_simdgroup_mm || !effective.has_simdgroup_mm)
        && (stock.has_bfloat || !effective.has_bfloat);
    !(claims_ok && flags_ok)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers(family: u8, flags: bool) -> DeviceAnswers {
        DeviceAnswers {
            apple_family: Some(family),
            max_threadgroup_memory: 32768,
            recommended_working_set: None,
            has_simdgroup_reduction: flags,
            has_simdgroup_mm: flags,
            has_bfloat: flags,
        }
    }

    #[test]
    fn a_stock_apple5_needs_an_apple7_unlock_and_a_stock_apple7_does_not() {
        let caps = Capabilities {
            apple_family_max: 7,
            max_threadgroup_memory: 32768,
            recommended_working_set: None,
        };
        assert!(unlock_needed(&answers(5, false), &answers(7, true), &caps));
        assert!(!unlock_needed(&answers(7, true), &answers(7, true), &caps));
    }
}
