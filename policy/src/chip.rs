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
//! | brand                      | family |
//! |----------------------------|--------|
//! | Apple M1 (Pro, Max, Ultra) | 7      |
//! | Apple M2 (…)               | 8      |
//! | Apple M3, Apple M4 (…)     | 9      |
//! | anything else, or unknown  | 7, with a warning |

/// The ceiling used when the brand is missing or not one of the table's.
pub const UNKNOWN_HOST_FAMILY: u8 = 7;

/// The Apple family of a chip brand string, `None` when the brand is not known.
#[must_use]
pub fn apple_family_for_brand(brand: &str) -> Option<u8> {
    let mut words = brand.split_whitespace();
    // "Apple M3 Max (Virtual)": the word after "Apple" is the chip generation.
    words.find(|w| *w == "Apple")?;
    let generation = words.next()?.strip_prefix('M')?;
    match generation {
        "1" => Some(7),
        "2" => Some(8),
        "3" | "4" => Some(9),
        _ => None,
    }
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
    }
}
