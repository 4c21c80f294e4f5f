//! Human byte sizes for profile values: `"12 GiB"`, `"512MiB"`, `"1.5 GB"`, `"4096"`.
//!
//! Binary units (KiB, MiB, GiB, TiB) are powers of 1024, decimal units (kB/KB, MB, GB,
//! TB) powers of 1000, `B` or no unit means bytes. A bare `K`/`M`/`G` is refused:
//! it is ambiguous, and a working-set floor off by 7% is a silent surprise.

/// Parses a human size into bytes, or says what is wrong with it.
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let number = number.replace('_', "");
    let unit = unit.trim();
    if number.is_empty() {
        return Err(format!(
            "`{text}` is not a size: expected a number such as \"12 GiB\""
        ));
    }
    let multiplier: u128 = match unit {
        "" | "B" => 1,
        "KiB" => 1 << 10,
        "MiB" => 1 << 20,
        "GiB" => 1 << 30,
        "TiB" => 1 << 40,
        "kB" | "KB" => 1_000,
        "MB" => 1_000_000,
        "GB" => 1_000_000_000,
        "TB" => 1_000_000_000_000,
        "K" | "M" | "G" | "T" | "k" | "m" | "g" | "t" => {
            return Err(format!(
                "`{text}`: `{unit}` is ambiguous; write `{}iB` (1024-based) or `{}B` (1000-based)",
                unit.to_ascii_uppercase(),
                unit.to_ascii_uppercase()
            ))
        }
        other => {
            return Err(format!(
                "`{text}`: unknown unit `{other}` (use B, KiB, MiB, GiB, TiB, kB, MB, GB or TB)"
            ))
        }
    };
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number.as_str(), ""),
    };
    if whole.is_empty() || frac.contains('.') || frac.len() > 9 {
        return Err(format!(
            "`{text}` is not a number we read (use e.g. 12 or 1.5)"
        ));
    }
    let too_big = || format!("`{text}` is too large");
    let whole: u128 = whole.parse().map_err(|_| too_big())?;
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| too_big())?
    };
    let scale = 10u128.pow(u32::try_from(frac.len()).map_err(|_| too_big())?);
    let bytes = whole
        .checked_mul(multiplier)
        .and_then(|w| w.checked_add(frac_value * multiplier / scale))
        .ok_or_else(too_big)?;
    u64::try_from(bytes).map_err(|_| too_big())
}

#[cfg(test)]
mod tests {
    use super::parse_size;

    #[test]
    fn binary_and_decimal_units_and_fractions() {
        assert_eq!(parse_size("12 GiB"), Ok(12 << 30));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("1.5 GB"), Ok(1_500_000_000));
        assert_eq!(parse_size("0.5 KiB"), Ok(512));
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4_096 B"), Ok(4096));
    }

    #[test]
    fn ambiguous_unknown_and_malformed_sizes_are_refused() {
        assert!(parse_size("12 G").unwrap_err().contains("ambiguous"));
        assert!(parse_size("12 parsecs")
            .unwrap_err()
            .contains("unknown unit"));
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("1.2.3 GiB").is_err());
        assert!(parse_size("99999999999999999999999 TiB").is_err());
    }
}
