//! One audit record as an RFC 5424 syslog message in RFC 6587 octet-counting framing.
//!
//! `<110>1 TIMESTAMP HOSTNAME metaliftd PROCID MSGID - JSON`: PRI 110 is facility 13
//! ("log audit", RFC 5424 §6.2.1) at severity 6 (informational); MSGID is the
//! record's `"kind"`; MSG is the record's JSON line exactly as the local log holds
//! it (no BOM: RFC 5424 allows MSG-ANY, and collectors keep JSON bytes untouched).
//! The frame is `MSG-LEN SP SYSLOG-MSG` (RFC 6587 §3.4.1, also RFC 5425 §4.3).

use std::time::SystemTime;

/// PRI: facility 13 (log audit) × 8 + severity 6 (informational).
pub const PRI: u8 = 13 * 8 + 6;

/// The fields every message of this daemon shares.
#[derive(Debug, Clone)]
pub struct Header {
    /// HOSTNAME: the host's name, printable US-ASCII, at most 255 characters.
    pub hostname: String,
    /// PROCID: the daemon's pid.
    pub pid: u32,
}

impl Header {
    /// This host's name (`gethostname`) and this process.
    #[must_use]
    pub fn of_this_host() -> Header {
        let name = rustix::system::uname();
        Header {
            hostname: sanitize(&name.nodename().to_string_lossy(), 255),
            pid: std::process::id(),
        }
    }
}

/// Appends `line` (one JSON record, without its newline) as one framed message.
pub fn push(out: &mut Vec<u8>, header: &Header, line: &[u8], now: SystemTime) {
    let kind = record_kind(line).map_or_else(|| "-".to_owned(), |k| sanitize(&k, 32));
    let msg = format!(
        "<{PRI}>1 {} {} metaliftd {} {kind} - ",
        crate::audit::rfc3339::format(now),
        header.hostname,
        header.pid,
    );
    let len = msg.len() + line.len();
    out.extend_from_slice(format!("{len} ").as_bytes());
    out.extend_from_slice(msg.as_bytes());
    out.extend_from_slice(line);
}

/// The `"kind"` of a record line, without parsing the whole JSON (the writer
/// always writes `"kind"` first; anything else falls back to a full parse).
fn record_kind(line: &[u8]) -> Option<String> {
    let prefix = br#"{"kind":""#;
    if let Some(rest) = line.strip_prefix(prefix) {
        let end = rest.iter().position(|&b| b == b'"')?;
        return std::str::from_utf8(&rest[..end]).ok().map(str::to_owned);
    }
    let value: serde_json::Value = serde_json::from_slice(line).ok()?;
    value.get("kind")?.as_str().map(str::to_owned)
}

/// `s` as a syslog header field: printable US-ASCII without spaces, at most `max`
/// characters, `-` (the nil value) when nothing is left.
fn sanitize(s: &str, max: usize) -> String {
    let out: String = s
        .chars()
        .filter(|c| c.is_ascii_graphic())
        .take(max)
        .collect();
    if out.is_empty() {
        "-".to_owned()
    } else {
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_is_framed_with_its_length_kind_and_json_untouched() {
        let header = Header {
            hostname: "guest-7".into(),
            pid: 42,
        };
        let line = br#"{"kind":"decision","time":"x","path":"/a b"}"#;
        let mut out = Vec::new();
        push(&mut out, &header, line, SystemTime::UNIX_EPOCH);
        let text = String::from_utf8(out).unwrap();
        let (len, msg) = text.split_once(' ').unwrap();
        assert_eq!(len.parse::<usize>().unwrap(), msg.len());
        assert!(msg.starts_with("<110>1 1970-01-01T00:00:00"), "{msg}");
        assert!(msg.contains(" guest-7 metaliftd 42 decision - {"), "{msg}");
        assert!(msg.ends_with(std::str::from_utf8(line).unwrap()));
    }

    #[test]
    fn header_fields_lose_spaces_and_an_unknown_kind_is_nil() {
        assert_eq!(sanitize("my host\u{e9}", 255), "myhost");
        assert_eq!(sanitize(" ", 255), "-");
        assert_eq!(record_kind(b"not json"), None);
        assert_eq!(
            record_kind(br#"{"time":"t","kind":"outcome"}"#).as_deref(),
            Some("outcome")
        );
    }
}
