//! `--expect-family N` and `--expect-family =N` (`metalift-probe`, `metalift exec`):
//! what a CI check asks of the Apple GPU families a device answers.
//!
//! Why "at least" is the default: llama.cpp's fast paths ask `supportsFamily:` for one
//! family and take any device that says YES (`has_simdgroup_reduction` and
//! `has_simdgroup_mm` need Apple7, `has_bfloat` Apple6 — `ggml-metal-device.m`), and
//! `apple_family_max = "host"` gives 7, 8, 9 or 10 depending on the host chip. So a
//! recipe that checks "Apple7 or above" holds on every host, where "exactly Apple7"
//! failed on M2 to M5 hosts (issue 26). `=N` keeps the exact check for whoever pins
//! a number.

use std::fmt;
use std::str::FromStr;

use crate::profile::MAX_APPLE_FAMILY;

/// What `--expect-family` asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyExpectation {
    /// `N`: the device answers YES for AppleN (and so, on Apple GPUs, every family below).
    AtLeast(u8),
    /// `=N`: YES for AppleN and NO for Apple(N+1).
    Exactly(u8),
}

impl FamilyExpectation {
    /// Whether a device answering `supports(n)` for Apple`n` meets it.
    #[must_use]
    pub fn holds(self, supports: impl Fn(u8) -> bool) -> bool {
        match self {
            FamilyExpectation::AtLeast(n) => supports(n),
            FamilyExpectation::Exactly(n) => supports(n) && !supports(n.saturating_add(1)),
        }
    }
}

impl fmt::Display for FamilyExpectation {
    /// "Apple7 or above", "exactly Apple7".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FamilyExpectation::AtLeast(n) => write!(f, "Apple{n} or above"),
            FamilyExpectation::Exactly(n) => write!(f, "exactly Apple{n}"),
        }
    }
}

impl FromStr for FamilyExpectation {
    type Err = String;

    /// `7` or `=7` (also `Apple7`, `=Apple7`); 1 to [`MAX_APPLE_FAMILY`].
    fn from_str(text: &str) -> Result<Self, String> {
        let (exact, number) = match text.strip_prefix('=') {
            Some(rest) => (true, rest),
            None => (false, text),
        };
        let number = number.strip_prefix("Apple").unwrap_or(number);
        let n: u8 = number
            .parse()
            .ok()
            .filter(|n| (1..=MAX_APPLE_FAMILY).contains(n))
            .ok_or_else(|| {
                format!(
                    "`{text}`: expected N (AppleN or above) or =N (exactly AppleN), N from 1 to {MAX_APPLE_FAMILY}"
                )
            })?;
        Ok(if exact {
            FamilyExpectation::Exactly(n)
        } else {
            FamilyExpectation::AtLeast(n)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up_to(top: u8) -> impl Fn(u8) -> bool {
        move |n| n <= top
    }

    #[test]
    fn a_bare_number_is_at_least_and_an_equals_sign_is_exactly() {
        assert_eq!("7".parse(), Ok(FamilyExpectation::AtLeast(7)));
        assert_eq!("=7".parse(), Ok(FamilyExpectation::Exactly(7)));
        assert_eq!("=Apple9".parse(), Ok(FamilyExpectation::Exactly(9)));
        for bad in ["", "=", "x", "0", "11", ">7", "7.0"] {
            assert!(bad.parse::<FamilyExpectation>().is_err(), "{bad}");
        }
    }

    #[test]
    fn at_least_7_holds_on_every_host_family_and_exactly_7_only_on_apple7() {
        for top in [7, 8, 9, 10] {
            assert!(FamilyExpectation::AtLeast(7).holds(up_to(top)), "{top}");
        }
        assert!(!FamilyExpectation::AtLeast(7).holds(up_to(5)));
        assert!(FamilyExpectation::Exactly(7).holds(up_to(7)));
        assert!(!FamilyExpectation::Exactly(7).holds(up_to(9)));
        assert!(!FamilyExpectation::Exactly(7).holds(up_to(5)));
        assert_eq!(FamilyExpectation::AtLeast(7).to_string(), "Apple7 or above");
        assert_eq!(FamilyExpectation::Exactly(7).to_string(), "exactly Apple7");
    }
}
