//! One audit record as an RFC 5424 syslog message in RFC 6587 octet-counting framing.
//!
//! `<110>1 TIMESTAMP HOSTNAME metaliftd PROCID MSGID - JSON`: PRI 110 is facility 13
//! ("log audit", RFC 5424 §6.2.1) at severity 6 (informational); TIMESTAMP is the
//! record's own `"time"` (when it happened, not when it was sent: a record
//! forwarded after a collector outage keeps its time; RFC 5424 §6.2.3 has the
//! originator's time there); MSGID is the record's `"kind"`; MSG is the record's
//! JSON line exactly as the local log holds it (no BOM: RFC 5424 allows MSG-ANY,
//! and collectors keep JSON bytes untouched). The frame is `MSG-LEN SP SYSLOG-MSG`
//! (RFC 6587 §3.4.1, also RFC 5425 §4.3).

use super::head::Head;

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
    /// The header for records of `host` written by this process: HOSTNAME is the
    /// clone's name when the orchestrator gave one (`host.instance`), else the
    /// host name, so a collector that files by HOSTNAME tells clones apart.
    #[must_use]
    pub fn of(host: &crate::audit::host::Host) -> Header {
        Header {
            hostname: sanitize(host.instance.as_deref().unwrap_or(&host.name), 255),
            pid: std::process::id(),
        }
    }
}

/// Appends `line` (one JSON record, without its newline) as one framed message:
/// its length in bytes (RFC 6587 MSG-LEN is an octet count), a space, the message.
pub fn push(out: &mut Vec<u8>, header: &Header, line: &[u8]) {
    let head = head_of(header, line);
    let len = head.len() + line.len();
    out.extend_from_slice(format!("{len} ").as_bytes());
    out.extend_from_slice(head.as_bytes());
    out.extend_from_slice(line);
}

/// Appends `line` as one RFC 5424 message without framing (RELP frames it).
pub fn message(out: &mut Vec<u8>, header: &Header, line: &[u8]) {
    out.extend_from_slice(head_of(header, line).as_bytes());
    out.extend_from_slice(line);
}

/// The message's header up to the MSG: `<110>1 TIMESTAMP HOSTNAME metaliftd
/// PROCID MSGID - `.
fn head_of(header: &Header, line: &[u8]) -> String {
    let head = Head::of(line);
    let kind = head
        .as_ref()
        .map_or_else(|| "-".to_owned(), |h| sanitize(&h.kind, 32));
    let time = head
        .as_ref()
        .and_then(|h| h.time.as_deref())
        .and_then(timestamp)
        .unwrap_or_else(|| "-".to_owned());
    format!(
        "<{PRI}>1 {time} {} metaliftd {} {kind} - ",
        header.hostname, header.pid,
    )
}

/// A record's `"time"` as an RFC 5424 TIMESTAMP (§6.2.3: RFC 3339 in UTC, at most
/// six fraction digits): parsed and written again the way the audit log writes
/// it, so a malformed time becomes the nil value (`None`), never a broken header.
fn timestamp(time: &str) -> Option<String> {
    crate::audit::rfc3339::parse(time)
        .ok()
        .map(crate::audit::rfc3339::format)
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
        let line = br#"{"schema":1,"id":"r-1","host":{"labels":{"kind":"x"}},"kind":"decision","time":"2026-11-30T06:01:02.123456Z","path":"/a b"}"#;
        let mut out = Vec::new();
        push(&mut out, &header, line);
        let text = String::from_utf8(out).unwrap();
        let (len, msg) = text.split_once(' ').unwrap();
        assert_eq!(len.parse::<usize>().unwrap(), msg.len());
        assert!(
            msg.starts_with("<110>1 2026-11-30T06:01:02.123456Z guest-7 metaliftd 42 decision - {"),
            "the record's own time and kind: {msg}"
        );
        assert!(msg.ends_with(std::str::from_utf8(line).unwrap()));
    }

    /// Regression (issue 42): a length counted in characters instead of bytes
    /// passes every ASCII record and mis-frames a path like `/Users/José`: the
    /// collector then cuts the stream in the wrong place.
    #[test]
    fn a_record_with_a_non_ascii_path_is_framed_by_its_length_in_bytes() {
        let header = Header {
            hostname: "h".into(),
            pid: 1,
        };
        let lines: [&[u8]; 2] = [
            r#"{"kind":"decision","time":"2026-01-01T00:00:00Z","path":"/Users/José/bin/ü"}"#
                .as_bytes(),
            br#"{"kind":"outcome","time":"2026-01-01T00:00:01Z"}"#,
        ];
        let mut out = Vec::new();
        for line in lines {
            push(&mut out, &header, line);
        }
        // Read the stream back as a collector does: LEN SP, then LEN bytes.
        let mut rest = &out[..];
        for line in lines {
            let sp = rest.iter().position(|&b| b == b' ').unwrap();
            let len: usize = std::str::from_utf8(&rest[..sp]).unwrap().parse().unwrap();
            let msg = &rest[sp + 1..sp + 1 + len];
            assert!(
                msg.ends_with(line),
                "the frame holds exactly its record: {:?}",
                String::from_utf8_lossy(msg)
            );
            rest = &rest[sp + 1 + len..];
        }
        assert!(rest.is_empty(), "nothing left over");
        let mut unframed = Vec::new();
        message(&mut unframed, &header, lines[0]);
        assert!(out.windows(unframed.len()).any(|w| w == unframed));
    }

    fn header_of(line: &[u8]) -> String {
        let header = Header {
            hostname: "h".into(),
            pid: 1,
        };
        let mut out = Vec::new();
        push(&mut out, &header, line);
        let text = String::from_utf8(out).unwrap();
        let msg = text.split_once(' ').unwrap().1;
        msg.split(' ').take(6).collect::<Vec<_>>().join(" ")
    }

    #[test]
    fn a_time_in_another_precision_is_written_as_the_log_writes_it_and_a_bad_one_is_nil() {
        assert_eq!(
            header_of(br#"{"kind":"outcome","time":"2026-01-01T00:00:00.5Z"}"#),
            "<110>1 2026-01-01T00:00:00.500000Z h metaliftd 1 outcome"
        );
        assert_eq!(
            header_of(br#"{"kind":"outcome","time":"yesterday"}"#),
            "<110>1 - h metaliftd 1 outcome"
        );
        assert_eq!(
            header_of(br#"{"kind":"outcome"}"#),
            "<110>1 - h metaliftd 1 outcome"
        );
    }

    #[test]
    fn header_fields_lose_spaces_and_an_unknown_kind_is_nil() {
        assert_eq!(sanitize("my host\u{e9}", 255), "myhost");
        assert_eq!(sanitize(" ", 255), "-");
        assert_eq!(header_of(b"not json"), "<110>1 - h metaliftd 1 -");
    }
}
