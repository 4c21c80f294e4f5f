//! When a rule applies: its window, `from` (inclusive) `until` (exclusive), each an
//! RFC 3339 time with a UTC offset, each optional.
//!
//! A grant for an experiment ends by itself (`until`), and a change can be staged
//! ahead (`from`), as Santa's rules limited in time do. Outside its window a rule
//! does not match, as if it were not written; nothing else about it changes. The
//! policy reads no clock: every decision is given the time it is decided
//! ([`crate::Policy::evaluate`]), so a daemon crosses a boundary without a reload.
//!
//! Times are kept as [`SystemTime`] and written back in UTC to the second
//! (`2026-12-31T00:00:00Z`). A time without an offset is refused: a local time
//! means a different instant on each guest's time zone.

use std::time::{Duration, SystemTime};

/// A rule's window. Both ends absent: always (the default).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Window {
    /// The first instant the rule matches (`from`); `None`: since ever.
    pub from: Option<SystemTime>,
    /// The first instant it no longer matches (`until`); `None`: for ever.
    pub until: Option<SystemTime>,
}

/// Where a time falls relative to a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowState {
    /// Before `from`.
    NotYetOpen {
        /// When the window opens.
        opens: SystemTime,
    },
    /// Within the window: the rule may match.
    Open,
    /// At or after `until`.
    Closed {
        /// When the window closed.
        closed: SystemTime,
    },
}

/// Which edge of a window a change is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edge {
    /// `from`: the rule starts matching.
    Opens,
    /// `until`: the rule stops matching.
    Closes,
}

impl Edge {
    /// `opens` or `closes`, as `status` writes it.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Edge::Opens => "opens",
            Edge::Closes => "closes",
        }
    }
}

impl Window {
    /// Whether the rule has no window (it always applies).
    #[must_use]
    pub fn is_always(&self) -> bool {
        self.from.is_none() && self.until.is_none()
    }

    /// Where `at` falls.
    #[must_use]
    pub fn state(&self, at: SystemTime) -> WindowState {
        match (self.from, self.until) {
            (Some(opens), _) if at < opens => WindowState::NotYetOpen { opens },
            (_, Some(closed)) if at >= closed => WindowState::Closed { closed },
            _ => WindowState::Open,
        }
    }

    /// Whether a rule with this window may match at `at`.
    #[must_use]
    pub fn contains(&self, at: SystemTime) -> bool {
        self.state(at) == WindowState::Open
    }

    /// Whether this window is open whenever `inner` is (for the lints: a rule can
    /// only shadow another while it applies).
    #[must_use]
    pub fn covers(&self, inner: &Window) -> bool {
        let from_ok = match (self.from, inner.from) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(a), Some(b)) => a <= b,
        };
        let until_ok = match (self.until, inner.until) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(a), Some(b)) => a >= b,
        };
        from_ok && until_ok
    }

    /// Whether some instant is in both windows.
    #[must_use]
    pub fn overlaps(&self, other: &Window) -> bool {
        let start = self.from.max(other.from);
        let end = match (self.until, other.until) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match (start, end) {
            (Some(s), Some(e)) => s < e,
            _ => true,
        }
    }

    /// The first edge strictly after `at`, if any.
    #[must_use]
    pub fn next_edge_after(&self, at: SystemTime) -> Option<(SystemTime, Edge)> {
        [(self.from, Edge::Opens), (self.until, Edge::Closes)]
            .into_iter()
            .filter_map(|(t, e)| t.filter(|t| *t > at).map(|t| (t, e)))
            .min_by_key(|(t, _)| *t)
    }

    /// `from T until U`, `until U`, `from T`, or `always`, as explanations write it.
    #[must_use]
    pub fn describe(&self) -> String {
        match (self.from, self.until) {
            (None, None) => "always".to_owned(),
            (Some(f), None) => format!("from {}", format_rfc3339(f)),
            (None, Some(u)) => format!("until {}", format_rfc3339(u)),
            (Some(f), Some(u)) => format!("from {} until {}", format_rfc3339(f), format_rfc3339(u)),
        }
    }
}

/// `t` in UTC to the second: `2026-12-31T00:00:00Z`. A time before 1970 (which
/// [`parse_rfc3339`] never produces) is written as 1970's start.
#[must_use]
pub fn format_rfc3339(t: SystemTime) -> String {
    let t = t.max(SystemTime::UNIX_EPOCH);
    humantime::format_rfc3339_seconds(t).to_string()
}

/// Parses an RFC 3339 date-time with a UTC offset (`2026-12-31T00:00:00Z`,
/// `2026-12-31T09:00:00+09:00`, fractional seconds allowed), as TOML writes an
/// offset date-time. The error says what is wrong, for a diagnostic.
pub fn parse_rfc3339(text: &str) -> Result<SystemTime, String> {
    let text = text.trim();
    // Date, `T` (or `t` or a space, as RFC 3339 and TOML allow), time: the offset
    // is what follows the time's seconds and fraction.
    let (date_time, offset) = split_offset(text).ok_or_else(|| {
        format!("`{text}` has no UTC offset: write `Z` (UTC) or `+hh:mm`, e.g. `2026-12-31T00:00:00Z` (a local time would mean a different instant on each guest)")
    })?;
    let date_time: String = date_time
        .char_indices()
        .map(|(i, c)| {
            if i == 10 && (c == 't' || c == ' ') {
                'T'
            } else {
                c
            }
        })
        .collect();
    if date_time.len() < 19 || date_time.as_bytes().get(10) != Some(&b'T') {
        return Err(format!(
            "`{text}` is not an RFC 3339 date-time (YYYY-MM-DDThh:mm:ssZ)"
        ));
    }
    let utc = humantime::parse_rfc3339(&format!("{date_time}Z"))
        .map_err(|e| format!("`{text}` is not a valid RFC 3339 date-time: {e}"))?;
    let shifted = if offset >= 0 {
        utc.checked_sub(Duration::from_secs(offset.unsigned_abs()))
    } else {
        utc.checked_add(Duration::from_secs(offset.unsigned_abs()))
    };
    shifted
        .filter(|t| *t >= SystemTime::UNIX_EPOCH)
        .ok_or_else(|| format!("`{text}` is before 1970"))
}

/// Splits `text` into the local date-time and its offset from UTC in seconds, or
/// `None` when it has no offset.
fn split_offset(text: &str) -> Option<(&str, i64)> {
    if let Some(rest) = text.strip_suffix(['Z', 'z']) {
        return Some((rest, 0));
    }
    // `+hh:mm` or `-hh:mm` after the time (the date's dashes come before byte 10).
    let at = text.len().checked_sub(6)?;
    if at < 19 {
        return None;
    }
    let (rest, offset) = text.split_at(at);
    let bytes = offset.as_bytes();
    let sign = match bytes.first()? {
        b'+' => 1,
        b'-' => -1,
        _ => return None,
    };
    let digits = |r: std::ops::Range<usize>| -> Option<i64> {
        let s = offset.get(r)?;
        s.bytes()
            .all(|b| b.is_ascii_digit())
            .then(|| s.parse().ok())
            .flatten()
    };
    let (hours, minutes) = (digits(1..3)?, digits(4..6)?);
    if bytes.get(3) != Some(&b':') || hours > 23 || minutes > 59 {
        return None;
    }
    Some((rest, sign * (hours * 3600 + minutes * 60)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(text: &str) -> SystemTime {
        parse_rfc3339(text).unwrap()
    }

    #[test]
    fn offsets_name_the_same_instant_and_local_times_are_refused() {
        assert_eq!(at("2026-12-31T09:00:00+09:00"), at("2026-12-31T00:00:00Z"));
        assert_eq!(at("2026-12-30T19:00:00-05:00"), at("2026-12-31T00:00:00Z"));
        assert_eq!(at("2026-12-31 00:00:00z"), at("2026-12-31T00:00:00Z"));
        assert_eq!(
            at("2026-12-31T00:00:00.5Z"),
            at("2026-12-31T00:00:00Z") + Duration::from_millis(500)
        );
        assert_eq!(
            format_rfc3339(at("2026-12-31T09:00:00+09:00")),
            "2026-12-31T00:00:00Z"
        );
        let local = parse_rfc3339("2026-12-31T00:00:00").unwrap_err();
        assert!(local.contains("no UTC offset"), "{local}");
        assert!(parse_rfc3339("2026-02-30T00:00:00Z").is_err());
        assert!(parse_rfc3339("2026-12-31").is_err());
        assert!(parse_rfc3339("1969-12-31T23:00:00Z").is_err());
    }

    #[test]
    fn a_window_opens_at_from_and_is_closed_from_until_on() {
        let w = Window {
            from: Some(at("2026-01-01T00:00:00Z")),
            until: Some(at("2026-02-01T00:00:00Z")),
        };
        let second = Duration::from_secs(1);
        assert!(!w.contains(at("2026-01-01T00:00:00Z") - second));
        assert!(w.contains(at("2026-01-01T00:00:00Z")));
        assert!(w.contains(at("2026-02-01T00:00:00Z") - second));
        assert!(!w.contains(at("2026-02-01T00:00:00Z")));
        assert_eq!(
            w.next_edge_after(at("2025-06-01T00:00:00Z")),
            Some((at("2026-01-01T00:00:00Z"), Edge::Opens))
        );
        assert_eq!(
            w.next_edge_after(at("2026-01-01T00:00:00Z")),
            Some((at("2026-02-01T00:00:00Z"), Edge::Closes))
        );
        assert_eq!(w.next_edge_after(at("2026-02-01T00:00:00Z")), None);
        assert!(Window::default().covers(&w) && !w.covers(&Window::default()));
        let later = Window {
            from: Some(at("2026-02-01T00:00:00Z")),
            until: None,
        };
        assert!(!w.overlaps(&later) && later.overlaps(&Window::default()));
    }
}
