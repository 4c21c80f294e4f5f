//! `metalift edit` never overwrites a change it did not see (issue 20): the
//! scripted `$VISUAL` makes the admin's change in the copy *and*, while the copy is
//! open, changes the real file the way a configuration tool would (replaces it,
//! writes it in place, deletes it, creates it, makes it a symlink). Then nothing is
//! installed, the tool's change is intact, the admin's copy is kept beside the
//! policy (its path printed with a `diff -u` to run), and the exit status is 5.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use serde_json::Value;

const ORIGINAL: &str = "version = 1\nmode = \"enforce\"\n\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"llama\"\npath = \"/opt/llama.cpp/bin/llama-server\"\nunlock = \"apple7\"\n";

/// What the configuration tool writes (valid for a main file and a drop-in).
const THEIRS: &str = "# written by the fleet tool\n";

/// The admin's change, made in the copy the editor was given ("$1").
const ADMIN: &str = "printf '\\n# the admin was here\\n' >> \"$1\"";

/// How the tool changes the real file ("$REAL") while the editor is open.
#[derive(Debug, Clone, Copy)]
enum Change {
    /// A new file renamed over it (an atomic save).
    Replace,
    /// The same file written in place (same inode).
    InPlace,
    /// Removed.
    Delete,
    /// Created where there was no file when the edit began.
    Create,
    /// Replaced by a symlink to another file.
    Symlink,
}

impl Change {
    fn script(self) -> &'static str {
        match self {
            Change::Replace => "printf '%s' \"$THEIRS\" > \"$REAL.tool\" && mv \"$REAL.tool\" \"$REAL\"",
            Change::InPlace | Change::Create => "printf '%s' \"$THEIRS\" > \"$REAL\"",
            Change::Delete => "rm \"$REAL\"",
            Change::Symlink => {
                "printf '%s' \"$THEIRS\" > \"$REAL.elsewhere\" && ln -s \"$REAL.elsewhere\" \"$REAL.tool\" && mv \"$REAL.tool\" \"$REAL\""
            }
        }
    }
}

/// Which file is edited.
#[derive(Debug, Clone, Copy)]
enum Target {
    Main,
    Dropin,
}

struct Setup {
    dir: tempfile::TempDir,
    target: Target,
}

impl Setup {
    /// A policy directory where the edited file exists unless `change` is `Create`.
    fn new(target: Target, change: Change) -> Setup {
        let s = Setup {
            dir: tempfile::tempdir().unwrap(),
            target,
        };
        let exists = !matches!(change, Change::Create);
        if exists || matches!(target, Target::Dropin) {
            fs::write(s.policy(), ORIGINAL).unwrap();
        }
        if let Target::Dropin = target {
            fs::create_dir(s.dir.path().join("policy.d")).unwrap();
            if exists {
                fs::write(s.real(), "# 20-tool: managed\n").unwrap();
            }
        }
        s
    }

    fn policy(&self) -> PathBuf {
        self.dir.path().join("policy.toml")
    }

    /// The file being edited.
    fn real(&self) -> PathBuf {
        match self.target {
            Target::Main => self.policy(),
            Target::Dropin => self.dir.path().join("policy.d/20-tool.toml"),
        }
    }

    /// Runs `metalift edit` with an editor script whose body is `body`.
    fn edit(&self, body: &str, extra: &[&str]) -> Output {
        let editor = self.dir.path().join("ed.sh");
        fs::write(&editor, format!("#!/bin/sh\nset -e\n{body}\n")).unwrap();
        fs::set_permissions(&editor, fs::Permissions::from_mode(0o755)).unwrap();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_metalift"));
        cmd.arg("edit")
            .arg("--policy")
            .arg(self.policy())
            .arg("--allow-insecure-owner")
            .arg("--socket")
            .arg(self.dir.path().join("no-daemon.sock"))
            .args(extra);
        if let Target::Dropin = self.target {
            cmd.args(["--dropin", "20-tool"]);
        }
        cmd.env("VISUAL", &editor)
            .env_remove("EDITOR")
            .env("REAL", self.real())
            .env("THEIRS", THEIRS)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    }

    /// The copies kept beside the edited file.
    fn kept(&self) -> Vec<PathBuf> {
        let dir = self.real().parent().unwrap().to_owned();
        let name = self
            .real()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| {
                p.file_name()
                    .unwrap()
                    .to_string_lossy()
                    .starts_with(&format!("{name}.kept-"))
            })
            .collect()
    }

    /// Scratch and half-installed files (dot files other than the lock).
    fn leftovers(&self) -> Vec<String> {
        let mut names = Vec::new();
        for dir in [self.dir.path().to_owned(), self.dir.path().join("policy.d")] {
            let Ok(entries) = fs::read_dir(dir) else {
                continue;
            };
            names.extend(
                entries
                    .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                    .filter(|n| n.starts_with('.') && n != ".policy.toml.lock"),
            );
        }
        names
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs one case and checks everything the issue asks for.
fn given_a_change_during_the_edit_nothing_is_installed(target: Target, change: Change) {
    let s = Setup::new(target, change);
    let out = s.edit(&format!("{ADMIN}\n{}", change.script()), &[]);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(5),
        "{target:?} {change:?}: {stderr}"
    );
    // The tool's change is intact.
    match change {
        Change::Delete => assert!(
            fs::symlink_metadata(s.real()).is_err(),
            "the deleted file came back"
        ),
        Change::Symlink => {
            assert!(fs::symlink_metadata(s.real())
                .unwrap()
                .file_type()
                .is_symlink());
            assert_eq!(fs::read_to_string(s.real()).unwrap(), THEIRS);
        }
        _ => assert_eq!(fs::read_to_string(s.real()).unwrap(), THEIRS, "{stderr}"),
    }
    // The admin's copy is kept, its path printed with how to compare and retry.
    let kept = s.kept();
    assert_eq!(kept.len(), 1, "{kept:?} {stderr}");
    let mine = fs::read_to_string(&kept[0]).unwrap();
    assert!(mine.contains("# the admin was here"), "{mine}");
    assert!(stderr.contains("changed during the edit"), "{stderr}");
    assert!(stderr.contains("nothing installed"), "{stderr}");
    // A deleted file compares as empty.
    let theirs = match change {
        Change::Delete => PathBuf::from("/dev/null"),
        _ => s.real(),
    };
    assert!(
        stderr.contains(&format!(
            "diff -u {} {}",
            theirs.display(),
            kept[0].display()
        )),
        "{stderr}"
    );
    assert!(stderr.contains("metalift edit"), "how to retry: {stderr}");
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
    if matches!(target, Target::Dropin) && !matches!(change, Change::Delete) {
        // The main file was not touched either.
        assert_eq!(fs::read_to_string(s.policy()).unwrap(), ORIGINAL);
    }
}

#[test]
fn given_the_policy_is_replaced_during_the_edit_then_nothing_is_installed_and_exit_5() {
    given_a_change_during_the_edit_nothing_is_installed(Target::Main, Change::Replace);
}

#[test]
fn given_the_policy_is_written_in_place_during_the_edit_then_nothing_is_installed_and_exit_5() {
    given_a_change_during_the_edit_nothing_is_installed(Target::Main, Change::InPlace);
}

#[test]
fn given_the_policy_is_deleted_during_the_edit_then_it_stays_deleted_and_exit_5() {
    given_a_change_during_the_edit_nothing_is_installed(Target::Main, Change::Delete);
}

#[test]
fn given_a_new_policy_is_created_by_someone_else_during_the_edit_then_theirs_stays_and_exit_5() {
    given_a_change_during_the_edit_nothing_is_installed(Target::Main, Change::Create);
}

#[test]
fn given_the_policy_becomes_a_symlink_during_the_edit_then_the_symlink_stays_and_exit_5() {
    given_a_change_during_the_edit_nothing_is_installed(Target::Main, Change::Symlink);
}

#[test]
fn given_a_dropin_is_replaced_during_the_edit_then_nothing_is_installed_and_exit_5() {
    given_a_change_during_the_edit_nothing_is_installed(Target::Dropin, Change::Replace);
}

#[test]
fn given_a_dropin_is_written_in_place_during_the_edit_then_nothing_is_installed_and_exit_5() {
    given_a_change_during_the_edit_nothing_is_installed(Target::Dropin, Change::InPlace);
}

#[test]
fn given_a_dropin_is_deleted_during_the_edit_then_it_stays_deleted_and_exit_5() {
    given_a_change_during_the_edit_nothing_is_installed(Target::Dropin, Change::Delete);
}

#[test]
fn given_a_new_dropin_is_created_by_someone_else_during_the_edit_then_theirs_stays_and_exit_5() {
    given_a_change_during_the_edit_nothing_is_installed(Target::Dropin, Change::Create);
}

#[test]
fn given_a_dropin_becomes_a_symlink_during_the_edit_then_the_symlink_stays_and_exit_5() {
    given_a_change_during_the_edit_nothing_is_installed(Target::Dropin, Change::Symlink);
}

#[test]
fn given_a_change_during_the_edit_the_json_result_names_the_kept_copy_and_code_5() {
    let s = Setup::new(Target::Main, Change::Replace);
    let out = s.edit(
        &format!("{ADMIN}\n{}", Change::Replace.script()),
        &["--json"],
    );
    assert_eq!(out.status.code(), Some(5), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false, "{v}");
    assert_eq!(v["code"], 5, "{v}");
    let kept = s.kept();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(v["kept"], kept[0].display().to_string(), "{v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("changed during the edit"),
        "{v}"
    );
    assert_eq!(fs::read_to_string(s.real()).unwrap(), THEIRS);
}

/// The change is seen before the edit is validated: an invalid edit of a file
/// that changed is kept too (it was not "discarded": it was never checked against
/// the file it would replace).
#[test]
fn given_a_change_during_an_invalid_edit_the_copy_is_kept_not_discarded() {
    let s = Setup::new(Target::Main, Change::Replace);
    let broken = "printf 'mode = \"loud\"\n' >> \"$1\"";
    let out = s.edit(&format!("{broken}\n{}", Change::Replace.script()), &[]);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(5), "{stderr}");
    assert!(!stderr.contains("discarded"), "{stderr}");
    let kept = s.kept();
    assert_eq!(kept.len(), 1, "{kept:?} {stderr}");
    assert!(fs::read_to_string(&kept[0]).unwrap().contains("loud"));
    assert_eq!(fs::read_to_string(s.real()).unwrap(), THEIRS);
}

/// At a terminal the admin may edit the new file instead: their change is the
/// base, the first copy stays kept, and the second edit is installed on top.
#[test]
fn at_a_terminal_after_a_change_the_new_file_can_be_edited_instead() {
    let s = Setup::new(Target::Main, Change::Replace);
    // This time the tool's file is a valid main policy: the second edit is installed.
    let theirs = "version = 1\nmode = \"monitor\"\n";
    let count = s.dir.path().join("count");
    let editor = s.dir.path().join("ed.sh");
    fs::write(
        &editor,
        format!(
            "#!/bin/sh\nset -e\n{ADMIN}\nif [ ! -e '{c}' ]; then touch '{c}'; {}; fi\n",
            Change::Replace.script(),
            c = count.display()
        ),
    )
    .unwrap();
    fs::set_permissions(&editor, fs::Permissions::from_mode(0o755)).unwrap();
    let cmd = format!(
        "VISUAL='{}' REAL='{}' THEIRS='{theirs}' {} edit --policy '{}' --allow-insecure-owner --socket '{}'",
        editor.display(),
        s.real().display(),
        env!("CARGO_BIN_EXE_metalift"),
        s.policy().display(),
        s.dir.path().join("none.sock").display()
    );
    let mut script = Command::new("script")
        .args(["-qec", &cmd, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("script (util-linux) runs");
    {
        use std::io::Write;
        let mut stdin = script.stdin.take().unwrap();
        stdin.write_all(b"e\n").unwrap();
        // Keep the terminal open until the edit is done.
        std::thread::sleep(std::time::Duration::from_secs(3));
    }
    let out = script.wait_with_output().unwrap();
    let shown = text(&out.stdout);
    assert!(shown.contains("changed during the edit"), "{shown}");
    assert!(shown.contains("What now? [e]dit the new file"), "{shown}");
    assert_eq!(out.status.code(), Some(0), "{shown}");
    assert_eq!(
        fs::read_to_string(s.real()).unwrap(),
        format!("{theirs}\n# the admin was here\n"),
        "{shown}"
    );
    let kept = s.kept();
    assert_eq!(kept.len(), 1, "{kept:?}");
    assert_eq!(
        fs::read_to_string(&kept[0]).unwrap(),
        format!("{ORIGINAL}\n# the admin was here\n")
    );
}

/// The control: the same editor without the tool's change installs as before, so
/// the cases above fail for the change and not for the editor script.
#[test]
fn given_no_other_change_the_same_edit_is_installed() {
    for target in [Target::Main, Target::Dropin] {
        let s = Setup::new(target, Change::Replace);
        let out = s.edit(ADMIN, &[]);
        assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
        assert!(fs::read_to_string(s.real())
            .unwrap()
            .contains("# the admin was here"));
        assert!(s.kept().is_empty());
        assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
    }
}

/// A policy that is a symlink when the edit starts and stays one: the install
/// swaps the new file in for the link (the link is replaced by a file, as
/// before this check existed), and the file it pointed to is untouched.
#[test]
fn given_the_policy_was_a_symlink_and_stays_one_the_edit_is_installed() {
    let s = Setup::new(Target::Main, Change::Replace);
    let elsewhere = s.dir.path().join("managed.toml");
    fs::rename(s.policy(), &elsewhere).unwrap();
    std::os::unix::fs::symlink("managed.toml", s.policy()).unwrap();
    let out = s.edit(ADMIN, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(!fs::symlink_metadata(s.policy())
        .unwrap()
        .file_type()
        .is_symlink());
    assert_eq!(
        fs::read_to_string(s.policy()).unwrap(),
        format!("{ORIGINAL}\n# the admin was here\n")
    );
    assert_eq!(fs::read_to_string(&elsewhere).unwrap(), ORIGINAL);
    assert!(s.kept().is_empty());
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
}
