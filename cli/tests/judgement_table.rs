//! One judgement, every tool (issue 34): each daemon state — healthy; degraded
//! with the last good policy; nothing live; the audit log full; a verification
//! missing or refused; the daemon stopped — through `status`, `doctor`,
//! `exec --require-unlock` and `explain --live` against a real metaliftd, each
//! naming the same cause and exiting with the ladder's status (0 healthy, 3 the
//! file is not live, 4 degraded, 5 unlocks nothing).
//!
//! The full audit disk is a real one: a small tmpfs (mounting needs root, as CI
//! runs; without it the test fails unless `METALIFT_TEST_SKIP_ROOT=1`, and then
//! that row says SKIPPED).
#![cfg(target_os = "linux")]

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;

use support::{Daemon, DaemonDir, HANG_GUARD};

const BRAND: &str = "Apple M1 (Virtual)";

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn probe() -> PathBuf {
    support::workspace_binary("metalift-probe")
        .canonicalize()
        .expect("probe")
}

fn shim() -> PathBuf {
    support::workspace_binary("libmetalift.so")
        .canonicalize()
        .expect("shim")
}

fn metalift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .env_remove("METALIFT_SOCKET")
        .env_remove("METALIFT_POLICY")
        .env_remove("METALIFT_AUDIT_LOG")
        .env_remove("METALIFT_SHIM")
        .env_remove("LD_PRELOAD")
        .env_remove("METALIFT_DISABLE")
        .env("METALIFT_TIMEOUT_MS", "5000")
        .output()
        .expect("run metalift")
}

fn text(o: &Output) -> String {
    format!(
        "stdout:\n{}\nstderr:\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The probe's policy: profile `ci` (Apple 7) for the probe only, verified or not.
fn probe_policy(require_verified: bool) -> String {
    format!(
        "version = 1\n[profile.ci]\napple_family_max = 7\n{}\n[[rule]]\nid = \"the-probe\"\npath = \"{}\"\nunlock = \"ci\"\n",
        if require_verified {
            "require_verified = true\n"
        } else {
            ""
        },
        probe().display()
    )
}

fn write_policy(dir: &DaemonDir, text: &str) {
    fs::write(dir.policy(), text).expect("policy");
    fs::set_permissions(dir.policy(), fs::Permissions::from_mode(0o644)).expect("chmod");
}

fn start(dir: &DaemonDir) -> Daemon {
    dir.start(&[], &[("METALIFT_HOST_CHIP_BRAND", BRAND)])
}

/// A tmpfs mounted over a directory; unmounted (lazily) on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path) -> Option<Tmpfs> {
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=256k,mode=0755", "tmpfs"])
            .arg(dir)
            .output();
        let why = match out {
            Ok(o) if o.status.success() => return Some(Tmpfs(dir.to_owned())),
            Ok(o) => String::from_utf8_lossy(&o.stderr).trim().to_owned(),
            Err(e) => format!("cannot run mount: {e}"),
        };
        assert!(
            std::env::var_os("METALIFT_TEST_SKIP_ROOT").is_some_and(|v| v == "1"),
            "cannot mount a tmpfs for the full-disk row ({why}): run as root, as CI does, \
             or set METALIFT_TEST_SKIP_ROOT=1 to skip it"
        );
        eprintln!("SKIPPED: the full audit disk row: cannot mount a tmpfs: {why}");
        None
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// `chattr +i` on a file (root, ext4 and most file systems), undone on drop.
struct Immutable(PathBuf);

impl Immutable {
    fn set(file: &Path) -> Immutable {
        let out = Command::new("chattr")
            .arg("+i")
            .arg(file)
            .output()
            .expect("run chattr (e2fsprogs)");
        assert!(
            out.status.success(),
            "chattr +i {}: {} (the unwritable row needs root and a file system with the \
             immutable flag)",
            file.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Immutable(file.to_owned())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

/// Fills the file system holding `dir` until not one more byte fits.
fn fill(dir: &Path) {
    let mut f = fs::File::create(dir.join("ballast")).expect("ballast");
    let chunk = [0u8; 4096];
    while f.write(&chunk).is_ok_and(|n| n > 0) {}
    while f.write(&[0u8; 1]).is_ok_and(|n| n > 0) {}
}

fn wait_for_cause(dir: &DaemonDir, code: &str) {
    let start = Instant::now();
    loop {
        let report =
            metalift_daemon::service::status::request(&dir.socket(), Duration::from_secs(5));
        if report.is_ok_and(|r| r.health.causes.iter().any(|c| c.code == code)) {
            return;
        }
        assert!(
            start.elapsed() < HANG_GUARD,
            "the daemon never reported {code}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One state, as every tool must judge it.
struct Row {
    name: &'static str,
    /// The ladder's status.
    code: i32,
    /// The cause named first (`None`: healthy).
    cause: Option<&'static str>,
    /// `exec --require-unlock`'s status: the ladder's when nothing unlocks the
    /// probe (never milder than 4), 0 when it is unlocked (the cause then a note).
    exec_code: i32,
}

/// Runs the four tools on `dir` and checks each against `row`.
fn check_row(dir: &DaemonDir, row: &Row) {
    let (socket, policy, log) = (dir.socket(), dir.policy(), dir.audit_log());
    let name = row.name;

    let status = metalift(&["status", "--json", "--socket", s(&socket)]);
    let json: Value = serde_json::from_slice(&status.stdout)
        .unwrap_or_else(|e| panic!("{name}: status --json: {e}: {}", text(&status)));
    assert_eq!(
        status.status.code(),
        Some(row.code),
        "{name}: status: {json:#}"
    );
    assert_eq!(
        json["cause"]["code"].as_str(),
        row.cause,
        "{name}: status names the cause: {json:#}"
    );
    let plain = metalift(&["status", "--socket", s(&socket)]);
    assert_eq!(
        plain.status.code(),
        Some(row.code),
        "{name}: {}",
        text(&plain)
    );
    if let Some(cause) = row.cause {
        let all = text(&plain);
        assert!(
            all.contains(&format!("({cause})")),
            "{name}: status text: {all}"
        );
    }

    let doctor = metalift(&[
        "doctor",
        "--json",
        "--allow-insecure-owner",
        "--socket",
        s(&socket),
        "--policy",
        s(&policy),
        "--log",
        s(&log),
        "--shim",
        s(&shim()),
    ]);
    let report: Value = serde_json::from_slice(&doctor.stdout)
        .unwrap_or_else(|e| panic!("{name}: doctor --json: {e}: {}", text(&doctor)));
    let health = report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "health")
        .unwrap_or_else(|| panic!("{name}: no health check: {report:#}"))
        .clone();
    match row.cause {
        None => assert_eq!(health["status"], "ok", "{name}: doctor: {report:#}"),
        Some(cause) => {
            assert_eq!(health["status"], "fail", "{name}: doctor: {report:#}");
            assert!(
                health["message"]
                    .as_str()
                    .is_some_and(|m| m.contains(&format!("({cause})"))),
                "{name}: doctor names the cause: {health:#}"
            );
            assert_eq!(
                doctor.status.code(),
                Some(row.code),
                "{name}: doctor exits the ladder's status: {report:#}"
            );
        }
    }

    let explain = metalift(&[
        "explain",
        "--live",
        "--socket",
        s(&socket),
        "--log",
        s(&log),
        "--path",
        s(&probe()),
    ]);
    assert_eq!(
        explain.status.code(),
        Some(row.code),
        "{name}: explain --live: {}",
        text(&explain)
    );
    if let Some(cause) = row.cause {
        let err = String::from_utf8_lossy(&explain.stderr);
        assert!(
            err.contains(&format!("({cause})")),
            "{name}: explain --live names the cause: {err}"
        );
    }

    // Last: its check-in may itself be the write that fails.
    let exec = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["exec", "--require-unlock", "--log", s(&log), "--shim"])
        .arg(shim())
        .arg("--")
        .arg(probe())
        .env_remove("LD_PRELOAD")
        .env_remove("METALIFT_SHIM")
        .env_remove("METALIFT_DISABLE")
        .env("METALIFT_SOCKET", &socket)
        .env("METALIFT_TIMEOUT_MS", "5000")
        .output()
        .expect("run metalift exec");
    assert_eq!(
        exec.status.code(),
        Some(row.exec_code),
        "{name}: exec --require-unlock: {}",
        text(&exec)
    );
    if let Some(cause) = row.cause {
        let err = String::from_utf8_lossy(&exec.stderr);
        assert!(
            err.contains(&format!(": {cause}: ")),
            "{name}: exec names the cause: {err}"
        );
    }
}

#[test]
fn every_daemon_state_reads_the_same_through_status_doctor_exec_and_explain_live() {
    // Healthy.
    let dir = DaemonDir::new("table-healthy-");
    write_policy(&dir, &probe_policy(false));
    let _daemon = start(&dir);
    check_row(
        &dir,
        &Row {
            name: "healthy",
            code: 0,
            cause: None,
            exec_code: 0,
        },
    );

    // Degraded with the last good policy: policy.toml deleted.
    let dir = DaemonDir::new("table-last-good-");
    write_policy(&dir, &probe_policy(false));
    let _daemon = start(&dir);
    fs::remove_file(dir.policy()).expect("delete the policy");
    wait_for_cause(&dir, "policy_missing");
    check_row(
        &dir,
        &Row {
            name: "degraded, last good live",
            code: 4,
            cause: Some("policy_missing"),
            exec_code: 0,
        },
    );

    // Nothing live: refused at start (binary garbage).
    let dir = DaemonDir::new("table-nothing-");
    fs::write(dir.policy(), b"\x00\xff\xfe garbage\n").expect("garbage");
    fs::set_permissions(dir.policy(), fs::Permissions::from_mode(0o644)).expect("chmod");
    let _daemon = start(&dir);
    check_row(
        &dir,
        &Row {
            name: "nothing live",
            code: 5,
            cause: Some("nothing_live"),
            exec_code: 5,
        },
    );

    // A verification missing for a require_verified profile.
    let dir = DaemonDir::new("table-unverified-");
    write_policy(&dir, &probe_policy(true));
    let _daemon = start(&dir);
    check_row(
        &dir,
        &Row {
            name: "verification missing",
            code: 4,
            cause: Some("unverified"),
            exec_code: 4,
        },
    );

    // The verification file refused (larger than the daemon reads).
    let dir = DaemonDir::new("table-refused-verification-");
    write_policy(&dir, &probe_policy(true));
    let big = fs::File::create(dir.path("etc/verifications.jsonl")).expect("verifications");
    big.set_len(5 << 20).expect("a 5 MiB file");
    let _daemon = start(&dir);
    check_row(
        &dir,
        &Row {
            name: "verification refused",
            code: 4,
            cause: Some("verification_refused"),
            exec_code: 4,
        },
    );

    // The daemon stopped.
    let dir = DaemonDir::new("table-stopped-");
    write_policy(&dir, &probe_policy(false));
    drop(start(&dir));
    check_row(
        &dir,
        &Row {
            name: "daemon stopped",
            code: 5,
            cause: Some("daemon_unreachable"),
            exec_code: 5,
        },
    );

    // The audit log unwritable (immutable), said before any write fails.
    let dir = DaemonDir::new("table-unwritable-");
    write_policy(&dir, &probe_policy(false));
    let _daemon = start(&dir);
    let _immutable = Immutable::set(&dir.audit_log());
    check_row(
        &dir,
        &Row {
            name: "audit log unwritable",
            code: 5,
            cause: Some("audit_unwritable"),
            exec_code: 5,
        },
    );
    drop(_immutable);

    // The audit log's file system full.
    let dir = DaemonDir::new("table-full-");
    write_policy(&dir, &probe_policy(false));
    let Some(_tmpfs) = Tmpfs::mount(&dir.path("log")) else {
        return;
    };
    let _daemon = start(&dir);
    fill(&dir.path("log"));
    // The log's last page may still take a record or two: check in until a
    // write fails, so every tool below sees the same full log.
    let start = Instant::now();
    while !metalift_daemon::service::status::request(&dir.socket(), Duration::from_secs(5))
        .is_ok_and(|r| {
            r.health
                .causes
                .iter()
                .any(|c| c.code == "audit_write_failed")
        })
    {
        assert!(start.elapsed() < HANG_GUARD, "no audit write ever failed");
        support::check_in(&dir.socket());
    }
    check_row(
        &dir,
        &Row {
            name: "audit log full",
            code: 5,
            cause: Some("audit_write_failed"),
            exec_code: 5,
        },
    );
}
