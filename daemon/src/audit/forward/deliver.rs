//! Sending a batch and learning what the collector has: the forwarder's side of
//! the [`Window`](super::window::Window). Over TCP and TLS a batch is one write of
//! octet-counted frames, delivered by the TCP stack's acknowledgement and
//! [`TCP_SETTLE`]; over RELP each record is one `syslog` command, delivered when
//! the collector answers it, with at most [`relp::WINDOW`] unanswered.
//!
//! Every way a connection ends goes through here: [`lost`] (the collector closed
//! or reset it, a write or an answer failed: what was not delivered is sent again)
//! or [`close_ours`] (a stop, another collector: what was acknowledged by then is
//! delivered).

use std::time::{Duration, Instant};

use metalift_policy::forward::Forward;

use super::source::Mark;
use super::window::{Window, TCP_SETTLE};
use super::{conn::Conn, frame, note_error, relp, Shared, State};

/// What [`send`] put on the connection.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Sent {
    /// Records.
    pub records: u64,
    /// Bytes, framing included.
    pub bytes: u64,
}

/// Sends the batch in `st.batch` on `st.conn` and notes it in the window; the
/// error says what failed (the caller then calls [`lost`]).
pub(super) fn send(st: &mut State, config: &Forward) -> Result<Sent, String> {
    let State {
        conn,
        source,
        window,
        batch,
        out,
        msg,
        header,
        ..
    } = st;
    let (Some(conn), Some(source)) = (conn.as_mut(), source.as_mut()) else {
        return Ok(Sent::default());
    };
    // Claimed with the writer before a byte of it is written: a batch from a
    // file the writer deleted (and counted) meanwhile is not sent.
    if !source.claim(batch) {
        batch.clear();
        return Ok(Sent::default());
    }
    let Some(mut mark) = source.sent_mark() else {
        return Ok(Sent::default());
    };
    let failed = |e: std::io::Error| format!("sending to {}: {e}", config.address);
    out.clear();
    let mut sent = Sent::default();
    let mut start = 0;
    for end in memchr::memchr_iter(b'\n', batch) {
        let line = &batch[start..end];
        mark = mark.after(&batch[start..=end]);
        start = end + 1;
        if line.is_empty() {
            continue;
        }
        sent.records += 1;
        if !conn.is_relp() {
            frame::push(out, header, line);
            continue;
        }
        // The collector may count on no more than WINDOW unanswered: write what
        // is framed and wait for answers until at most LOW_WATER are left, so
        // the next write carries many messages, not the one or two a single
        // answer made room for.
        if window.unanswered() >= relp::WINDOW {
            conn.send(out).map_err(failed)?;
            sent.bytes += out.len() as u64;
            out.clear();
            while window.unanswered() > relp::LOW_WATER {
                answers(conn, window, config, true)?;
            }
        }
        msg.clear();
        frame::message(msg, header, line);
        let before = out.len();
        let txnr = conn.relp_push(out, "syslog", msg).unwrap_or_default();
        window.push(txnr, mark, (out.len() - before) as u64);
    }
    conn.send(out).map_err(failed)?;
    sent.bytes += out.len() as u64;
    source.sent(batch);
    if !conn.is_relp() {
        if let Some(mark) = source.sent_mark() {
            window.push(conn.written(), mark, out.len() as u64);
        }
    }
    Ok(sent)
}

/// Reads the collector's RELP answers (waiting for some with `wait`) into the
/// window; an error answer, a `serverclose` or anything unexpected is an error.
fn answers(
    conn: &mut Conn,
    window: &mut Window,
    config: &Forward,
    wait: bool,
) -> Result<(), String> {
    let frames = conn
        .replies(wait)
        .map_err(|e| format!("RELP answers from {}: {e}", config.address))?;
    let now = Instant::now();
    for f in frames {
        match (f.command.as_str(), f.status()) {
            ("rsp", Some((200, _))) => {
                // An answer to a transaction not in the window (the open, a
                // close) changes nothing.
                window.acked(f.txnr, now);
            }
            ("rsp", status) => {
                return Err(format!(
                    "{} refused RELP transaction {}: {}",
                    config.address,
                    f.txnr,
                    status.map_or_else(
                        || String::from_utf8_lossy(&f.data).into_owned(),
                        |(code, text)| format!("{code} {text}")
                    )
                ))
            }
            ("serverclose", _) => {
                return Err(format!(
                    "{} closed the RELP session (serverclose)",
                    config.address
                ))
            }
            (other, _) => {
                return Err(format!(
                    "{} sent an unexpected RELP command {other:?}",
                    config.address
                ))
            }
        }
    }
    Ok(())
}

/// Asks the connection what the collector has: a collector that went away ends
/// it ([`lost`]); what it acknowledged is delivered (over TCP and TLS once the
/// connection then stayed up for [`TCP_SETTLE`]).
pub(super) fn check(st: &mut State, config: &Forward, shared: &Shared) {
    let Some(conn) = st.conn.as_mut() else {
        return;
    };
    let now = Instant::now();
    let settle = if conn.is_relp() {
        if let Err(error) = answers(conn, &mut st.window, config, false) {
            lost(st, shared, error);
            return;
        }
        Duration::ZERO
    } else {
        if conn.peer_closed() {
            lost(
                st,
                shared,
                format!("{} closed the connection", config.address),
            );
            return;
        }
        match conn.acknowledged() {
            Ok(n) => st.window.acked_through(n, now),
            Err(error) => {
                lost(
                    st,
                    shared,
                    format!("reading the send queue of {}: {error}", config.address),
                );
                return;
            }
        }
        TCP_SETTLE
    };
    let mark = st.window.settled(now, settle);
    deliver(st, mark);
}

/// Bytes sent and not acknowledged: over RELP the messages not answered yet,
/// over TCP and TLS the socket's send queue; `None` when not connected.
pub(super) fn unacknowledged(st: &State) -> Option<u64> {
    let conn = st.conn.as_ref()?;
    if conn.is_relp() {
        Some(st.window.unacknowledged_bytes())
    } else {
        conn.unacknowledged().ok()
    }
}

/// Closes the connection ourselves (a stop, another collector): what the
/// collector acknowledged by `deadline` is delivered (waiting for it until then:
/// over TCP and TLS its TCP stack; over RELP its answers, then a `close`), the
/// rest is sent again (to the next collector, or by the next start).
pub(super) fn close_ours(st: &mut State, shared: &Shared, deadline: Instant) {
    shared.connected(None);
    let Some(mut conn) = st.conn.take() else {
        return;
    };
    let relp = conn.is_relp();
    loop {
        let now = Instant::now();
        if relp {
            let Some(config) = st.config.as_ref() else {
                break;
            };
            if answers(&mut conn, &mut st.window, config, false).is_err() {
                break;
            }
        } else {
            match conn.acknowledged() {
                Ok(n) => st.window.acked_through(n, now),
                Err(_) => break,
            }
        }
        if st.window.unacknowledged_bytes() == 0 || now >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if relp && Instant::now() < deadline {
        // A polite end of the session; its answer is not waited for beyond the
        // deadline (nothing depends on it).
        let mut out = Vec::new();
        if conn.relp_push(&mut out, "close", b"").is_some() && conn.send(&out).is_ok() {
            let _ = conn.set_write_timeout(deadline.saturating_duration_since(Instant::now()));
            let _ = conn.replies(false);
        }
    }
    let mark = st.window.settled(Instant::now(), Duration::ZERO);
    deliver(st, mark);
    end_of_connection(st);
}

/// The connection is gone: what was sent on it and is not delivered is sent
/// again from the delivered position.
fn end_of_connection(st: &mut State) {
    st.conn = None;
    st.window.clear();
    if let Some(source) = st.source.as_mut() {
        source.rewind();
    }
}

/// The connection ended other than by our close (the collector closed or reset
/// it, a write failed or timed out, an answer was an error): nothing more of it
/// counts as delivered.
pub(super) fn lost(st: &mut State, shared: &Shared, error: String) {
    end_of_connection(st);
    shared.connected(None);
    st.backoff.failed(Instant::now());
    note_error(shared, error);
}

/// Moves the delivered position to `mark` (if any), and to where sending has got
/// when nothing waits in the window; hands a new position to the save schedule.
fn deliver(st: &mut State, mark: Option<Mark>) {
    let Some(source) = st.source.as_mut() else {
        return;
    };
    if let Some(m) = mark {
        source.delivered(m);
        st.backoff.delivered();
    }
    if st.window.is_empty() {
        if let Some(m) = source.sent_mark() {
            source.delivered(m);
        }
    }
    let now = source.cursor();
    if now != st.delivered {
        st.delivered = now;
        if let Some(c) = now {
            st.saves.delivered(c);
        }
    }
}
