//! `metalift edit` against the real binary with a scripted `$VISUAL`: a good edit
//! is installed (owner, mode, hash); a broken one is discarded and the original
//! stays byte-identical; a killed editor installs nothing; the lock names its
//! holder; drop-ins are validated with the main file; a running daemon is waited for.

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod support;

const ORIGINAL: &str = "version = 1\nmode = \"enforce\"\n\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"llama\"\npath = \"/opt/llama.cpp/bin/llama-server\"\nunlock = \"apple7\"\n";

struct Setup {
    dir: tempfile::TempDir,
}

impl Setup {
    fn new(mode: u32) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let s = Setup { dir };
        fs::write(s.policy(), ORIGINAL).unwrap();
        fs::set_permissions(s.policy(), fs::Permissions::from_mode(mode)).unwrap();
        s
    }

    fn policy(&self) -> PathBuf {
        self.dir.path().join("policy.toml")
    }

    /// An editor script: `body` runs with the file to edit as "$1".
    fn editor(&self, name: &str, body: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn edit_command(&self, visual: &str, extra: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_metalift"));
        cmd.arg("edit")
            .arg("--policy")
            .arg(self.policy())
            .arg("--allow-insecure-owner")
            .args(extra);
        if !extra.contains(&"--socket") {
            cmd.arg("--socket")
                .arg(self.dir.path().join("no-daemon.sock"));
        }
        cmd.env("VISUAL", visual)
            .env_remove("EDITOR")
            .stdin(Stdio::null());
        cmd
    }

    fn edit(&self, visual: &str, extra: &[&str]) -> Output {
        self.edit_command(visual, extra).output().unwrap()
    }

    /// Files in the directory besides the policy, the editor scripts and the lock.
    fn leftovers(&self) -> Vec<String> {
        fs::read_dir(self.dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.') && n != ".policy.toml.lock")
            .collect()
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn validate_hash(policy: &Path) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["validate", "--allow-insecure-owner", "--json"])
        .arg(policy)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    v["policy"]["sha256"].as_str().unwrap().to_owned()
}

const TO_MONITOR: &str = "sed -i 's/mode = \"enforce\"/mode = \"monitor\"/' \"$1\"";

#[test]
fn given_a_good_edit_it_is_installed_secure_and_its_hash_printed() {
    // An insecure original (group/other writable) is fixed by the install.
    let s = Setup::new(0o666);
    let editor = s.editor("ed.sh", TO_MONITOR);
    let out = s.edit(editor.to_str().unwrap(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let installed = fs::read_to_string(s.policy()).unwrap();
    assert!(installed.contains("mode = \"monitor\""), "{installed}");
    let meta = fs::metadata(s.policy()).unwrap();
    assert_eq!(meta.mode() & 0o7777, 0o644);
    if rustix::process::geteuid().is_root() {
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "root:wheel / root:root");
    }
    let stdout = text(&out.stdout);
    let hash = validate_hash(&s.policy());
    assert!(
        stdout.contains(&format!("policy sha256 {hash}")),
        "{stdout}"
    );
    // Said once (the status client's error already begins with it).
    assert_eq!(stdout.matches("no daemon answers").count(), 1, "{stdout}");
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
}

#[test]
fn given_a_secure_original_its_owner_and_mode_are_kept() {
    let s = Setup::new(0o600);
    let before = fs::metadata(s.policy()).unwrap();
    let editor = s.editor("ed.sh", TO_MONITOR);
    let out = s.edit(editor.to_str().unwrap(), &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let after = fs::metadata(s.policy()).unwrap();
    if before.uid() == 0 {
        assert_eq!(after.mode() & 0o7777, 0o600);
        assert_eq!((after.uid(), after.gid()), (before.uid(), before.gid()));
    }
    assert_ne!(
        after.ino(),
        before.ino(),
        "replaced by rename, not rewritten in place"
    );
}

#[test]
fn given_an_invalid_edit_it_is_discarded_and_the_original_is_byte_identical() {
    let s = Setup::new(0o644);
    let editor = s.editor(
        "ed.sh",
        "printf 'version = 1\\n[[rule]]\\nid = \"x\"\\npath = \"/a\"\\nunlock = \"nope\"\\n' > \"$1\"",
    );
    let out = s.edit(editor.to_str().unwrap(), &[]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert_eq!(fs::read(s.policy()).unwrap(), ORIGINAL.as_bytes());
    let stderr = text(&out.stderr);
    let location = format!("{}:5:", s.policy().display());
    assert!(stderr.contains(&location), "{stderr}");
    assert!(stderr.contains("discarded"), "{stderr}");
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());

    let garbage = s.editor("garbage.sh", "printf '[[[ \\377 garbage' > \"$1\"");
    let out = s.edit(garbage.to_str().unwrap(), &["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["ok"].clone(), v["code"].clone()),
        (false.into(), 1.into())
    );
    assert_eq!(fs::read(s.policy()).unwrap(), ORIGINAL.as_bytes());
}

#[test]
fn given_the_editor_is_killed_nothing_is_installed() {
    let s = Setup::new(0o644);
    let editor = s.editor("ed.sh", "printf 'version = 1\\nmo' > \"$1\"; kill -9 $$");
    let out = s.edit(editor.to_str().unwrap(), &[]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("unchanged"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(fs::read(s.policy()).unwrap(), ORIGINAL.as_bytes());
    assert!(s.leftovers().is_empty(), "{:?}", s.leftovers());
}

#[test]
fn given_no_changes_nothing_is_written() {
    let s = Setup::new(0o644);
    let before = fs::metadata(s.policy()).unwrap();
    let editor = s.editor("ed.sh", "exit 0");
    let out = s.edit(editor.to_str().unwrap(), &[]);
    assert_eq!(out.status.code(), Some(0));
    assert!(
        text(&out.stdout).contains("no changes"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(fs::metadata(s.policy()).unwrap().ino(), before.ino());
}

#[test]
fn the_editor_command_is_split_like_a_shell_and_gets_the_file_last() {
    let s = Setup::new(0o644);
    let args = s.dir.path().join("args");
    let editor = s.editor(
        "my editor.sh",
        &format!("printf '%s|' \"$@\" > '{}'", args.display()),
    );
    let visual = format!("'{}' --wait", editor.display());
    let out = s.edit(&visual, &[]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let seen = fs::read_to_string(&args).unwrap();
    assert!(seen.starts_with("--wait|"), "{seen}");
    assert!(
        seen.contains(".policy.edit-"),
        "the scratch copy beside the policy: {seen}"
    );
}

#[test]
fn a_second_editor_is_told_who_holds_the_lock() {
    let s = Setup::new(0o644);
    let slow = s.editor("slow.sh", "sleep 5");
    let mut first: Child = s
        .edit_command(slow.to_str().unwrap(), &[])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let lock = s.dir.path().join(".policy.toml.lock");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !fs::read_to_string(&lock)
        .unwrap_or_default()
        .contains("pid")
    {
        assert!(
            Instant::now() < deadline,
            "the first edit never took the lock"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let noop = s.editor("noop.sh", "exit 0");
    let out = s.edit(noop.to_str().unwrap(), &[]);
    let _ = first.kill();
    let _ = first.wait();
    assert_eq!(out.status.code(), Some(2));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("being edited by pid {}", first.id())),
        "{stderr}"
    );
}

#[test]
fn a_dropin_is_validated_with_the_main_policy() {
    let s = Setup::new(0o644);
    // The profile is defined in the main file: a drop-in may use it.
    let good = s.editor(
        "good.sh",
        "printf '[[rule]]\\nid = \"whisper\"\\npath = \"/opt/whisper\"\\nunlock = \"apple7\"\\n' > \"$1\"",
    );
    let out = s.edit(good.to_str().unwrap(), &["--dropin", "20-whisper"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let dropin = s.dir.path().join("policy.d/20-whisper.toml");
    assert!(fs::read_to_string(&dropin).unwrap().contains("whisper"));
    // An id used by the main file is refused, with the drop-in's location.
    let clash = s.editor(
        "clash.sh",
        "printf '[[rule]]\\nid = \"llama\"\\nname = \"x\"\\nstock = true\\n' > \"$1\"",
    );
    let out = s.edit(clash.to_str().unwrap(), &["--dropin", "30-clash.toml"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(!s.dir.path().join("policy.d/30-clash.toml").exists());
    assert!(
        text(&out.stderr).contains("30-clash.toml:2:"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn with_a_daemon_the_edit_waits_until_the_new_hash_is_live() {
    let s = Setup::new(0o644);
    let socket = s.dir.path().join("d.sock");
    let mut cmd = Command::new(support::workspace_binary("metaliftd"));
    cmd.arg("--policy")
        .arg(s.policy())
        .arg("--socket")
        .arg(&socket)
        .arg("--audit-log")
        .arg(s.dir.path().join("audit.jsonl"))
        .arg("--allow-insecure-owner")
        .stderr(Stdio::null());
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    // Ready once it answers (the scratch daemon's spawn).
    let _daemon = support::Daemon::spawn(cmd, socket.clone());
    let editor = s.editor("ed.sh", TO_MONITOR);
    let out = s
        .edit_command(editor.to_str().unwrap(), &["--json", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["daemon"]["state"], "live", "{v}");
    let status = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["status", "--json", "--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    let live: Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(live["policy_sha256"], v["sha256"]);
}

#[test]
fn at_a_terminal_an_invalid_edit_can_be_edited_again() {
    let s = Setup::new(0o644);
    // First run: break it; second run: a good edit.
    let count = s.dir.path().join("count");
    let editor = s.editor(
        "ed.sh",
        &format!(
            "if [ -e '{c}' ]; then sed -i 's/mode = .*/mode = \"monitor\"/' \"$1\"; \
             else touch '{c}'; sed -i 's/mode = .*/mode = \"loud\"/' \"$1\"; fi",
            c = count.display()
        ),
    );
    let cmd = format!(
        "VISUAL='{}' {} edit --policy '{}' --allow-insecure-owner --socket '{}'",
        editor.display(),
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
        std::thread::sleep(Duration::from_secs(3));
    }
    let out = script.wait_with_output().unwrap();
    let shown = text(&out.stdout);
    assert!(
        shown.contains("What now? [e]dit again, [d]iscard"),
        "{shown}"
    );
    assert!(
        fs::read_to_string(s.policy())
            .unwrap()
            .contains("mode = \"monitor\""),
        "{shown}"
    );
}

#[test]
fn when_the_daemon_refuses_the_new_policy_edit_says_so_and_exits_3() {
    let s = Setup::new(0o644);
    let socket = s.dir.path().join("strict.sock");
    // A strict daemon (no development override): as root it accepts the policy.
    let mut cmd = Command::new(support::workspace_binary("metaliftd"));
    cmd.arg("--policy")
        .arg(s.policy())
        .arg("--socket")
        .arg(&socket)
        .arg("--audit-log")
        .arg(s.dir.path().join("audit.jsonl"))
        .stderr(Stdio::null());
    cmd.stdin(Stdio::null()).stdout(Stdio::null());
    // Ready once it answers (the scratch daemon's spawn).
    let _daemon = support::Daemon::spawn(cmd, socket.clone());
    // Then policy.d/ becomes writable by everyone: the daemon will refuse the next
    // load, which edit (with its development override) does not.
    let dropins = s.dir.path().join("policy.d");
    fs::create_dir(&dropins).unwrap();
    fs::set_permissions(&dropins, fs::Permissions::from_mode(0o777)).unwrap();
    let editor = s.editor("ed.sh", TO_MONITOR);
    let out = s
        .edit_command(editor.to_str().unwrap(), &["--socket"])
        .arg(&socket)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    assert!(stdout.contains("installed"), "{stdout}");
    if rustix::process::geteuid().is_root() {
        assert!(stdout.contains("metaliftd refused it"), "{stdout}");
        assert!(stdout.contains("policy.d"), "the daemon's reason: {stdout}");
    }
}

#[test]
fn a_user_who_may_not_write_the_policy_is_told_to_use_sudo() {
    let s = Setup::new(0o644);
    let editor = s.editor("ed.sh", TO_MONITOR);
    // Nobody but root may write the directory (so the lock cannot be created).
    fs::set_permissions(s.dir.path(), fs::Permissions::from_mode(0o555)).unwrap();
    // Root may write anything: then the edit runs as nobody.
    let mut cmd = if rustix::process::geteuid().is_root() {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(env!("CARGO_BIN_EXE_metalift"));
        c
    } else {
        Command::new(env!("CARGO_BIN_EXE_metalift"))
    };
    let out = cmd
        .arg("edit")
        .arg("--policy")
        .arg(s.policy())
        .env("VISUAL", &editor)
        .stdin(Stdio::null())
        .output()
        .expect("setpriv (util-linux) runs");
    fs::set_permissions(s.dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("run with sudo"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(fs::read(s.policy()).unwrap(), ORIGINAL.as_bytes());
}

#[test]
fn a_new_dropin_left_as_its_template_is_not_created() {
    let s = Setup::new(0o644);
    let noop = s.editor("noop.sh", "exit 0");
    let out = s.edit(noop.to_str().unwrap(), &["--dropin", "40-new"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("not created"),
        "{}",
        text(&out.stdout)
    );
    assert!(!s.dir.path().join("policy.d/40-new.toml").exists());
}
