//! `--since` / `--until` values: an RFC 3339 time, `today`, `yesterday`, `now`, or
//! a duration ago (`10m`, `2h`, `1day`).

use std::time::{Duration, SystemTime};

use super::local_day;

/// A point in time as the admin wrote it, resolved against "now" when the command starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum When {
    /// An absolute time (`2026-11-30T11:00:00Z`, `2026-11-30T12:00:00+01:00`, `2026-11-30`).
    At(SystemTime),
    /// That long before now.
    Ago(Duration),
    /// Local midnight that began today.
    Today,
    /// Local midnight that began yesterday.
    Yesterday,
}

/// Parses a `--since`/`--until` argument (clap's value parser).
pub fn parse(text: &str) -> Result<When, String> {
    let t = text.trim();
    match t {
        "today" => return Ok(When::Today),
        "yesterday" => return Ok(When::Yesterday),
        "now" => return Ok(When::Ago(Duration::ZERO)),
        _ => {}
    }
    if let Ok(d) = humantime::parse_duration(t) {
        return Ok(When::Ago(d));
    }
    parse_time(t).map(When::At).ok_or_else(|| {
        format!(
            "{text:?} is not a time: use RFC 3339 (2026-11-30T11:00:00Z or with +01:00), \
             a date (2026-11-30, UTC), today, yesterday, or a duration ago (10m, 2h, 1day)"
        )
    })
}

/// An RFC 3339 time with `Z` or a `±HH:MM` offset, or a bare date (midnight UTC).
fn parse_time(t: &str) -> Option<SystemTime> {
    if t.len() == 10 && t.as_bytes()[4] == b'-' {
        return humantime::parse_rfc3339(&format!("{t}T00:00:00Z")).ok();
    }
    if let Some(utc) = t.strip_suffix('Z').or_else(|| t.strip_suffix('z')) {
        return humantime::parse_rfc3339_weak(utc).ok();
    }
    // `±HH:MM` offset: parse the local part as UTC, then shift.
    let split = t.len().checked_sub(6)?;
    let (local, offset) = (t.get(..split)?, t.get(split..)?);
    let sign = match offset.as_bytes()[0] {
        b'+' => 1i64,
        b'-' => -1,
        _ => return humantime::parse_rfc3339_weak(t).ok(),
    };
    let hours: u64 = offset.get(1..3)?.parse().ok()?;
    let minutes: u64 = offset.get(4..6)?.parse().ok()?;
    if offset.as_bytes()[3] != b':' || hours > 23 || minutes > 59 {
        return None;
    }
    let shift = Duration::from_secs(hours * 3600 + minutes * 60);
    let as_utc = humantime::parse_rfc3339_weak(local).ok()?;
    // 12:00+01:00 is 11:00Z.
    if sign > 0 {
        as_utc.checked_sub(shift)
    } else {
        as_utc.checked_add(shift)
    }
}

impl When {
    /// The instant meant, given the time the command started.
    #[must_use]
    pub fn resolve(self, now: SystemTime) -> SystemTime {
        match self {
            When::At(t) => t,
            When::Ago(d) => now.checked_sub(d).unwrap_or(SystemTime::UNIX_EPOCH),
            When::Today => local_day::start_of_day(now, 0),
            When::Yesterday => local_day::start_of_day(now, 1),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SystemTime {
        humantime::parse_rfc3339(text).unwrap()
    }

    #[test]
    fn rfc3339_with_z_an_offset_or_a_date_is_an_absolute_time() {
        let eleven = at("2026-11-30T11:00:00Z");
        assert_eq!(parse("2026-11-30T11:00:00Z"), Ok(When::At(eleven)));
        assert_eq!(parse("2026-11-30T12:00:00+01:00"), Ok(When::At(eleven)));
        assert_eq!(parse("2026-11-30T06:30:00-04:30"), Ok(When::At(eleven)));
        assert_eq!(
            parse("2026-11-30T11:00:00.250Z"),
            Ok(When::At(eleven + Duration::from_millis(250)))
        );
        assert_eq!(
            parse("2026-11-30"),
            Ok(When::At(at("2026-11-30T00:00:00Z")))
        );
    }

    #[test]
    fn words_and_durations_are_relative_to_now() {
        assert_eq!(parse("today"), Ok(When::Today));
        assert_eq!(parse("yesterday"), Ok(When::Yesterday));
        assert_eq!(parse("90m"), Ok(When::Ago(Duration::from_secs(5400))));
        let now = at("2026-11-30T11:00:00Z");
        assert_eq!(
            When::Ago(Duration::from_secs(3600)).resolve(now),
            at("2026-11-30T10:00:00Z")
        );
    }

    #[test]
    fn nonsense_is_refused_with_the_accepted_forms() {
        let err = parse("soon").unwrap_err();
        assert!(
            err.contains("RFC 3339") && err.contains("yesterday"),
            "{err}"
        );
        assert!(parse("2026-11-30T11:00:00+1:00").is_err());
    }
}
