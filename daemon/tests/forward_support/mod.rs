//! What the forwarding tests share: the scratch daemon's directory with a policy
//! that forwards ([`Env`]), records on demand ([`reloads`], [`check_in`]), a free
//! port, and one test at a time ([`serial`]).
#![allow(dead_code)] // each test binary uses its part

pub mod fleet;

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use metalift_daemon::scratch::{ScratchDaemon, ScratchDir};
use metalift_policy::wire::{Client, VerdictMsg};

/// Longest any wait of these tests lasts.
pub const GUARD: Duration = Duration::from_secs(60);

/// One test at a time: each starts an rsyslogd and a metaliftd, and on two busy
/// cores the tests in parallel starved each other's forwarders (seen in CI-like runs).
pub static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

pub fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The one scratch daemon's directory ([`ScratchDir`]).
pub struct Env {
    pub dir: tempfile::TempDir,
    pub scratch: ScratchDir,
    /// `--audit-keep`.
    pub keep: usize,
}

impl std::ops::Deref for Env {
    type Target = ScratchDir;

    fn deref(&self) -> &ScratchDir {
        &self.scratch
    }
}

impl Env {
    pub fn new() -> Env {
        let dir = tempfile::Builder::new().prefix("fwd-").tempdir().unwrap();
        let scratch = ScratchDir::new(dir.path()).expect("layout");
        Env {
            dir,
            scratch,
            keep: 200,
        }
    }
    pub fn log(&self) -> PathBuf {
        self.audit_log()
    }
    pub fn policy(&self, forward: &str) {
        std::fs::write(
            self.scratch.policy(),
            format!("version = 1\n\n[audit.forward]\n{forward}\n"),
        )
        .unwrap();
    }
    pub fn start(&self, max_bytes: u64) -> ScratchDaemon {
        let (max_bytes, keep) = (max_bytes.to_string(), self.keep.to_string());
        self.scratch
            .start(
                Path::new(env!("CARGO_BIN_EXE_metaliftd")),
                &["--audit-max-bytes", &max_bytes, "--audit-keep", &keep],
                &[],
            )
            .unwrap_or_else(|e| panic!("{e}"))
    }
    /// Every record line of the local log, oldest file first.
    pub fn local_lines(&self) -> Vec<String> {
        let mut files: Vec<(usize, PathBuf)> = std::fs::read_dir(self.path("log"))
            .unwrap()
            .filter_map(|e| {
                let p = e.ok()?.path();
                let name = p.file_name()?.to_str()?.to_owned();
                let n = match name.strip_prefix("audit.jsonl") {
                    Some("") => 0,
                    Some(rest) => rest.strip_prefix('.')?.parse().ok()?,
                    None => return None,
                };
                Some((n, p))
            })
            .collect();
        files.sort_by_key(|f| std::cmp::Reverse(f.0));
        files
            .iter()
            .flat_map(|(_, p)| {
                // A file rotation removed between the listing and the read holds
                // nothing local any more (seen once under load on 2 busy cores).
                match std::fs::read_to_string(p) {
                    Ok(text) => text,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                    Err(e) => panic!("{}: {e}", p.display()),
                }
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
            })
            .collect()
    }
    /// Record lines after the saved cursor (`dev ino offset`): in its file after
    /// the offset, and in every newer file. All of them without a cursor.
    pub fn lines_past_cursor(&self, cursor: &str) -> usize {
        use std::os::unix::fs::MetadataExt;
        let f: Vec<u64> = cursor
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        let mut files: Vec<(usize, PathBuf)> = (0..=200)
            .map(|n| {
                let p = if n == 0 {
                    self.log()
                } else {
                    PathBuf::from(format!("{}.{n}", self.log().display()))
                };
                (n, p)
            })
            .filter(|(_, p)| p.exists())
            .collect();
        files.sort_by_key(|f| std::cmp::Reverse(f.0));
        let mut count = 0;
        let mut counting = f.len() != 3;
        for (_, p) in files {
            let text = std::fs::read(&p).unwrap();
            let meta = std::fs::metadata(&p).unwrap();
            if !counting && meta.dev() == f[0] && meta.ino() == f[1] {
                counting = true;
                count += text[f[2] as usize..]
                    .iter()
                    .filter(|&&b| b == b'\n')
                    .count();
            } else if counting {
                count += text.iter().filter(|&&b| b == b'\n').count();
            }
        }
        count
    }
    pub fn status(&self) -> metalift_daemon::service::status::StatusReport {
        metalift_daemon::service::status::request(&self.socket(), GUARD).unwrap()
    }
}

/// The records in `buf`'s whole RFC 6587 octet-counted frames (RFC 5424
/// messages with the record's JSON as MSG), consumed from it (a partial frame stays).
pub fn take_records(buf: &mut Vec<u8>) -> Vec<serde_json::Value> {
    let mut records = Vec::new();
    loop {
        let Some(sp) = buf.iter().position(|&b| b == b' ') else {
            return records;
        };
        let len: usize = std::str::from_utf8(&buf[..sp])
            .ok()
            .and_then(|l| l.parse().ok())
            .unwrap_or_else(|| panic!("not a frame length: {:?}", String::from_utf8_lossy(buf)));
        if buf.len() < sp + 1 + len {
            return records;
        }
        let msg = buf[sp + 1..sp + 1 + len].to_vec();
        buf.drain(..sp + 1 + len);
        // <PRI>1 TIME HOST APP PROCID MSGID SD JSON
        let json = msg
            .splitn(8, |&b| b == b' ')
            .nth(7)
            .expect("a message with a JSON body");
        records.push(serde_json::from_slice(json).expect("the body is the record"));
    }
}

/// Makes the daemon write `n` `policy_loaded` records (one SIGHUP each).
pub fn reloads(env: &Env, daemon: &ScratchDaemon, n: usize) {
    let pid = rustix::process::Pid::from_raw(daemon.pid() as i32).unwrap();
    for _ in 0..n {
        // The newest line, not the count: rotation may remove an old file as the
        // new record lands, and every record's id is unique.
        let before = env.local_lines().last().cloned();
        rustix::process::kill_process(pid, rustix::process::Signal::HUP).unwrap();
        let start = Instant::now();
        while env.local_lines().last().cloned() == before {
            assert!(start.elapsed() < GUARD, "no record after SIGHUP");
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}

/// One check-in at `socket` (a decision record), claiming `job`; the client stays
/// open for the outcome.
pub fn check_in(socket: &Path, job: Option<&str>) -> (Client, VerdictMsg) {
    metalift_daemon::scratch::check_in(socket, "test", job, GUARD).expect("a verdict")
}

/// The header of [`send_torn`]'s frames.
pub fn torn_header() -> metalift_daemon::audit::forward::frame::Header {
    metalift_daemon::audit::forward::frame::Header {
        hostname: "torn".into(),
        pid: 7,
    }
}

/// [`send_torn`]'s record `n`.
pub fn torn_record(n: u32) -> String {
    format!(
        "{{\"schema\":1,\"id\":\"torn-{n}\",\"kind\":\"daemon_stop\",\"time\":\"2026-12-06T12:00:0{n}.000000Z\",\"pid\":7,\"reason\":\"{}\"}}",
        "x".repeat(200)
    )
}

/// Issue 42 item 2's scene for a collector on `port` that writes to `out`: frame
/// 1 and half of frame 2 on one connection, which then closes; frame 3 on the
/// next. Waits until record 3 is in `out`, and a moment for anything of the torn
/// frame to follow; returns `out`'s lines sorted (a collector's workers read the
/// two connections in either order).
pub fn send_torn(port: u16, out: &Path) -> Vec<String> {
    use metalift_daemon::audit::forward::frame;
    use std::io::Write;
    let framed = |n: u32| {
        let mut bytes = Vec::new();
        frame::push(&mut bytes, &torn_header(), torn_record(n).as_bytes());
        bytes
    };
    let mut first = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    first.write_all(&framed(1)).unwrap();
    let torn = framed(2);
    first.write_all(&torn[..torn.len() / 2]).unwrap();
    drop(first);
    let mut second = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    second.write_all(&framed(3)).unwrap();
    drop(second);
    let start = Instant::now();
    while !std::fs::read_to_string(out)
        .unwrap_or_default()
        .contains("torn-3")
    {
        assert!(
            start.elapsed() < GUARD,
            "frame 3 never reached {}",
            out.display()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let mut lines: Vec<String> = std::fs::read_to_string(out)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect();
    lines.sort_unstable();
    lines
}
