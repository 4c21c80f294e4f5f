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

/// The words after `marker` in `text` up to the first character in `stops`
/// (one stated fact), or a failure naming the page.
fn stated<'a>(text: &'a str, page: &str, marker: &str, stops: &[char]) -> &'a str {
    let at = text
        .find(marker)
        .unwrap_or_else(|| panic!("{page} no longer says {marker:?}: update this test"));
    let rest = &text[at + marker.len()..];
    let end = rest.find(stops).unwrap_or(rest.len());
    rest[..end].trim()
}

/// Issue 43 item 5: the exit codes and the levels the guide's pages state (the
/// ones scripts branch on), each checked against the program: the judgement's
/// ladder, the daemon's effect of a cause, and doctor run for real.
#[test]
fn the_exit_codes_and_levels_the_guide_states_are_the_programs() {
    use metalift_cli::judgement::Level;
    use metalift_daemon::service::health::{code, Effect};
    let status_page = "docs/src/operations/reload-and-status.md";
    let status = read(status_page);
    // "no daemon answers": stated with its code, and run.
    let unreachable = metalift(&["status", "--socket", "/nonexistent/metalift.sock"]);
    let said: i32 = {
        let sentence = stated(
            &status,
            status_page,
            "which includes no daemon answering",
            &[')'],
        );
        sentence
            .rsplit('(')
            .next()
            .and_then(|s| s.split(':').next())
            .and_then(|n| n.trim().parse().ok())
            .unwrap_or_else(|| {
                panic!("{status_page}: no code for 'no daemon answers' in {sentence:?}")
            })
    };
    assert_eq!(
        Some(said),
        unreachable.status.code(),
        "{status_page}: status with no daemon answering"
    );
    // The health example: its heading word and exit code for its cause.
    let example = stated(
        &status,
        status_page,
        "$ metalift status; echo \"exit $?\"\n",
        &['`'],
    );
    let (heading, cause) = example
        .split_once(": ")
        .unwrap_or_else(|| panic!("{status_page}: example {example:?}"));
    let code_in = cause
        .rsplit('(')
        .next()
        .and_then(|c| c.split(')').next())
        .expect("the example's cause code");
    let level = Level::from(Effect::of(code_in));
    let want_heading = match level {
        Level::UnlocksNothing => "UNLOCKS NOTHING",
        Level::Degraded => "DEGRADED",
        Level::DiskNotLive => "DISK NOT LIVE",
        Level::Healthy => "healthy",
    };
    assert_eq!(
        heading, want_heading,
        "{status_page}: the example's first line for {code_in}"
    );
    let exit: u8 = stated(example, status_page, "\nexit ", &['\n'])
        .parse()
        .expect("the example's exit");
    assert_eq!(
        exit,
        level.exit_code(),
        "{status_page}: the example's exit for {code_in}"
    );
    // The causes table: "nothing" unlocked exactly for the causes whose effect is
    // unlocks_nothing; "this one alone is exit N".
    let table = section(
        &status,
        "## Health: running is not the same as able to unlock",
    );
    let mut causes = 0;
    for row in rows(table) {
        let [cause, _, unlocked, what] = &row[..] else {
            continue;
        };
        let Some(c) = cause.strip_prefix('`').and_then(|c| c.strip_suffix('`')) else {
            continue;
        };
        causes += 1;
        let effect = Effect::of(c);
        assert_eq!(
            unlocked.starts_with("nothing"),
            effect == Effect::UnlocksNothing,
            "{status_page}: `{c}` is said to unlock {unlocked:?}, its effect is {effect:?}"
        );
        if let Some(n) = what.split("alone is exit ").nth(1) {
            let n: u8 = n
                .trim_end_matches(|ch: char| !ch.is_ascii_digit())
                .parse()
                .expect("code");
            assert_eq!(
                n,
                Level::from(effect).exit_code(),
                "{status_page}: `{c}`'s exit"
            );
        }
    }
    assert!(
        causes >= 5,
        "{status_page}: the causes table was not read ({causes} rows)"
    );
    assert_eq!(Effect::of(code::FORWARD_BEHIND), Effect::Degraded);

    // doctor and baking: the level of an unverified require_verified profile, and
    // of a policy that unlocks nothing (plain and under --bake), run for real.
    let root = tempfile::tempdir().unwrap();
    let policy = root.path().join("etc/metalift/policy.toml");
    std::fs::create_dir_all(policy.parent().unwrap()).unwrap();
    std::fs::write(
        &policy,
        "version = 1\n[profile.v]\napple_family_max = 7\nrequire_verified = true\n",
    )
    .unwrap();
    let doctor = |extra: &[&str]| -> Value {
        let mut args = vec!["doctor", "--json", "--allow-insecure-owner", "--root"];
        let r = root.path().to_str().unwrap();
        args.push(r);
        args.extend_from_slice(extra);
        serde_json::from_slice(&metalift(&args).stdout).expect("doctor --json")
    };
    let check = |report: &Value, name: &str| -> String {
        report["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name} check: {report}"))["status"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let plain = doctor(&[]);
    let doctor_page = "docs/src/operations/doctor.md";
    let text = read(doctor_page);
    assert_eq!(
        stated(&text, doctor_page, "`require_verified = true` (`", &['`']),
        check(&plain, "verified unlock"),
        "{doctor_page}: an unverified require_verified profile"
    );
    assert_eq!(
        stated(
            &text,
            doctor_page,
            "whether any rule unlocks at all (`unlocks`:\n`",
            &['`']
        ),
        check(&plain, "unlocks"),
        "{doctor_page}: a policy that unlocks nothing"
    );
    let baking_page = "docs/src/operations/baking.md";
    let baking = read(baking_page);
    let word = stated(
        &baking,
        baking_page,
        "on that chip and build too, and `metalift doctor` ",
        &[' ', '.'],
    );
    let want = match check(&plain, "verified unlock").as_str() {
        "fail" => "fails",
        "warn" => "warns",
        other => panic!("verified unlock is {other}"),
    };
    assert_eq!(word, want, "{baking_page}: doctor on an unverified chip");
    // --bake: "a policy with no rule that unlocks" is among the FAIL causes.
    assert!(
        stated(
            &baking,
            baking_page,
            "every check that means\n   \"cannot unlock\" (",
            &[')']
        )
        .contains("a policy with no rule that unlocks"),
        "{baking_page}"
    );
    let bake = metalift(&[
        "doctor",
        "--bake",
        "--allow-insecure-owner",
        "--root",
        root.path().to_str().unwrap(),
    ]);
    let out = String::from_utf8_lossy(&bake.stdout);
    assert!(
        out.lines().any(|l| l.starts_with("FAIL unlocks: ")),
        "{out}"
    );
    // exit-codes.md: no entity shown literally inside a code span.
    let codes = read("docs/src/reference/exit-codes.md");
    for (i, span) in codes.split('`').enumerate() {
        assert!(
            i % 2 == 0 || !span.contains("&lt;") && !span.contains("&gt;"),
            "exit-codes.md shows an entity literally in `{span}`"
        );
    }
}
