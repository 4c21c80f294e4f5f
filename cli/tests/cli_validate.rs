//! `metalift validate` and `metalift explain`, run as the built binary against
//! policies in a temp dir per test.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

fn metalift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .output()
        .expect("run metalift")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// A temp dir with `policy.toml` holding `text` (mode 0644).
fn policy_dir(text: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policy.toml");
    fs::write(&path, text).expect("write policy");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).expect("chmod");
    (dir, path)
}

fn example(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    fs::read_to_string(path).expect("example")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

/// The brand a macOS guest on an M2 host reads: the shipped examples follow the
/// host chip (`apple_family_max = "host"`), so they are warning-free only where it
/// is known.
const GUEST_BRAND: &str = "Apple M2 (Virtual)";

const INVALID: &str = "version = 1\nmode = \"loud\"\n[profile.apple7]\napple_family_max = 11\n";

#[test]
fn validate_a_valid_policy_exits_0_with_a_summary() {
    let (_d, path) = policy_dir(&example("llama-fleet.toml"));
    // The example follows the host chip: checked as on the guest it is written for.
    let out = metalift(&[
        "validate",
        s(&path),
        "--allow-insecure-owner",
        "--skip-host-checks",
        "--host-chip-brand",
        GUEST_BRAND,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains(
            ": valid: 5 rules and 2 profiles in 1 file, mode enforce, 0 warnings; sha256 "
        ),
        "{text}"
    );
}

#[test]
fn validate_an_invalid_policy_exits_1_and_underlines_every_error() {
    let (_d, path) = policy_dir(INVALID);
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let p = path.display();
    assert!(
        text.contains(&format!(
            "{p}:2:8: error: unknown mode `loud` (expected \"enforce\" or \"monitor\")\nmode = \"loud\"\n       ^~~~~~\n"
        )),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "{p}:4:20: error: apple_family_max 11 is outside Apple5..Apple10\napple_family_max = 11\n                   ^~\n"
        )),
        "{text}"
    );
    assert!(
        text.ends_with(&format!("{p}: invalid: 2 errors, 0 warnings\n")),
        "{text}"
    );
}

#[test]
fn validate_prints_warnings_but_still_exits_0() {
    let (_d, path) = policy_dir(
        "version = 1\n[profile.p]\napple_family_max = 7\nmax_threadgroup_memory = 65536\n",
    );
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(stdout(&out).contains(":4:26: warning: max_threadgroup_memory 65536 exceeds 32768"));
}

#[test]
fn validate_a_missing_policy_exits_2() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policy.toml");
    let out = metalift(&["validate", s(&path)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stdout(&out).contains("no such policy file"));
}

#[test]
fn validate_reports_a_group_writable_candidate_as_a_warning_and_checks_it() {
    let (_d, path) = policy_dir(&example("default-policy.toml"));
    fs::set_permissions(&path, fs::Permissions::from_mode(0o664)).expect("chmod");
    let out = metalift(&["validate", s(&path), "--host-chip-brand", GUEST_BRAND]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "{}: warning: writable by group or other (mode 0664): metaliftd refuses a policy file that is not owned by root or is writable by group or other; install it with `sudo install -o root -m 0644`",
            path.display()
        )),
        "{text}"
    );
    assert!(
        text.contains(": valid: 0 rules and 1 profile in 1 file, mode enforce, 1 warning; sha256 "),
        "{text}"
    );
    // --strict is about the policy's contents: the owner stays a warning.
    assert_eq!(
        metalift(&[
            "validate",
            s(&path),
            "--strict",
            "--host-chip-brand",
            GUEST_BRAND
        ])
        .status
        .code(),
        Some(0)
    );
    let out = metalift(&[
        "validate",
        s(&path),
        "--allow-insecure-owner",
        "--host-chip-brand",
        GUEST_BRAND,
    ]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!stdout(&out).contains(": warning:"), "{}", stdout(&out));
    assert!(
        stdout(&out).contains(", 0 warnings; sha256 "),
        "{}",
        stdout(&out)
    );
}

#[test]
fn validate_json_lists_diagnostics_with_locations() {
    let (_d, path) = policy_dir(INVALID);
    let out = metalift(&["validate", s(&path), "--json", "--allow-insecure-owner"]);
    assert_eq!(out.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["status"], "invalid");
    assert_eq!(doc["errors"], 2);
    assert_eq!(doc["diagnostics"][0]["line"], 2);
    assert_eq!(doc["diagnostics"][0]["col"], 8);
    assert_eq!(doc["diagnostics"][0]["len"], 6);
    assert_eq!(doc["diagnostics"][1]["severity"], "error");

    let (_d, path) = policy_dir(&example("default-policy.toml"));
    let out = metalift(&["validate", s(&path), "--json", "--allow-insecure-owner"]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["status"], "valid");
    assert_eq!(doc["policy"]["rules"], 0);
    assert_eq!(doc["policy"]["sha256"].as_str().map(str::len), Some(64));
}

/// An executable-like file named `name` in `dir`.
fn exe(dir: &Path, name: &str, contents: &[u8]) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, contents).expect("write exe");
    path
}

#[test]
fn explain_a_path_shows_identity_every_rule_the_winner_and_the_profile() {
    let (d, path) = policy_dir(&example("dev-policy.toml"));
    let probe = exe(d.path(), "metalift-probe", b"probe");
    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--path",
        s(&probe),
        "--allow-insecure-owner",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(
        text.contains(&format!(
            "  path        {}\n",
            fs::canonicalize(&probe).expect("canon").display()
        )),
        "{text}"
    );
    assert!(
        text.contains("  sha256      not computed (no rule needs it)"),
        "{text}"
    );
    assert!(text.contains("  WINS  probe ("), "{text}");
    assert!(
        text.contains("unlock with profile `apple7` (rule `probe`, mode enforce)"),
        "{text}"
    );
    assert!(text.contains("  apple_family_max         7 "), "{text}");

    let other = exe(d.path(), "llama-server", b"x");
    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--path",
        s(&other),
        "--allow-insecure-owner",
    ]);
    let text = stdout(&out);
    assert!(text.contains("  -   probe ("), "{text}");
    assert!(text.contains("stock: no rule matches"), "{text}");
}

#[test]
fn explain_computes_sha256_only_when_a_rule_needs_it() {
    // sha256("hello") = 2cf24dba...
    let digest = "2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824";
    let (d, path) = policy_dir(&format!(
        "version = 1\nmode = \"monitor\"\n[profile.apple7]\napple_family_max = 7\n[[rule]]\nid = \"h\"\nsha256 = \"{digest}\"\nunlock = \"apple7\"\n"
    ));
    let bin = exe(d.path(), "tool", b"hello");
    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--path",
        s(&bin),
        "--json",
        "--allow-insecure-owner",
    ]);
    assert_eq!(out.status.code(), Some(0));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["subject"]["sha256"], digest);
    assert_eq!(doc["verdict"]["action"], "stock");
    assert_eq!(doc["verdict"]["mode"], "monitor");
    assert_eq!(doc["verdict"]["rule"], "h");
    assert_eq!(doc["verdict"]["would_unlock"], "apple7");
    assert_eq!(doc["verdict"]["capabilities"]["apple_family_max"], 7);
    assert_eq!(doc["trace"][0]["winner"], true);
}

#[test]
fn explain_what_if_signature_flags_reach_team_and_signing_rules() {
    let (d, path) = policy_dir(&example("llama-fleet.toml"));
    let bin = exe(d.path(), "bench", b"b");
    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--path",
        s(&bin),
        "--team-id",
        "ABCDE12345",
        "--signing-id",
        "com.example.bench-runner",
        "--json",
        "--allow-insecure-owner",
    ]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["verdict"]["rule"], "bench-runner");
    assert_eq!(doc["verdict"]["action"], "unlock");
    assert_eq!(doc["trace"].as_array().map(Vec::len), Some(5));
}

#[cfg(target_os = "linux")]
#[test]
fn explain_a_pid_reads_its_executable_uid_and_parent_from_proc() {
    let (_d, path) = policy_dir(&example("default-policy.toml"));
    let me = std::process::id().to_string();
    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--pid",
        &me,
        "--json",
        "--allow-insecure-owner",
    ]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    let exe = std::env::current_exe().expect("current exe");
    assert_eq!(doc["subject"]["path"], exe.display().to_string());
    // The effective uid, the owner of /proc/self on Linux (which macOS lacks).
    let uid = rustix::process::geteuid().as_raw();
    assert_eq!(doc["subject"]["uid"], uid);
    assert!(doc["subject"]["parent"].is_string(), "{doc}");
    assert_eq!(doc["verdict"]["action"], "stock");
}

#[test]
fn explain_with_no_policy_file_says_everything_is_stock() {
    let dir = tempfile::tempdir().expect("tempdir");
    let policy = dir.path().join("absent.toml");
    let out = metalift(&["explain", "--policy", s(&policy), "--path", "/bin/sh"]);
    assert_eq!(out.status.code(), Some(0));
    let text = stdout(&out);
    assert!(text.contains("no such policy file"), "{text}");
    assert!(text.contains("(none: the policy has no rules)"), "{text}");
}

#[test]
fn explain_with_an_invalid_policy_exits_1_and_prints_the_errors() {
    let (_d, path) = policy_dir(INVALID);
    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--path",
        "/bin/sh",
        "--allow-insecure-owner",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains(":2:8: error: unknown mode"));
}

#[test]
fn explain_needs_a_path_or_a_pid() {
    let out = metalift(&["explain", "--policy", "/nonexistent"]);
    assert_eq!(out.status.code(), Some(2), "clap usage error");
}

// ---------------------------------------------------------------------------
// One policy hash, whatever the path spelling (issue 12 item 3)
// ---------------------------------------------------------------------------

/// `metalift validate PATH --json` run in `cwd`: the policy hash it prints.
fn hash_in(cwd: &Path, path: &str) -> String {
    let o = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .current_dir(cwd)
        .args(["validate", path, "--json", "--skip-host-checks"])
        .output()
        .expect("run metalift");
    let doc: Value = serde_json::from_slice(&o.stdout).expect("json");
    doc["policy"]["sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("{doc}"))
        .to_owned()
}

/// The guide's command line starting with `start` (the documented one-liners of
/// docs/src/policy/hash.md are tested as written).
fn readme_command(start: &str) -> String {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/policy/hash.md");
    let text = fs::read_to_string(page).expect("docs/src/policy/hash.md");
    text.lines()
        .find(|l| l.starts_with(start))
        .unwrap_or_else(|| panic!("docs/src/policy/hash.md has no line starting with {start:?}"))
        .to_owned()
}

/// The one-liners the guide documents, run through `sh` in `dir`.
fn documented_hash(dir: &Path, with_drop_ins: bool) -> String {
    let script = if with_drop_ins {
        readme_command("(cd /etc/metalift && ")
    } else {
        readme_command("sha256sum < /etc/metalift/policy.toml")
    };
    let o = Command::new("sh")
        .arg("-c")
        .arg(script.replace("/etc/metalift", s(dir)))
        .output()
        .expect("sh");
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_owned()
}

#[test]
fn the_policy_hash_is_the_same_for_every_spelling_and_equals_sha256sum() {
    let (d, _path) = policy_dir(&example("llama-fleet.toml"));
    let dir = d.path();
    let abs = dir.join("policy.toml");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let link = elsewhere.path().join("linked.toml");
    std::os::unix::fs::symlink(&abs, &link).expect("symlink");
    let hashes = [
        hash_in(dir, "policy.toml"),
        hash_in(dir, "./policy.toml"),
        hash_in(elsewhere.path(), s(&abs)),
        hash_in(elsewhere.path(), "linked.toml"),
    ];
    let documented = documented_hash(dir, false);
    assert_eq!(documented.len(), 64);
    for h in &hashes {
        assert_eq!(h, &documented, "{hashes:?}");
    }
    // The text summary prints the same hash.
    let text = stdout(&metalift(&["validate", s(&abs), "--skip-host-checks"]));
    assert!(text.contains(&format!("; sha256 {documented}\n")), "{text}");
}

#[test]
fn with_drop_ins_the_hash_is_the_same_for_every_spelling_and_equals_the_one_liner() {
    let (d, _path) = policy_dir(&example("llama-fleet.toml"));
    let dir = d.path();
    fs::create_dir_all(dir.join("policy.d")).expect("policy.d");
    fs::write(dir.join("policy.d/20-b.toml"), "version = 1\n# b\n").expect("write");
    fs::write(dir.join("policy.d/10-a.toml"), "version = 1\n# a\n").expect("write");
    fs::write(dir.join("policy.d/.hidden.toml"), "not read").expect("write");
    fs::write(dir.join("policy.d/notes.txt"), "not read").expect("write");
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let linked_dir = elsewhere.path().join("etc-link");
    std::os::unix::fs::symlink(dir, &linked_dir).expect("symlink the directory");
    let hashes = [
        hash_in(dir, "policy.toml"),
        hash_in(dir, "./policy.toml"),
        hash_in(elsewhere.path(), s(&dir.join("policy.toml"))),
        hash_in(elsewhere.path(), "etc-link/policy.toml"),
    ];
    let documented = documented_hash(dir, true);
    assert_eq!(documented.len(), 64);
    for h in &hashes {
        assert_eq!(h, &documented, "{hashes:?}");
    }
    assert_ne!(documented, documented_hash(dir, false));
}

// ---------------------------------------------------------------------------
// Lints and --strict (item 5), symlinked rule paths (item 4)
// ---------------------------------------------------------------------------

const LINTED: &str = "version = 1\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"everything\"\npath = \"/**\"\nunlock = \"apple7\"\n";

#[test]
fn a_lint_is_a_located_warning_and_strict_makes_it_exit_1() {
    let (_d, path) = policy_dir(LINTED);
    let p = path.display();
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "{p}:7:8: warning: rule `everything`: `/**` starts with a wildcard at the root and matches every executable on the machine"
        )),
        "{text}"
    );
    assert!(text.contains("path = \"/**\"\n       ^~~~~\n"), "{text}");
    assert!(text.contains(", 1 warning; sha256 "), "{text}");

    let out = metalift(&["validate", s(&path), "--allow-insecure-owner", "--strict"]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("{p}:7:8: error (--strict): rule `everything`")),
        "{text}"
    );
    assert!(
        text.ends_with(&format!("{p}: invalid (--strict): 0 errors, 1 warning\n")),
        "{text}"
    );
    let out = metalift(&[
        "validate",
        s(&path),
        "--allow-insecure-owner",
        "--strict",
        "--json",
    ]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["status"], "invalid");
    assert_eq!(doc["strict"], true);
}

#[test]
fn strict_accepts_a_policy_without_warnings() {
    let (_d, path) = policy_dir(&example("default-policy.toml"));
    let out = metalift(&[
        "validate",
        s(&path),
        "--allow-insecure-owner",
        "--strict",
        "--host-chip-brand",
        GUEST_BRAND,
    ]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

#[test]
fn validate_warns_that_a_rule_on_a_symlink_never_matches_and_explain_resolves_it() {
    let d = tempfile::tempdir().expect("tempdir");
    let root = fs::canonicalize(d.path()).expect("canonical");
    let keg = root.join("Cellar/llama.cpp/1234/bin");
    fs::create_dir_all(&keg).expect("keg");
    fs::create_dir_all(root.join("bin")).expect("bin");
    let target = exe(&keg, "llama-server", b"\x7fELF");
    let link = root.join("bin/llama-server");
    std::os::unix::fs::symlink(&target, &link).expect("symlink");
    let text = format!(
        "version = 1\n[profile.apple7]\napple_family_max = 7\n[[rule]]\nid = \"brew-llama\"\npath = \"{}\"\nunlock = \"apple7\"\n",
        link.display()
    );
    let (_p, path) = policy_dir(&text);
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner"]);
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert!(
        report.contains(&format!(
            "warning: rule `brew-llama`: {} is a symlink to {}; rules match the resolved executable, so this rule never matches: use the resolved path or a glob over the Cellar (\"{}/Cellar/llama.cpp/*/bin/llama-server\"",
            link.display(),
            target.display(),
            root.display()
        )),
        "{report}"
    );
    // --skip-host-checks: the machine is not asked.
    let out = metalift(&[
        "validate",
        s(&path),
        "--allow-insecure-owner",
        "--skip-host-checks",
    ]);
    assert!(stdout(&out).contains(", 0 warnings; "), "{}", stdout(&out));

    let out = metalift(&[
        "explain",
        "--policy",
        s(&path),
        "--allow-insecure-owner",
        "--path",
        s(&link),
    ]);
    let text = stdout(&out);
    assert!(
        text.contains(&format!("  path        {}\n", target.display())),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "  given as    {} → {} (resolved: rules match the resolved executable",
            link.display(),
            target.display()
        )),
        "{text}"
    );
    assert!(text.contains("stock: no rule matches"), "{text}");
}

#[test]
fn validate_warns_about_a_rule_path_that_does_not_exist_and_not_about_one_that_does() {
    let d = tempfile::tempdir().expect("tempdir");
    let root = fs::canonicalize(d.path()).expect("canonical");
    let real = exe(&root, "tool", b"x");
    let text = format!(
        "version = 1\n[profile.apple7]\napple_family_max = 7\n[[rule]]\nid = \"real\"\npath = \"{}\"\nunlock = \"apple7\"\n[[rule]]\nid = \"typo\"\npath = \"{}/tol\"\nunlock = \"apple7\"\n",
        real.display(),
        root.display()
    );
    let (_p, path) = policy_dir(&text);
    let report = stdout(&metalift(&["validate", s(&path), "--allow-insecure-owner"]));
    assert!(
        report.contains(&format!(
            "warning: rule `typo`: {}/tol does not exist on this machine",
            root.display()
        )),
        "{report}"
    );
    assert!(!report.contains("rule `real`"), "{report}");
}

#[test]
fn validate_flags_a_uid_that_is_not_the_rules_user() {
    let text = "version = 1\n[profile.apple7]\napple_family_max = 7\n[[rule]]\nid = \"odd\"\nname = \"llama-server\"\nuid = 0\nuser = \"inference-nobody-has-this\"\nunlock = \"apple7\"\n";
    let (_p, path) = policy_dir(text);
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner", "--strict"]);
    let report = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{report}");
    assert!(
        report.contains(":8:8: error (--strict): rule `odd`: contradictory qualifiers: uid 0 is `root` on this machine, not `inference-nobody-has-this`"),
        "{report}"
    );
    let fine = text.replace("inference-nobody-has-this", "root");
    let (_q, path) = policy_dir(&fine);
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner", "--strict"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}

// ---------------------------------------------------------------------------
// Candidates like `visudo -c -f` (item 6)
// ---------------------------------------------------------------------------

const MAIN: &str = "version = 1\n[profile.apple7]\napple_family_max = 7\n[[rule]]\nid = \"main-llama\"\npath = \"/opt/llama/bin/llama-server\"\nunlock = \"apple7\"\n";

/// An installed-looking main policy with `policy.d/10-fleet.toml`.
fn installed() -> (tempfile::TempDir, PathBuf) {
    let (d, main) = policy_dir(MAIN);
    fs::create_dir_all(d.path().join("policy.d")).expect("policy.d");
    fs::write(
        d.path().join("policy.d/10-fleet.toml"),
        "[[rule]]\nid = \"fleet\"\nname = \"whisper\"\nunlock = \"apple7\"\n",
    )
    .expect("write");
    (d, main)
}

#[test]
fn validate_main_checks_a_drop_in_against_the_installed_policy() {
    let (_d, main) = installed();
    let cand_dir = tempfile::tempdir().expect("tempdir");
    // Uses the main file's profile: invalid alone, valid in context.
    let cand = cand_dir.path().join("20-ci.toml");
    fs::write(
        &cand,
        "[[rule]]\nid = \"ci\"\nname = \"ollama\"\nunlock = \"apple7\"\n",
    )
    .expect("write");
    let alone = metalift(&["validate", s(&cand), "--skip-host-checks"]);
    assert_eq!(alone.status.code(), Some(1), "{}", stdout(&alone));

    let out = metalift(&[
        "validate",
        "--main",
        s(&main),
        s(&cand),
        "--skip-host-checks",
        "--allow-insecure-owner",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "{}: checked as a drop-in of {} (as a new {}/policy.d/20-ci.toml)",
            cand.display(),
            main.display(),
            main.parent().map(Path::display).expect("dir")
        )),
        "{text}"
    );
    assert!(
        text.contains(": valid: 3 rules and 1 profile in 3 files (with policy.d/)"),
        "{text}"
    );
    // The hash printed is the one the policy will have once the candidate is installed.
    let before: String = text
        .rsplit("sha256 ")
        .next()
        .unwrap_or_default()
        .trim()
        .to_owned();
    fs::copy(&cand, main.with_file_name("policy.d/20-ci.toml")).expect("install");
    let after = stdout(&metalift(&[
        "validate",
        s(&main),
        "--skip-host-checks",
        "--allow-insecure-owner",
    ]));
    assert!(
        after.ends_with(&format!("sha256 {before}\n")),
        "{after} vs {before}"
    );
}

#[test]
fn validate_main_replaces_an_installed_drop_in_of_the_same_name_and_locates_errors_in_the_candidate(
) {
    let (_d, main) = installed();
    let cand_dir = tempfile::tempdir().expect("tempdir");
    let cand = cand_dir.path().join("10-fleet.toml");
    // Would be a duplicate id `fleet` if both were read; a syntax error in the candidate.
    fs::write(
        &cand,
        "[[rule]]\nid = \"fleet\"\nname = \"whisper\"\nunlock = \"apple7\n",
    )
    .expect("write");
    let out = metalift(&[
        "validate",
        "--main",
        s(&main),
        s(&cand),
        "--skip-host-checks",
        "--allow-insecure-owner",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("(replacing the installed "), "{text}");
    assert!(
        text.contains(&format!("{}:4:17: error: TOML syntax", cand.display())),
        "{text}"
    );
    assert!(!text.contains("duplicate rule id"), "{text}");
}

#[test]
fn validate_main_warns_when_a_drop_in_overrides_a_main_file_rule() {
    let (_d, main) = installed();
    let cand_dir = tempfile::tempdir().expect("tempdir");
    let cand = cand_dir.path().join("50-deny.toml");
    fs::write(
        &cand,
        "[[rule]]\nid = \"deny-llama\"\npath = \"/opt/llama/bin/llama-server\"\nuser = \"ci\"\nstock = true\n",
    )
    .expect("write");
    let out = metalift(&[
        "validate",
        "--main",
        s(&main),
        s(&cand),
        "--skip-host-checks",
        "--allow-insecure-owner",
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "{}:2:6: warning: rule `deny-llama` in a policy.d/ file overrides the main policy's rule `main-llama`",
            cand.display()
        )),
        "{text}"
    );
    let strict = metalift(&[
        "validate",
        "--main",
        s(&main),
        s(&cand),
        "--skip-host-checks",
        "--allow-insecure-owner",
        "--strict",
    ]);
    assert_eq!(strict.status.code(), Some(1));
}

#[test]
fn a_candidate_not_owned_by_root_is_checked_with_its_owner_as_a_warning() {
    let (_d, path) = policy_dir(&example("default-policy.toml"));
    let uid = std::os::unix::fs::MetadataExt::uid(&fs::metadata(&path).expect("stat"));
    let uid = if uid == 0 {
        std::os::unix::fs::chown(&path, Some(1000), Some(1000)).expect("chown as root");
        1000
    } else {
        uid
    };
    let out = metalift(&["validate", s(&path)]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "{}: warning: owned by uid {uid}, not root: metaliftd refuses a policy file that is not owned by root",
            path.display()
        )),
        "{text}"
    );
    assert!(!text.contains("development override"), "{text}");
    let out = metalift(&["validate", s(&path), "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(doc["status"], "valid");
    assert_eq!(
        doc["ownership"][0]["reason"],
        format!("owned by uid {uid}, not root")
    );
}

/// `metalift validate --skip-host-checks --allow-insecure-owner PATH`: exit code and stdout.
fn validate_text(path: &Path) -> (Option<i32>, String) {
    let out = metalift(&[
        "validate",
        "--skip-host-checks",
        "--allow-insecure-owner",
        s(path),
    ]);
    (out.status.code(), stdout(&out))
}

/// Issue 26: one diagnostic per cause. A profile refused for its `apple_family_max`
/// used to be reported again as "unknown profile" at every rule that names it.
#[test]
fn a_bad_apple_family_max_is_reported_once_not_again_at_every_rule() {
    let (_d, path) = policy_dir(
        "version = 1\n[profile.p]\napple_family_max = 12\n\n[[rule]]\nid = \"a\"\nname = \"x\"\nunlock = \"p\"\n\n[[rule]]\nid = \"b\"\nname = \"y\"\nunlock = \"p\"\n",
    );
    let (code, text) = validate_text(&path);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(":3:20: error: apple_family_max 12 is outside Apple5..Apple10"),
        "{text}"
    );
    assert!(!text.contains("unknown profile"), "{text}");
    assert!(text.contains("invalid: 1 error,"), "{text}");
    // A profile that is really missing is still named at its rule.
    let (_d, path) =
        policy_dir("version = 1\n[[rule]]\nid = \"a\"\nname = \"x\"\nunlock = \"q\"\n");
    let (_, text) = validate_text(&path);
    assert!(text.contains("unknown profile `q`"), "{text}");
}

/// Issue 26: an unclosed `[` is underlined at the `[`, in metalift's words.
#[test]
fn an_unclosed_bracket_in_a_glob_is_located_at_the_bracket() {
    let (_d, path) = policy_dir(
        "version = 1\n[profile.p]\napple_family_max = 7\n[[rule]]\nid = \"a\"\npath = \"/opt/x/ab[cd/e*\"\nunlock = \"p\"\n",
    );
    let (code, text) = validate_text(&path);
    assert_eq!(code, Some(1), "{text}");
    assert!(
        text.contains(":6:18: error: bad glob in `path`: this `[` opens a character class that is never closed with `]` (for a literal `[`, write `[[]`)"),
        "{text}"
    );
    assert!(
        text.contains("path = \"/opt/x/ab[cd/e*\"\n                 ^\n"),
        "one caret under the `[`: {text}"
    );
}

/// Issue 26: a binary file is described, never echoed to the terminal.
#[test]
fn validate_of_a_binary_file_describes_it_without_echoing_its_bytes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policy.toml");
    let mut elf = b"\x7fELF\x02\x01\x01\0\0\0\0\0\0\0\0\0\x03\0>\0".to_vec();
    elf.extend((0u8..=255).cycle().take(2000));
    fs::write(&path, &elf).expect("write");
    let out = metalift(&[
        "validate",
        "--skip-host-checks",
        "--allow-insecure-owner",
        s(&path),
    ]);
    let text = stdout(&out);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(
        text.contains("error: not a policy file: it holds an ELF executable or library (2020 bytes, a NUL byte at offset 7)"),
        "{text}"
    );
    assert!(
        !text.chars().any(|c| c.is_control() && c != '\n'),
        "control characters reached the terminal: {text:?}"
    );
}

#[test]
fn validate_locates_every_audit_forward_error() {
    let (_d, path) = policy_dir(
        "version = 1\n\n[audit.forward]\naddress = \"logs:0\"\ntransport = \"tls\"\nca = \"rel/ca.pem\"\nclient_cert = \"/c.pem\"\nadress = 1\n",
    );
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner"]);
    assert_eq!(out.status.code(), Some(1));
    let text = stdout(&out);
    let p = path.display();
    for (place, message) in [
        ("4:11", "`address` has port \"0\": expected 1-65535"),
        ("6:6", "`rel/ca.pem` must be an absolute path"),
        ("7:15", "`client_cert` needs `client_key`"),
        (
            "8:1",
            "unknown key `adress` in [audit.forward] (did you mean `address`?)",
        ),
    ] {
        assert!(
            text.contains(&format!("{p}:{place}: error: {message}")),
            "{place}: {text}"
        );
    }
}

#[test]
fn validate_accepts_an_audit_forward_table_over_tls() {
    let (_d, path) = policy_dir(
        "version = 1\n\n[audit.forward]\naddress = \"[::1]:6514\"\ntransport = \"tls\"\nca = \"/etc/metalift/ca.pem\"\n",
    );
    let out = metalift(&["validate", s(&path), "--allow-insecure-owner"]);
    assert_eq!(out.status.code(), Some(0), "{}", stdout(&out));
}
