//! Issue 34 item 5: `apple_family_max = "host"` (the recommended ceiling) on a
//! chip the CLI cannot read (Linux has no `machdep.cpu.brand_string`, and the
//! daemon here has no `METALIFT_HOST_CHIP_BRAND`) weighs the same in `validate`,
//! `doctor`, `edit` and `explain`: a note, never a warning; so `validate
//! --strict` passes it and `doctor` exits 0 for it on a healthy staged install.
#![cfg(target_os = "linux")]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod support;

use support::Daemon;

/// The words the policy crate's diagnostic about `"host"` begins with.
const HOST_DIAGNOSTIC: &str = "apple_family_max = \"host\"";

fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_metalift"))
        .parent()
        .expect("bin dir")
        .to_path_buf()
}

/// A staged installation under a temporary root (as `doctor --root` reads one),
/// whose policy unlocks the probe with the recommended `"host"` ceiling.
struct Staged {
    dir: tempfile::TempDir,
}

impl Staged {
    fn new() -> Staged {
        let dir = tempfile::tempdir().expect("tempdir");
        for d in [
            "etc/metalift",
            "var/log/metalift",
            "usr/local/metalift/lib",
            "run/metalift",
        ] {
            fs::create_dir_all(dir.path().join(d)).expect("mkdir");
        }
        let staged = Staged { dir };
        let probe = bin_dir()
            .join("metalift-probe")
            .canonicalize()
            .expect("probe");
        fs::write(
            staged.policy(),
            format!(
                "version = 1\n[profile.recommended]\napple_family_max = \"host\"\n\n[[rule]]\nid = \"probe\"\npath = \"{}\"\nunlock = \"recommended\"\n",
                probe.display()
            ),
        )
        .expect("policy");
        fs::set_permissions(staged.policy(), fs::Permissions::from_mode(0o644)).expect("chmod");
        fs::copy(
            bin_dir().join("libmetalift.so"),
            staged.path("usr/local/metalift/lib/libmetalift.so"),
        )
        .expect("shim");
        staged
    }

    fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }

    fn policy(&self) -> PathBuf {
        self.path("etc/metalift/policy.toml")
    }

    fn socket(&self) -> PathBuf {
        self.path("run/metalift/metalift.sock")
    }

    fn start(&self) -> Daemon {
        let mut cmd = Command::new(support::workspace_binary("metaliftd"));
        cmd.arg("--policy")
            .arg(self.policy())
            .arg("--socket")
            .arg(self.socket())
            .arg("--audit-log")
            .arg(self.path("var/log/metalift/audit.jsonl"))
            .arg("--allow-insecure-owner")
            .env_remove("METALIFT_HOST_CHIP_BRAND")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        Daemon::spawn(cmd, self.socket())
    }
}

fn metalift(args: &[&str], envs: &[(&str, &Path)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_metalift"));
    cmd.args(args)
        .env_remove("METALIFT_SOCKET")
        .env_remove("METALIFT_POLICY")
        .env_remove("METALIFT_AUDIT_LOG")
        .env_remove("METALIFT_SHIM")
        .env_remove("METALIFT_HOST_CHIP_BRAND")
        .stdin(Stdio::null());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.output().expect("run metalift")
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    })
}

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

/// The severities given to the `"host"` diagnostic in `diagnostics` (JSON objects).
fn host_severities(diagnostics: &Value) -> Vec<String> {
    diagnostics
        .as_array()
        .expect("diagnostics")
        .iter()
        .filter(|d| {
            d["message"]
                .as_str()
                .unwrap_or("")
                .contains(HOST_DIAGNOSTIC)
        })
        .map(|d| d["severity"].as_str().unwrap_or("?").to_owned())
        .collect()
}

#[test]
fn given_host_on_a_chip_unknown_here_then_validate_doctor_edit_and_explain_all_call_it_a_note() {
    let staged = Staged::new();
    let _daemon = staged.start();
    let policy = staged.policy();
    let root = staged.dir.path();

    // doctor: the policy check is ok (the note named), and it exits 0.
    let out = metalift(&["doctor", "--json", "--root", s(root)], &[]);
    let doctor = json_of(&out);
    let policy_check = doctor["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .find(|c| c["name"] == "policy")
        .cloned()
        .expect("policy check");
    assert_eq!(policy_check["status"], "ok", "{doctor:#}");
    assert!(
        policy_check["message"]
            .as_str()
            .unwrap_or("")
            .contains("1 note"),
        "{policy_check:#}"
    );
    assert_eq!(out.status.code(), Some(0), "{doctor:#}");
    // Nothing to fix: not even --strict fails it (a note is not a warning).
    let strict = metalift(&["doctor", "--strict", "--root", s(root)], &[]);
    assert_eq!(
        strict.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&strict.stdout)
    );

    // validate: a note, and --strict passes it.
    let out = metalift(
        &[
            "validate",
            "--strict",
            "--json",
            "--socket",
            s(&staged.socket()),
            s(&policy),
        ],
        &[],
    );
    let validate = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{validate:#}");
    assert_eq!(
        host_severities(&validate["diagnostics"]),
        ["note"],
        "{validate:#}"
    );
    assert_eq!(
        validate["daemon"]["host_chip_brand"],
        Value::Null,
        "{validate:#}"
    );

    // explain: the same diagnostic, the same severity.
    let probe = bin_dir()
        .join("metalift-probe")
        .canonicalize()
        .expect("probe");
    let out = metalift(
        &[
            "explain",
            "--json",
            "--policy",
            s(&policy),
            "--path",
            s(&probe),
        ],
        &[],
    );
    let explain = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{explain:#}");
    assert_eq!(
        host_severities(&explain["policy"]["diagnostics"]),
        ["note"],
        "{explain:#}"
    );

    // edit: an edit of it installs, and what it prints about "host" is a note.
    let editor = staged.path("to-monitor.sh");
    fs::write(
        &editor,
        "#!/bin/sh\nsed -i 's/^version = 1$/version = 1\\nmode = \"monitor\"/' \"$1\"\n",
    )
    .expect("editor");
    fs::set_permissions(&editor, fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = metalift(
        &[
            "edit",
            "--allow-insecure-owner",
            "--policy",
            s(&policy),
            "--socket",
            s(&staged.socket()),
        ],
        &[("VISUAL", &editor)],
    );
    let said = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        fs::read_to_string(&policy)
            .expect("policy")
            .contains("mode = \"monitor\""),
        "the edit was installed"
    );
    // The rendered diagnostic's first line is `file:line:col: severity: message`.
    let headed = |severity: &str| {
        said.lines()
            .filter(|l| l.contains(&format!(": {severity}: {HOST_DIAGNOSTIC}")))
            .count()
    };
    assert_eq!((headed("note"), headed("warning")), (1, 0), "{said}");
}
