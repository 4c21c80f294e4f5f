//! Never above the host, at validation: a profile asking more Apple family than the
//! host chip has is applied at the host's family (with a warning that says so), and
//! with the host unknown a ceiling of Apple9 or more draws a warning (Metal turns its
//! own bf16 emulation off there). The reasons are [`crate::ceiling`]'s.

use crate::ceiling::{FamilyCap, BF16_EMULATION_OFF_FAMILY};
use crate::diagnostic::Basis;
use crate::model::{At, FamilyText, RawProfile};
use crate::profile::Capabilities;

use super::Validator;

impl Validator<'_> {
    /// `caps` as the host allows them, and the cap when one applied. Only a numeric
    /// `apple_family_max` can exceed the host: `"host"` already is the host's family.
    pub(super) fn host_ceiling(
        &mut self,
        i: usize,
        profile: &str,
        raw: &RawProfile,
        caps: Capabilities,
    ) -> (Capabilities, Option<FamilyCap>) {
        let Some(At {
            value: FamilyText::Number(_),
            span,
        }) = &raw.apple_family_max
        else {
            return (caps, None);
        };
        let host = &self.opts.host;
        let requested = caps.apple_family_max;
        if let Some(cap) = FamilyCap::for_host(requested, host) {
            self.warn_on(
                Basis::HostChip,
                i,
                span.clone(),
                format!(
                    "{}, as metaliftd on this host applies it: {}; `apple_family_max = \"host\"` follows each host's chip",
                    cap.describe(profile),
                    cap.why()
                ),
            );
            let applied = Capabilities {
                apple_family_max: cap.applied,
                ..caps
            };
            return (applied, Some(cap));
        }
        if host.known_family().is_none() && requested >= BF16_EMULATION_OFF_FAMILY {
            self.warn_on(
                Basis::HostChip,
                i,
                span.clone(),
                format!(
                    "profile `{profile}` asks Apple{requested} and {}, so it cannot be capped at the host's family: at Apple{BF16_EMULATION_OFF_FAMILY} and above Metal turns its own bf16 emulation off, which an M1 or M2 host (Apple7, Apple8) needs; metaliftd caps it where it reads the chip; prefer `apple_family_max = \"host\"`",
                    match &host.brand {
                        Some(b) => format!("the chip `{b}` is not one metalift knows"),
                        None => "the host chip could not be read here".to_owned(),
                    }
                ),
            );
        }
        (caps, None)
    }
}
