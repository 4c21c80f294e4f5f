//! `metalift status` against the real metaliftd: what it shows, its exit codes
//! (0 healthy, 1 no daemon, 3 the file on disk is refused) and its JSON.
//!
//! The daemon is the real binary on a temporary socket; check-ins come from this
//! process in the raw wire protocol and from the probe run through `metalift exec`.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;

use support::{Daemon, HANG_GUARD};

/// The daemon's directory, and what this file does with it.
struct Env(support::DaemonDir);

impl std::ops::Deref for Env {
    type Target = support::DaemonDir;
    fn deref(&self) -> &support::DaemonDir {
        &self.0
    }
}

impl Env {
    fn new() -> Env {
        Env(support::DaemonDir::new("status-"))
    }

    /// An enforcing policy with one unlock rule `id` made of `matchers` (TOML lines).
    fn write_rule(&self, id: &str, matchers: &str) {
        let text = format!(
            "version = 1\nmode = \"enforce\"\n\n[profile.apple7]\napple_family_max = 7\nmax_threadgroup_memory = 32768\n\n\
             [[rule]]\nid = \"{id}\"\n{matchers}\nunlock = \"apple7\"\n"
        );
        std::fs::write(self.policy(), text).unwrap();
    }

    fn start(&self) -> Daemon {
        self.0.start(&[], &[("RUST_LOG", "debug")])
    }

    /// Waits until `cond` holds for the audit records of `kind`.
    fn wait_for(&self, kind: &str, what: &str, cond: impl Fn(&[Value]) -> bool) -> Vec<Value> {
        let start = Instant::now();
        loop {
            let records = self.records_of(kind);
            if cond(&records) {
                return records;
            }
            assert!(
                start.elapsed() < HANG_GUARD,
                "gave up waiting for {what}: {records:?}\ndaemon log:\n{}",
                std::fs::read_to_string(self.daemon_log()).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `metalift status [--json]` on this socket: (exit code, stdout, stderr).
    fn status(&self, json: bool) -> (Option<i32>, String, String) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_metalift"));
        cmd.arg("status").arg("--socket").arg(self.socket());
        if json {
            cmd.arg("--json");
        }
        let out = cmd.output().expect("metalift status");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }
}

/// metalift-probe (built with the workspace), run with libmetalift through
/// `metalift exec`: one check-in from a process the daemon sees as the probe.
fn probe_through_the_shim(socket: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .arg("exec")
        .arg("--shim")
        .arg(support::workspace_binary("libmetalift.so"))
        .arg("--")
        .arg(probe())
        .arg("--json")
        .env_remove("LD_PRELOAD")
        .env_remove("METALIFT_SHIM")
        .env_remove("METALIFT_DISABLE")
        .env("METALIFT_SOCKET", socket)
        .env("METALIFT_TIMEOUT_MS", "2000")
        .output()
        .expect("metalift exec");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn probe() -> PathBuf {
    support::workspace_binary("metalift-probe")
        .canonicalize()
        .expect("resolve metalift-probe")
}

#[test]
fn metalift_status_shows_the_policy_and_counts() {
    let env = Env::new();
    env.write_rule("llama", &format!("path = \"{}\"", probe().display()));
    let _daemon = env.start();
    // One unlock (the probe matches the rule), one stock (this test does not).
    probe_through_the_shim(&env.socket());
    support::check_in(&env.socket());

    let (code, text, err) = env.status(false);
    assert_eq!(code, Some(0), "{text}{err}");
    let sha = env.records_of("policy_loaded")[0]["sha256"]
        .as_str()
        .unwrap()
        .to_owned();
    for needle in [
        env.policy().display().to_string(),
        sha,
        "rules           1".into(),
        "mode            enforce".into(),
        "check-ins         2".into(),
        "unlocks         1".into(),
        "last error      none".into(),
    ] {
        assert!(text.contains(&needle), "{needle:?} missing from\n{text}");
    }

    let (_, json, _) = env.status(true);
    let v: Value = serde_json::from_str(&json).expect("json");
    assert_eq!(v["check_ins"], 2);
    assert_eq!(v["unlocks"], 1);
}

#[test]
fn metalift_status_without_a_daemon_exits_5_unlocks_nothing_and_names_the_socket() {
    let env = Env::new();
    let (code, _, stderr) = env.status(false);
    assert_eq!(code, Some(5));
    assert!(stderr.contains("is metaliftd running?"), "{stderr}");
    assert!(
        stderr.contains(&env.socket().display().to_string()),
        "{stderr}"
    );
}

#[test]
fn given_a_healthy_daemon_then_status_exits_0_and_the_disk_hash_is_the_live_one() {
    let env = Env::new();
    env.write_rule("one", "name = \"one\"");
    let _daemon = env.start();
    let (code, out, err) = env.status(false);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!out.contains("problems"), "{out}");

    let (code, out, _) = env.status(true);
    assert_eq!(code, Some(0));
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["ok"], true);
    assert!(v["error"].is_null());
    assert_eq!(v["problems"], serde_json::json!([]));
    assert_eq!(v["disk_sha256"], v["policy_sha256"]);
    assert_eq!(v["rule_count"], 1);
}

#[test]
fn given_a_refused_file_on_disk_then_status_exits_3_listing_every_error_cause_first() {
    let env = Env::new();
    env.write_rule("good", "name = \"good\"");
    let _daemon = env.start();
    let good_sha = metalift_daemon::service::status::request(&env.socket(), HANG_GUARD)
        .expect("status")
        .policy_sha256;

    // Two errors: an unknown key (line 2), a rule naming an unknown profile (line 6).
    std::fs::write(
        env.policy(),
        "version = 1\nbogus = 1\n\n[[rule]]\nid = \"x\"\nunlock = \"nope\"\nname = \"x\"\n",
    )
    .unwrap();
    env.wait_for("policy_rejected", "the refusal", |r| !r.is_empty());

    let (code, out, _) = env.status(false);
    assert_eq!(code, Some(3), "{out}");
    let problems = out.split("problems (cause first):").nth(1).expect(&out);
    let refused = problems.find("the daemon refused").expect(problems);
    let knock_on = problems.find("so the live policy").expect(problems);
    assert!(refused < knock_on, "cause first:\n{problems}");
    assert!(problems.contains("2 errors"), "{problems}");
    assert!(problems.contains("policy.toml:2:"), "{problems}");
    assert!(problems.contains("policy.toml:6:"), "{problems}");
    assert!(problems.contains(&good_sha), "{problems}");

    let (code, out, _) = env.status(true);
    assert_eq!(code, Some(3));
    let v: Value = serde_json::from_str(&out).expect("json");
    assert_eq!(v["ok"], false);
    assert_eq!(v["last_reload_errors"].as_array().map(Vec::len), Some(2));
    assert_eq!(v["policy_sha256"], good_sha.as_str());
    assert_ne!(v["disk_sha256"], good_sha.as_str());
    assert_eq!(v["disk_sha256"], v["refused_sha256"]);
}

#[test]
fn given_no_daemon_then_status_exits_5_and_json_still_prints_one_object() {
    let env = Env::new();
    let (code, out, err) = env.status(true);
    assert_eq!(code, Some(5), "{out}{err}");
    let v: Value = serde_json::from_str(&out).expect("json on failure");
    assert_eq!(v["ok"], false);
    assert!(v["error"]
        .as_str()
        .is_some_and(|e| e.contains("is metaliftd running?")));
    assert_eq!(v["socket"], env.socket().display().to_string());

    let (code, out, err) = env.status(false);
    assert_eq!(code, Some(5));
    assert!(out.is_empty(), "{out}");
    assert!(err.contains("is metaliftd running?"), "{err}");
}

/// `--wait`: a script that has just started a daemon asks once it answers. The
/// status asked before the daemon exists (and with a stale socket file left at its
/// path) answers healthy once the daemon is up; without `--wait` the same exits 5.
#[test]
fn given_wait_then_status_asks_again_until_a_daemon_just_started_answers() {
    let env = Env::new();
    env.write_rule("one", "name = \"one\"");
    // An earlier daemon's socket file, nobody listening on it.
    drop(std::os::unix::net::UnixListener::bind(env.socket()).expect("stale socket"));
    assert_eq!(env.status(false).0, Some(5), "nothing answers yet");

    let waiting = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["status", "--wait", "30", "--socket"])
        .arg(env.socket())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("metalift status --wait");
    std::thread::sleep(Duration::from_millis(500));
    std::fs::remove_file(env.socket()).expect("remove the stale socket");
    let _daemon = env.start();
    let out = waiting.wait_with_output().expect("status --wait");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("rules"), "the daemon's report: {stdout}");
}

/// `--wait` is a bound, not a promise: with no daemon at all it gives up after SECS
/// and exits 5, naming the socket.
#[test]
fn given_wait_and_no_daemon_then_status_gives_up_after_the_wait_with_5() {
    let env = Env::new();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["status", "--wait", "1", "--socket"])
        .arg(env.socket())
        .output()
        .expect("metalift status --wait 1");
    assert_eq!(out.status.code(), Some(5));
    assert!(started.elapsed() >= Duration::from_secs(1), "it waited");
    assert!(String::from_utf8_lossy(&out.stderr).contains(&env.socket().display().to_string()));
}
