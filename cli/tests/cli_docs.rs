//! The man pages, shell completions and the guide's generated reference pages:
//! the committed copies are what the CLI generates now, the hand-written
//! metalift-policy(5) names every policy key, and `metalift completions` prints
//! each shell's script; every page has a full `.TH` line with the fixed date
//! and `mandoc -T lint` finds nothing at warning level or above.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn metalift(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .output()
        .unwrap()
}

fn files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn the_committed_man_pages_and_completions_are_up_to_date() {
    let tmp = tempfile::tempdir().unwrap();
    let out = metalift(&["__generate-docs", tmp.path().to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for sub in ["man", "completions"] {
        let fresh = tmp.path().join(sub);
        let committed = repo().join(sub);
        let mut expected = files(&fresh);
        if sub == "man" {
            expected.push("metalift-policy.5".into());
            expected.sort();
        }
        assert_eq!(files(&committed), expected, "{sub}/: files differ");
        for name in files(&fresh) {
            assert_eq!(
                std::fs::read_to_string(committed.join(&name)).unwrap(),
                std::fs::read_to_string(fresh.join(&name)).unwrap(),
                "{sub}/{name} is stale: run `metalift __generate-docs .` at the repository root"
            );
        }
    }
    for page in ["exit-codes.md", "cli.md"] {
        let name = format!("docs/src/reference/{page}");
        assert_eq!(
            std::fs::read_to_string(repo().join(&name)).unwrap_or_default(),
            std::fs::read_to_string(tmp.path().join(&name)).unwrap(),
            "{name} is stale: run `metalift __generate-docs .` at the repository root"
        );
    }
}

#[test]
fn there_is_a_page_per_subcommand_and_one_for_the_daemon() {
    let man = repo().join("man");
    for page in [
        "metalift.1",
        "metalift-audit.1",
        "metalift-doctor.1",
        "metalift-edit.1",
        "metalift-exec.1",
        "metalift-validate.1",
        "metaliftd.8",
        "metalift-policy.5",
    ] {
        assert!(man.join(page).exists(), "{page} missing");
    }
    let top = std::fs::read_to_string(man.join("metalift.1")).unwrap();
    assert!(
        top.contains("Exit status"),
        "metalift(1) documents exit codes"
    );
    let daemon = std::fs::read_to_string(man.join("metaliftd.8")).unwrap();
    assert!(daemon.contains(".TH METALIFTD 8 "), "{}", &daemon[..200]);
    assert!(daemon.contains("Exit status") && daemon.contains("NO_COLOR"));
}

#[test]
fn the_policy_page_names_every_key_the_schema_has() {
    let page = std::fs::read_to_string(repo().join("man/metalift-policy.5")).unwrap();
    let schema: serde_json::Value = serde_json::from_slice(&metalift(&["schema"]).stdout).unwrap();
    let mut keys: Vec<String> = Vec::new();
    for props in [
        &schema["properties"],
        &schema["definitions"]["profile"]["properties"],
        &schema["definitions"]["rule"]["properties"],
    ] {
        keys.extend(props.as_object().unwrap().keys().cloned());
    }
    assert!(keys.len() > 15, "{keys:?}");
    for key in keys {
        let bold = format!(".B {key}\n");
        let in_text = format!("[{key}");
        assert!(
            page.contains(&bold)
                || page.contains(&in_text)
                || page.contains(&format!(".BI [{key}")),
            "metalift-policy(5) does not document `{key}`"
        );
    }
}

#[test]
fn completions_are_printed_for_bash_zsh_and_fish() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef metalift"),
        ("fish", "complete -c metalift"),
    ] {
        let out = metalift(&["completions", shell]);
        assert!(out.status.success());
        let script = String::from_utf8_lossy(&out.stdout);
        assert!(script.contains(marker), "{shell}: {marker} missing");
        assert!(
            script.contains("doctor") && script.contains("require-unlock"),
            "{shell}"
        );
    }
}

/// The arguments of a `.TH` line: words, or "quoted strings" (no escapes in ours).
fn th_args(line: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut rest = line.trim_start_matches(".TH").trim();
    while !rest.is_empty() {
        if let Some(quoted) = rest.strip_prefix('"') {
            let end = quoted.find('"').expect("a closed quote in .TH");
            args.push(quoted[..end].to_owned());
            rest = quoted[end + 1..].trim_start();
        } else {
            let end = rest.find(' ').unwrap_or(rest.len());
            args.push(rest[..end].to_owned());
            rest = rest[end..].trim_start();
        }
    }
    args
}

#[test]
fn every_page_has_title_section_fixed_date_source_and_manual() {
    let man = repo().join("man");
    let source = format!("metalift {}", env!("CARGO_PKG_VERSION"));
    for name in files(&man) {
        let text = std::fs::read_to_string(man.join(&name)).unwrap();
        let th = text
            .lines()
            .find(|l| l.starts_with(".TH "))
            .unwrap_or_else(|| panic!("{name}: no .TH line"));
        let (stem, section) = name.rsplit_once('.').unwrap();
        let args = th_args(th);
        assert_eq!(
            args,
            [
                stem.to_uppercase(),
                section.to_owned(),
                metalift_cli::docs::MAN_DATE.to_owned(),
                source.clone(),
                args.get(4).cloned().unwrap_or_default(),
            ],
            "{name}: {th}"
        );
        assert!(args[4].ends_with("Manual"), "{name}: no manual name: {th}");
    }
}

#[test]
fn the_daemon_page_name_line_says_metaliftd_once() {
    let page = std::fs::read_to_string(repo().join("man/metaliftd.8")).unwrap();
    let name_line = page
        .lines()
        .skip_while(|l| *l != ".SH NAME")
        .nth(1)
        .expect("a NAME section");
    assert!(name_line.starts_with("metaliftd \\- "), "{name_line}");
    assert_eq!(name_line.matches("metaliftd").count(), 1, "{name_line}");
}

/// `mandoc -T lint -W warning`: Debian's mandoc (scripts/setup.sh installs it).
/// STYLE notes (lines longer than 80 bytes in clap's help text) are below the
/// warning level and not counted.
#[test]
fn mandoc_lint_reports_no_warning_on_any_page() {
    let man = repo().join("man");
    let pages: Vec<PathBuf> = files(&man).iter().map(|n| man.join(n)).collect();
    let out = Command::new("mandoc")
        .args(["-T", "lint", "-W", "warning"])
        .args(&pages)
        .output()
        .unwrap_or_else(|e| panic!("cannot run mandoc ({e}): install it (scripts/setup.sh)"));
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.trim().is_empty(),
        "mandoc -T lint:\n{report}"
    );
}

/// Issue 43: `reference/cli.md` has a section for every command that has a man
/// page, nested ones too (`metalift audit flush` had a page and no section).
#[test]
fn the_cli_reference_has_a_section_for_every_command_with_a_man_page() {
    let page = std::fs::read_to_string(repo().join("docs/src/reference/cli.md")).unwrap();
    let mut seen = 0;
    for name in files(&repo().join("man")) {
        let Some(stem) = name.strip_suffix(".1") else {
            continue;
        };
        if stem == "metalift" {
            continue;
        }
        let command = stem.replace('-', " ");
        assert!(
            page.contains(&format!("\n## {command}\n")),
            "docs/src/reference/cli.md has no section `## {command}` (man/{name} exists)"
        );
        seen += 1;
    }
    assert!(seen >= 10, "only {seen} command pages in man/");
}
