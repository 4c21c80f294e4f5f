//! Uninstall never leaves a process unable to start (issue 11 item 7): dyld
//! halts a launch whose DYLD_INSERT_LIBRARIES names a library it cannot load
//! (dyld-1378 `dyld/DyldRuntimeState.cpp`, `RuntimeState::loadInsertedLibraries`),
//! so uninstall refuses while anything still names the shim, and `--force`
//! leaves an inert stub at its path.

use super::*;

fn shim_at(machine: &Machine) -> PathBuf {
    machine.at(&format!("/usr/local/metalift/lib/{}", shim_file()))
}

fn refused(machine: &Machine, args: &[&str]) -> String {
    let out = machine.script("pkg/uninstall.sh", args);
    let said = String::from_utf8_lossy(&out.stdout).into_owned();
    assert_eq!(out.status.code(), Some(1), "{said}");
    assert!(said.contains("refusing"), "{said}");
    assert!(said.contains("Nothing was changed"), "{said}");
    said
}

/// A CI agent's own launchd job that injects the shim into its builds.
fn add_injecting_job(machine: &Machine) -> &'static str {
    let plist = "/Library/LaunchDaemons/com.example.ci-agent.plist";
    fs::create_dir_all(machine.at("/Library/LaunchDaemons")).unwrap();
    fs::write(
        machine.at(plist),
        "<plist><dict><key>EnvironmentVariables</key><dict>\
         <key>DYLD_INSERT_LIBRARIES</key>\
         <string>/usr/local/metalift/lib/libmetalift.dylib</string></dict></dict></plist>",
    )
    .unwrap();
    plist
}

#[test]
fn uninstall_refuses_while_a_launchd_plist_names_the_shim_and_changes_nothing() {
    let machine = Machine::new();
    machine.install();
    let plist = add_injecting_job(&machine);
    machine.clear_calls();
    let before = snapshot(&machine.root());

    let said = refused(&machine, &[]);
    assert!(said.contains(&format!("{plist}: launchd plist")), "{said}");
    assert_eq!(snapshot(&machine.root()), before, "nothing removed");
    assert!(
        !machine.calls().iter().any(|c| c.contains("bootout")),
        "nothing stopped: {:#?}",
        machine.calls()
    );
}

#[test]
fn uninstall_refuses_while_launchctl_setenv_a_profile_or_a_process_names_the_shim() {
    let mut machine = Machine::new();
    machine.install();
    let shim = "/usr/local/metalift/lib/libmetalift.dylib";
    machine.env.push(("STUB_GETENV_SYSTEM", shim.to_owned()));
    machine
        .env
        .push(("STUB_GETENV_USER", format!("/opt/x.dylib:{shim}")));
    machine.env.push((
        "STUB_PS",
        format!("  4242 /bin/zsh DYLD_INSERT_LIBRARIES={shim} HOME=/Users/admin\n"),
    ));
    fs::create_dir_all(machine.at("/Users/admin")).unwrap();
    fs::write(
        machine.at("/Users/admin/.zshenv"),
        format!("export PATH=/opt/bin:$PATH\nexport DYLD_INSERT_LIBRARIES={shim}\n"),
    )
    .unwrap();
    fs::write(machine.at("/etc/zprofile"), format!("# {shim}\n")).unwrap();

    let said = refused(&machine, &[]);
    for expected in [
        "launchctl getenv (system domain): DYLD_INSERT_LIBRARIES=",
        "launchctl getenv (user 501): DYLD_INSERT_LIBRARIES=/opt/x.dylib:",
        "/Users/admin/.zshenv: shell profile (line 2)",
        "/etc/zprofile: shell profile (line 1)",
        "running process 4242",
    ] {
        assert!(said.contains(expected), "no `{expected}` in:\n{said}");
    }
    assert!(shim_at(&machine).is_file());
    assert!(machine
        .calls()
        .contains(&"launchctl asuser 501 launchctl getenv DYLD_INSERT_LIBRARIES".to_owned()));
}

#[test]
fn uninstall_force_leaves_the_inert_stub_at_the_shims_path_and_removes_everything_else() {
    let machine = Machine::new();
    machine.install();
    add_injecting_job(&machine);
    let inert =
        fs::read(machine.at(&format!("/usr/local/metalift/libexec/{}", inert_file()))).unwrap();

    let out = machine.uninstall(&["--force"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("INERT STUB"), "{said}");
    let shim = shim_at(&machine);
    assert_eq!(fs::read(&shim).unwrap(), inert, "the stub, not the shim");
    assert_eq!(mode(&shim), 0o755);
    // Only the stub is left of /usr/local/metalift.
    let left: Vec<String> = snapshot(&machine.at("/usr/local/metalift"))
        .into_iter()
        .filter(|(_, what)| !what.starts_with("dir"))
        .map(|(path, _)| path)
        .collect();
    assert_eq!(left, vec![format!("lib/{}", shim_file())]);
    assert!(!machine
        .at("/Library/LaunchDaemons/com.metalift.metaliftd.plist")
        .exists());
    assert!(machine
        .calls()
        .contains(&"launchctl bootout system/com.metalift.metaliftd".to_owned()));
}

/// The stub really is inert: no constructor, no dependency, nothing exported.
#[cfg(target_os = "linux")]
#[test]
fn the_inert_stub_has_no_constructor_no_imports_and_no_exports() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("payload");
    stage(&root, &frozen_bins(dir.path()));
    let stub = root.join(format!("usr/local/metalift/libexec/{}", inert_file()));
    let out = check(
        Command::new("readelf")
            .args(["--dynamic", "--dyn-syms"])
            .arg(&stub)
            .output()
            .expect("readelf (binutils)"),
        "readelf",
    );
    let text = String::from_utf8_lossy(&out.stdout);
    for forbidden in ["(NEEDED)", "(INIT)", "(INIT_ARRAY)", "FUNC"] {
        assert!(!text.contains(forbidden), "{forbidden} in:\n{text}");
    }
}

#[test]
fn uninstall_on_a_clean_machine_removes_everything_without_force() {
    let mut machine = Machine::new();
    machine.install();
    // Naming the shim as an argument, with another library inserted: not a reference.
    machine.env.push((
        "STUB_PS",
        "  77 vim /usr/local/metalift/lib/libmetalift.dylib DYLD_INSERT_LIBRARIES=/opt/other.dylib\n"
            .to_owned(),
    ));
    let out = machine.uninstall(&[]);
    assert!(!String::from_utf8_lossy(&out.stdout).contains("INERT"));
    assert!(!machine.at("/usr/local/metalift").exists());
}
