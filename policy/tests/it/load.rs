//! Loading from disk: merge order of policy.d/, ownership checks, missing and unreadable files.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use metalift_policy::{load, LoadError, LoadOptions};

use crate::{at, HEADER};

const DEV: LoadOptions = LoadOptions {
    allow_insecure_owner: true,
};

fn write(path: &Path, text: &str) {
    if let Some(dir) = path.parent() {
        fs::create_dir_all(dir).expect("create dir");
    }
    fs::write(path, text).expect("write file");
    fs::set_permissions(path, fs::Permissions::from_mode(0o644)).expect("chmod");
}

/// A temp dir holding `policy.toml` with `main`, and `policy.d/NAME` for each drop-in.
fn tree(main: &str, drop_ins: &[(&str, &str)]) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let main_path = dir.path().join("policy.toml");
    write(&main_path, main);
    for (name, text) in drop_ins {
        write(&dir.path().join("policy.d").join(name), text);
    }
    // tempdir() makes 0700 dirs; policy.d must not be group/other writable either.
    let d = dir.path().join("policy.d");
    if d.exists() {
        fs::set_permissions(&d, fs::Permissions::from_mode(0o755)).expect("chmod dir");
    }
    (dir, main_path)
}

fn rule(id: &str, name: &str) -> String {
    format!("[[rule]]\nid = \"{id}\"\nname = \"{name}\"\nunlock = \"apple7\"\n")
}

#[test]
fn policy_d_files_merge_in_file_name_order_after_the_main_file() {
    let (_dir, main) = tree(
        HEADER,
        &[
            ("20-second.toml", &rule("second", "tool")),
            ("10-first.toml", &rule("first", "tool")),
            ("30-third.toml", &rule("third", "other")),
        ],
    );
    let loaded = load(&main, &DEV).expect("valid");
    let names: Vec<&str> = loaded.sources.iter().map(|s| s.name.as_str()).collect();
    assert!(names[0].ends_with("/policy.toml"));
    assert!(names[1].ends_with("policy.d/10-first.toml"));
    assert!(names[2].ends_with("policy.d/20-second.toml"));
    assert!(names[3].ends_with("policy.d/30-third.toml"));
    assert_eq!(loaded.policy.rule_count(), 3);
    // Same specificity, both unlock: the earlier file (10-first) wins.
    assert_eq!(
        loaded
            .policy
            .evaluate(&at("/bin/tool"), std::time::SystemTime::now())
            .rule
            .as_deref(),
        Some("first")
    );
}

#[test]
fn only_visible_toml_regular_files_in_policy_d_are_read() {
    let (dir, main) = tree(
        HEADER,
        &[
            ("a.toml", &rule("a", "a")),
            ("b.toml.bak", "garbage ["),
            (".c.toml", "garbage ["),
            ("README", "garbage ["),
        ],
    );
    fs::create_dir(dir.path().join("policy.d/sub.toml")).expect("mkdir");
    let loaded = load(&main, &DEV).expect("only a.toml is read");
    assert_eq!(loaded.sources.len(), 2);
}

#[test]
fn a_missing_main_file_is_not_found_and_a_missing_policy_d_is_fine() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("policy.toml");
    assert!(matches!(load(&path, &DEV), Err(LoadError::NotFound { path: p }) if p == path));
    write(&path, HEADER);
    assert!(load(&path, &DEV).is_ok());
}

#[test]
fn errors_in_a_drop_in_are_located_in_that_file() {
    let (_dir, main) = tree(
        HEADER,
        &[(
            "10-x.toml",
            "\n[[rule]]\nid = \"x\"\nname = \"x\"\nunlock = \"nope\"\n",
        )],
    );
    match load(&main, &DEV) {
        Err(LoadError::Invalid {
            diagnostics,
            sources,
        }) => {
            assert_eq!(diagnostics.len(), 1);
            assert!(diagnostics[0].file.ends_with("policy.d/10-x.toml"));
            assert_eq!((diagnostics[0].line, diagnostics[0].col), (5, 10));
            assert!(diagnostics[0]
                .render(&sources)
                .ends_with("unlock = \"nope\"\n         ^~~~~~"));
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_file_that_is_not_utf8_is_invalid_with_its_location() {
    let (_dir, main) = tree(HEADER, &[]);
    fs::write(&main, b"version = 1\n# caf\xe9\n").expect("write");
    match load(&main, &DEV) {
        Err(LoadError::Invalid { diagnostics, .. }) => {
            assert_eq!((diagnostics[0].line, diagnostics[0].col), (2, 6));
            assert!(diagnostics[0].message.contains("UTF-8"));
        }
        other => panic!("{other:?}"),
    }
}

fn is_root() -> bool {
    let dir = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::MetadataExt::uid(&fs::metadata(dir.path()).expect("stat")) == 0
}

#[test]
fn a_group_or_world_writable_file_is_refused_unless_overridden() {
    let (_dir, main) = tree(HEADER, &[]);
    fs::set_permissions(&main, fs::Permissions::from_mode(0o664)).expect("chmod");
    if is_root() {
        match load(&main, &LoadOptions::default()) {
            Err(LoadError::Permission { path, reason }) => {
                assert_eq!(path, main);
                assert_eq!(reason, "writable by group or other (mode 0664)");
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(load(&main, &DEV).is_ok());
}

#[test]
fn a_writable_policy_d_or_drop_in_is_refused() {
    if !is_root() {
        return;
    }
    let (dir, main) = tree(HEADER, &[("a.toml", &rule("a", "a"))]);
    assert!(load(&main, &LoadOptions::default()).is_ok());
    let drop_in = dir.path().join("policy.d/a.toml");
    fs::set_permissions(&drop_in, fs::Permissions::from_mode(0o646)).expect("chmod");
    assert!(
        matches!(load(&main, &LoadOptions::default()), Err(LoadError::Permission { path, .. }) if path == drop_in)
    );
    fs::set_permissions(&drop_in, fs::Permissions::from_mode(0o644)).expect("chmod");
    let d = dir.path().join("policy.d");
    fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).expect("chmod");
    assert!(
        matches!(load(&main, &LoadOptions::default()), Err(LoadError::Permission { path, .. }) if path == d)
    );
}

#[test]
fn a_file_not_owned_by_root_is_refused_unless_overridden() {
    let (_dir, main) = tree(HEADER, &[]);
    // As root, hand the file to uid 1000; as anyone else, the file is already not root's.
    if is_root() {
        std::os::unix::fs::chown(&main, Some(1000), Some(1000)).expect("chown");
    }
    let err = load(&main, &LoadOptions::default()).expect_err("refused");
    let uid = std::os::unix::fs::MetadataExt::uid(&fs::metadata(&main).expect("stat"));
    assert_eq!(
        err.to_string(),
        format!(
            "{p}: refused: owned by uid {uid}, not root: metaliftd accepts only files owned by root and not writable by group or other (fix: `sudo chown root {p} && sudo chmod go-w {p}`; for development only, metaliftd --allow-insecure-owner)",
            p = main.display()
        )
    );
    // The message names the override, never an unnamed "development override".
    assert!(err.to_string().contains("--allow-insecure-owner"));
    assert!(load(&main, &DEV).is_ok());
}

#[test]
fn an_unreadable_policy_d_entry_is_an_io_error() {
    let (dir, main) = tree(HEADER, &[]);
    fs::create_dir_all(dir.path().join("policy.d")).expect("mkdir");
    fs::set_permissions(
        dir.path().join("policy.d"),
        fs::Permissions::from_mode(0o755),
    )
    .expect("chmod");
    std::os::unix::fs::symlink(
        "/nonexistent/target",
        dir.path().join("policy.d/dangling.toml"),
    )
    .expect("symlink");
    assert!(matches!(load(&main, &DEV), Err(LoadError::Io { .. })));
}

#[test]
fn given_a_policy_over_the_limit_with_its_drop_ins_then_it_is_refused_unread_and_at_the_limit_it_loads(
) {
    let main = format!("{HEADER}{}", rule("a", "a"));
    let drop_in = rule("b", "b");
    let (_dir, path) = tree(&main, &[("10-b.toml", &drop_in)]);
    let total = (main.len() + drop_in.len()) as u64;
    let compile = metalift_policy::CompileOptions::default();

    let loaded = metalift_policy::load_within(&path, &DEV, &compile, total).expect("at the limit");
    assert_eq!(loaded.policy.rule_count(), 2);

    match metalift_policy::load_within(&path, &DEV, &compile, total - 1) {
        Err(LoadError::TooLarge { bytes, limit, .. }) => {
            assert_eq!((bytes, limit), (total, total - 1));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    // Each file alone is under the limit: it is the whole policy that counts.
    assert!((main.len() as u64) < total - 1 && (drop_in.len() as u64) < total - 1);
}
