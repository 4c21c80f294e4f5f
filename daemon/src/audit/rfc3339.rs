//! `SystemTime` as an RFC 3339 UTC string with microseconds, e.g. `2026-11-30T06:01:02.123456Z`.

use std::time::SystemTime;

use serde::{Deserialize, Deserializer, Serializer};

/// Formats `time` the way the audit log writes it.
#[must_use]
pub fn format(time: SystemTime) -> String {
    humantime::format_rfc3339_micros(time).to_string()
}

/// Parses an RFC 3339 UTC timestamp (`Z` suffix, any sub-second precision).
pub fn parse(text: &str) -> Result<SystemTime, humantime::TimestampError> {
    humantime::parse_rfc3339_weak(text)
}

/// serde: writes [`format`].
pub fn serialize<S: Serializer>(time: &SystemTime, s: S) -> Result<S::Ok, S::Error> {
    s.collect_str(&humantime::format_rfc3339_micros(*time))
}

/// serde: reads what [`format`] wrote.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<SystemTime, D::Error> {
    let text = <std::borrow::Cow<'de, str>>::deserialize(d)?;
    parse(&text).map_err(serde::de::Error::custom)
}
