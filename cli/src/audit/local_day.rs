//! Local midnight for `--since today` / `yesterday`: the C library's time zone
//! rules (`TZ`, /etc/localtime), as `date` uses them. A platform module: its two
//! libc calls are its only unsafe operations.
#![allow(unsafe_code)]

use std::time::{Duration, SystemTime};

/// Local midnight that began the day `days_back` days before the day of `now`.
/// Falls back to UTC midnight if the C library cannot convert.
#[must_use]
pub fn start_of_day(now: SystemTime, days_back: u32) -> SystemTime {
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let Ok(t) = libc::time_t::try_from(secs) else {
        return utc_midnight(secs, days_back);
    };
    // SAFETY: an all-zero `tm` is a valid value (integers and, on some systems, a
    // null `tm_zone` pointer), and it is only written by localtime_r below.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: both pointers are to live locals of the right types; localtime_r is
    // the reentrant form and keeps no pointer to them.
    if unsafe { libc::localtime_r(&t, &mut tm) }.is_null() {
        return utc_midnight(secs, days_back);
    }
    tm.tm_hour = 0;
    tm.tm_min = 0;
    tm.tm_sec = 0;
    tm.tm_mday -= days_back as libc::c_int;
    // Let mktime decide whether daylight saving time applies at that midnight.
    tm.tm_isdst = -1;
    // SAFETY: `tm` is a valid, initialised struct owned by this frame; mktime
    // normalises it in place (a day of month below 1 rolls into the month before).
    let midnight = unsafe { libc::mktime(&mut tm) };
    match u64::try_from(midnight) {
        Ok(s) => SystemTime::UNIX_EPOCH + Duration::from_secs(s),
        Err(_) => utc_midnight(secs, days_back),
    }
}

fn utc_midnight(secs: u64, days_back: u32) -> SystemTime {
    let day = (secs / 86_400).saturating_sub(u64::from(days_back));
    SystemTime::UNIX_EPOCH + Duration::from_secs(day * 86_400)
}
