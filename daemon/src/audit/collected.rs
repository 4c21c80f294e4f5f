//! A record as a collector stores it: the JSON line alone, or the same line behind
//! the syslog header a collector kept. Recognised by structure, never guessed:
//!
//! - bare JSON (`{` first): the local log, Vector, syslog-ng's `template("${MSG}\n")`;
//! - RFC 5424 (`<PRI>1 TIMESTAMP HOST APP PROCID MSGID SD MSG`), as metaliftd sends
//!   it ([`super::forward::frame`]) and as rsyslog's `%rawmsg%` and syslog-ng's
//!   `$RAWMSG` keep it; an optional UTF-8 BOM before MSG (RFC 5424 §6.4);
//! - RFC 3164-style `[<PRI>]TIMESTAMP HOST TAG: MSG`, with the BSD timestamp
//!   (`Dec  6 07:00:00`) or an RFC 3339 one (rsyslog's `RSYSLOG_FileFormat`), as a
//!   relay that rewrote the header or a collector's default file template writes it.
//!
//! Whatever the header, the message must be the record's JSON object; a line that is
//! none of these is not a record (the caller counts it and says where it was).

/// The record's JSON in `line` (without its newline), or what the line is instead.
pub fn record_text(line: &str) -> Result<&str, &'static str> {
    let line = line.strip_suffix('\r').unwrap_or(line);
    if line.starts_with('{') {
        return Ok(line);
    }
    let after_pri = strip_pri(line);
    let message = match after_pri.strip_prefix("1 ") {
        Some(rest) => rfc5424_message(rest),
        None => rfc3164_message(after_pri),
    }
    .ok_or("neither a JSON record nor a syslog line (RFC 5424 or RFC 3164) carrying one")?;
    let message = message.strip_prefix('\u{feff}').unwrap_or(message);
    if message.starts_with('{') {
        Ok(message)
    } else {
        Err("a syslog line whose message is not a JSON record")
    }
}

/// `line` after a leading `<PRI>` (1 to 3 digits), or all of it when there is none.
fn strip_pri(line: &str) -> &str {
    let Some(rest) = line.strip_prefix('<') else {
        return line;
    };
    match rest.find('>') {
        Some(end @ 1..=3) if rest[..end].bytes().all(|b| b.is_ascii_digit()) => &rest[end + 1..],
        _ => line,
    }
}

/// RFC 5424 after `<PRI>1 `: five space-separated header fields (TIMESTAMP HOSTNAME
/// APP-NAME PROCID MSGID), STRUCTURED-DATA (`-` or `[..]` elements), then MSG.
fn rfc5424_message(rest: &str) -> Option<&str> {
    let mut rest = rest;
    for _ in 0..5 {
        let (field, after) = rest.split_once(' ')?;
        if field.is_empty() {
            return None;
        }
        rest = after;
    }
    let after_sd = structured_data_end(rest)?;
    let rest = &rest[after_sd..];
    // MSG is optional; an absent one is not a record, which the caller reports.
    Some(rest.strip_prefix(' ').unwrap_or(rest))
}

/// The length of the STRUCTURED-DATA at the start of `s`: `-`, or SD-ELEMENTs
/// `[id param="value" ...]` whose values may hold `\"`, `\\` and `\]` (§6.3.3).
fn structured_data_end(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    if bytes.first() == Some(&b'-') {
        return Some(1);
    }
    let mut i = 0;
    while bytes.get(i) == Some(&b'[') {
        let mut quoted = false;
        i += 1;
        loop {
            match *bytes.get(i)? {
                b'\\' if quoted => i += 1,
                b'"' => quoted = !quoted,
                b']' if !quoted => break,
                _ => {}
            }
            i += 1;
        }
        i += 1;
    }
    (i > 0).then_some(i)
}

/// RFC 3164-style: TIMESTAMP (BSD `Mmm dd hh:mm:ss`, or one RFC 3339 token), HOST,
/// then a TAG ending in `:` (`metaliftd[412]:`), then MSG.
fn rfc3164_message(s: &str) -> Option<&str> {
    let rest = bsd_timestamp(s).or_else(|| rfc3339_token(s))?;
    let rest = rest.strip_prefix(' ')?;
    let (host, rest) = rest.split_once(' ')?;
    if host.is_empty() {
        return None;
    }
    let (tag, rest) = rest.split_once(' ')?;
    if tag.len() < 2 || !tag.ends_with(':') {
        return None;
    }
    Some(rest)
}

const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// After `Mmm dd hh:mm:ss` (the day space-padded: `Dec  6`), or `None`.
fn bsd_timestamp(s: &str) -> Option<&str> {
    let month = s.get(..3)?;
    if !MONTHS.contains(&month) {
        return None;
    }
    let rest = s[3..].strip_prefix(' ')?;
    let rest = rest.strip_prefix(' ').unwrap_or(rest);
    let (day, rest) = rest.split_once(' ')?;
    if day.is_empty() || day.len() > 2 || !day.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let time = rest.get(..8)?.as_bytes();
    let shape_ok = time.iter().enumerate().all(|(i, b)| {
        if i == 2 || i == 5 {
            *b == b':'
        } else {
            b.is_ascii_digit()
        }
    });
    shape_ok.then(|| &rest[8..])
}

/// After one RFC 3339 token (`2026-12-06T07:00:00.123+00:00`), or `None`.
fn rfc3339_token(s: &str) -> Option<&str> {
    let end = s.find(' ')?;
    let token = &s[..end];
    let b = token.as_bytes();
    let looks =
        b.len() >= 20 && b[..4].iter().all(u8::is_ascii_digit) && b[4] == b'-' && b[10] == b'T';
    looks.then(|| &s[end..])
}

#[cfg(test)]
mod tests {
    use super::*;

    const JSON: &str = r#"{"kind":"daemon_stop","time":"2026-12-06T07:00:00Z"}"#;

    #[test]
    fn bare_json_is_the_record() {
        assert_eq!(record_text(JSON), Ok(JSON));
        assert_eq!(record_text(&format!("{JSON}\r")), Ok(JSON));
    }

    #[test]
    fn an_rfc5424_line_as_metaliftd_sends_it_and_rsyslog_rawmsg_keeps_it() {
        let line =
            format!("<110>1 2026-12-06T07:00:00.000000Z guest-7 metaliftd 412 decision - {JSON}");
        assert_eq!(record_text(&line), Ok(JSON));
        // Structured data with an escaped bracket and quote, and a BOM before MSG.
        let line = format!(
            "<110>1 2026-12-06T07:00:00Z h app - - [ex@32473 a=\"x\\]y\\\"z\"][b c=\"d\"] \u{feff}{JSON}"
        );
        assert_eq!(record_text(&line), Ok(JSON));
    }

    #[test]
    fn an_rfc3164_line_with_a_bsd_or_rfc3339_timestamp() {
        for line in [
            format!("Dec  6 07:00:00 guest-7 metaliftd[412]: {JSON}"),
            format!("<110>Dec 16 07:00:00 guest-7 metaliftd: {JSON}"),
            format!("2026-12-06T07:00:00.123456+00:00 guest-7 metaliftd[412]: {JSON}"),
        ] {
            assert_eq!(record_text(&line), Ok(JSON), "{line}");
        }
    }

    #[test]
    fn a_line_that_is_none_of_them_is_refused_with_what_it_is() {
        assert!(record_text("hello").is_err());
        assert!(record_text("").is_err());
        assert_eq!(
            record_text("<110>1 2026-12-06T07:00:00Z h rsyslogd - - - started"),
            Err("a syslog line whose message is not a JSON record")
        );
        assert!(record_text("Dec  6 07:00:00 guest-7 no-colon {}").is_err());
        assert!(record_text("<110>1 too few fields").is_err());
        assert!(record_text("<110>1 t h a p m [unterminated {}").is_err());
    }
}
