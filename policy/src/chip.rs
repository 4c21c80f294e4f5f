//! `apple_family_max = "host"`: the Apple GPU family ceiling of the machine the daemon
//! runs on, from the chip's brand string. Pure: the daemon reads the brand
//! (`sysctl machdep.cpu.brand_string`, in `metalift_daemon::live_policy::host_chip`) and hands it
//! here through [`CompileOptions`].
//!
//! Why a profile may follow the host: llama.cpp's newer Metal backend picks its kernel
//! tuning by the highest Apple family the device claims, so claiming more than the
//! host chip has mis-tunes it, and claiming less leaves speed behind. In a macOS guest
//! the brand names the host's chip, e.g. "Apple M2 (Virtual)".
//!
//! | brand                      | family | evidence |
//! |----------------------------|--------|----------|
//! | Apple M1 (Pro, Max, Ultra) | 7      | Apple's `MTLGPUFamily.apple7`: "A14 and M1 GPUs" |
//! | Apple M2 (…)               | 8      | Apple's `MTLGPUFamily.apple8`: "A15, A16, and M2 GPUs" |
//! | Apple M3, Apple M4 (…)     | 9      | Apple's `MTLGPUFamily.apple9`: "A17, M3, and M4 GPUs" |
//! | Apple M5 (…)               | 10     | observed, see below |
//! | anything else, or unknown  | 7, with a warning | see [`UNKNOWN_HOST_FAMILY`] |
//!
//! The first three rows are Apple's documentation of `MTLGPUFamily`
//! (developer.apple.com/documentation/metal/mtlgpufamily, and the Metal feature set
//! tables, developer.apple.com/metal/limits). For Apple10 Apple's reference lists the
//! case (`MTLGPUFamilyApple10` = 1010, macOS 26 SDK) without naming chips; what names
//! the M5 is what it answers: llama.cpp's Metal backend, which prints the highest
//! Apple family `supportsFamily:` answers, logs "GPU name: Apple M5" with "GPU
//! family: MTLGPUFamilyApple10 (1010)" and Metal4 on an M5 MacBook Pro (llama.cpp
//! build 7217, macOS 26.1, a user's published `llama-cli` log; an M5 Max
//! MacBook Pro, Mac17,7, on macOS 26.6.2 logs the same family), and PyTorch's MPS
//! backend gates its M5 tensor-unit GEMM on `supportsFamily:` 1010 ("MTLGPUFamilyApple10
//! (M5, the first tensor-unit family)", `aten/src/ATen/native/mps`). The M5 Pro, Max
//! and Ultra share the M5's GPU generation, as every earlier generation's variants
//! share theirs.

/// The ceiling `"host"` resolves to when the brand is missing or not one of the
/// table's (a chip newer than this build, an A-series Mac, a brand string that is not
/// Apple's): Apple7, the family of the oldest Apple silicon Mac (M1).
///
/// Why the lowest and not the newest: every Apple silicon Mac has Apple7, and Apple7
/// is what turns llama.cpp's three fast paths on (`has_simdgroup_reduction`,
/// `has_simdgroup_mm`, `has_bfloat`), so an unknown host still gets them. Claiming a
/// family the chip lacks is what does harm: at Apple9 Metal turns its own bf16
/// emulation off (`crate::ceiling`), and llama.cpp runs another chip's tuning. A chip
/// that has more only leaves some tuning unused until metalift knows it.
pub const UNKNOWN_HOST_FAMILY: u8 = 7;

/// The chip generations this build knows, as `(generation, family)`: `("M5", 10)` is
/// "Apple M5", "Apple M5 Pro", "Apple M5 Max (Virtual)"…
pub const KNOWN_CHIPS: &[(&str, u8)] = &[("M1", 7), ("M2", 8), ("M3", 9), ("M4", 9), ("M5", 10)];

/// The table in one line, for messages: "M1 → 7, M2 → 8, M3/M4 → 9, M5 → 10".
#[must_use]
pub fn known_chips_line() -> String {
    let mut groups: Vec<(Vec<&str>, u8)> = Vec::new();
    for (chip, family) in KNOWN_CHIPS {
        match groups.last_mut() {
            Some((chips, f)) if f == family => chips.push(chip),
            _ => groups.push((vec![chip], *family)),
        }
    }
    groups
        .iter()
        .map(|(chips, family)| format!("{} → {family}", chips.join("/")))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The Apple family of a chip brand string, `None` when the brand is not known.
#[must_use]
pub fn apple_family_for_brand(brand: &str) -> Option<u8> {
    let mut words = brand.split_whitespace();
    // "Apple M3 Max (Virtual)": the word after "Apple" is the chip generation.
    words.find(|w| *w == "Apple")?;
    let generation = words.next()?;
    KNOWN_CHIPS
        .iter()
        .find(|(chip, _)| *chip == generation)
        .map(|(_, family)| *family)
}

/// The host's chip as far as compiling a policy needs it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct HostFamily {
    /// The brand string read from the machine (or its override), if any.
    pub brand: Option<String>,
}

impl HostFamily {
    /// A host whose brand is `brand`.
    #[must_use]
    pub fn from_brand(brand: impl Into<String>) -> Self {
        HostFamily {
            brand: Some(brand.into()),
        }
    }

    /// The ceiling `"host"` resolves to: the brand's family, or
    /// [`UNKNOWN_HOST_FAMILY`] when it is unknown.
    #[must_use]
    pub fn family(&self) -> u8 {
        self.known_family().unwrap_or(UNKNOWN_HOST_FAMILY)
    }

    /// The brand's family, `None` when the brand is missing or unknown.
    #[must_use]
    pub fn known_family(&self) -> Option<u8> {
        self.brand.as_deref().and_then(apple_family_for_brand)
    }

    /// How explanations name the source of the value: `host: Apple M2 (Virtual)`.
    #[must_use]
    pub fn describe(&self) -> String {
        match (&self.brand, self.known_family()) {
            (Some(b), Some(_)) => format!("host: {b}"),
            (Some(b), None) => {
                format!("host: unknown chip `{b}`, so {UNKNOWN_HOST_FAMILY}")
            }
            (None, _) => format!("host: chip unknown, so {UNKNOWN_HOST_FAMILY}"),
        }
    }
}

/// What compiling a policy needs to know about the machine it will decide on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CompileOptions {
    /// What `apple_family_max = "host"` resolves to.
    pub host: HostFamily,
    /// When the policy is compiled, for the warning on a rule whose window has
    /// already closed (`until` in the past). `None`: no such warning (the policy
    /// crate reads no clock; its caller says what time it is).
    pub now: Option<std::time::SystemTime>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn brands_map_to_their_apple_family() {
        for (brand, family) in [
            ("Apple M1", Some(7)),
            ("Apple M1 Ultra", Some(7)),
            ("Apple M2 (Virtual)", Some(8)),
            ("Apple M2 Pro", Some(8)),
            ("Apple M3 Max (Virtual)", Some(9)),
            ("Apple M4 Pro", Some(9)),
            ("Apple M4", Some(9)),
            ("Apple M5", Some(10)),
            ("Apple M5 Pro (Virtual)", Some(10)),
            ("Apple M5 Max", Some(10)),
            ("Apple M6", None),
            ("Apple M12", None),
            ("Apple A12Z", None),
            ("Intel(R) Core(TM) i9-9980HK CPU @ 2.40GHz", None),
            ("M2", None),
            ("", None),
        ] {
            assert_eq!(apple_family_for_brand(brand), family, "{brand}");
        }
    }

    #[test]
    fn an_unknown_or_missing_brand_resolves_to_7() {
        assert_eq!(HostFamily::default().family(), 7);
        assert_eq!(HostFamily::from_brand("Apple M9").family(), 7);
        assert_eq!(HostFamily::from_brand("Apple M3 Max (Virtual)").family(), 9);
        assert_eq!(HostFamily::from_brand("Apple M5 (Virtual)").family(), 10);
    }

    #[test]
    fn the_table_in_one_line_names_every_known_chip() {
        assert_eq!(known_chips_line(), "M1 → 7, M2 → 8, M3/M4 → 9, M5 → 10");
    }
}
