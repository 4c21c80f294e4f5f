//! The shim's unresponsive marker (shim/c/unresponsive.c) seen from outside:
//! what a daemon that does not answer costs later processes (a probe, then a
//! skip only over timeouts in a row), and that nobody else can aim the marker
//! (no shared directory, no truncation, no hard-linked, symlinked or foreign
//! file).
//!
//! Linux only: the simulated Metal and `LD_PRELOAD`.
#![cfg(target_os = "linux")]

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use metalift_policy::wire::OutcomeResult;
use support::*;

/// The marker's name for `socket`, as unresponsive.c makes it: the uid and the
/// FNV-1a hash of the socket path.
fn marker_path(dir: &Path, socket: &Path) -> PathBuf {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for byte in socket.as_os_str().as_encoded_bytes() {
        hash ^= u64::from(*byte);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    let uid = std::fs::metadata(dir).expect("marker dir").uid();
    dir.join(format!("metalift-unresponsive-{uid}-{hash:016x}"))
}

fn markers_in(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("metalift-unresponsive-")
        })
        .map(|e| e.path())
        .collect()
}

/// Runs the probe against `daemon`, timing it; (took, stderr).
fn timed(daemon: &FakeDaemon, timeout_ms: u64, markers: Option<&Path>) -> (Duration, String) {
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("METALIFT_TIMEOUT_MS", timeout_ms.to_string())
        .env("METALIFT_DEBUG", "1")
        .arg("--json");
    if let Some(dir) = markers {
        cmd.env("XDG_RUNTIME_DIR", dir);
    }
    let start = Instant::now();
    let output = run(cmd, b"");
    let took = start.elapsed();
    assert!(output.status.success(), "{output:?}");
    (took, String::from_utf8_lossy(&output.stderr).into_owned())
}

fn age(path: &Path, by: Duration) {
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(SystemTime::now() - by)
        .unwrap();
}

#[test]
fn given_a_daemon_that_never_answers_then_the_first_waits_the_next_probes_and_only_then_they_skip()
{
    let daemon = FakeDaemon::start(Behaviour::Silent);
    let (first, _) = timed(&daemon, 1500, None);
    assert!(first >= Duration::from_millis(1500), "took {first:?}");
    assert_eq!(daemon.check_ins(), 1);
    // One timeout: the next process asks again, briefly (a probe), never a
    // silent skip.
    let (second, stderr) = timed(&daemon, 1500, None);
    assert!(second < Duration::from_millis(1000), "took {second:?}");
    assert!(stderr.contains("probing it (300 ms)"), "{stderr}");
    assert_eq!(daemon.check_ins(), 2, "the probe is a check-in");
    // Two in a row: now the check-ins are skipped, with no connection.
    for _ in 0..3 {
        let (took, stderr) = timed(&daemon, 1500, None);
        assert!(took < Duration::from_millis(1000), "took {took:?}");
        assert!(
            stderr.contains("did not answer 2 check-ins in a row"),
            "{stderr}"
        );
    }
    assert_eq!(
        daemon.connections(),
        2,
        "skipped processes make no connection"
    );
    let markers = markers_in(daemon.socket.parent().unwrap());
    assert_eq!(markers.len(), 1, "{markers:?}");
    assert_eq!(std::fs::read_to_string(&markers[0]).unwrap(), "002\n");
    // After the skip (10 s for two), a probe again: a third timeout in a row.
    age(&markers[0], Duration::from_secs(11));
    let (probe_again, _) = timed(&daemon, 1500, None);
    assert!(
        probe_again < Duration::from_millis(1000),
        "took {probe_again:?}"
    );
    assert_eq!(daemon.check_ins(), 3);
    assert_eq!(std::fs::read_to_string(&markers[0]).unwrap(), "003\n");
    // Once the marker is older than its skip (20 s for three) plus 10 s, it
    // is forgotten: the full deadline again.
    age(&markers[0], Duration::from_secs(31));
    let (again, _) = timed(&daemon, 1500, None);
    assert!(again >= Duration::from_millis(1500), "took {again:?}");
    assert_eq!(daemon.check_ins(), 4);
    assert_eq!(std::fs::read_to_string(&markers[0]).unwrap(), "001\n");
}

#[test]
fn given_a_fresh_marker_and_a_daemon_that_answers_then_the_probe_unlocks_and_the_marker_goes() {
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let dir = daemon.socket.parent().unwrap();
    let marker = marker_path(dir, &daemon.socket);
    std::fs::write(&marker, "001\n").unwrap();
    std::fs::set_permissions(&marker, std::fs::Permissions::from_mode(0o600)).unwrap();
    let report = probe_json(injected(probe(), &daemon.socket));
    assert_apple7(&report);
    assert_eq!(daemon.check_ins(), 1, "a probe, not a skip");
    assert_eq!(daemon.outcome().result, OutcomeResult::Applied);
    assert!(!marker.exists(), "an answer removes the marker");
}

#[test]
fn given_a_marker_that_is_a_hard_link_then_its_target_is_left_intact_and_it_is_not_believed() {
    let daemon = FakeDaemon::start(Behaviour::Silent);
    let dir = daemon.socket.parent().unwrap();
    // Another file of this user's, hard-linked where the marker goes (on macOS
    // any user may link another's file into a directory they can write).
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious contents\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let marker = marker_path(dir, &daemon.socket);
    std::fs::hard_link(&victim, &marker).unwrap();
    let (took, _) = timed(&daemon, 300, None);
    assert!(
        took >= Duration::from_millis(300),
        "believed: took {took:?}"
    );
    assert_eq!(daemon.check_ins(), 1, "a linked marker is not believed");
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "precious contents\n",
        "the link's target was written"
    );
    // Nor written after the timeout: the next process waits again.
    let (took, _) = timed(&daemon, 300, None);
    assert!(took >= Duration::from_millis(300), "took {took:?}");
    assert_eq!(
        std::fs::read_to_string(&victim).unwrap(),
        "precious contents\n"
    );
}

#[test]
fn given_a_marker_directory_others_can_write_then_no_marker_is_written_or_believed() {
    let daemon = FakeDaemon::start(Behaviour::Silent);
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    // A fresh marker someone left there says nothing ...
    let planted = marker_path(shared.path(), &daemon.socket);
    std::fs::write(&planted, "005\n").unwrap();
    std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (took, _) = timed(&daemon, 300, Some(shared.path()));
    assert!(
        took >= Duration::from_millis(300),
        "believed: took {took:?}"
    );
    assert_eq!(daemon.check_ins(), 1);
    assert_eq!(
        std::fs::read_to_string(&planted).unwrap(),
        "005\n",
        "written"
    );
    // ... and none is written there (the next process waits again).
    std::fs::remove_file(&planted).unwrap();
    let (took, _) = timed(&daemon, 300, Some(shared.path()));
    assert!(took >= Duration::from_millis(300), "took {took:?}");
    assert!(
        markers_in(shared.path()).is_empty(),
        "a marker in a shared directory"
    );
    assert_eq!(daemon.check_ins(), 2);
}

#[test]
fn given_no_private_directory_then_no_marker_is_left_in_tmp() {
    let daemon = FakeDaemon::start(Behaviour::Silent);
    let tmp_marker = marker_path(Path::new("/tmp"), &daemon.socket);
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("METALIFT_TIMEOUT_MS", "300")
        .env_remove("XDG_RUNTIME_DIR");
    assert_stock(&probe_json(cmd));
    assert_eq!(daemon.check_ins(), 1);
    assert!(!tmp_marker.exists(), "a marker in /tmp: {tmp_marker:?}");
}

#[test]
fn given_a_marker_others_can_write_then_it_is_not_believed() {
    let daemon = FakeDaemon::start(Behaviour::Silent);
    let dir = daemon.socket.parent().unwrap();
    let marker = marker_path(dir, &daemon.socket);
    std::fs::write(&marker, "005\n").unwrap();
    std::fs::set_permissions(&marker, std::fs::Permissions::from_mode(0o666)).unwrap();
    let (took, _) = timed(&daemon, 300, None);
    assert!(
        took >= Duration::from_millis(300),
        "believed: took {took:?}"
    );
    assert_eq!(daemon.check_ins(), 1);
}

/// Issue 42 item 6: a symlink planted where the marker goes is never written
/// through (the marker is opened with `O_NOFOLLOW`): its target, a file of
/// this user's that would pass every check on the open descriptor, keeps its
/// contents, and the link is not believed.
#[test]
fn given_a_marker_that_is_a_symlink_then_its_target_is_not_written_through_nor_believed() {
    let daemon = FakeDaemon::start(Behaviour::Silent);
    let dir = daemon.socket.parent().unwrap();
    let victim = dir.join("victim");
    std::fs::write(&victim, "precious contents\n").unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let marker = marker_path(dir, &daemon.socket);
    std::os::unix::fs::symlink(&victim, &marker).unwrap();
    for _ in 0..2 {
        // Each waits its deadline: the first times out (and would note it),
        // the second would believe what the first wrote through the link.
        let (took, _) = timed(&daemon, 300, None);
        assert!(
            took >= Duration::from_millis(300),
            "believed: took {took:?}"
        );
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "precious contents\n",
            "the link's target was written through"
        );
    }
    assert_eq!(daemon.check_ins(), 2, "a linked marker is not believed");
    assert!(
        std::fs::symlink_metadata(&marker)
            .unwrap()
            .file_type()
            .is_symlink(),
        "the link itself is left as it was"
    );
}

/// Issue 42 item 6: another user's marker is neither believed nor written,
/// even by root (who may write any file): the marker's owner must be the
/// process's uid. The test runs as root and plants the marker as uid 65534.
#[test]
fn given_another_users_marker_then_it_is_neither_believed_nor_written() {
    let daemon = FakeDaemon::start(Behaviour::Silent);
    let dir = daemon.socket.parent().unwrap();
    let marker = marker_path(dir, &daemon.socket);
    std::fs::write(&marker, "005\n").unwrap();
    std::fs::set_permissions(&marker, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&marker, Some(65534), Some(65534))
        .expect("chown the marker to uid 65534: run the tests as root");
    // Fresh and five timeouts in a row: believed, it would skip the check-in.
    let (took, _) = timed(&daemon, 300, None);
    assert!(
        took >= Duration::from_millis(300),
        "believed: took {took:?}"
    );
    assert_eq!(daemon.check_ins(), 1, "another user's marker was believed");
    assert_eq!(
        std::fs::read_to_string(&marker).unwrap(),
        "005\n",
        "another user's marker was written"
    );
    assert_eq!(std::fs::metadata(&marker).unwrap().uid(), 65534);
}
