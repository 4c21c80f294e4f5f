//! `metalift doctor --root DIR` on a healthy and on a broken temporary installation,
//! against the real binaries (metaliftd serving the healthy one).

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_metalift"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A job plist that inserts `library`.
fn job_plist(label: &str, library: &str) -> String {
    format!(
        r#"<?xml version="1.0" encoding="UTF-8"?>
<!DOCTYPE plist PUBLIC "-//Apple//DTD PLIST 1.0//EN" "http://www.apple.com/DTDs/PropertyList-1.0.dtd">
<plist version="1.0"><dict>
  <key>Label</key><string>{label}</string>
  <key>ProgramArguments</key><array><string>/opt/ci/agent</string></array>
  <key>EnvironmentVariables</key><dict>
    <key>DYLD_INSERT_LIBRARIES</key><string>{library}</string>
  </dict>
</dict></plist>
"#
    )
}

struct Root {
    dir: tempfile::TempDir,
}

impl Root {
    fn new() -> Root {
        let dir = tempfile::tempdir().unwrap();
        for d in [
            "etc/metalift",
            "var/log/metalift",
            "usr/local/metalift/lib",
            "run/metalift",
            "Library/LaunchDaemons",
        ] {
            fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        Root { dir }
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    /// `metalift doctor --bake` (and `extra`): its exit status and its lines.
    fn bake(&self, extra: &[&str]) -> (Option<i32>, Vec<String>) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_metalift"));
        cmd.args(["doctor", "--bake", "--root"])
            .arg(self.dir.path())
            .args(extra);
        if !rustix::process::geteuid().is_root() {
            cmd.arg("--allow-insecure-owner");
        }
        let out = cmd.output().unwrap();
        let lines = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        (out.status.code(), lines)
    }

    fn policy(&self, text: &str, mode: u32) {
        fs::write(self.path("etc/metalift/policy.toml"), text).unwrap();
        fs::set_permissions(
            self.path("etc/metalift/policy.toml"),
            fs::Permissions::from_mode(mode),
        )
        .unwrap();
    }

    fn doctor(&self) -> (Output, Value) {
        self.doctor_with(&[])
    }

    fn doctor_with(&self, extra: &[&str]) -> (Output, Value) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_metalift"));
        cmd.args(["doctor", "--json", "--root"])
            .arg(self.dir.path())
            .args(extra);
        if !rustix::process::geteuid().is_root() {
            cmd.arg("--allow-insecure-owner");
        }
        let out = cmd.output().unwrap();
        let v: Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)));
        (out, v)
    }
}

fn statuses(report: &Value) -> Vec<(String, String)> {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["name"].as_str().unwrap().to_owned(),
                c["status"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn status_of<'a>(checks: &'a [(String, String)], name: &str) -> Vec<&'a str> {
    checks
        .iter()
        .filter(|(n, _)| n == name)
        .map(|(_, s)| s.as_str())
        .collect()
}

/// A child process (the TLS collector) killed on drop.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// metaliftd on the fake root's installed paths, through the one scratch daemon's
/// spawn (ready once it answers).
fn start_daemon(root: &Root) -> support::Daemon {
    let socket = root.path("run/metalift/metalift.sock");
    let mut cmd = Command::new(support::workspace_binary("metaliftd"));
    cmd.arg("--policy")
        .arg(root.path("etc/metalift/policy.toml"))
        .arg("--socket")
        .arg(&socket)
        .arg("--audit-log")
        .arg(root.path("var/log/metalift/audit.jsonl"))
        .arg("--allow-insecure-owner")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    support::Daemon::spawn(cmd, socket)
}

fn healthy() -> Root {
    let root = Root::new();
    let probe = bin_dir().join("metalift-probe").canonicalize().unwrap();
    root.policy(
        &format!(
            "version = 1\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"probe\"\npath = \"{}\"\nunlock = \"apple7\"\n",
            probe.display()
        ),
        0o644,
    );
    fs::copy(
        bin_dir().join("libmetalift.so"),
        root.path("usr/local/metalift/lib/libmetalift.so"),
    )
    .unwrap();
    fs::write(
        root.path("Library/LaunchDaemons/com.example.ci.plist"),
        job_plist("com.example.ci", "/usr/local/metalift/lib/libmetalift.so"),
    )
    .unwrap();
    root
}

#[test]
fn a_healthy_installation_is_all_ok_and_exits_0() {
    let root = healthy();
    let _daemon = start_daemon(&root);
    let (out, report) = root.doctor();
    let checks = statuses(&report);
    assert_eq!(out.status.code(), Some(0), "{report:#}");
    assert_eq!(report["ok"], true);
    for name in [
        "daemon",
        "policy",
        "live policy",
        "audit log",
        "shim",
        "injection",
        "rules",
    ] {
        assert_eq!(status_of(&checks, name), ["ok"], "{name}: {report:#}");
    }
    assert_eq!(status_of(&checks, "SIP"), ["n/a"], "Linux has no SIP");
}

#[test]
fn a_broken_installation_without_a_daemon_fails_each_broken_part_with_a_fix_and_exits_5() {
    let root = Root::new();
    // Group/other-writable policy, a 32-bit shim, a job naming a missing library, no daemon.
    root.policy("version = 1\n", 0o666);
    let mut header = b"\x7fELF\x01\x01\x01".to_vec();
    header.resize(20, 0);
    header[18] = 0x28;
    fs::write(root.path("usr/local/metalift/lib/libmetalift.so"), header).unwrap();
    fs::write(
        root.path("Library/LaunchDaemons/com.example.old.plist"),
        job_plist("com.example.old", "/usr/local/lib/old-unlocker.dylib"),
    )
    .unwrap();
    let (out, report) = root.doctor();
    let checks = statuses(&report);
    // No daemon: it unlocks nothing, the ladder's worst (as `metalift status`).
    assert_eq!(out.status.code(), Some(5), "{report:#}");
    assert_eq!(report["ok"], false);
    for name in ["daemon", "shim", "injection"] {
        assert_eq!(status_of(&checks, name), ["fail"], "{name}: {report:#}");
    }
    if rustix::process::geteuid().is_root() {
        assert_eq!(status_of(&checks, "policy"), ["fail"], "{report:#}");
    }
    for check in report["checks"].as_array().unwrap() {
        if check["status"] == "fail" {
            assert!(
                check["fix"].as_str().is_some_and(|f| !f.is_empty()),
                "no fix: {check}"
            );
        }
    }
    let text = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["doctor", "--root"])
        .arg(root.dir.path())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.lines().any(|l| l.starts_with("fail  shim")),
        "one line per check, status first: {text}"
    );
    assert!(text.contains("fix: "), "{text}");
}

#[test]
fn warnings_alone_exit_0_and_1_with_strict() {
    let root = healthy();
    root.policy(
        "version = 1\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"gone\"\npath = \"/opt/not-installed/llama-server\"\nunlock = \"apple7\"\n",
        0o644,
    );
    let _daemon = start_daemon(&root);
    let (out, report) = root.doctor();
    let checks = statuses(&report);
    assert_eq!(status_of(&checks, "rules"), ["warn"], "{report:#}");
    assert_eq!(out.status.code(), Some(0), "advice exits 0: {report:#}");
    assert_eq!(report["ok"], true, "{report:#}");
    let (strict, report) = root.doctor_with(&["--strict"]);
    assert_eq!(strict.status.code(), Some(1), "--strict: {report:#}");
    assert_eq!(report["ok"], false, "{report:#}");
}

/// The format `metalift doctor --bake` promises a Packer build log: one line per
/// check, `ok|warn|FAIL <check>: <message>`, exit 0 only without a FAIL line.
fn assert_bake_lines(lines: &[String]) {
    assert!(!lines.is_empty());
    for line in lines {
        let (word, rest) = line.split_once(' ').unwrap_or_else(|| panic!("{line}"));
        assert!(["ok", "warn", "FAIL"].contains(&word), "{line}");
        let (name, message) = rest.split_once(": ").unwrap_or_else(|| panic!("{line}"));
        assert!(!name.is_empty() && !message.is_empty(), "{line}");
    }
}

#[test]
fn bake_prints_one_line_per_check_and_fails_only_on_fail_lines() {
    let root = healthy();
    root.policy(
        "version = 1\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"gone\"\npath = \"/opt/not-installed/llama-server\"\nunlock = \"apple7\"\n",
        0o644,
    );
    let daemon = start_daemon(&root);
    let (_, report) = root.doctor();
    let count = report["checks"].as_array().unwrap().len();
    let (code, lines) = root.bake(&[]);
    assert_bake_lines(&lines);
    assert_eq!(lines.len(), count, "one line per check: {lines:#?}");
    assert!(
        lines.iter().any(|l| l.starts_with("warn rules: ")),
        "{lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.starts_with("FAIL ")), "{lines:#?}");
    assert_eq!(code, Some(0), "warnings only: {lines:#?}");
    let (strict, lines) = root.bake(&["--strict"]);
    assert_bake_lines(&lines);
    assert!(
        lines.iter().any(|l| l.starts_with("FAIL rules: ")),
        "--strict: a warning fails: {lines:#?}"
    );
    assert_ne!(strict, Some(0), "{lines:#?}");
    drop(daemon);
    // No daemon: it cannot unlock, so the bake fails on the daemon line.
    let (code, lines) = root.bake(&[]);
    assert_bake_lines(&lines);
    assert!(
        lines.iter().any(|l| l.starts_with("FAIL daemon: ")),
        "{lines:#?}"
    );
    assert_eq!(
        code,
        Some(5),
        "unlocks nothing, as status exits: {lines:#?}"
    );
}

#[test]
fn the_shim_check_honours_metalift_shim_as_exec_does() {
    let root = healthy();
    let _daemon = start_daemon(&root);
    // A 32-bit shim named by METALIFT_SHIM: doctor checks that one, as exec would inject it.
    let mut header = b"\x7fELF\x01\x01\x01".to_vec();
    header.resize(20, 0);
    header[18] = 0x28;
    let bad = root.path("elsewhere-libmetalift.so");
    fs::write(&bad, header).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_metalift"));
    cmd.args(["doctor", "--json", "--root"])
        .arg(root.dir.path())
        .env("METALIFT_SHIM", &bad);
    if !rustix::process::geteuid().is_root() {
        cmd.arg("--allow-insecure-owner");
    }
    let out = cmd.output().unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let shim = report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "shim")
        .unwrap();
    assert_eq!(shim["status"], "fail", "{shim}");
    assert!(
        shim["message"]
            .as_str()
            .is_some_and(|m| m.contains("elsewhere-libmetalift.so")),
        "{shim}"
    );
}

#[test]
fn a_collector_with_an_untrusted_certificate_fails_the_forwarder_check() {
    let root = Root::new();
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .output()
            .expect("openssl: run scripts/setup.sh");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let p = |f: &str| root.path(f).display().to_string();
    // The collector's self-signed certificate; the policy trusts another CA.
    for name in ["collector", "trusted"] {
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            &p(&format!("{name}.key")),
            "-out",
            &p(&format!("{name}.pem")),
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
        ]);
    }
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let server = Command::new("openssl")
        .args([
            "s_server",
            "-quiet",
            "-accept",
            &format!("127.0.0.1:{port}"),
            "-cert",
            &p("collector.pem"),
            "-key",
            &p("collector.key"),
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let _server = Killed(server);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "openssl s_server did not listen");
        std::thread::sleep(Duration::from_millis(20));
    }
    root.policy(
        &format!(
            "version = 1\n\n[audit.forward]\naddress = \"127.0.0.1:{port}\"\ntransport = \"tls\"\nca = \"{}\"\nserver_name = \"localhost\"\n",
            p("trusted.pem")
        ),
        0o644,
    );
    let _daemon = start_daemon(&root);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, report) = root.doctor();
        let check = report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "forwarder")
            .cloned()
            .expect("a forwarder check");
        if check["status"] == "fail" {
            let message = check["message"].as_str().unwrap();
            assert!(message.contains("certificate"), "{check}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the forwarder check never failed: {check}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Issue 43 item 2: a bake of the installed default policy (no rules) fails on
/// the `unlocks` line with the drop-in as its fix; a required label the policy
/// lacks fails, and one it has passes.
#[test]
fn bake_fails_an_image_whose_policy_unlocks_nothing_and_one_without_a_required_label() {
    let root = healthy();
    let default = fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/default-policy.toml"),
    )
    .unwrap();
    root.policy(&default, 0o644);
    let daemon = start_daemon(&root);
    let (code, lines) = root.bake(&[]);
    assert_bake_lines(&lines);
    let unlocks = lines
        .iter()
        .find(|l| l.starts_with("FAIL unlocks: "))
        .unwrap_or_else(|| panic!("no FAIL unlocks line: {lines:#?}"));
    assert!(
        unlocks.contains("the policy has no rules")
            && unlocks.contains(" -- fix: install a drop-in")
            && unlocks.contains("policy.d/50-bake.toml"),
        "{unlocks}"
    );
    assert_eq!(
        code,
        Some(2),
        "a failing check, the daemon healthy: {lines:#?}"
    );
    drop(daemon);

    // A policy that unlocks, labelled `image` only.
    let probe = bin_dir().join("metalift-probe").canonicalize().unwrap();
    root.policy(
        &format!(
            "version = 1\n[audit.labels]\nimage = \"macos-15-ci\"\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"probe\"\npath = \"{}\"\nunlock = \"apple7\"\n",
            probe.display()
        ),
        0o644,
    );
    let daemon = start_daemon(&root);
    let (code, lines) = root.bake(&["--require-label", "image"]);
    assert!(
        lines
            .iter()
            .any(|l| l == "ok label: image = \"macos-15-ci\""),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ok unlocks: 1 rule(s) unlock: probe")),
        "{lines:#?}"
    );
    assert_eq!(code, Some(0), "{lines:#?}");
    let (code, lines) = root.bake(&["--require-label", "image", "--require-label", "pool"]);
    assert!(
        lines.iter().any(
            |l| l.starts_with("FAIL label: `pool` is required") && l.contains("[audit.labels]")
        ),
        "{lines:#?}"
    );
    assert_eq!(code, Some(2), "{lines:#?}");
    // No [audit.forward]: --require-forward fails, with or without the network excuse.
    for extra in [
        &["--require-forward"][..],
        &["--require-forward", "--forward-unreachable-ok"],
    ] {
        let (code, lines) = root.bake(extra);
        assert!(
            lines.iter().any(|l| l.starts_with("FAIL forward: required (--require-forward), and the live policy has no [audit.forward]")),
            "{extra:?}: {lines:#?}"
        );
        assert_eq!(code, Some(2), "{lines:#?}");
    }
    drop(daemon);
}

/// `--require-forward` wants the forwarder connected; `--forward-unreachable-ok`
/// accepts a collector out of the build network's reach, its backlog included.
#[test]
fn require_forward_fails_an_unreachable_collector_unless_told_it_is_out_of_reach() {
    let root = healthy();
    let probe = bin_dir().join("metalift-probe").canonicalize().unwrap();
    // A port nothing listens on.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    root.policy(
        &format!(
            "version = 1\n[audit.forward]\naddress = \"127.0.0.1:{port}\"\nmax_delay_seconds = 1\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"probe\"\npath = \"{}\"\nunlock = \"apple7\"\n",
            probe.display()
        ),
        0o644,
    );
    let _daemon = start_daemon(&root);
    // Past max_delay_seconds: the start's records wait, forward_behind is live.
    std::thread::sleep(std::time::Duration::from_millis(2500));
    let (code, lines) = root.bake(&["--require-forward"]);
    assert!(
        lines.iter().any(|l| l.starts_with(
            "FAIL forward: required (--require-forward), and not connected to 127.0.0.1:"
        )),
        "{lines:#?}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("FAIL health: degraded: ") && l.contains("(forward_behind)")),
        "{lines:#?}"
    );
    assert_eq!(code, Some(4), "degraded, as status exits: {lines:#?}");
    let (code, lines) = root.bake(&["--require-forward", "--forward-unreachable-ok"]);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("ok forward: configured for 127.0.0.1:")),
        "{lines:#?}"
    );
    assert!(!lines.iter().any(|l| l.starts_with("FAIL")), "{lines:#?}");
    assert_eq!(code, Some(0), "{lines:#?}");
}

fn fix_of(report: &Value, name: &str) -> String {
    report["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .and_then(|c| c["fix"].as_str())
        .unwrap_or_else(|| panic!("no fix for {name}: {report:#}"))
        .to_owned()
}

/// Issue 43: doctor's fixes name what is in use: the socket doctor was pointed at
/// (not the system's), the jobs that still insert a missing shim, and the pid to
/// send `SIGHUP` to.
#[test]
fn doctors_fixes_name_the_socket_the_jobs_and_the_pid_in_use() {
    let root = healthy();
    fs::remove_file(root.path("usr/local/metalift/lib/libmetalift.so")).unwrap();
    let (_, report) = root.doctor();
    let socket = root.path("run/metalift/metalift.sock");
    let daemon_fix = fix_of(&report, "daemon");
    assert!(
        daemon_fix.contains(&format!("--socket {}", socket.display())),
        "{daemon_fix}"
    );
    let shim_fix = fix_of(&report, "shim");
    assert!(
        shim_fix.contains("from the jobs that name it: com.example.ci (")
            && shim_fix.contains("com.example.ci.plist)"),
        "{shim_fix}"
    );

    // A daemon serving its last good policy while the file on disk is refused.
    let _daemon = start_daemon(&root);
    root.policy("version = 1\n[[rule]]\nid = \"broken\"\n", 0o644);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let (_, report) = root.doctor();
        let health = fix_of(&report, "health");
        if health.contains("kill -HUP") {
            let pid = report["checks"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == "daemon")
                .and_then(|c| c["message"].as_str())
                .and_then(|m| m.split("(pid ").nth(1))
                .and_then(|m| m.split(')').next())
                .unwrap_or_else(|| panic!("no pid in the daemon check: {report:#}"))
                .to_owned();
            assert!(
                health.contains(&format!("sudo kill -HUP {pid} ")),
                "{health}"
            );
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the refused policy never reached doctor's health fix: {report:#}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
