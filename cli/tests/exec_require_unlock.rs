//! `metalift exec --require-unlock` and `--expect-family` as CI uses them (issue 26),
//! end to end on Linux: the real metaliftd (with a host chip brand), the real shim
//! injected into the real probe on the simulated Metal, and the README's CI recipe
//! (`examples/ci-recipe.sh`) run as written.
//!
//! Needs the workspace built first (`cargo build --workspace`, as scripts/test.sh does).
#![cfg(target_os = "linux")]

mod support;

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use metalift_policy::wire::{self, Message, LENGTH_PREFIX};
use support::{workspace_binary, Daemon, DaemonDir};

fn probe() -> PathBuf {
    workspace_binary("metalift-probe")
        .canonicalize()
        .expect("probe")
}

fn shim() -> PathBuf {
    workspace_binary("libmetalift.so")
        .canonicalize()
        .expect("shim")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// A policy whose profile asks `family` (a number or `"host"`) for the probe only.
fn probe_policy(family: &str) -> String {
    format!(
        "version = 1\n[profile.ci]\napple_family_max = {family}\n\n[[rule]]\nid = \"the-probe\"\npath = \"{}\"\nunlock = \"ci\"\n",
        probe().display()
    )
}

/// A metaliftd on a fresh directory with `policy`, on a host whose chip is `brand`.
fn daemon(policy: &str, brand: &str) -> (DaemonDir, Daemon) {
    let dir = DaemonDir::new("require-unlock-");
    fs::write(dir.policy(), policy).expect("policy");
    fs::set_permissions(dir.policy(), fs::Permissions::from_mode(0o644)).expect("chmod");
    let daemon = dir.start(&[], &[("METALIFT_HOST_CHIP_BRAND", brand)]);
    (dir, daemon)
}

/// `metalift exec --require-unlock --log LOG --shim SHIM ARGS...` against `socket`.
fn require_unlock(socket: &Path, log: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["exec", "--require-unlock", "--log"])
        .arg(log)
        .arg("--shim")
        .arg(shim())
        .args(args)
        .env_remove("LD_PRELOAD")
        .env_remove("METALIFT_SHIM")
        .env_remove("METALIFT_DISABLE")
        .env("METALIFT_SOCKET", socket)
        .env("METALIFT_TIMEOUT_MS", "5000")
        .output()
        .expect("run metalift")
}

/// An executable shell script `name` in `dir` with `body` after the `#!/bin/sh` line.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, format!("#!/bin/sh\n{body}")).expect("script");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).expect("chmod");
    path
}

/// A stand-in for `llama-bench`: a wrapper script whose child is the probe, with
/// work after it so the shell cannot `exec` the probe in its own place.
fn wrapper(dir: &Path) -> PathBuf {
    script(
        dir,
        "llama-bench",
        &format!(
            "\"{}\" --json >/dev/null\nstatus=$?\necho \"bench done\" >&2\nexit $status\n",
            probe().display()
        ),
    )
}

#[test]
fn given_a_wrapper_script_whose_child_is_unlocked_then_require_unlock_passes() {
    let (dir, daemon) = daemon(&probe_policy("7"), "Apple M1 (Virtual)");
    let wrapper = wrapper(dir.root());
    let out = require_unlock(
        &daemon.socket,
        &dir.audit_log(),
        &["--", wrapper.to_str().expect("utf-8")],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(0), "{err}");
    assert!(err.contains("unlocked by rule the-probe"), "{err}");
    assert!(
        err.contains(&probe().display().to_string()),
        "names the process: {err}"
    );
    // Two levels down (make → sh → the program) counts too.
    let outer = script(
        dir.root(),
        "make",
        &format!("sh -c '\"{}\"; :'\n:\n", wrapper.display()),
    );
    let out = require_unlock(
        &daemon.socket,
        &dir.audit_log(),
        &["--", outer.to_str().expect("utf-8")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
}

#[test]
fn given_a_command_that_exits_2_then_require_unlock_exits_2_with_a_line_saying_so() {
    let (dir, daemon) = daemon(&probe_policy("7"), "Apple M1 (Virtual)");
    let out = require_unlock(
        &daemon.socket,
        &dir.audit_log(),
        &["--", "sh", "-c", "exit 2"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("exited with status 2: passing it through"),
        "{err}"
    );
    assert!(!err.contains("no decision"), "not judged: {err}");

    let out = require_unlock(
        &daemon.socket,
        &dir.audit_log(),
        &["--", "sh", "-c", "kill -KILL $$"],
    );
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(128 + 9), "{err}");
    assert!(
        err.contains("was killed by signal 9 (SIGKILL): exiting 137"),
        "{err}"
    );
}

#[test]
fn given_a_command_that_succeeds_without_metal_then_4_says_why() {
    let (dir, daemon) = daemon(&probe_policy("7"), "Apple M1 (Virtual)");
    let out = require_unlock(&daemon.socket, &dir.audit_log(), &["--", "true"]);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(4), "{err}");
    assert!(err.contains("no decision for pid"), "{err}");
}

#[test]
fn quiet_says_nothing_when_the_command_was_unlocked() {
    let (dir, daemon) = daemon(&probe_policy("7"), "Apple M1 (Virtual)");
    let probe = probe();
    let out = require_unlock(
        &daemon.socket,
        &dir.audit_log(),
        &["--quiet", "--", probe.to_str().expect("utf-8")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
}

#[test]
fn expect_family_n_is_apple_n_or_above_of_the_unlocked_process_and_equals_n_exactly() {
    // "host" on an M3 host: the probe is told Apple9.
    let (dir, daemon) = daemon(&probe_policy("\"host\""), "Apple M3 (Virtual)");
    let probe = probe();
    let run = |expect: &str| {
        require_unlock(
            &daemon.socket,
            &dir.audit_log(),
            &[
                "--expect-family",
                expect,
                "--",
                probe.to_str().expect("utf-8"),
            ],
        )
    };
    let out = run("7");
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert!(stderr(&out).contains("(up to Apple9)"), "{}", stderr(&out));
    assert_eq!(run("=9").status.code(), Some(0));
    let out = run("=7");
    assert_eq!(out.status.code(), Some(4), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("answers up to Apple9, not exactly Apple7"),
        "{}",
        stderr(&out)
    );
    assert_eq!(run("10").status.code(), Some(4));
}

/// README's CI recipe as written (`examples/ci-recipe.sh`: both steps inject with
/// `metalift exec`), with the recommended `apple_family_max = "host"`: it must hold
/// on an M1 host (Apple7) and on an M3 host (Apple9) alike.
#[test]
fn the_readme_ci_recipe_holds_on_an_m1_and_an_m3_host() {
    let recipe = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/ci-recipe.sh");
    let recipe_with = |daemon: &Daemon, dir: &DaemonDir, workload: &Path| {
        Command::new("sh")
            .arg(&recipe)
            .arg(workload)
            .env("METALIFT", env!("CARGO_BIN_EXE_metalift"))
            .env("METALIFT_PROBE", probe())
            .env("METALIFT_AUDIT_LOG", dir.audit_log())
            .env("METALIFT_EXPORT_DIR", dir.root().join("export"))
            .env_remove("LD_PRELOAD")
            .env("METALIFT_SOCKET", &daemon.socket)
            .env("METALIFT_SHIM", shim())
            .env("METALIFT_TIMEOUT_MS", "5000")
            .output()
            .expect("run the recipe")
    };
    for brand in ["Apple M1 (Virtual)", "Apple M3 (Virtual)"] {
        let (dir, daemon) = daemon(&probe_policy("\"host\""), brand);
        let workload = wrapper(dir.root());
        let out = recipe_with(&daemon, &dir, &workload);
        assert_eq!(
            out.status.code(),
            Some(0),
            "{brand}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            stderr(&out)
        );
        assert!(
            stderr(&out).contains("unlocked by rule the-probe"),
            "{brand}: {}",
            stderr(&out)
        );
        // Step 4 left this boot's bundle in the export directory.
        let exported = std::fs::read_dir(dir.root().join("export"))
            .map(|d| d.count())
            .unwrap_or(0);
        assert_eq!(exported, 1, "{brand}: {}", stderr(&out));
        // A workload that runs fine but is never unlocked fails the job with 4.
        let out = recipe_with(&daemon, &dir, Path::new("/bin/true"));
        assert_eq!(out.status.code(), Some(4), "{brand}: {}", stderr(&out));
    }
}

/// A stand-in daemon that answers status requests with `status_json` and closes
/// every other connection (a check-in then stays stock).
fn fake_status_daemon(socket: &Path, status_json: String) {
    let listener = UnixListener::bind(socket).expect("bind");
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut prefix = [0u8; LENGTH_PREFIX];
            if stream.read_exact(&mut prefix).is_err() {
                continue;
            }
            let Ok(len) = wire::frame_length(prefix) else {
                continue;
            };
            let mut body = vec![0u8; len];
            if stream.read_exact(&mut body).is_err() {
                continue;
            }
            if let Ok(Message::StatusRequest) = wire::decode_body(&body) {
                let reply = Message::Status(status_json.clone());
                let _ = stream.write_all(&wire::encode_frame(&reply));
            }
        }
    });
}

/// `exec --require-unlock` of the probe against a stand-in daemon answering a
/// real daemon's status with `cause` as its only health cause: its exit status
/// and stderr, and the stand-in's socket.
fn require_unlock_with_cause(dir: &Path, cause: serde_json::Value) -> (Output, String, PathBuf) {
    let socket = dir.join("metalift.sock");
    let real = DaemonDir::new("exec-degraded");
    fs::write(real.policy(), "version = 1\n").expect("policy");
    let daemon = real.start(&[], &[]);
    let json = metalift_daemon::service::status::request_raw(
        &daemon.socket,
        std::time::Duration::from_secs(5),
    )
    .expect("status");
    let mut status: serde_json::Value = serde_json::from_str(&json).expect("status JSON");
    status["health"] = serde_json::json!({"state": "degraded", "causes": [cause]});
    fake_status_daemon(&socket, status.to_string());
    let log = dir.join("audit.jsonl");
    fs::write(&log, "").expect("log");
    let probe = probe();
    let out = require_unlock(&socket, &log, &["--", probe.to_str().expect("utf-8")]);
    let err = stderr(&out);
    (out, err, socket)
}

#[test]
fn the_effect_the_daemon_sends_is_what_exec_says_not_one_derived_from_the_code() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A cause code no metalift knows (from a newer daemon), sent with its effect:
    // derived from the code it would read as degraded (exit 4).
    let (out, err, _) = require_unlock_with_cause(
        dir.path(),
        serde_json::json!({
            "code": "enclave_melted",
            "message": "the enclave melted",
            "effect": "unlocks_nothing",
        }),
    );
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(
        err.contains(
            "the daemon cannot unlock (unlocks_nothing): enclave_melted: the enclave melted"
        ),
        "{err}"
    );
}

#[test]
fn given_a_degraded_daemon_then_require_unlock_names_its_cause() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A full-disk daemon's cause as a daemon older than `effect` sends it: the
    // CLI classifies the code with the daemon crate's table.
    let (out, err, socket) = require_unlock_with_cause(
        dir.path(),
        serde_json::json!({
            "code": metalift_daemon::service::health::code::AUDIT_WRITE_FAILED,
            "message": "the last audit write failed (No space left on device (os error 28)); every decision is answered stock until a record can be written",
        }),
    );
    // The ladder: a daemon that unlocks nothing exits 5, never milder than 4.
    assert_eq!(out.status.code(), Some(5), "{err}");
    assert!(
        err.contains("the daemon cannot unlock (unlocks_nothing): audit_write_failed: the last audit write failed (No space left on device"),
        "{err}"
    );
    // Said before the command runs too, as plain `metalift exec` says it.
    assert!(
        err.contains(&format!(
            "metalift: warning: metaliftd on {}: the daemon cannot unlock (unlocks_nothing): audit_write_failed",
            socket.display()
        )),
        "{err}"
    );
}

#[test]
fn the_shim_reports_the_workspace_version_as_the_cli_and_the_daemon_do() {
    let (dir, daemon) = daemon(&probe_policy("7"), "Apple M1 (Virtual)");
    let out = require_unlock(
        &daemon.socket,
        &dir.audit_log(),
        &["--", probe().to_str().expect("utf-8")],
    );
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    let decisions = dir.records_of("decision");
    let version = env!("CARGO_PKG_VERSION");
    assert!(!decisions.is_empty());
    for d in &decisions {
        assert_eq!(
            d["advisory"]["shim_version"], version,
            "one version for all: {d}"
        );
    }
    let status = metalift_daemon::service::status::request(
        &daemon.socket,
        std::time::Duration::from_secs(5),
    )
    .expect("status");
    assert_eq!(status.version, version);
}
