//! Never above the host: a profile's Apple family ceiling is applied at most at the
//! host chip's family, when the chip is known.
//!
//! Why: Metal derives its own behaviour from the family answers the shim changes.
//! `-[_MTLDevice requiresBFloat16Emulation]` returns `!supportsFamily:Apple9` (a
//! decompile of Metal.framework's `_MTLDevice`; `../shared/REAL-METAL.md` §4), so a
//! process told Apple9 on an M1 or M2 host (Apple7, Apple8 hardware) has Metal's own
//! bf16 emulation switched off for a GPU that needs it. And llama.cpp tunes by the
//! highest family answered (ggml-org/llama.cpp, `ggml-metal-device.m`: the highest
//! `supportsFamily:` in the Apple range becomes `props.gpu_family`;
//! `ggml-metal-tuning.cpp`, `fa_vec_pick`: a device whose name matches no tuned SKU —
//! the "Apple Paravirtual device" — is looked up under its family's representative,
//! Apple9 → the M4 Max table), so a claimed Apple9 runs M4 Max tuning on an M1.
//!
//! Pure: the host comes in through [`HostFamily`], the brand the daemon (or
//! `metalift validate` / `explain`) read. The cap is applied when a policy compiles,
//! so every verdict, decision record and explanation reads the same applied value.

use std::sync::Arc;

use crate::chip::HostFamily;

/// The first Apple family at which Metal turns its own bf16 emulation off
/// (`requiresBFloat16Emulation` = `!supportsFamily:Apple9`).
pub const BF16_EMULATION_OFF_FAMILY: u8 = 9;

/// A profile whose `apple_family_max` asked more than the host chip has, and what is
/// applied instead.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyCap {
    /// What the profile asks (its `apple_family_max`).
    pub requested: u8,
    /// What the shim is told: the host chip's family.
    pub applied: u8,
    /// The host chip's brand string, e.g. "Apple M1 (Virtual)". Shared: every
    /// verdict of a capped profile carries it.
    pub host: Arc<str>,
}

impl FamilyCap {
    /// The cap for a profile asking `requested` on `host`: `None` when the host chip
    /// is unknown (nothing to cap at) or has at least `requested`.
    #[must_use]
    pub fn for_host(requested: u8, host: &HostFamily) -> Option<FamilyCap> {
        let (brand, family) = (host.brand.as_deref()?, host.known_family()?);
        (requested > family).then(|| FamilyCap {
            requested,
            applied: family,
            host: Arc::from(brand),
        })
    }

    /// One line for explanations and the audit log: "profile `apple9` asks Apple9;
    /// this host (Apple M1 (Virtual)) has Apple7: applied as Apple7".
    #[must_use]
    pub fn describe(&self, profile: &str) -> String {
        format!(
            "profile `{profile}` asks Apple{}; this host ({}) has Apple{}: applied as Apple{}",
            self.requested, self.host, self.applied, self.applied
        )
    }

    /// Why the cap exists, for the policy's load warning.
    #[must_use]
    pub fn why(&self) -> String {
        let bf16 = if self.requested >= BF16_EMULATION_OFF_FAMILY
            && self.applied < BF16_EMULATION_OFF_FAMILY
        {
            " (at Apple9 Metal turns its own bf16 emulation off, which this chip needs)"
        } else {
            ""
        };
        format!(
            "an unlock never claims more than the host chip has: Metal derives its own behaviour from the family answers{bf16}"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ceiling_above_a_known_host_is_capped_at_the_hosts_family() {
        let m1 = HostFamily::from_brand("Apple M1 (Virtual)");
        let cap = FamilyCap::for_host(9, &m1).expect("capped");
        assert_eq!((cap.requested, cap.applied), (9, 7));
        assert_eq!(
            cap.describe("apple9"),
            "profile `apple9` asks Apple9; this host (Apple M1 (Virtual)) has Apple7: applied as Apple7"
        );
        assert!(cap.why().contains("bf16 emulation off"), "{}", cap.why());
        // Asking 8 on an M1: capped, but bf16 is not the reason.
        let eight = FamilyCap::for_host(8, &m1).expect("capped");
        assert!(!eight.why().contains("bf16"), "{}", eight.why());
    }

    #[test]
    fn at_or_below_the_host_or_on_an_unknown_host_nothing_is_capped() {
        let m1 = HostFamily::from_brand("Apple M1 (Virtual)");
        assert_eq!(FamilyCap::for_host(7, &m1), None);
        assert_eq!(FamilyCap::for_host(5, &m1), None);
        let m3 = HostFamily::from_brand("Apple M3 Max (Virtual)");
        assert_eq!(FamilyCap::for_host(9, &m3), None);
        assert_eq!(FamilyCap::for_host(9, &HostFamily::default()), None);
        assert_eq!(
            FamilyCap::for_host(9, &HostFamily::from_brand("Apple M9")),
            None
        );
    }
}
