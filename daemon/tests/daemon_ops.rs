//! Daily operations against the real metaliftd: SIGHUP, and qualifier rules
//! (`uid`, `user`, `parent`) decided for real child processes. (`metalift status`
//! against it: `cli/tests/cli_status.rs`.)
//!
//! Children are this test binary, hard-linked as `bin/<name>` and re-executed with
//! `--ignored --exact child_check_in`: the daemon sees the executable, uid and
//! parent the test chose. Tests that need root (running a child under another uid)
//! fail when not root, unless `METALIFT_TEST_SKIP_ROOT=1` opts out, which prints
//! `SKIPPED` (CI runs as root and does not set it).
#![cfg(target_os = "linux")]

#[path = "record_schema.rs"]
mod record_schema;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use metalift_daemon::scratch::{ScratchDaemon, ScratchDir};
use metalift_policy::wire::{CheckIn, Client, WireAction};
use serde_json::Value;

const HANG_GUARD: Duration = Duration::from_secs(60);
/// `nobody` on Debian.
const NOBODY: u32 = 65534;

/// The one scratch daemon's directory ([`ScratchDir`]), with `bin/` for the
/// children, all reachable by another user.
struct Env {
    _dir: tempfile::TempDir,
    scratch: ScratchDir,
}

impl std::ops::Deref for Env {
    type Target = ScratchDir;

    fn deref(&self) -> &ScratchDir {
        &self.scratch
    }
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::Builder::new()
            .prefix("ops-")
            .tempdir_in(base_dir())
            .expect("temp dir");
        let scratch = ScratchDir::new(dir.path()).expect("layout");
        // Children may run as another user: they must reach bin/ and run/.
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::create_dir(dir.path().join("bin")).unwrap();
        for sub in ["bin", "run", "log"] {
            std::fs::set_permissions(dir.path().join(sub), std::fs::Permissions::from_mode(0o755))
                .unwrap();
        }
        Env { _dir: dir, scratch }
    }

    /// A policy with one unlock rule `id` made of `matchers` (TOML lines).
    fn write_rule(&self, id: &str, matchers: &str) {
        let text = format!(
            "version = 1\n\n[profile.apple7]\napple_family_max = 7\n\n\
             [[rule]]\nid = \"{id}\"\n{matchers}\nunlock = \"apple7\"\n"
        );
        std::fs::write(self.policy(), text).unwrap();
    }

    /// This test binary as `bin/<name>`: hard-linked, or copied when the temporary
    /// directory is on another file system.
    fn executable_named(&self, name: &str) -> PathBuf {
        let target = self.path("bin").join(name);
        let me = std::env::current_exe().unwrap();
        if std::fs::hard_link(&me, &target).is_err() {
            std::fs::copy(&me, &target).expect("copy the test binary");
        }
        target
    }

    fn start(&self) -> ScratchDaemon {
        self.scratch
            .start(
                Path::new(env!("CARGO_BIN_EXE_metaliftd")),
                &[] as &[&str],
                &[("RUST_LOG", "debug")],
            )
            .unwrap_or_else(|e| panic!("{e}"))
    }

    fn records_of(&self, kind: &str) -> Vec<Value> {
        record_schema::valid_records(&self.audit_log())
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect()
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
                self.daemon_log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// Where the test directories go: cargo's target tmp dir when every directory
/// above it lets other users through (children run as `nobody` must reach the
/// socket and their executable), else the system's temporary directory (a
/// checkout under `/root`, mode 0700, is not reachable by `nobody`).
fn base_dir() -> PathBuf {
    let target = PathBuf::from(env!("CARGO_TARGET_TMPDIR"));
    let traversable = target
        .ancestors()
        .all(|dir| std::fs::metadata(dir).is_ok_and(|m| m.permissions().mode() & 0o001 != 0));
    if traversable {
        target
    } else {
        std::env::temp_dir()
    }
}

/// Sends `signal` to the scratch daemon.
fn signal(daemon: &ScratchDaemon, signal: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(daemon.pid() as i32).unwrap();
    rustix::process::kill_process(pid, signal).expect("kill");
}

/// Fails the test when not root, unless `METALIFT_TEST_SKIP_ROOT=1` says to skip
/// it (visibly). Returns whether to run.
fn require_root(test: &str) -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(
        std::env::var_os("METALIFT_TEST_SKIP_ROOT").is_some_and(|v| v == "1"),
        "{test} needs root (it runs a child under another uid); run the tests as root, \
         as CI does, or set METALIFT_TEST_SKIP_ROOT=1 to skip it"
    );
    eprintln!("SKIPPED {test}: not root and METALIFT_TEST_SKIP_ROOT=1");
    false
}

/// How a child is launched.
enum Launch {
    /// Directly by this test process, as this process's user.
    Direct,
    /// Directly, with its uid and gid set to `uid` before exec.
    As(u32),
    /// Through `/bin/sh -c '<exe> ...; exit $?'`: its parent is the shell.
    ThroughShell,
}

/// Runs `exe` as a child that checks in, and returns (decision id, action, rule).
fn verdict_of_child(exe: &Path, socket: &Path, launch: Launch) -> (u64, String, String) {
    let args = [
        "--ignored",
        "--exact",
        "child_check_in",
        "--nocapture",
        "--test-threads=1",
    ];
    let mut cmd = match launch {
        Launch::ThroughShell => {
            let mut c = Command::new("/bin/sh");
            // `; exit` keeps the shell alive as the parent (no exec optimisation).
            c.arg("-c")
                .arg(format!("\"$0\" {} ; exit $?", args.join(" ")))
                .arg(exe);
            c
        }
        _ => {
            let mut c = Command::new(exe);
            c.args(args);
            c
        }
    };
    if let Launch::As(uid) = launch {
        cmd.uid(uid).gid(uid);
    }
    let out = cmd
        .env("METALIFT_TEST_SOCKET", socket)
        .output()
        .expect("run child");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let line = stdout
        .lines()
        .find_map(|l| l.split_once("VERDICT ").map(|(_, rest)| rest.to_owned()))
        .unwrap_or_else(|| {
            panic!(
                "child printed no verdict: {stdout}\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    let mut parts = line.split(' ');
    let id = parts.next().and_then(|p| p.parse().ok()).expect("id");
    let action = parts.next().expect("action").to_owned();
    let rule = parts.next().expect("rule").to_owned();
    (id, action, rule)
}

/// Not a test: the body of the child processes above.
#[test]
#[ignore = "child-process helper, run by other tests"]
fn child_check_in() {
    let socket = std::env::var_os("METALIFT_TEST_SOCKET").expect("METALIFT_TEST_SOCKET");
    let v = Client::connect(Path::new(&socket), HANG_GUARD)
        .and_then(|mut c| c.check_in(&CheckIn::default()))
        .expect("a verdict");
    let action = match v.action {
        WireAction::Unlock => "unlock",
        WireAction::Stock => "stock",
    };
    println!(
        "VERDICT {} {action} {}",
        v.decision_id,
        v.rule.as_deref().unwrap_or("-")
    );
}

fn decision(env: &Env, id: u64) -> Value {
    env.records_of("decision")
        .into_iter()
        .find(|r| r["decision_id"] == id)
        .unwrap_or_else(|| panic!("no decision {id}"))
}

// ---------------------------------------------------------------------------
// SIGHUP
// ---------------------------------------------------------------------------

#[test]
fn given_sighup_then_the_daemon_keeps_running_reloads_and_audits_the_reason() {
    let env = Env::new();
    env.write_rule("first", "name = \"first\"");
    let mut daemon = env.start();

    // Nothing changed on disk: the admin's request still leaves a record.
    signal(&daemon, rustix::process::Signal::HUP);
    let loaded = env.wait_for("policy_loaded", "a sighup reload", |r| {
        r.iter().any(|r| r["reason"] == "sighup")
    });
    assert_eq!(loaded[0]["sha256"], loaded.last().unwrap()["sha256"]);
    assert!(daemon.alive(), "SIGHUP stopped metaliftd");

    // A new policy, then SIGHUP: whoever reads it first (the watcher or the
    // signal), the SIGHUP's record names the new policy and it is live.
    env.write_rule("second", "name = \"second\"");
    let new_sha = metalift_policy::load(
        &env.policy(),
        &metalift_policy::LoadOptions {
            allow_insecure_owner: true,
        },
    )
    .expect("valid")
    .policy
    .sha256_hex()
    .to_owned();
    signal(&daemon, rustix::process::Signal::HUP);
    env.wait_for("policy_loaded", "a sighup reload of the new policy", |r| {
        r.iter()
            .any(|r| r["reason"] == "sighup" && r["sha256"] == new_sha.as_str())
    });
    let status =
        metalift_daemon::service::status::request(&env.socket(), HANG_GUARD).expect("status");
    assert_eq!(status.policy_sha256, new_sha);
    assert!(daemon.alive(), "SIGHUP stopped metaliftd");
    assert!(env.records_of("daemon_stop").is_empty());
}

// ---------------------------------------------------------------------------
// Qualifiers through the running daemon, with real processes
// ---------------------------------------------------------------------------

#[test]
fn given_a_uid_rule_then_only_a_child_running_as_that_uid_is_unlocked() {
    if !require_root("given_a_uid_rule_then_only_a_child_running_as_that_uid_is_unlocked") {
        return;
    }
    let env = Env::new();
    let tool = env.executable_named("tool");
    env.write_rule(
        "for-nobody",
        &format!("path = \"{}\"\nuid = {NOBODY}", tool.display()),
    );
    let _daemon = env.start();

    let (id, action, rule) = verdict_of_child(&tool, &env.socket(), Launch::As(NOBODY));
    assert_eq!((action.as_str(), rule.as_str()), ("unlock", "for-nobody"));
    assert_eq!(decision(&env, id)["uid"], NOBODY);

    let (id, action, _) = verdict_of_child(&tool, &env.socket(), Launch::Direct);
    assert_eq!(action, "stock", "root must not match uid = {NOBODY}");
    assert_eq!(decision(&env, id)["uid"], 0);
}

#[test]
fn given_a_user_rule_then_only_a_child_running_as_that_user_is_unlocked() {
    if !require_root("given_a_user_rule_then_only_a_child_running_as_that_user_is_unlocked") {
        return;
    }
    let env = Env::new();
    let tool = env.executable_named("tool");
    env.write_rule(
        "for-nobody",
        &format!("path = \"{}\"\nuser = \"nobody\"", tool.display()),
    );
    let _daemon = env.start();

    let (_, action, rule) = verdict_of_child(&tool, &env.socket(), Launch::As(NOBODY));
    assert_eq!((action.as_str(), rule.as_str()), ("unlock", "for-nobody"));
    let (_, action, _) = verdict_of_child(&tool, &env.socket(), Launch::Direct);
    assert_eq!(action, "stock", "root must not match user = nobody");
}

#[test]
fn given_a_parent_rule_then_only_a_child_of_that_parent_is_unlocked() {
    let env = Env::new();
    let tool = env.executable_named("tool");
    let me = std::env::current_exe().unwrap();
    env.write_rule(
        "from-the-test",
        &format!(
            "path = \"{}\"\nparent = \"{}\"",
            tool.display(),
            me.display()
        ),
    );
    let _daemon = env.start();

    let (id, action, rule) = verdict_of_child(&tool, &env.socket(), Launch::Direct);
    assert_eq!(
        (action.as_str(), rule.as_str()),
        ("unlock", "from-the-test")
    );
    assert_eq!(decision(&env, id)["parent_exe"], me.display().to_string());

    let (id, action, _) = verdict_of_child(&tool, &env.socket(), Launch::ThroughShell);
    assert_eq!(action, "stock", "a child of /bin/sh must not match");
    let parent = decision(&env, id)["parent_exe"].clone();
    assert_ne!(parent, Value::from(me.display().to_string()));
    assert!(parent.as_str().is_some_and(|p| !p.is_empty()), "{parent}");
}
