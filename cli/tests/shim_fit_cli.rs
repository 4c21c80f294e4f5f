//! Executables that cannot take the shim are named before they fail: `validate`
//! (a lint on an unlock rule whose exact path exists), `explain --path` and
//! `doctor`, through the CLI's Mach-O reader, on Mach-O fixtures built here that
//! carry the Hardened Runtime, library validation, setuid, and no usable slice.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;

#[path = "../src/macho/fixture.rs"]
mod fixture;

use fixture::{fat, thin, Sign};

const CPU_TYPE_ARM64: u32 = 0x0100_000c;
const CS_RUNTIME: u32 = 0x0001_0000;
const CS_REQUIRE_LV: u32 = 0x0000_2000;

/// (fixture name, bytes, mode, the words its message must hold).
fn fixtures() -> Vec<(&'static str, Vec<u8>, u32, &'static str)> {
    vec![
        (
            "hardened",
            thin(CPU_TYPE_ARM64, 0, Some(&Sign::new(CS_RUNTIME))),
            0o755,
            "uses the Hardened Runtime without com.apple.security.cs.allow-dyld-environment-variables",
        ),
        (
            "libval",
            thin(CPU_TYPE_ARM64, 0, Some(&Sign::new(CS_REQUIRE_LV))),
            0o755,
            "enforces library validation",
        ),
        (
            "setuid",
            thin(CPU_TYPE_ARM64, 0, None),
            0o4755,
            "setuid",
        ),
        (
            "noslice",
            fat(&[thin(0x12, 0, None)]),
            0o755,
            "has no slice the shim has",
        ),
    ]
}

fn write(dir: &Path, name: &str, bytes: &[u8], mode: u32) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, bytes).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    path.canonicalize().unwrap()
}

fn policy(dir: &Path, exe: &Path) -> PathBuf {
    let path = dir.join("policy.toml");
    fs::write(
        &path,
        format!(
            "version = 1\n\n[profile.apple7]\napple_family_max = 7\n\n\
             [[rule]]\nid = \"workload\"\npath = {:?}\nunlock = \"apple7\"\n",
            exe.display().to_string()
        ),
    )
    .unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
    path
}

fn run(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .output()
        .unwrap();
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn validate_names_each_executable_that_cannot_take_the_shim() {
    for (name, bytes, mode, words) in fixtures() {
        let dir = tempfile::tempdir().unwrap();
        let exe = write(dir.path(), name, &bytes, mode);
        let policy = policy(dir.path(), &exe);
        let text = run(&[
            "validate",
            "--allow-insecure-owner",
            policy.to_str().unwrap(),
        ]);
        assert!(
            text.contains("the unlock never applies") && text.contains(words),
            "{name}: {text}"
        );
    }
    // A plain signed arm64 executable: nothing said.
    let dir = tempfile::tempdir().unwrap();
    let exe = write(
        dir.path(),
        "plain",
        &thin(CPU_TYPE_ARM64, 0, Some(&Sign::new(0))),
        0o755,
    );
    let text = run(&[
        "validate",
        "--allow-insecure-owner",
        policy(dir.path(), &exe).to_str().unwrap(),
    ]);
    assert!(!text.contains("the unlock never applies"), "{text}");
}

#[test]
fn explain_path_names_each_executable_that_cannot_take_the_shim() {
    for (name, bytes, mode, words) in fixtures() {
        let dir = tempfile::tempdir().unwrap();
        let exe = write(dir.path(), name, &bytes, mode);
        let policy = policy(dir.path(), &exe);
        let text = run(&[
            "explain",
            "--allow-insecure-owner",
            "--policy",
            policy.to_str().unwrap(),
            "--path",
            exe.to_str().unwrap(),
        ]);
        assert!(
            text.contains("it will run stock") && text.contains(words),
            "{name}: {text}"
        );
    }
}

#[test]
fn doctor_names_each_executable_that_cannot_take_the_shim() {
    let bin = Path::new(env!("CARGO_BIN_EXE_metalift"))
        .parent()
        .unwrap()
        .to_path_buf();
    for (name, bytes, mode, words) in fixtures() {
        let root = tempfile::tempdir().unwrap();
        for d in [
            "etc/metalift",
            "var/log/metalift",
            "usr/local/metalift/lib",
            "run/metalift",
        ] {
            fs::create_dir_all(root.path().join(d)).unwrap();
        }
        fs::copy(
            bin.join("libmetalift.so"),
            root.path().join("usr/local/metalift/lib/libmetalift.so"),
        )
        .expect("the shim (cargo build --workspace first)");
        let exe = write(root.path(), name, &bytes, mode);
        let policy_text = fs::read_to_string(policy(root.path(), &exe)).unwrap();
        fs::write(root.path().join("etc/metalift/policy.toml"), policy_text).unwrap();
        let text = run(&[
            "doctor",
            "--allow-insecure-owner",
            "--root",
            root.path().to_str().unwrap(),
        ]);
        let line = text
            .lines()
            .find(|l| l.contains("rule workload"))
            .unwrap_or_else(|| panic!("{name}: no rule check:\n{text}"));
        // doctor compares the slices with the installed shim's own (exec's check).
        let words = if name == "noslice" {
            "the loader will not load it"
        } else {
            words
        };
        assert!(line.contains(words), "{name}: {line}");
    }
}
