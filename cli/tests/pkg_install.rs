//! The install path, checked on any OS: the launchd plists, the staged .pkg
//! payload, and preinstall/postinstall/uninstall.sh run against a temporary
//! root with stub `launchctl`, `stat`, `chown` and `pkgutil` recording calls.
//!
//! Needs the workspace built first (`metalift-probe` and libmetalift come from
//! other crates): `scripts/test.sh` does that.

use std::collections::BTreeMap;
use std::fs;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use plist::Value;

#[path = "pkg_install/agent_launcher.rs"]
mod agent_launcher;
#[path = "pkg_install/shared_places.rs"]
mod shared_places;
#[path = "pkg_install/uninstall_refusal.rs"]
mod uninstall_refusal;
#[path = "pkg_install/well_formed.rs"]
mod well_formed;

mod support;

const LABEL: &str = "com.metalift.metaliftd";
const POLICY_SERVICE: &str = "com.metalift.policy";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("cli/ sits in the workspace root")
        .to_path_buf()
}

/// cargo's output directory, where every workspace binary and libmetalift are.
fn bin_dir() -> PathBuf {
    let dir = Path::new(env!("CARGO_BIN_EXE_metalift"))
        .parent()
        .expect("binary has a directory")
        .to_path_buf();
    for needed in ["metalift-probe", shim_file()] {
        assert!(
            dir.join(needed).exists(),
            "{} is missing: build the workspace first (cargo build --workspace, as scripts/test.sh does)",
            dir.join(needed).display()
        );
    }
    dir
}

fn shim_file() -> &'static str {
    if cfg!(target_os = "macos") {
        "libmetalift.dylib"
    } else {
        "libmetalift.so"
    }
}

/// The inert stub `uninstall.sh --force` leaves at the shim's path.
fn inert_file() -> &'static str {
    if cfg!(target_os = "macos") {
        "libmetalift-inert.dylib"
    } else {
        "libmetalift-inert.so"
    }
}

fn check(output: Output, what: &str) -> Output {
    assert!(
        output.status.success(),
        "{what} failed ({}):\nstdout:\n{}\nstderr:\n{}",
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The built artifacts, hard-linked (else copied) into `dir/bin`: other builds
/// sharing the target directory may replace them while a test stages twice.
fn frozen_bins(dir: &Path) -> PathBuf {
    let frozen = dir.join("bin");
    fs::create_dir_all(&frozen).unwrap();
    let built = bin_dir();
    for name in ["metaliftd", "metalift", "metalift-probe", shim_file()] {
        let (from, to) = (built.join(name), frozen.join(name));
        if fs::hard_link(&from, &to).is_err() {
            fs::copy(&from, &to).unwrap();
        }
    }
    frozen
}

/// Runs pkg/stage.sh into `dest` (a fresh install, or an upgrade over a previous one).
fn stage(dest: &Path, bins: &Path) {
    check(
        Command::new("bash")
            .arg(repo().join("pkg/stage.sh"))
            .arg(dest)
            .arg("--bin-dir")
            .arg(bins)
            .output()
            .expect("run bash"),
        "pkg/stage.sh",
    );
}

fn mode(path: &Path) -> u32 {
    fs::symlink_metadata(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .permissions()
        .mode()
        & 0o7777
}

/// A temporary macOS-shaped root (`etc` and `var` are symlinks into `private/`,
/// as on a Mac) plus stub commands that append each call to a log.
struct Machine {
    dir: tempfile::TempDir,
    console_uid: u32,
    /// Extra environment for the scripts (the stubs' answers).
    env: Vec<(&'static str, String)>,
}

impl Machine {
    fn new() -> Machine {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().join("root");
        for d in [
            "private/etc",
            "private/var/log",
            "private/var/run",
            "Users/Shared",
        ] {
            fs::create_dir_all(root.join(d)).unwrap();
        }
        symlink("private/etc", root.join("etc")).unwrap();
        symlink("private/var", root.join("var")).unwrap();
        let stubs = dir.path().join("stubs");
        fs::create_dir(&stubs).unwrap();
        let log = dir.path().join("calls.log");
        for (name, body) in [
            // `getenv` answers for the system domain, `asuser UID launchctl getenv`
            // for a user's: what `launchctl setenv` left there.
            (
                "launchctl",
                r#"echo "launchctl $*" >> "$STUB_LOG"
case "$1" in
  getenv) printf '%s' "${STUB_GETENV_SYSTEM:-}" ;;
  asuser) printf '%s' "${STUB_GETENV_USER:-}" ;;
esac"#,
            ),
            // The process table with environments: one line per STUB_PS entry.
            ("ps", r#"printf '%s' "${STUB_PS:-}""#),
            ("chown", r#"echo "chown $*" >> "$STUB_LOG""#),
            ("pkgutil", r#"echo "pkgutil $*" >> "$STUB_LOG""#),
            // `stat -f%u PATH`: who is at the console, or who owns a home
            // (`STUB_UID_<name>` for /Users/<name>, else the console uid).
            (
                "stat",
                r#"case "$2" in
  */Users/*) eval "echo \"\${STUB_UID_${2##*/}:-$STUB_CONSOLE_UID}\"" ;;
  *) echo "$STUB_CONSOLE_UID" ;;
esac"#,
            ),
        ] {
            let path = stubs.join(name);
            fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        }
        fs::write(&log, "").unwrap();
        frozen_bins(dir.path());
        Machine {
            dir,
            console_uid: 501,
            env: Vec::new(),
        }
    }

    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn at(&self, path: &str) -> PathBuf {
        self.root().join(path.trim_start_matches('/'))
    }

    fn calls(&self) -> Vec<String> {
        fs::read_to_string(self.dir.path().join("calls.log"))
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn clear_calls(&self) {
        fs::write(self.dir.path().join("calls.log"), "").unwrap();
    }

    fn script(&self, script: &str, args: &[&str]) -> Output {
        let path = format!(
            "{}:{}",
            self.dir.path().join("stubs").display(),
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
        );
        Command::new("bash")
            .arg(repo().join(script))
            .args(args)
            .env("PATH", path)
            .env("METALIFT_ROOT", self.root())
            .env("STUB_LOG", self.dir.path().join("calls.log"))
            .env("STUB_CONSOLE_UID", self.console_uid.to_string())
            .envs(self.env.iter().map(|(k, v)| (*k, v.as_str())))
            .output()
            .expect("run bash")
    }

    /// What Installer does: lay the payload, then run postinstall for volume "/".
    fn install(&self) -> Output {
        check(
            self.script("pkg/scripts/preinstall", &["metalift.pkg", "/", "/", "/"]),
            "preinstall",
        );
        stage(&self.root(), &self.dir.path().join("bin"));
        check(
            self.script("pkg/scripts/postinstall", &["metalift.pkg", "/", "/", "/"]),
            "postinstall",
        )
    }

    fn uninstall(&self, args: &[&str]) -> Output {
        check(self.script("pkg/uninstall.sh", args), "uninstall.sh")
    }

    /// Creates the marker that selects the opt-in LaunchAgent.
    fn choose_agent(&self) {
        fs::create_dir_all(self.at("/etc/metalift")).unwrap();
        fs::write(self.at("/etc/metalift/use-launchagent"), "").unwrap();
    }
}

/// Every entry under `root` (symlinks not followed): kind, mode and a content hash.
fn snapshot(root: &Path) -> BTreeMap<String, String> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<String, String>) {
        let mut entries: Vec<_> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for path in entries {
            let rel = path.strip_prefix(root).unwrap().display().to_string();
            let meta = fs::symlink_metadata(&path).unwrap();
            let mode = meta.permissions().mode() & 0o7777;
            if meta.file_type().is_symlink() {
                let target = fs::read_link(&path).unwrap();
                out.insert(rel, format!("link -> {}", target.display()));
            } else if meta.is_dir() {
                out.insert(rel, format!("dir {mode:o}"));
                walk(root, &path, out);
            } else {
                let mut hasher = DefaultHasher::new();
                fs::read(&path).unwrap().hash(&mut hasher);
                out.insert(rel, format!("file {mode:o} {:x}", hasher.finish()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn plist_dict(path: &Path) -> plist::Dictionary {
    Value::from_file(path)
        .unwrap_or_else(|e| panic!("{} does not parse: {e}", path.display()))
        .into_dictionary()
        .unwrap_or_else(|| panic!("{} is not a dictionary", path.display()))
}

fn program_arguments(dict: &plist::Dictionary) -> Vec<String> {
    dict.get("ProgramArguments")
        .and_then(Value::as_array)
        .expect("ProgramArguments is an array")
        .iter()
        .map(|v| v.as_string().expect("arguments are strings").to_owned())
        .collect()
}

fn flag_value<'a>(args: &'a [String], flag: &str) -> &'a str {
    let at = args
        .iter()
        .position(|a| a == flag)
        .unwrap_or_else(|| panic!("{flag} missing in {args:?}"));
    args.get(at + 1).expect("flag has a value")
}

/// Only flags metaliftd really has (its `--help` is the contract).
fn assert_metaliftd_has_flags<'a>(flags: impl IntoIterator<Item = &'a str>, whose: &str) {
    let help = Command::new(support::workspace_binary("metaliftd"))
        .arg("--help")
        .output()
        .expect("run metaliftd --help");
    let help = String::from_utf8_lossy(&help.stdout);
    for flag in flags {
        assert!(
            help.contains(&format!("{flag} ")),
            "{whose} passes {flag}, which metaliftd --help does not list:\n{help}"
        );
    }
}

/// Launchd's restart policy, both plists: restart only after a failure, never
/// sooner than a throttle, and no stdout/stderr file that nothing rotates.
fn assert_restarts_are_throttled_and_no_log_file_grows(dict: &plist::Dictionary, what: &str) {
    let keep_alive = dict
        .get("KeepAlive")
        .and_then(Value::as_dictionary)
        .unwrap_or_else(|| {
            panic!("{what}: KeepAlive must be a dictionary, not `true` (a hot loop)")
        });
    assert_eq!(
        keep_alive.get("SuccessfulExit").and_then(Value::as_boolean),
        Some(false),
        "{what}: restart only after a failure"
    );
    let throttle = dict
        .get("ThrottleInterval")
        .and_then(Value::as_signed_integer)
        .unwrap_or_else(|| panic!("{what}: no ThrottleInterval"));
    assert!(throttle >= 10, "{what}: ThrottleInterval {throttle} < 10 s");
    for key in ["StandardOutPath", "StandardErrorPath"] {
        assert!(
            dict.get(key).is_none(),
            "{what}: {key} is a file launchd keeps open and nothing rotates (issue 12 item 9)"
        );
    }
}

/// Checks one plist against a root where it was installed: keys, and that every
/// path it names exists there (for files the daemon creates: their directory).
fn assert_plist_is_complete_and_its_paths_exist(plist: &Path, root: &Path) {
    let dict = plist_dict(plist);
    let at = |p: &str| root.join(p.trim_start_matches('/'));
    let what = plist.display().to_string();
    assert_eq!(
        dict.get("Label").and_then(Value::as_string),
        Some(LABEL),
        "{what}"
    );
    let services = dict
        .get("MachServices")
        .and_then(Value::as_dictionary)
        .expect("MachServices is a dictionary");
    assert_eq!(
        services.get(POLICY_SERVICE).and_then(Value::as_boolean),
        Some(true)
    );
    assert_eq!(
        dict.get("RunAtLoad").and_then(Value::as_boolean),
        Some(true)
    );
    assert_restarts_are_throttled_and_no_log_file_grows(&dict, &what);
    assert!(dict.get("ProcessType").and_then(Value::as_string).is_some());

    let args = program_arguments(&dict);
    let program = at(&args[0]);
    assert!(
        mode(&program) & 0o111 != 0,
        "{} is not an executable in the payload",
        args[0]
    );
    assert_metaliftd_has_flags(
        args.iter()
            .skip(1)
            .filter(|a| a.starts_with('-'))
            .map(String::as_str),
        &what,
    );
    if args.len() == 1 {
        return; // the agent's launcher: checked by the agent tests
    }
    let policy = flag_value(&args, "--policy");
    assert!(at(policy).is_file(), "{policy} is not installed");
    for created_by_daemon in [
        flag_value(&args, "--audit-log"),
        flag_value(&args, "--socket"),
    ] {
        let parent = at(created_by_daemon).parent().unwrap().to_path_buf();
        assert!(
            parent.is_dir(),
            "the directory of {created_by_daemon} ({what}) does not exist after install"
        );
    }
}

#[test]
fn both_plists_restart_only_after_a_failure_and_respect_a_throttle() {
    for kind in ["LaunchAgents", "LaunchDaemons"] {
        let path = repo().join(format!("launchd/{kind}/{LABEL}.plist"));
        assert_restarts_are_throttled_and_no_log_file_grows(&plist_dict(&path), kind);
    }
}

#[test]
fn daemon_is_the_default_install_and_its_plist_names_only_installed_paths() {
    let machine = Machine::new();
    machine.install();
    let installed = machine.at("/Library/LaunchDaemons/com.metalift.metaliftd.plist");
    assert_eq!(
        fs::read(&installed).unwrap(),
        fs::read(repo().join("launchd/LaunchDaemons/com.metalift.metaliftd.plist")).unwrap()
    );
    assert_plist_is_complete_and_its_paths_exist(&installed, &machine.root());
    let dict = plist_dict(&installed);
    assert!(dict.get("LimitLoadToSessionType").is_none());
    assert_eq!(
        flag_value(&program_arguments(&dict), "--socket"),
        "/var/run/metalift/metalift.sock",
        "the macOS system socket (policy/src/socket_path.rs)"
    );
    assert!(!machine
        .at("/Library/LaunchAgents/com.metalift.metaliftd.plist")
        .exists());
}

#[test]
fn agent_with_the_marker_runs_the_launcher_in_the_background_session() {
    let machine = Machine::new();
    machine.choose_agent();
    machine.install();
    let installed = machine.at("/Library/LaunchAgents/com.metalift.metaliftd.plist");
    assert_plist_is_complete_and_its_paths_exist(&installed, &machine.root());
    let dict = plist_dict(&installed);
    // Background: visible from the user's GUI and ssh sessions alike (see the plist's comment).
    assert_eq!(
        dict.get("LimitLoadToSessionType")
            .and_then(Value::as_string),
        Some("Background")
    );
    assert_eq!(
        program_arguments(&dict),
        vec!["/usr/local/metalift/libexec/metaliftd-agent".to_owned()]
    );
    assert_eq!(
        dict.get("Umask").and_then(Value::as_signed_integer),
        Some(0o077)
    );
    assert!(!machine
        .at("/Library/LaunchDaemons/com.metalift.metaliftd.plist")
        .exists());
    // Nothing shared between users: each agent's socket is in its user's own
    // DARWIN_USER_TEMP_DIR (policy/src/socket_path.rs).
    assert!(!machine.at("/Users/Shared/metalift").exists());
}

#[test]
fn install_removes_the_squattable_socket_directories_of_earlier_releases() {
    let machine = Machine::new();
    machine.choose_agent();
    // What an earlier release left: a 1777 parent with per-uid directories, one
    // of them a symlink a squatter planted to a directory of theirs.
    let old = machine.at("/Users/Shared/metalift");
    fs::create_dir_all(old.join("501")).unwrap();
    fs::set_permissions(&old, fs::Permissions::from_mode(0o1777)).unwrap();
    let theirs = machine.dir.path().join("theirs");
    fs::create_dir(&theirs).unwrap();
    fs::write(theirs.join("keep"), "").unwrap();
    symlink(&theirs, old.join("502")).unwrap();
    let out = machine.install();
    assert!(!old.exists());
    assert!(
        theirs.join("keep").exists(),
        "a planted symlink's target is not followed"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("DARWIN_USER_TEMP_DIR"));
}

#[test]
fn staged_payload_has_exactly_the_expected_files_and_modes() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("payload");
    let bins = frozen_bins(dir.path());
    stage(&root, &bins);
    let shim = format!("usr/local/metalift/lib/{}", shim_file());
    let inert = format!("usr/local/metalift/libexec/{}", inert_file());
    let mut expected: BTreeMap<String, String> = BTreeMap::new();
    let mut expect = |path: &str, what: &str| {
        expected.insert(path.to_owned(), what.to_owned());
    };
    for d in [
        "usr/local/metalift",
        "usr/local/metalift/bin",
        "usr/local/metalift/lib",
        "usr/local/metalift/libexec",
        "usr/local/metalift/share",
        "usr/local/metalift/share/completions",
        "usr/local/metalift/share/launchd",
        "usr/local/metalift/share/launchd/LaunchAgents",
        "usr/local/metalift/share/launchd/LaunchDaemons",
        "usr/local/metalift/share/man",
        "usr/local/metalift/share/man/man1",
        "usr/local/metalift/share/man/man5",
        "usr/local/metalift/share/man/man8",
        "usr/local/metalift/share/schema",
    ] {
        expect(d, "dir 755");
    }
    for f in [
        "usr/local/metalift/bin/metaliftd",
        "usr/local/metalift/bin/metalift",
        "usr/local/metalift/bin/metalift-probe",
        shim.as_str(),
        inert.as_str(),
        "usr/local/metalift/libexec/uninstall.sh",
        "usr/local/metalift/libexec/metaliftd-agent",
    ] {
        expect(f, "file 755");
    }
    for f in [
        "usr/local/metalift/share/launchd/LaunchAgents/com.metalift.metaliftd.plist",
        "usr/local/metalift/share/launchd/LaunchDaemons/com.metalift.metaliftd.plist",
        "usr/local/metalift/share/default-policy.toml",
        "usr/local/metalift/share/links",
        "usr/local/metalift/share/completions/_metalift",
        "usr/local/metalift/share/completions/metalift.bash",
        "usr/local/metalift/share/completions/metalift.fish",
        "usr/local/metalift/share/schema/metalift-policy.schema.json",
    ] {
        expect(f, "file 644");
    }
    let mut pages = 0;
    for page in fs::read_dir(repo().join("man")).unwrap() {
        let name = page.unwrap().file_name().into_string().unwrap();
        let section = name.rsplit('.').next().unwrap().to_owned();
        expect(
            &format!("usr/local/metalift/share/man/man{section}/{name}"),
            "file 644",
        );
        pages += 1;
    }
    assert!(pages >= 3, "man pages missing from man/");

    let actual: BTreeMap<String, String> = snapshot(&root)
        .into_iter()
        // Staging scaffolding, not payload: build.sh hands pkgbuild
        // usr/local/metalift as the root (the_payload_holds_only_metalifts_own_directories).
        .filter(|(path, _)| path != "usr" && path != "usr/local")
        .map(|(path, what)| {
            // Drop content hashes: kinds and modes are what this test is about.
            let what = match what.strip_prefix("file ") {
                Some(rest) => format!("file {}", rest.split(' ').next().unwrap()),
                None => what,
            };
            (path, what)
        })
        .collect();
    assert_eq!(actual, expected);

    // Contents: the right sources, byte for byte.
    let same = |staged: &str, source: &Path| {
        assert_eq!(
            fs::read(root.join(staged)).unwrap(),
            fs::read(source).unwrap(),
            "{staged}"
        );
    };
    same(&shim, &bins.join(shim_file()));
    same("usr/local/metalift/bin/metalift", &bins.join("metalift"));
    same(
        "usr/local/metalift/share/default-policy.toml",
        &repo().join("examples/default-policy.toml"),
    );
    same(
        "usr/local/metalift/libexec/uninstall.sh",
        &repo().join("pkg/uninstall.sh"),
    );
    same(
        "usr/local/metalift/share/man/man5/metalift-policy.5",
        &repo().join("man/metalift-policy.5"),
    );
    same(
        "usr/local/metalift/share/completions/_metalift",
        &repo().join("completions/_metalift"),
    );
}

#[test]
fn every_shell_script_is_shellcheck_clean() {
    let scripts = [
        "pkg/build.sh",
        "pkg/stage.sh",
        "pkg/uninstall.sh",
        "pkg/scripts/preinstall",
        "pkg/scripts/postinstall",
        "pkg/libexec/metaliftd-agent",
    ];
    let Ok(output) = Command::new("shellcheck")
        .arg("--shell=bash")
        .arg("--severity=style")
        .args(scripts.iter().map(|s| repo().join(s)))
        .output()
    else {
        assert!(
            std::env::var_os("CI").is_none(),
            "shellcheck is not installed, and CI must run it (apt-get install shellcheck)"
        );
        eprintln!("SKIPPED every_shell_script_is_shellcheck_clean: shellcheck is not installed");
        return;
    };
    assert!(
        output.status.success(),
        "shellcheck:\n{}",
        String::from_utf8_lossy(&output.stdout)
    );
    for script in scripts {
        assert!(
            mode(&repo().join(script)) & 0o111 != 0,
            "{script} is not executable (pkgbuild runs scripts as they are)"
        );
    }
}

#[test]
fn postinstall_for_another_volume_changes_nothing_and_calls_nothing() {
    let machine = Machine::new();
    stage(&machine.root(), &machine.dir.path().join("bin"));
    let before = snapshot(&machine.root());
    for script in ["pkg/scripts/preinstall", "pkg/scripts/postinstall"] {
        check(
            machine.script(
                script,
                &["metalift.pkg", "/", "/Volumes/Image", "/Volumes/Image"],
            ),
            script,
        );
    }
    assert_eq!(snapshot(&machine.root()), before);
    assert_eq!(machine.calls(), Vec::<String>::new());
}

#[test]
fn fresh_install_puts_the_default_policy_in_place_and_starts_the_daemon() {
    let machine = Machine::new();
    machine.install();

    let policy = machine.at("/etc/metalift/policy.toml");
    assert_eq!(
        fs::read(&policy).unwrap(),
        fs::read(repo().join("examples/default-policy.toml")).unwrap()
    );
    assert_eq!(mode(&policy), 0o644);
    assert_eq!(mode(&machine.at("/etc/metalift")), 0o755);
    assert_eq!(mode(&machine.at("/etc/metalift/policy.d")), 0o755);
    assert_eq!(mode(&machine.at("/var/log/metalift")), 0o750);
    assert_eq!(mode(&machine.at("/var/run/metalift")), 0o755);
    let daemon_plist = machine.at("/Library/LaunchDaemons/com.metalift.metaliftd.plist");
    assert_eq!(mode(&daemon_plist), 0o644);

    let calls = machine.calls();
    for expected in [
        format!("chown root:wheel {}.metalift-new", policy.display()),
        format!(
            "chown root:admin {}",
            machine.at("/var/log/metalift").display()
        ),
        format!("launchctl bootstrap system {}", daemon_plist.display()),
    ] {
        assert!(calls.contains(&expected), "no `{expected}` in {calls:#?}");
    }
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("launchctl bootstrap user/")),
        "{calls:#?}"
    );
}

#[test]
fn an_upgrade_keeps_the_group_and_mode_the_admin_gave_the_log_directory() {
    let machine = Machine::new();
    machine.install();
    let log_dir = machine.at("/var/log/metalift");
    // The CI cookbook: `chgrp staff` (a stub here: the call is what is checked)
    // and a group-writable directory of the admin's choice.
    fs::set_permissions(&log_dir, fs::Permissions::from_mode(0o770)).unwrap();
    machine.clear_calls();
    let out = machine.install();
    assert_eq!(mode(&log_dir), 0o770, "the admin's mode is kept");
    let calls = machine.calls();
    assert!(
        !calls.iter().any(|c| c.starts_with("chown")
            && c.contains(":admin")
            && c.contains("var/log/metalift")),
        "the log's group is not reset: {calls:#?}"
    );
    assert!(
        calls.contains(&format!("chown -R root {}", log_dir.display())),
        "the owner is still root's (records an old agent wrote): {calls:#?}"
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("keeping the group and mode of"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn an_upgrade_over_a_policy_the_new_version_refuses_says_so_and_what_the_daemon_will_do() {
    let machine = Machine::new();
    fs::create_dir_all(machine.at("/etc/metalift/policy.d")).unwrap();
    let policy = machine.at("/etc/metalift/policy.toml");
    fs::write(&policy, "version = 1\nmode = \"loud\"\n").unwrap();
    fs::set_permissions(&policy, fs::Permissions::from_mode(0o644)).unwrap();
    let out = machine.install();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("this version refuses the kept policy"),
        "{stdout}"
    );
    assert!(stdout.contains("mode"), "the error itself: {stdout}");
    assert!(
        stdout.contains("every check-in is answered stock"),
        "what the daemon will do: {stdout}"
    );
    // A valid kept policy is said to be valid.
    fs::write(&policy, "version = 1\n").unwrap();
    let out = machine.install();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("the kept policy is valid for this version"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn existing_policy_survives_install_and_upgrade() {
    let machine = Machine::new();
    fs::create_dir_all(machine.at("/etc/metalift/policy.d")).unwrap();
    let mine = "version = 1\n# the admin's own policy\n";
    let policy = machine.at("/etc/metalift/policy.toml");
    fs::write(&policy, mine).unwrap();
    fs::set_permissions(&policy, fs::Permissions::from_mode(0o640)).unwrap();
    let dropped = machine.at("/etc/metalift/policy.d/50-fleet.toml");
    fs::write(&dropped, "version = 1\n").unwrap();

    let out = machine.install();
    assert!(String::from_utf8_lossy(&out.stdout).contains("keeping the existing"));
    machine.install(); // upgrade: the same package again over it

    assert_eq!(fs::read_to_string(&policy).unwrap(), mine);
    assert_eq!(
        mode(&policy),
        0o640,
        "an existing policy's mode is the admin's business"
    );
    assert_eq!(fs::read_to_string(&dropped).unwrap(), "version = 1\n");
    assert!(!machine
        .calls()
        .iter()
        .any(|c| c.starts_with("chown") && c.contains("policy.toml")));
}

#[test]
fn second_install_is_harmless_and_boots_out_before_bootstrapping() {
    let machine = Machine::new();
    machine.install();
    let after_first = snapshot(&machine.root());
    machine.clear_calls();

    machine.install();
    assert_eq!(snapshot(&machine.root()), after_first);
    let calls = machine.calls();
    let bootout = calls
        .iter()
        .rposition(|c| c == "launchctl bootout system/com.metalift.metaliftd")
        .unwrap_or_else(|| panic!("no bootout in {calls:#?}"));
    let bootstrap = calls
        .iter()
        .position(|c| c.starts_with("launchctl bootstrap system "))
        .unwrap_or_else(|| panic!("no bootstrap in {calls:#?}"));
    assert!(bootout < bootstrap, "{calls:#?}");
    assert_eq!(
        calls
            .iter()
            .filter(|c| c.starts_with("launchctl bootstrap"))
            .count(),
        1,
        "{calls:#?}"
    );
}

#[test]
fn use_launchagent_marker_switches_a_daemon_install_to_the_agent_and_back() {
    let machine = Machine::new();
    machine.install();
    machine.clear_calls();

    machine.choose_agent();
    machine.install();
    let calls = machine.calls();
    let agent_plist = machine.at("/Library/LaunchAgents/com.metalift.metaliftd.plist");
    assert!(agent_plist.is_file());
    assert!(!machine
        .at("/Library/LaunchDaemons/com.metalift.metaliftd.plist")
        .exists());
    assert!(calls.contains(&"launchctl bootout system/com.metalift.metaliftd".to_owned()));
    assert!(calls.contains(&format!(
        "launchctl bootstrap user/501 {}",
        agent_plist.display()
    )));

    fs::remove_file(machine.at("/etc/metalift/use-launchagent")).unwrap();
    machine.clear_calls();
    machine.install();
    assert!(!agent_plist.exists());
    assert!(machine
        .calls()
        .contains(&"launchctl bootout user/501/com.metalift.metaliftd".to_owned()));
}

#[test]
fn an_agent_install_of_an_older_release_upgrades_to_the_daemon_and_says_so() {
    let machine = Machine::new();
    // What the previous release left: the agent (its default), a shared socket,
    // and the retired marker on another machine of the fleet.
    fs::create_dir_all(machine.at("/Library/LaunchAgents")).unwrap();
    fs::write(
        machine.at("/Library/LaunchAgents/com.metalift.metaliftd.plist"),
        "<plist/>",
    )
    .unwrap();
    fs::create_dir_all(machine.at("/etc/metalift")).unwrap();
    fs::write(machine.at("/etc/metalift/use-launchdaemon"), "").unwrap();
    let out = machine.install();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("upgrade: switching from the LaunchAgent to the LaunchDaemon"),
        "{said}"
    );
    assert!(
        said.contains("use-launchdaemon is no longer needed"),
        "{said}"
    );
    assert!(!machine
        .at("/Library/LaunchAgents/com.metalift.metaliftd.plist")
        .exists());
    assert!(machine
        .at("/Library/LaunchDaemons/com.metalift.metaliftd.plist")
        .is_file());
    assert!(machine
        .calls()
        .contains(&"launchctl bootout user/501/com.metalift.metaliftd".to_owned()));
}

#[test]
fn install_boots_out_the_agent_of_every_user_with_a_home() {
    let mut machine = Machine::new();
    for (user, uid) in [("alice", "502"), ("bob", "503"), ("console", "501")] {
        fs::create_dir_all(machine.at(&format!("/Users/{user}"))).unwrap();
        machine.env.push((
            match user {
                "alice" => "STUB_UID_alice",
                "bob" => "STUB_UID_bob",
                _ => "STUB_UID_console",
            },
            uid.to_owned(),
        ));
    }
    machine.install();
    let calls = machine.calls();
    for uid in [501, 502, 503] {
        let bootout = format!("launchctl bootout user/{uid}/com.metalift.metaliftd");
        // preinstall and postinstall, once each: uid 501 is the console's and a home's.
        assert_eq!(
            calls.iter().filter(|c| **c == bootout).count(),
            2,
            "{bootout}: {calls:#?}"
        );
    }
}

#[test]
fn agent_install_with_nobody_at_the_console_leaves_the_agent_for_the_next_login() {
    let mut machine = Machine::new();
    machine.console_uid = 0; // the login window owns the console
    machine.choose_agent();
    let out = machine.install();
    assert!(String::from_utf8_lossy(&out.stdout).contains("next login"));
    let calls = machine.calls();
    assert!(
        !calls.iter().any(|c| c.starts_with("launchctl bootstrap")),
        "{calls:#?}"
    );
    assert!(machine
        .at("/Library/LaunchAgents/com.metalift.metaliftd.plist")
        .is_file());
}

/// Pre-existing files that are not metalift's, to prove uninstall leaves them.
fn add_unrelated_files(machine: &Machine) {
    fs::create_dir_all(machine.at("/usr/local/bin")).unwrap();
    fs::write(machine.at("/usr/local/bin/other-tool"), "#!/bin/sh\n").unwrap();
    fs::create_dir_all(machine.at("/Library/LaunchAgents")).unwrap();
    fs::write(
        machine.at("/Library/LaunchAgents/com.example.other.plist"),
        "<plist/>",
    )
    .unwrap();
}

/// Files (not directories) in a snapshot.
fn files(snapshot: &BTreeMap<String, String>) -> Vec<String> {
    snapshot
        .iter()
        .filter(|(_, what)| !what.starts_with("dir"))
        .map(|(path, _)| path.clone())
        .collect()
}

#[test]
fn uninstall_removes_what_install_added_and_keeps_policy_and_audit_log() {
    let machine = Machine::new();
    add_unrelated_files(&machine);
    let before = files(&snapshot(&machine.root()));
    machine.install();
    fs::write(
        machine.at("/var/log/metalift/audit.jsonl"),
        "{\"kind\":\"decision\"}\n",
    )
    .unwrap();
    machine.clear_calls();

    machine.uninstall(&[]);
    let mut expected = before;
    expected.extend([
        "private/etc/metalift/policy.toml".to_owned(),
        "private/var/log/metalift/audit.jsonl".to_owned(),
    ]);
    expected.sort();
    assert_eq!(files(&snapshot(&machine.root())), expected);
    assert!(!machine.at("/usr/local/metalift").exists());
    assert!(!machine.at("/Users/Shared/metalift").exists());
    let calls = machine.calls();
    for expected in [
        "launchctl bootout system/com.metalift.metaliftd",
        "launchctl bootout user/501/com.metalift.metaliftd",
        "pkgutil --forget com.metalift.pkg",
    ] {
        assert!(
            calls.contains(&expected.to_owned()),
            "no `{expected}` in {calls:#?}"
        );
    }
}

#[test]
fn uninstall_with_purge_leaves_only_what_was_there_before() {
    let machine = Machine::new();
    add_unrelated_files(&machine);
    let before = files(&snapshot(&machine.root()));
    machine.install();
    fs::write(machine.at("/var/log/metalift/audit.jsonl"), "{}\n").unwrap();
    // What an opt-in agent of a user would have written.
    let agent_log = machine.at("/Users/admin/Library/Logs/metalift/audit.jsonl");
    fs::create_dir_all(agent_log.parent().unwrap()).unwrap();
    fs::write(&agent_log, "{}\n").unwrap();

    machine.uninstall(&["--purge"]);
    assert!(!agent_log.exists(), "the agent's audit log is purged too");
    assert_eq!(files(&snapshot(&machine.root())), before);
    assert!(!machine.at("/etc/metalift").exists());
    assert!(!machine.at("/var/log/metalift").exists());
}

#[test]
fn uninstall_leaves_a_metalift_link_that_is_not_ours() {
    let machine = Machine::new();
    fs::create_dir_all(machine.at("/usr/local/bin")).unwrap();
    symlink("/opt/other/metalift", machine.at("/usr/local/bin/metalift")).unwrap();
    machine.uninstall(&[]);
    assert!(fs::symlink_metadata(machine.at("/usr/local/bin/metalift")).is_ok());
}

#[test]
fn default_policy_is_valid_and_unlocks_nothing() {
    use metalift_policy::{compile_sources, Action, Source, Subject};

    let path = repo().join("examples/default-policy.toml");
    let text = fs::read_to_string(&path).unwrap();
    let loaded = compile_sources(vec![Source::new("policy.toml", &text)])
        .unwrap_or_else(|e| panic!("{} is refused: {e:?}", path.display()));
    for exe in [
        "/opt/llama.cpp/bin/llama-server",
        "/usr/local/metalift/bin/metalift-probe",
        "/bin/sh",
    ] {
        let subject = Subject {
            path: exe.into(),
            ..Subject::default()
        };
        let verdict = loaded
            .policy
            .evaluate(&subject, std::time::SystemTime::now());
        assert!(
            matches!(verdict.action, Action::Stock),
            "{exe}: {verdict:?}"
        );
        assert_eq!(verdict.rule, None, "{exe}");
    }
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "reads LD_PRELOAD from /bin/sh; on macOS SIP strips DYLD_* from protected binaries"
)]
fn installed_metalift_exec_finds_the_installed_shim_through_the_usr_local_bin_link() {
    let machine = Machine::new();
    machine.install();
    let out = Command::new(machine.at("/usr/local/bin/metalift"))
        .args(["exec", "--", "sh", "-c", "echo \"$LD_PRELOAD\""])
        .env_remove("LD_PRELOAD")
        .env_remove("DYLD_INSERT_LIBRARIES")
        .env_remove("METALIFT_SHIM")
        .env("METALIFT_SOCKET", machine.dir.path().join("absent.sock"))
        .output()
        .unwrap();
    let out = check(out, "metalift exec through the /usr/local/bin link");
    let shim = machine
        .at("/usr/local/metalift/lib")
        .join(shim_file())
        .canonicalize()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        shim.display().to_string()
    );
}
