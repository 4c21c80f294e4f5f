//! Issue 34, "a raised `--max-policy-bytes` leaves the CLI behind": the limits a
//! policy is judged with (its size, the host chip) reach `validate`, `edit` and
//! `doctor` as the running daemon has them (its status), not as the CLI was
//! compiled. A real metaliftd started with a raised limit serves a policy over the
//! compiled 4 MiB: `status` exits 0, `doctor` does not fail it on size, `edit`
//! installs an edit of it, and `validate --socket` accepts it (alone and as
//! `--main` of a drop-in), with the daemon's judgement rendered in each.
#![cfg(target_os = "linux")]

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

mod support;

use support::DaemonDir;

/// The daemon's raised limit: well over the compiled default.
const RAISED: u64 = 8 * 1024 * 1024;

fn s(p: &Path) -> &str {
    p.to_str().expect("UTF-8 path")
}

fn metalift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .env_remove("METALIFT_SOCKET")
        .env_remove("METALIFT_POLICY")
        .env_remove("METALIFT_AUDIT_LOG")
        .env_remove("METALIFT_HOST_CHIP_BRAND")
        .stdin(Stdio::null())
        .output()
        .expect("run metalift")
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

/// A valid policy of more than `bytes` bytes: one profile, one rule, and a long
/// comment (the limit is on bytes, whatever they hold).
fn policy_over(bytes: u64) -> String {
    let mut text = String::from(
        "version = 1\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"tool\"\npath = \"/opt/tool/bin/x\"\nunlock = \"apple7\"\n",
    );
    let line = format!("# {}\n", "x".repeat(76));
    while (text.len() as u64) <= bytes {
        text.push_str(&line);
    }
    text
}

#[test]
fn given_a_daemon_with_a_raised_limit_then_status_doctor_edit_and_validate_judge_with_its_limit() {
    let dir = DaemonDir::new("limits-");
    let default = metalift_policy::DEFAULT_MAX_POLICY_BYTES;
    std::fs::write(dir.policy(), policy_over(default + 1024)).expect("policy");
    let _daemon = dir.start(&["--max-policy-bytes", &RAISED.to_string()], &[]);
    let socket = dir.socket();

    // status: the daemon serves it; healthy.
    let out = metalift(&["status", "--json", "--socket", s(&socket)]);
    let status = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{status:#}");
    assert_eq!(status["max_policy_bytes"], RAISED);

    // doctor: the policy and the live policy are judged within the daemon's limit.
    let out = metalift(&[
        "doctor",
        "--json",
        "--socket",
        s(&socket),
        "--policy",
        s(&dir.policy()),
        "--log",
        s(&dir.audit_log()),
        "--allow-insecure-owner",
    ]);
    let doctor = json_of(&out);
    for name in ["policy", "live policy", "health"] {
        let check = doctor["checks"]
            .as_array()
            .expect("checks")
            .iter()
            .find(|c| c["name"] == name)
            .unwrap_or_else(|| panic!("no {name} check: {doctor:#}"));
        assert_eq!(check["status"], "ok", "{name}: {doctor:#}");
    }

    // validate: over the compiled limit it is refused unread without a daemon;
    // with the daemon asked it is judged within the daemon's limit.
    let out = metalift(&["validate", "--skip-host-checks", s(&dir.policy())]);
    assert_eq!(out.status.code(), Some(2), "compiled default: {out:?}");
    let out = metalift(&[
        "validate",
        "--skip-host-checks",
        "--json",
        "--socket",
        s(&socket),
        s(&dir.policy()),
    ]);
    let valid = json_of(&out);
    assert_eq!(out.status.code(), Some(0), "{valid:#}");
    assert_eq!(valid["status"], "valid");
    assert_eq!(valid["daemon"]["state"], "healthy", "{valid:#}");
    assert_eq!(valid["daemon"]["max_policy_bytes"], RAISED);
    assert_eq!(valid["daemon"]["code"], 0);
    // The text says the daemon's state in the judgement's words.
    let out = metalift(&[
        "validate",
        "--skip-host-checks",
        "--socket",
        s(&socket),
        s(&dir.policy()),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert!(text.starts_with("metaliftd: healthy: "), "{text}");

    // validate --main: a drop-in checked against the large installed policy.
    let dropin = dir.path("60-more.toml");
    std::fs::write(
        &dropin,
        "[[rule]]\nid = \"more\"\npath = \"/opt/more/bin/y\"\nunlock = \"apple7\"\n",
    )
    .expect("drop-in");
    let main_args = |socket: Option<&Path>| {
        let mut args = vec![
            "validate".to_owned(),
            "--skip-host-checks".into(),
            "--allow-insecure-owner".into(),
            "--main".into(),
            s(&dir.policy()).into(),
        ];
        if let Some(socket) = socket {
            args.extend(["--socket".to_owned(), s(socket).to_owned()]);
        }
        args.push(s(&dropin).into());
        args
    };
    let run = |args: Vec<String>| {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        metalift(&args)
    };
    let out = run(main_args(None));
    assert_eq!(out.status.code(), Some(2), "compiled default: {out:?}");
    let out = run(main_args(Some(&socket)));
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // edit: an edit of the large policy validates within the daemon's limit,
    // installs and goes live.
    let editor = dir.path("append-a-line.sh");
    std::fs::write(&editor, "#!/bin/sh\necho '# edited' >> \"$1\"\n").expect("editor");
    std::fs::set_permissions(&editor, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args([
            "edit",
            "--json",
            "--wait",
            "30",
            "--allow-insecure-owner",
            "--policy",
            s(&dir.policy()),
            "--socket",
            s(&socket),
        ])
        .env("VISUAL", s(&editor))
        .env_remove("EDITOR")
        .env_remove("METALIFT_HOST_CHIP_BRAND")
        .stdin(Stdio::null())
        .output()
        .expect("run metalift edit");
    let edited = json_of(&out);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{edited:#} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(edited["changed"], true, "{edited:#}");
    assert_eq!(edited["daemon"]["state"], "live", "{edited:#}");
    assert_eq!(edited["judgement"]["state"], "healthy", "{edited:#}");
    assert!(std::fs::read_to_string(dir.policy())
        .expect("policy")
        .ends_with("# edited\n"));
}

#[test]
fn given_a_daemon_that_reads_its_chip_then_validate_resolves_host_with_the_daemons_chip() {
    let dir = DaemonDir::new("limits-chip-");
    std::fs::write(
        dir.policy(),
        "version = 1\n[profile.rec]\napple_family_max = \"host\"\n\n[[rule]]\nid = \"tool\"\npath = \"/opt/tool/bin/x\"\nunlock = \"rec\"\n",
    )
    .expect("policy");
    let _daemon = dir.start(&[], &[("METALIFT_HOST_CHIP_BRAND", "Apple M2 (Virtual)")]);
    let policy = dir.policy();
    let validate = |socket: Option<&Path>| {
        let mut args = vec!["validate", "--json", "--allow-insecure-owner"];
        if let Some(socket) = socket {
            args.extend(["--socket", s(socket)]);
        }
        args.push(s(&policy));
        json_of(&metalift(&args))
    };
    // This machine (Linux) cannot read its chip: "host" draws a note here.
    let here = validate(None);
    assert_eq!(here["notes"], 1, "{here:#}");
    assert!(here["daemon"].is_null(), "no daemon asked: {here:#}");
    // The daemon has a chip: "host" is that chip's family, nothing to note.
    let daemons = validate(Some(&dir.socket()));
    assert_eq!(daemons["notes"], 0, "{daemons:#}");
    assert_eq!(daemons["daemon"]["host_chip_brand"], "Apple M2 (Virtual)");
}
