//! The payload holds only metalift's own directories; the links into places other
//! software shares (`/usr/local/bin`, the man, completion and schema directories)
//! are made by postinstall, which never changes an existing directory, and removed
//! by uninstall only while they are still metalift's.

use std::os::unix::fs::MetadataExt;

use super::*;

/// The payload's root in the staged tree and on the target volume: what build.sh
/// hands pkgbuild as `--root` and `--install-location`.
const PAYLOAD: &str = "usr/local/metalift";

/// The lines of the staged payload's `share/links`: (link, relative target).
fn link_table(root: &Path) -> Vec<(String, String)> {
    fs::read_to_string(root.join(PAYLOAD).join("share/links"))
        .unwrap()
        .lines()
        .map(|line| {
            let (link, target) = line.split_once(' ').expect("LINK TARGET");
            (link.to_owned(), target.to_owned())
        })
        .collect()
}

#[test]
fn the_payload_holds_only_metalifts_own_directories() {
    let build = fs::read_to_string(repo().join("pkg/build.sh")).unwrap();
    assert!(
        build.contains(&format!("pkgbuild --root \"$root/{PAYLOAD}\""))
            && build.contains(&format!("--install-location /{PAYLOAD} ")),
        "build.sh must give pkgbuild {PAYLOAD} as root and install location"
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("payload");
    stage(&root, &frozen_bins(dir.path()));
    let outside: Vec<String> = snapshot(&root)
        .into_keys()
        // usr and usr/local are above the payload's root (scaffolding).
        .filter(|path| path != "usr" && path != "usr/local")
        .filter(|path| path != PAYLOAD && !path.starts_with(&format!("{PAYLOAD}/")))
        .collect();
    assert_eq!(outside, Vec::<String>::new(), "staged outside {PAYLOAD}");

    // Every link postinstall will make lies outside the payload and, made where
    // its table says, resolves to a file of the payload.
    let links = link_table(&root);
    assert!(links.len() >= 8, "{links:?}");
    for (link, target) in &links {
        assert!(!link.starts_with(PAYLOAD), "{link}");
        // Resolved by hand: the link's own directory is not in the payload.
        let mut resolved = Path::new(link).parent().unwrap().to_path_buf();
        for part in Path::new(target).components() {
            match part {
                std::path::Component::ParentDir => assert!(resolved.pop(), "{target}"),
                std::path::Component::Normal(name) => resolved.push(name),
                other => panic!("{link} -> {target}: {other:?} in a relative link"),
            }
        }
        assert!(resolved.starts_with(PAYLOAD), "{link} -> {target}");
        assert!(
            root.join(&resolved).is_file(),
            "{link} -> {target} does not reach a payload file"
        );
    }
    for expected in [
        "usr/local/bin/metalift",
        "usr/local/bin/metalift-probe",
        "usr/local/share/man/man1/metalift.1",
        "usr/local/share/man/man5/metalift-policy.5",
        "usr/local/share/man/man8/metaliftd.8",
        "usr/local/share/zsh/site-functions/_metalift",
        "usr/local/share/fish/vendor_completions.d/metalift.fish",
        "usr/local/etc/bash_completion.d/metalift",
        "usr/local/share/metalift/metalift-policy.schema.json",
    ] {
        assert!(
            links.iter().any(|(l, _)| l == expected),
            "no {expected} in {links:?}"
        );
    }
}

/// Owner and mode of `path`.
fn owner_and_mode(path: &Path) -> (u32, u32, u32) {
    let meta = fs::metadata(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    (meta.uid(), meta.gid(), meta.mode() & 0o7777)
}

#[test]
fn postinstall_leaves_an_existing_usr_local_bin_exactly_as_it_was() {
    let machine = Machine::new();
    // As Homebrew on an Intel Mac leaves them: group-writable, owned by a user.
    // The test runs as root where it can give them another owner (CI does);
    // elsewhere they keep the test user's, and the mode and calls still count.
    let (uid, gid) = if rustix::process::geteuid().is_root() {
        (501, 20)
    } else {
        (
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )
    };
    let shared = ["/usr/local/bin", "/usr/local/share/man/man1"];
    for dir in shared {
        let path = machine.at(dir);
        fs::create_dir_all(&path).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o775)).unwrap();
        std::os::unix::fs::chown(&path, Some(uid), Some(gid)).unwrap();
    }
    machine.install();
    for dir in shared {
        let path = machine.at(dir);
        assert_eq!(
            owner_and_mode(&path),
            (uid, gid, 0o775),
            "{dir} was changed"
        );
        let named = path.display().to_string();
        let calls: Vec<String> = machine
            .calls()
            .into_iter()
            .filter(|c| c.split(' ').any(|word| word == named))
            .collect();
        assert_eq!(calls, Vec::<String>::new(), "{dir}");
    }
    // The links are there and reach the installed files.
    assert_eq!(
        fs::read_link(machine.at("/usr/local/bin/metalift")).unwrap(),
        Path::new("../metalift/bin/metalift")
    );
    assert!(machine.at("/usr/local/bin/metalift").is_file());
    assert!(machine.at("/usr/local/share/man/man1/metalift.1").is_file());
}

#[test]
fn postinstall_creates_missing_shared_directories_root_wheel_0755() {
    let machine = Machine::new();
    machine.install();
    let calls = machine.calls();
    for dir in [
        "/usr/local/bin",
        "/usr/local/share",
        "/usr/local/share/man/man8",
        "/usr/local/share/zsh/site-functions",
        "/usr/local/share/fish/vendor_completions.d",
        "/usr/local/etc/bash_completion.d",
        "/usr/local/share/metalift",
    ] {
        let path = machine.at(dir);
        assert_eq!(mode(&path), 0o755, "{dir}");
        let chown = format!("chown root:wheel {}", path.display());
        assert!(calls.contains(&chown), "no `{chown}` in {calls:#?}");
    }
    assert!(machine
        .at("/usr/local/share/zsh/site-functions/_metalift")
        .is_file());
    assert!(machine
        .at("/usr/local/etc/bash_completion.d/metalift")
        .is_file());
}

#[test]
fn postinstall_leaves_a_file_it_did_not_make_at_a_links_name_and_says_so() {
    let machine = Machine::new();
    fs::create_dir_all(machine.at("/usr/local/bin")).unwrap();
    fs::write(
        machine.at("/usr/local/bin/metalift"),
        "#!/bin/sh\n# someone else's\n",
    )
    .unwrap();
    let out = machine.install();
    assert_eq!(
        fs::read_to_string(machine.at("/usr/local/bin/metalift")).unwrap(),
        "#!/bin/sh\n# someone else's\n"
    );
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("leaving /usr/local/bin/metalift"), "{said}");
    // The other links are made all the same.
    assert!(
        fs::symlink_metadata(machine.at("/usr/local/bin/metalift-probe"))
            .unwrap()
            .file_type()
            .is_symlink()
    );
}

#[test]
fn uninstall_removes_metalifts_links_and_leaves_foreign_files_and_the_directories() {
    let machine = Machine::new();
    machine.install();
    let links = link_table(&machine.root());
    // After the install: an admin replaced one completion with a file of their
    // own, pointed another name elsewhere, and other tools live beside ours.
    let zsh = machine.at("/usr/local/share/zsh/site-functions/_metalift");
    fs::remove_file(&zsh).unwrap();
    fs::write(&zsh, "#compdef metalift\n# the admin's\n").unwrap();
    let fish = machine.at("/usr/local/share/fish/vendor_completions.d/metalift.fish");
    fs::remove_file(&fish).unwrap();
    symlink("/opt/other/metalift.fish", &fish).unwrap();
    fs::write(machine.at("/usr/local/bin/other-tool"), "#!/bin/sh\n").unwrap();
    fs::write(
        machine.at("/usr/local/share/man/man1/other.1"),
        ".TH OTHER 1\n",
    )
    .unwrap();

    machine.uninstall(&[]);
    for (link, _) in &links {
        let path = machine.root().join(link);
        if path == zsh || path == fish {
            continue;
        }
        assert!(
            fs::symlink_metadata(&path).is_err(),
            "{link} is still there after uninstall"
        );
    }
    assert_eq!(
        fs::read_to_string(&zsh).unwrap(),
        "#compdef metalift\n# the admin's\n"
    );
    assert_eq!(
        fs::read_link(&fish).unwrap(),
        Path::new("/opt/other/metalift.fish")
    );
    assert!(machine.at("/usr/local/bin/other-tool").is_file());
    assert!(machine.at("/usr/local/share/man/man1/other.1").is_file());
    for dir in [
        "/usr/local/bin",
        "/usr/local/share/man/man1",
        "/usr/local/etc/bash_completion.d",
    ] {
        assert!(machine.at(dir).is_dir(), "{dir} is shared: it stays");
    }
    assert!(
        !machine.at("/usr/local/share/metalift").exists(),
        "metalift's own schema directory goes once empty"
    );
}
