//! The guide's facts are the code's: the exit codes, paths, modes and JSON shapes
//! written once in `docs/src/reference/` (and the policy keys in
//! `docs/src/policy/reference.md`) are read back here and compared with the
//! constants the programs use, the installer's scripts, and what the commands
//! actually do and print.

mod support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(repo().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn metalift(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .env_remove("METALIFT_SOCKET")
        .env_remove("METALIFT_POLICY")
        .env_remove("METALIFT_AUDIT_LOG")
        .output()
        .expect("run metalift")
}

/// The text under the heading `heading` (a whole line, e.g. `## metalift`), up to
/// the next heading of the same or a higher level.
fn section<'a>(page: &'a str, heading: &str) -> &'a str {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let start = page
        .lines()
        .position(|l| l == heading)
        .unwrap_or_else(|| panic!("no heading {heading:?}"));
    let lines: Vec<&str> = page.lines().collect();
    let end = lines[start + 1..]
        .iter()
        .position(|l| {
            let hashes = l.chars().take_while(|c| *c == '#').count();
            hashes > 0 && hashes <= level && l[hashes..].starts_with(' ')
        })
        .map_or(lines.len(), |i| start + 1 + i);
    let from = page.find(lines[start]).unwrap_or(0);
    let to = if end < lines.len() {
        page.find(lines[end]).unwrap_or(page.len())
    } else {
        page.len()
    };
    &page[from..to]
}

/// The body rows of every Markdown table in `text`, as trimmed cells.
fn rows(text: &str) -> Vec<Vec<String>> {
    text.lines()
        .filter(|l| l.starts_with('|') && !l.starts_with("|---"))
        .map(|l| {
            l.trim_matches('|')
                .split('|')
                .map(|c| c.trim().to_owned())
                .collect()
        })
        .collect()
}

/// `(code, command)` for every row of the guide's `metalift` exit code table.
fn documented_exit_codes() -> Vec<(u8, String)> {
    let page = read("docs/src/reference/exit-codes.md");
    rows(section(&page, "## metalift"))
        .into_iter()
        .filter(|r| r[0] != "code")
        .map(|r| {
            let code = r[0].parse().unwrap_or_else(|_| panic!("not a code: {r:?}"));
            (code, r[1].trim_matches('`').to_owned())
        })
        .collect()
}

/// The one documented code for `command` whose meaning contains `words`.
fn documented(command: &str, words: &str) -> i32 {
    let page = read("docs/src/reference/exit-codes.md");
    let found: Vec<i32> = rows(section(&page, "## metalift"))
        .into_iter()
        .filter(|r| r[1].trim_matches('`') == command && r[2].contains(words))
        .map(|r| r[0].parse().expect("a code"))
        .collect();
    assert_eq!(
        found.len(),
        1,
        "exit-codes.md: one row for `{command}` saying {words:?}"
    );
    found[0]
}

#[test]
fn every_exit_code_constant_is_documented_for_its_command() {
    use metalift_cli::{doctor, edit, exec, explain, report, status, validate, verify};
    let doc = documented_exit_codes();
    for (code, command) in [
        (validate::VALID, "every command"),
        (report::ERROR, "every command"),
        (validate::INVALID, "validate"),
        (explain::INVALID_POLICY, "explain"),
        (status::EXIT_UNREACHABLE, "status"),
        (status::EXIT_UNLOCKS_NOTHING, "status"),
        (exec::UNLOCKS_NOTHING, "exec --require-unlock"),
        (
            metalift_cli::judgement::EXIT_DISK_NOT_LIVE,
            "explain --live",
        ),
        (status::EXIT_DISK_NOT_LIVE, "status"),
        (status::EXIT_DEGRADED, "status"),
        (doctor::WARNINGS, "doctor"),
        (doctor::FAILURES, "doctor"),
        (edit::DISCARDED, "edit"),
        (edit::NOT_LIVE, "edit"),
        (edit::NOT_INSTALLED, "edit"),
        (exec::NOT_UNLOCKED, "exec --require-unlock"),
        (exec::NOT_EXECUTABLE, "exec"),
        (exec::NOT_FOUND, "exec"),
        (verify::FAILED, "verify"),
    ] {
        assert!(
            doc.iter().any(|(c, cmd)| *c == code && cmd == command),
            "docs/src/reference/exit-codes.md has no row {code} for `{command}`: {doc:?}"
        );
    }
}

#[test]
fn the_documented_exit_codes_are_what_the_commands_return() {
    let tmp = tempfile::tempdir().unwrap();
    let socket = tmp.path().join("nobody.sock");
    let status = metalift(&["status", "--socket", socket.to_str().unwrap()]);
    assert_eq!(
        status.status.code(),
        Some(documented("status", "no daemon answers")),
        "metalift status without a daemon"
    );
    let invalid = tmp.path().join("policy.toml");
    std::fs::write(&invalid, "version = 1\n[[rule]]\nid = \"x\"\n").unwrap();
    let validate = metalift(&[
        "validate",
        "--allow-insecure-owner",
        "--skip-host-checks",
        invalid.to_str().unwrap(),
    ]);
    assert_eq!(
        validate.status.code(),
        Some(documented("validate", "has errors")),
        "metalift validate on an invalid policy: {}",
        String::from_utf8_lossy(&validate.stdout)
    );
    let usage = metalift(&["status", "--no-such-flag"]);
    assert_eq!(
        usage.status.code(),
        Some(documented("every command", "usage or runtime error"))
    );
    let missing = tmp.path().join("no-such-command");
    let exec = metalift(&["exec", "--", missing.to_str().unwrap()]);
    assert_eq!(exec.status.code(), Some(documented("exec", "not found")));
}

/// The exit codes listed under `Exit status:` in `metalift CMD --help`.
fn help_codes(command: &str) -> BTreeSet<u8> {
    let out = metalift(&[command, "--help"]);
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let Some(at) = help.find("Exit status:") else {
        return BTreeSet::new();
    };
    help[at..]
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next()?.parse().ok())
        .collect()
}

#[test]
fn each_commands_help_lists_the_codes_the_reference_gives_it() {
    let doc = documented_exit_codes();
    let everyone: BTreeSet<u8> = doc
        .iter()
        .filter(|(_, c)| c == "every command")
        .map(|(code, _)| *code)
        .collect();
    for command in ["status", "edit", "doctor", "exec", "audit", "verify"] {
        let own: BTreeSet<u8> = doc
            .iter()
            .filter(|(_, c)| c.split_whitespace().next() == Some(command))
            .map(|(code, _)| *code)
            .collect();
        let help = help_codes(command);
        assert!(
            !help.is_empty(),
            "`metalift {command} --help` lists its exit codes"
        );
        let allowed: BTreeSet<u8> = own.union(&everyone).copied().collect();
        assert!(
            help.is_subset(&allowed),
            "`metalift {command} --help` lists {help:?}; exit-codes.md gives it {allowed:?}"
        );
        assert!(
            own.is_subset(&help),
            "exit-codes.md gives `{command}` {own:?}; its --help lists {help:?}"
        );
    }
}

/// The row of a paths.md table whose first cell is `what`.
fn path_row(what: &str) -> Vec<String> {
    let page = read("docs/src/reference/paths.md");
    rows(&page)
        .into_iter()
        .find(|r| r[0] == what)
        .unwrap_or_else(|| panic!("paths.md has no row {what:?}"))
}

#[test]
fn the_documented_paths_and_modes_are_the_codes_and_the_installers() {
    use metalift_daemon::audit::{writer, Rotation, DEFAULT_LOG_PATH};
    use metalift_daemon::live_policy::archive;
    use metalift_daemon::service::config::DEFAULT_POLICY;
    use metalift_policy::socket_path::{SYSTEM_SOCKET, USER_SOCKET_NAME};

    let code = |path: &str| format!("`{path}`");
    assert!(path_row("the policy file")[1].contains(&code(DEFAULT_POLICY)));
    assert!(path_row("the audit log")[1].contains(&code(DEFAULT_LOG_PATH)));
    let platform = if cfg!(target_os = "macos") {
        "macOS"
    } else {
        "Linux"
    };
    assert!(
        path_row(&format!("the system daemon's socket, {platform}"))[1]
            .contains(&code(SYSTEM_SOCKET))
    );
    assert!(path_row("a per-user daemon's socket")[1].contains(&code(USER_SOCKET_NAME)));

    let dir = path_row("the audit log directory");
    assert!(dir[1].contains(&code(
        &(Path::new(DEFAULT_LOG_PATH)
            .parent()
            .unwrap()
            .display()
            .to_string()
            + "/")
    )));
    let postinstall = read("pkg/scripts/postinstall");
    for (doc, script) in [
        ("root:admin", r#"chown root:admin "$log_dir""#),
        ("0750", r#"chmod 0750 "$log_dir""#),
    ] {
        assert!(dir[2].contains(doc), "paths.md: {dir:?}");
        assert!(
            postinstall.contains(script),
            "postinstall no longer runs {script}"
        );
    }
    assert!(dir[2].contains(&format!("itself is `{:04o}`", writer::DIR_MODE)));
    let file = path_row("the live audit log");
    assert!(
        file[2].contains(&format!("`{:04o}`", writer::FILE_MODE)),
        "{file:?}"
    );
    let rotated = path_row("rotated files");
    let rotation = Rotation::default();
    assert!(rotated[2].contains(&format!("past {} bytes", rotation.max_bytes)));
    assert!(rotated[2].contains(&format!("{} kept", rotation.keep)));
    assert!(rotated[1].contains(&format!("`audit.jsonl.{}`", rotation.keep)));
    assert!(path_row("the policy archive")[2].contains(&format!("newest {} kept", archive::KEEP)));
}

/// Every key of `value` (an object) is named as `` `key` `` in `text`.
fn keys_named(value: &Value, text: &str, what: &str) {
    let object = value
        .as_object()
        .unwrap_or_else(|| panic!("{what}: {value}"));
    assert!(!object.is_empty(), "{what}: no keys");
    for key in object.keys() {
        assert!(
            text.contains(&format!("`{key}`")),
            "docs/src/reference/json.md does not name {what}'s key `{key}`"
        );
    }
}

#[test]
fn the_documented_json_shapes_are_what_the_commands_print() {
    let page = read("docs/src/reference/json.md");

    // The error object, exactly as printed.
    let error = section(&page, "## The error object");
    let block = error
        .split("```json\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("a json block");
    assert_eq!(
        block,
        metalift_cli::report::json_error("…", metalift_cli::report::ERROR)
    );
    let usage = metalift(&["status", "--json", "--no-such-flag"]);
    let printed: Value = serde_json::from_slice(&usage.stdout).expect("one JSON object");
    let shown: Value = serde_json::from_str(block).expect("the documented object is JSON");
    let keys = |v: &Value| v.as_object().map(|o| o.keys().cloned().collect::<Vec<_>>());
    assert_eq!(keys(&printed), keys(&shown), "printed: {printed}");
    assert_eq!(printed["code"], usage.status.code().unwrap_or(-1));

    // status --json, without and with a daemon.
    let status_doc = section(&page, "## `metalift status --json`");
    let dir = support::DaemonDir::new("docs-facts");
    std::fs::write(
        dir.policy(),
        "version = 1\n[profile.p]\napple_family_max = 7\n[[rule]]\nid = \"me\"\npath = \"/**\"\nunlock = \"p\"\n",
    )
    .unwrap();
    let down = metalift(&[
        "status",
        "--json",
        "--socket",
        dir.socket().to_str().unwrap(),
    ]);
    keys_named(
        &serde_json::from_slice(&down.stdout).expect("JSON without a daemon"),
        status_doc,
        "status --json (no daemon)",
    );
    let daemon = dir.start(&[], &[]);
    let up = metalift(&[
        "status",
        "--json",
        "--socket",
        daemon.socket.to_str().unwrap(),
    ]);
    keys_named(
        &serde_json::from_slice(&up.stdout).expect("JSON with a daemon"),
        status_doc,
        "status --json",
    );

    // A decision record, as the daemon writes it.
    let verdict = support::check_in(&daemon.socket);
    let decisions = dir.records_of("decision");
    let decision = decisions
        .iter()
        .find(|d| d["decision_id"] == verdict.decision_id)
        .expect("the check-in's decision");
    keys_named(
        decision,
        section(&page, "### Decision"),
        "a decision record",
    );

    // doctor --json and its checks.
    let doctor_doc = section(&page, "## `metalift doctor --json`");
    let root = tempfile::tempdir().unwrap();
    let doctor = metalift(&["doctor", "--json", "--root", root.path().to_str().unwrap()]);
    let report: Value = serde_json::from_slice(&doctor.stdout).expect("doctor's JSON");
    keys_named(&report, doctor_doc, "doctor --json");
    for check in report["checks"].as_array().expect("checks") {
        keys_named(check, doctor_doc, "a doctor check");
    }
}

#[test]
fn the_guides_policy_reference_names_every_key_the_schema_has() {
    let page = read("docs/src/policy/reference.md");
    let schema: Value = serde_json::from_slice(&metalift(&["schema"]).stdout).unwrap();
    for props in [
        &schema["properties"],
        &schema["definitions"]["profile"]["properties"],
        &schema["definitions"]["rule"]["properties"],
    ] {
        for key in props.as_object().expect("properties").keys() {
            assert!(
                page.contains(&format!("| `{key}` |")),
                "docs/src/policy/reference.md has no row for `{key}`"
            );
        }
    }
}
