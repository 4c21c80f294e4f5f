//! RELP, the Reliable Event Logging Protocol of rsyslog's librelp (the collector
//! side is rsyslog's `imrelp`, Debian's `rsyslog-relp`): every message carries a
//! transaction number and the collector answers each one (`rsp 200 OK`) once it
//! has taken it, so the forwarder knows what was delivered instead of guessing.
//!
//! A frame is `TXNR SP COMMAND SP DATALEN [SP DATA] LF` (librelp `relpframe.c`:
//! no space and no data when DATALEN is 0). A session opens with
//! `open` offering `relp_version=0`, `relp_software` and `commands=syslog`; the
//! collector's `rsp` says `200 OK` and what it supports. Messages go as `syslog`
//! commands (the RFC 5424 message without RFC 6587's octet count: RELP frames it);
//! a `close` ends the session, answered by `rsp`. The collector may send
//! `serverclose` (transaction number 0) before it goes away. Transaction numbers
//! run from 1 to 999 999 999 and wrap to 1 (librelp `relpsess.c`).
//!
//! This module is the protocol only (framing and parsing); the connection
//! ([`super::conn`]) and the window of unanswered messages ([`super::window`])
//! use it.

use std::fmt::Write as _;

/// Most messages sent and not yet answered: librelp's default window
/// (`RELP_DFLT_WINDOW_SIZE`, 128); the collector may count on no more.
pub const WINDOW: usize = 128;
/// With [`WINDOW`] messages unanswered, the forwarder waits for answers until at
/// most this many are left before it writes again: writing again as soon as one
/// answer came made a write, and a wake-up of the collector's reader, per one or
/// two messages.
pub const LOW_WATER: usize = WINDOW / 2;
/// The highest transaction number before the count starts again at 1.
const MAX_TXNR: u64 = 999_999_999;
/// Longest answer accepted from a collector (answers are a status line and the
/// offers): a longer DATALEN is a broken or hostile peer, not a reason to buffer.
const MAX_ANSWER: usize = 64 * 1024;

/// One frame received from the collector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// Its transaction number (0 for `serverclose`).
    pub txnr: u64,
    /// `rsp`, `serverclose`, …
    pub command: String,
    /// The data (for `rsp`: `CODE SP TEXT`, then offers after a newline).
    pub data: Vec<u8>,
}

impl Frame {
    /// For an `rsp`: its status code and text (the first line of the data).
    #[must_use]
    pub fn status(&self) -> Option<(u16, String)> {
        if self.command != "rsp" {
            return None;
        }
        let text = String::from_utf8_lossy(&self.data);
        let first = text.lines().next().unwrap_or("");
        let (code, rest) = first.split_once(' ').unwrap_or((first, ""));
        Some((code.parse().ok()?, rest.to_owned()))
    }
}

/// One RELP session's numbering and what was received and not yet parsed.
#[derive(Debug)]
pub struct Session {
    next: u64,
    inbox: Vec<u8>,
}

impl Default for Session {
    fn default() -> Session {
        Session {
            next: 1,
            inbox: Vec::new(),
        }
    }
}

impl Session {
    /// The `open` command's offers.
    #[must_use]
    pub fn offers() -> String {
        format!(
            "relp_version=0\nrelp_software=metaliftd,{},https://github.com/metalift\ncommands=syslog",
            env!("CARGO_PKG_VERSION")
        )
    }

    /// Appends one `command` frame with `data` to `out`; returns its transaction
    /// number.
    pub fn push(&mut self, out: &mut Vec<u8>, command: &str, data: &[u8]) -> u64 {
        let txnr = self.next;
        self.next = if txnr >= MAX_TXNR { 1 } else { txnr + 1 };
        let mut head = String::with_capacity(24);
        let _ = write!(head, "{txnr} {command} {}", data.len());
        out.extend_from_slice(head.as_bytes());
        if !data.is_empty() {
            out.push(b' ');
            out.extend_from_slice(data);
        }
        out.push(b'\n');
        txnr
    }

    /// Takes `bytes` received from the collector; returns the whole frames they
    /// complete (a partial one is kept for the next call), or what is wrong with
    /// the stream.
    pub fn receive(&mut self, bytes: &[u8]) -> Result<Vec<Frame>, String> {
        self.inbox.extend_from_slice(bytes);
        let mut frames = Vec::new();
        let mut at = 0;
        while let Some((frame, used)) = parse(&self.inbox[at..])? {
            frames.push(frame);
            at += used;
        }
        self.inbox.drain(..at);
        Ok(frames)
    }
}

/// Whether the data of the collector's answer to `open` offers the `syslog`
/// command (a `commands=` line listing it).
#[must_use]
pub fn offers_syslog(data: &[u8]) -> bool {
    String::from_utf8_lossy(data).lines().any(|l| {
        l.strip_prefix("commands=")
            .is_some_and(|c| c.split(',').any(|c| c.trim() == "syslog"))
    })
}

/// One frame from the start of `b`, with the bytes it took; `None` when `b` holds
/// only part of one.
fn parse(b: &[u8]) -> Result<Option<(Frame, usize)>, String> {
    let bad = |what: &str| {
        Err(format!(
            "the collector sent a malformed RELP frame ({what}): {:?}",
            String::from_utf8_lossy(&b[..b.len().min(80)])
        ))
    };
    let mut fields = [0usize; 2];
    let mut at = 0;
    // TXNR SP COMMAND SP: the two spaces, within sane lengths.
    for (n, limit) in [(0, 10), (1, 10 + 1 + 32)] {
        match b.iter().skip(at).take(limit + 1).position(|&c| c == b' ') {
            Some(i) => {
                fields[n] = at + i;
                at += i + 1;
            }
            None if b.len() - at > limit => return bad("header"),
            None => return Ok(None),
        }
    }
    let txnr = match std::str::from_utf8(&b[..fields[0]])
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(t) => t,
        None => return bad("transaction number"),
    };
    let command = &b[fields[0] + 1..fields[1]];
    if command.is_empty() || !command.iter().all(u8::is_ascii_alphabetic) {
        return bad("command");
    }
    // DATALEN, then LF (no data) or SP DATA LF.
    let digits = b[at..].iter().take_while(|c| c.is_ascii_digit()).count();
    if at + digits == b.len() {
        return if digits > 9 {
            bad("data length")
        } else {
            Ok(None)
        };
    }
    let len: usize = match std::str::from_utf8(&b[at..at + digits])
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(n) if n <= MAX_ANSWER => n,
        _ => return bad("data length"),
    };
    at += digits;
    let data_at = match b[at] {
        b'\n' if len == 0 => {
            return Ok(Some((frame(txnr, command, &[]), at + 1)));
        }
        b' ' => at + 1,
        _ => return bad("after the data length"),
    };
    if b.len() < data_at + len + 1 {
        return Ok(None);
    }
    if b[data_at + len] != b'\n' {
        return bad("trailer");
    }
    Ok(Some((
        frame(txnr, command, &b[data_at..data_at + len]),
        data_at + len + 1,
    )))
}

fn frame(txnr: u64, command: &[u8], data: &[u8]) -> Frame {
    Frame {
        txnr,
        command: String::from_utf8_lossy(command).into_owned(),
        data: data.to_vec(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_numbered_from_one_and_written_as_librelp_writes_them() {
        let mut s = Session::default();
        let mut out = Vec::new();
        assert_eq!(s.push(&mut out, "open", b"relp_version=0"), 1);
        assert_eq!(
            s.push(&mut out, "syslog", "<110>1 - h a - José".as_bytes()),
            2
        );
        assert_eq!(s.push(&mut out, "close", b""), 3);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "1 open 14 relp_version=0\n2 syslog 20 <110>1 - h a - José\n3 close 0\n",
            "DATALEN counts bytes, not characters"
        );
        s.next = MAX_TXNR;
        let mut out = Vec::new();
        assert_eq!(s.push(&mut out, "syslog", b"x"), MAX_TXNR);
        assert_eq!(s.push(&mut out, "syslog", b"x"), 1, "wraps to 1");
    }

    #[test]
    fn answers_split_anywhere_are_parsed_once_whole() {
        let wire =
            b"1 rsp 37 200 OK\nrelp_version=0\ncommands=syslog\n2 rsp 6 200 OK\n0 serverclose 0\n";
        for cut in 0..wire.len() {
            let mut s = Session::default();
            let mut got = s.receive(&wire[..cut]).unwrap();
            got.extend(s.receive(&wire[cut..]).unwrap());
            assert_eq!(got.len(), 3, "cut at {cut}");
            assert_eq!(got[0].status(), Some((200, "OK".into())));
            assert!(offers_syslog(&got[0].data));
            assert_eq!(
                (got[1].txnr, got[1].status()),
                (2, Some((200, "OK".into())))
            );
            assert_eq!((got[2].txnr, got[2].command.as_str()), (0, "serverclose"));
        }
    }

    #[test]
    fn a_malformed_answer_is_an_error_naming_what_is_wrong() {
        for (wire, what) in [
            (&b"x rsp 6 200 OK\n"[..], "transaction number"),
            (b"1 rsp 6 200 OKK\n", "trailer"),
            (b"1 rsp 99999999 ", "data length"),
            (b"1 r$p 6 200 OK\n", "command"),
            (b"12345678901234567890", "header"),
        ] {
            let err = Session::default().receive(wire).unwrap_err();
            assert!(err.contains(what), "{err}");
        }
        let mut s = Session::default();
        let refused = s.receive(b"5 rsp 20 500 message too long\n").unwrap();
        assert_eq!(refused[0].status(), Some((500, "message too long".into())));
    }
}
