//! `metalift audit flush` against the real metaliftd forwarding to a loopback
//! collector: nothing configured, a collector that reads everything, and one that
//! accepts and never reads (the flush times out saying how far behind, while
//! check-ins are still answered).
#![cfg(target_os = "linux")]

mod support;

use std::io::Read;
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{check_in, DaemonDir, HANG_GUARD};

fn flush(dir: &DaemonDir, timeout: &str) -> (i32, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["audit", "flush", "--timeout", timeout, "--socket"])
        .arg(dir.socket())
        .output()
        .expect("run metalift audit flush");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn forward_to(dir: &DaemonDir, port: u16) {
    std::fs::write(
        dir.policy(),
        format!("version = 1\n\n[audit.forward]\naddress = \"127.0.0.1:{port}\"\n"),
    )
    .unwrap();
}

#[test]
fn without_a_forwarder_flush_succeeds_saying_there_is_nothing_to_flush() {
    let dir = DaemonDir::new("flush-none-");
    std::fs::write(dir.policy(), "version = 1\n").unwrap();
    let _daemon = dir.start(&[], &[]);
    let (code, out) = flush(&dir, "5");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("no forwarder configured: nothing to flush"),
        "{out}"
    );
}

#[test]
fn against_a_collector_that_reads_flush_returns_once_everything_is_acknowledged() {
    let dir = DaemonDir::new("flush-ok-");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                while conn.read(&mut buf).is_ok_and(|n| n > 0) {}
            });
        }
    });
    forward_to(&dir, port);
    let daemon = dir.start(&[], &[]);
    for _ in 0..50 {
        check_in(&daemon.socket);
    }
    let (code, out) = flush(&dir, "20");
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("flushed") && out.contains("acknowledged by the collector's TCP stack"),
        "over TCP a flush claims no more than the TCP stack's acknowledgement: {out}"
    );
}

/// A loopback collector that accepts one connection and never reads it, with a
/// receive buffer so small that a few records fill the window: the daemon's
/// writes then block. Returns its port and the thread holding the connection.
fn never_reading_collector() -> (u16, std::thread::JoinHandle<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let small: libc::c_int = 2048;
    // SAFETY: setsockopt reads one c_int through a pointer valid for the call, on
    // the listener's open fd; accepted sockets inherit the receive buffer size.
    let rc = unsafe {
        libc::setsockopt(
            listener.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVBUF,
            (&raw const small).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0);
    let port = listener.local_addr().unwrap().port();
    let held = std::thread::spawn(move || {
        // Accept and hold the connection, never reading.
        let conn = listener.accept().map(|(c, _)| c);
        std::thread::sleep(Duration::from_secs(30));
        drop(conn);
    });
    (port, held)
}

/// A stop never waits for a collector: with the forwarder blocked in a write to
/// one that does not read (a write bounded only by the 5 s I/O timeout), SIGTERM
/// still ends the daemon within its drain and a moment (about 1.3 s), and the
/// `daemon_stop` record is in the local log.
#[test]
fn against_a_collector_that_never_reads_the_daemon_still_stops_in_a_moment() {
    let dir = DaemonDir::new("stop-stuck-");
    let (port, held) = never_reading_collector();
    forward_to(&dir, port);
    let mut daemon = dir.start(&[], &[]);
    for _ in 0..200 {
        check_in(&daemon.socket);
    }
    // Check in until the forwarder is stuck: behind, and no progress over 300 ms
    // (the kernel takes a few MB into the send queue before a write blocks).
    let forwarder = || {
        let report = metalift_daemon::service::status::request_raw(&dir.socket(), HANG_GUARD)
            .expect("status");
        let status: serde_json::Value = serde_json::from_str(&report).expect("json");
        status["forwarder"].clone()
    };
    let start = Instant::now();
    loop {
        for _ in 0..500 {
            check_in(&daemon.socket);
        }
        let before = forwarder();
        std::thread::sleep(Duration::from_millis(300));
        let after = forwarder();
        if after["connected"] == true
            && after["bytes_behind"].as_u64().unwrap_or(0) > 0
            && after["delivered_bytes"] == before["delivered_bytes"]
        {
            break;
        }
        assert!(
            start.elapsed() < HANG_GUARD,
            "the forwarder never blocked: {after}"
        );
    }
    // About 1.3 s here (the service's 0.5 s wait for the forwarder to catch up,
    // then STOP_DRAIN + 250 ms before the cut); without the cut, until the blocked
    // write's 5 s timeout.
    let exit = daemon.terminate(Duration::from_secs(3));
    assert!(
        exit.is_some_and(|s| s.success()),
        "metaliftd did not stop within 3 s of SIGTERM ({exit:?}): {}",
        std::fs::read_to_string(dir.daemon_log()).unwrap_or_default()
    );
    assert_eq!(dir.records_of("daemon_stop").len(), 1);
    drop(held);
}

#[test]
fn against_a_collector_that_never_reads_flush_times_out_saying_how_far_behind_and_verdicts_still_come(
) {
    let dir = DaemonDir::new("flush-stuck-");
    let (port, held) = never_reading_collector();
    forward_to(&dir, port);
    let daemon = dir.start(&[], &[]);
    for _ in 0..200 {
        check_in(&daemon.socket);
    }
    let (code, out) = flush(&dir, "1.5");
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("timed out after 1.5s"), "{out}");
    assert!(out.contains("not acknowledged"), "{out}");
    assert!(out.contains("metalift audit export"), "{out}");
    // The numbers are the daemon's: something is behind or unacknowledged.
    let numbers: Vec<u64> = out
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|w| w.parse().ok())
        .collect();
    assert!(numbers.iter().skip(2).any(|&n| n > 0), "{out}");
    // Verdicts are unaffected: a check-in is answered promptly.
    let start = Instant::now();
    let verdict = check_in(&daemon.socket);
    assert!(start.elapsed() < Duration::from_secs(2), "{verdict:?}");
    assert!(start.elapsed() < HANG_GUARD);
    drop(daemon);
    drop(held);
}

/// Issue 43: with the collector down, the timeout says in words that nothing is
/// in flight (not a `?` for an unknown figure) and what to do next.
#[test]
fn against_a_collector_that_is_down_flush_times_out_saying_nothing_is_in_flight_and_what_to_do() {
    let dir = DaemonDir::new("flush-down-");
    // A port nothing listens on: bound, then released.
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    forward_to(&dir, port);
    let daemon = dir.start(&[], &[]);
    for _ in 0..5 {
        check_in(&daemon.socket);
    }
    let (code, out) = flush(&dir, "1");
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains(&format!(
            "not connected to 127.0.0.1:{port}: nothing in flight; "
        )),
        "{out}"
    );
    assert!(
        out.contains("records (") && out.contains("bytes) not yet sent"),
        "{out}"
    );
    assert!(out.contains("Connection refused"), "{out}");
    assert!(out.contains("`metalift audit export --to DIR`"), "{out}");
    assert!(
        !out.contains('?'),
        "an unknown figure is said in words: {out}"
    );
}
