//! examples/packer/provision.sh, the Packer templates' provisioner, run on Linux
//! against a simulated install: the pkg is a file with a known checksum, `pkgutil`
//! prints what Apple's `pkgutil --check-signature` prints for a Developer ID
//! package, and `installer` stands in for Installer + postinstall + launchd: it
//! stages the real payload (pkg/stage.sh) under a temporary root and starts the
//! staged, real metaliftd on it (or, for a guest whose daemon never started, does
//! not). The script then runs the staged `metalift validate`, `metalift verify`
//! (the real probe under the real shim on the simulated Metal) and `metalift
//! doctor --bake`, and must pass on a guest that can unlock and fail, naming why,
//! on each guest that cannot.
//!
//! Needs the workspace built first (`cargo build --workspace`, as scripts/test.sh does).
#![cfg(target_os = "linux")]

mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::workspace_binary;

const TEAM: &str = "ABCDE12345";
const CHIP: &str = "Apple M2 (Virtual)";
const BUILD: &str = "24A335";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// What Apple's `pkgutil --check-signature` prints for a notarized package signed
/// with a Developer ID Installer certificate (format: `Package "NAME":`, the
/// Status and Notarization lines, then the chain, leaf first).
fn pkgutil_stub(team: &str) -> String {
    format!(
        r#"#!/bin/sh
[ "$1" = --check-signature ] || exit 64
cat <<OUT
Package "$(basename "$2")":
   Status: signed by a developer certificate issued by Apple for distribution
   Notarization: trusted by the Apple notary service
   Signed with a trusted timestamp on: 2026-12-03 12:00:00 +0000
   Certificate Chain:
    1. Developer ID Installer: Example Fleet Corp ({team})
       Expires: 2031-12-03 12:00:00 +0000
       ------------------------------------------------------------------------
    2. Developer ID Certification Authority
       Expires: 2031-09-17 00:00:00 +0000
       ------------------------------------------------------------------------
    3. Apple Root CA
       Expires: 2035-02-09 21:40:36 +0000
OUT
"#
    )
}

/// Installer + postinstall + launchd, on Linux: the payload staged under
/// $BAKE_ROOT, /etc/metalift's default policy when absent, and (unless
/// $BAKE_NO_DAEMON) the staged metaliftd started on that root, as launchd would.
const INSTALLER_STUB: &str = r#"#!/bin/sh
set -e
[ "$1" = -pkg ] && [ -f "$2" ] && [ "$3" = -target ] && [ "$4" = / ] || exit 64
bash "$BAKE_REPO/pkg/stage.sh" "$BAKE_ROOT" --bin-dir "$BAKE_BIN_DIR" >/dev/null
prefix="$BAKE_ROOT/usr/local/metalift"
mkdir -p "$BAKE_ROOT/etc/metalift/policy.d" "$BAKE_ROOT/var/log/metalift" "$BAKE_ROOT/run/metalift"
[ -e "$BAKE_ROOT/etc/metalift/policy.toml" ] || cp "$prefix/share/default-policy.toml" "$BAKE_ROOT/etc/metalift/policy.toml"
[ -z "${BAKE_REMOVE_SHIM:-}" ] || rm -f "$prefix/lib/libmetalift.so"
[ -z "${BAKE_NO_DAEMON:-}" ] || exit 0
owner=""
[ "$(id -u)" -eq 0 ] || owner=--allow-insecure-owner
"$prefix/bin/metaliftd" --policy "$BAKE_ROOT/etc/metalift/policy.toml" \
  --socket "$BAKE_ROOT/run/metalift/metalift.sock" \
  --audit-log "$BAKE_ROOT/var/log/metalift/audit.jsonl" $owner \
  </dev/null >"$BAKE_ROOT/daemon.log" 2>&1 &
echo $! >"$BAKE_ROOT/daemon.pid"
"#;

/// One guest: its root, the uploaded pkg and policy, the stubs; the daemon the
/// installer started is killed on drop.
struct Guest {
    dir: tempfile::TempDir,
}

impl Guest {
    fn new(require_verified: bool) -> Guest {
        let dir = tempfile::tempdir().unwrap();
        let guest = Guest { dir };
        fs::create_dir_all(guest.root()).unwrap();
        fs::write(guest.path("metalift.pkg"), b"xar! a package stand-in\n").unwrap();
        let probe = guest.root().join("usr/local/metalift/bin/metalift-probe");
        fs::write(
            guest.path("50-bake.toml"),
            format!(
                "version = 1\n\n[profile.apple7]\napple_family_max = 7\nrequire_verified = {require_verified}\n\n\
                 [[rule]]\nid = \"probe\"\npath = {:?}\nunlock = \"apple7\"\n",
                probe.display().to_string()
            ),
        )
        .unwrap();
        for (name, text) in [
            ("pkgutil", pkgutil_stub(TEAM)),
            ("installer", INSTALLER_STUB.to_owned()),
        ] {
            fs::write(guest.path(name), text).unwrap();
            fs::set_permissions(guest.path(name), fs::Permissions::from_mode(0o755)).unwrap();
        }
        guest
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("guest")
    }

    fn sha256(&self) -> String {
        let out = Command::new("sha256sum")
            .arg(self.path("metalift.pkg"))
            .output()
            .expect("sha256sum (coreutils)");
        String::from_utf8_lossy(&out.stdout)
            .split_whitespace()
            .next()
            .unwrap()
            .to_owned()
    }

    /// Runs provision.sh as the Packer shell provisioner would, plus `envs`.
    fn provision(&self, envs: &[(&str, String)]) -> Output {
        let bin_dir = workspace_binary("metaliftd")
            .parent()
            .unwrap()
            .to_path_buf();
        let simmetal = Command::new(workspace_binary("metalift-probe"))
            .arg("--simmetal-dir")
            .output()
            .expect("metalift-probe --simmetal-dir");
        let simmetal = PathBuf::from(String::from_utf8_lossy(&simmetal.stdout).trim().to_owned());
        let mut cmd = Command::new("bash");
        cmd.arg(repo().join("examples/packer/provision.sh"))
            .env("METALIFT_BAKE_PKG", self.path("metalift.pkg"))
            .env("METALIFT_BAKE_PKG_SHA256", self.sha256())
            .env("METALIFT_BAKE_TEAM_ID", TEAM)
            .env("METALIFT_BAKE_POLICY", self.path("50-bake.toml"))
            .env("METALIFT_BAKE_WAIT", "10")
            .env("METALIFT_BAKE_ROOT", self.root())
            .env("PKGUTIL", self.path("pkgutil"))
            .env("INSTALLER", self.path("installer"))
            .env("BAKE_ROOT", self.root())
            .env("BAKE_REPO", repo())
            .env("BAKE_BIN_DIR", bin_dir)
            .env("METALIFT_HOST_CHIP_BRAND", CHIP)
            .env("METALIFT_HOST_OS_BUILD", BUILD)
            .env("LD_LIBRARY_PATH", simmetal.join("normal"))
            .env("METALIFT_TIMEOUT_MS", "10000")
            .env_remove("METALIFT_POLICY")
            .env_remove("METALIFT_SOCKET")
            .env_remove("METALIFT_AUDIT_LOG");
        for (key, value) in envs {
            cmd.env(key, value);
        }
        cmd.output().expect("bash examples/packer/provision.sh")
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Ok(pid) = fs::read_to_string(self.root().join("daemon.pid")) {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                // SAFETY: kill(2) on the pid of the daemon this guest's installer started.
                unsafe { libc::kill(pid, libc::SIGTERM) };
            }
        }
    }
}

fn text(out: &Output) -> String {
    format!(
        "exit {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// The `doctor --bake` lines of a run: `ok|warn|FAIL <check>: <message>`.
fn bake_lines(out: &Output) -> Vec<String> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| {
            let word = l.split(' ').next().unwrap_or("");
            ["ok", "warn", "FAIL"].contains(&word) && l.contains(": ")
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn a_guest_that_can_unlock_passes_with_one_ok_line_per_check() {
    let guest = Guest::new(false);
    let out = guest.provision(&[]);
    assert!(out.status.success(), "{}", text(&out));
    let lines = bake_lines(&out);
    assert!(
        lines.iter().any(|l| l.starts_with("ok daemon: ")),
        "{}",
        text(&out)
    );
    assert!(
        lines.iter().any(|l| l.contains(" policy: ")
            && l.contains(
                &guest
                    .root()
                    .join("etc/metalift/policy.toml")
                    .display()
                    .to_string()
            )),
        "doctor judged the guest's policy: {}",
        text(&out)
    );
    // Every check ok; the one warning Linux draws: the default policy's
    // `apple_family_max = "host"`, with no host chip to read here.
    assert!(
        lines.iter().all(|l| l.starts_with("ok ")
            || (l.starts_with("warn policy: ") && l.contains("the host chip could not be read"))),
        "a healthy guest: every check ok: {}",
        text(&out)
    );
    assert!(
        guest
            .root()
            .join("etc/metalift/policy.d/50-bake.toml")
            .is_file(),
        "the drop-in is installed"
    );
}

#[test]
fn a_guest_whose_daemon_never_started_fails_the_build_on_the_daemon_line() {
    let guest = Guest::new(false);
    let out = guest.provision(&[
        ("BAKE_NO_DAEMON", "1".into()),
        ("METALIFT_BAKE_WAIT", "3".into()),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        bake_lines(&out)
            .iter()
            .any(|l| l.starts_with("FAIL daemon: ")),
        "{}",
        text(&out)
    );
    assert!(
        text(&out).contains("this image cannot unlock"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_guest_without_the_shim_fails_the_build() {
    let guest = Guest::new(false);
    let out = guest.provision(&[
        ("BAKE_REMOVE_SHIM", "1".into()),
        ("METALIFT_BAKE_WAIT", "3".into()),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        bake_lines(&out).iter().any(|l| l.starts_with("FAIL shim")),
        "{}",
        text(&out)
    );
}

#[test]
fn a_require_verified_profile_is_verified_on_the_guest_and_then_unlocks() {
    let guest = Guest::new(true);
    let out = guest.provision(&[("METALIFT_BAKE_VERIFY_PROFILES", "apple7".into())]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        guest
            .root()
            .join("etc/metalift/verifications.jsonl")
            .is_file(),
        "{}",
        text(&out)
    );
}

#[test]
fn a_guest_whose_gpu_computes_wrongly_fails_verify_and_the_build() {
    let guest = Guest::new(true);
    let simmetal = Command::new(workspace_binary("metalift-probe"))
        .arg("--simmetal-dir")
        .output()
        .unwrap();
    let wrong =
        PathBuf::from(String::from_utf8_lossy(&simmetal.stdout).trim()).join("wrongresults");
    let out = guest.provision(&[
        ("METALIFT_BAKE_VERIFY_PROFILES", "apple7".into()),
        ("LD_LIBRARY_PATH", wrong.display().to_string()),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("metalift verify --profile apple7 did not pass"),
        "{}",
        text(&out)
    );
}

#[test]
fn a_package_whose_checksum_differs_is_never_installed() {
    let guest = Guest::new(false);
    let out = guest.provision(&[("METALIFT_BAKE_PKG_SHA256", "00".repeat(32))]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("SHA256SUMS says"), "{}", text(&out));
    assert!(
        !guest.root().join("usr/local/metalift").exists(),
        "installed anyway"
    );
}

#[test]
fn a_package_signed_by_another_team_is_never_installed() {
    let guest = Guest::new(false);
    fs::write(guest.path("pkgutil"), pkgutil_stub("ZZZZZ99999")).unwrap();
    let out = guest.provision(&[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("(ABCDE12345)"), "{}", text(&out));
    assert!(
        !guest.root().join("usr/local/metalift").exists(),
        "installed anyway"
    );
}

/// Issue 43 item 2: the template's `require_labels` reaches doctor: a label the
/// drop-in does not set fails the build on its `label` line.
#[test]
fn a_required_label_the_policy_lacks_fails_the_build() {
    let guest = Guest::new(false);
    let out = guest.provision(&[
        ("METALIFT_BAKE_REQUIRE_LABELS", "image".into()),
        ("METALIFT_BAKE_WAIT", "3".into()),
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        bake_lines(&out)
            .iter()
            .any(|l| l.starts_with("FAIL label: `image` is required")),
        "{}",
        text(&out)
    );
}
