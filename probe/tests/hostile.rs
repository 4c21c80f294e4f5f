//! libmetalift injected into programs that are hard on their descriptors and
//! processes (`probe/hostile/hostile.c`): they close every descriptor and reuse
//! the numbers (also after fork + setsid), start with 0/1/2 closed, fork before
//! and after the check-in, exec. Their files and output must be byte-identical
//! to an unshimmed run (with a stock verdict, so the answers match), none of
//! their descriptors may be closed by the shim (they check, exit status 10+),
//! and a child forked before any device registers its own and gets its own
//! check-in, verdict and outcome. (A child forked after the parent registered,
//! or while it registers, is Metal's case: `simmetal_truth.rs`.)
//!
//! Linux only: the simulated Metal and `LD_PRELOAD`.
#![cfg(target_os = "linux")]

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Command, Output};

use metalift_policy::verdict::Mode;
use metalift_policy::wire::OutcomeResult;
use support::*;

/// Runs `program mode [OUT]` unshimmed, then shimmed against `daemon`; returns
/// (output, OUT's contents) for both.
fn both(
    program: &str,
    args: &[&str],
    daemon: &FakeDaemon,
    env: &[(&str, &str)],
) -> ((Output, Vec<u8>), (Output, Vec<u8>)) {
    let dir = tempfile::tempdir().unwrap();
    let mut results = Vec::new();
    for shimmed in [false, true] {
        let out = dir.path().join(if shimmed { "shimmed" } else { "plain" });
        let mut cmd = if shimmed {
            injected(hostile(program), &daemon.socket)
        } else {
            clean(hostile(program))
        };
        cmd.args(args);
        if args.first() != Some(&"fork") && args.first() != Some(&"exec") {
            cmd.arg(&out);
        }
        cmd.envs(env.iter().copied());
        let output = run(cmd, b"");
        let file = std::fs::read(&out).unwrap_or_default();
        results.push((output, file));
    }
    let shimmed = results.pop().unwrap();
    let plain = results.pop().unwrap();
    (plain, shimmed)
}

fn assert_identical(plain: &(Output, Vec<u8>), shimmed: &(Output, Vec<u8>)) {
    assert_eq!(
        plain.0.status.code(),
        Some(0),
        "unshimmed run: {:?}",
        plain.0
    );
    assert_eq!(
        shimmed.0.status.code(),
        Some(0),
        "shimmed run: {:?}",
        shimmed.0
    );
    assert_eq!(
        String::from_utf8_lossy(&shimmed.1),
        String::from_utf8_lossy(&plain.1),
        "the program's file"
    );
    assert_eq!(
        String::from_utf8_lossy(&shimmed.0.stdout),
        String::from_utf8_lossy(&plain.0.stdout),
        "stdout"
    );
    assert_eq!(
        String::from_utf8_lossy(&shimmed.0.stderr),
        String::from_utf8_lossy(&plain.0.stderr),
        "stderr"
    );
}

#[test]
fn a_program_that_closes_every_descriptor_and_reuses_the_number_keeps_its_file() {
    for (behaviour, family) in [(stock(Mode::Enforce, false), 5), (unlock(APPLE7), 7)] {
        let daemon = FakeDaemon::start(behaviour);
        let (mut plain, shimmed) = both("metalift-hostile", &["closefds"], &daemon, &[]);
        // The program closed the shim's connection and reused its number: its
        // file is untouched (the unlock itself was decided before), and the
        // shim wrote nothing into it (the outcome had nowhere to go).
        let text =
            String::from_utf8_lossy(&plain.1).replace("family 5", &format!("family {family}"));
        plain.1 = text.into_bytes();
        assert_identical(&plain, &shimmed);
        assert_eq!(daemon.check_ins(), 1);
        assert!(daemon.garbage().is_empty(), "{:?}", daemon.garbage());
    }
}

#[test]
fn a_child_that_calls_setsid_and_closes_every_descriptor_keeps_its_files_and_checks_in_itself() {
    let daemon = FakeDaemon::start(stock(Mode::Enforce, false));
    let (plain, shimmed) = both("metalift-hostile", &["forksetsid"], &daemon, &[]);
    assert_identical(&plain, &shimmed);

    let daemon = FakeDaemon::start(unlock(APPLE7));
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("child");
    let mut cmd = injected(hostile("metalift-hostile"), &daemon.socket);
    cmd.arg("forksetsid").arg(&out);
    let output = run(cmd, b"");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "child family 7\n");
    assert_eq!(String::from_utf8_lossy(&output.stdout), "parent family 7\n");
    assert_own_sessions(&daemon, 2);
}

#[test]
fn a_program_started_with_0_1_2_closed_gets_them_for_its_own_files() {
    let wrapper = |program: &Path| {
        let mut cmd = clean("sh");
        cmd.arg("-c")
            .arg(r#"exec "$0" stdio "$1" <&- >&- 2>&-"#)
            .arg(program);
        cmd
    };
    let dir = tempfile::tempdir().unwrap();
    for behaviour in [stock(Mode::Enforce, false), unlock(APPLE7)] {
        let daemon = FakeDaemon::start(behaviour.clone());
        let mut files = Vec::new();
        for shimmed in [false, true] {
            let out = dir.path().join(format!("stdio-{shimmed}"));
            let mut cmd = wrapper(&hostile("metalift-hostile"));
            cmd.arg(&out);
            if shimmed {
                cmd.env("LD_PRELOAD", shim())
                    .env("METALIFT_SOCKET", &daemon.socket)
                    .env("METALIFT_TIMEOUT_MS", "10000");
            }
            let output = run(cmd, b"");
            assert_eq!(
                output.status.code(),
                Some(0),
                "shimmed={shimmed}: {output:?}"
            );
            files.push(std::fs::read_to_string(&out).unwrap());
        }
        let expected = if matches!(behaviour, Behaviour::Verdict(ref v) if v.capabilities.is_some())
        {
            "family 7\na line on stderr\n"
        } else {
            "family 5\na line on stderr\n"
        };
        assert_eq!(files[0], "family 5\na line on stderr\n");
        assert_eq!(files[1], expected);
        assert!(daemon.garbage().is_empty(), "{:?}", daemon.garbage());
    }

    // With METALIFT_DEBUG=1 the debug text goes to the program's own fd 2 and
    // nothing can raise SIGPIPE.
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let out = dir.path().join("stdio-debug");
    let mut cmd = wrapper(&hostile("metalift-hostile"));
    cmd.arg(&out)
        .env("LD_PRELOAD", shim())
        .env("METALIFT_SOCKET", &daemon.socket)
        .env("METALIFT_DEBUG", "1");
    let output = run(cmd, b"");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let text = std::fs::read_to_string(&out).unwrap();
    assert!(
        text.contains("family 7\n") && text.contains("a line on stderr\n"),
        "{text}"
    );
    assert!(text.contains("libmetalift: applied"), "{text}");
    assert!(daemon.garbage().is_empty(), "{:?}", daemon.garbage());
    assert_eq!(daemon.outcome().result, OutcomeResult::Applied);
}

/// `n` check-ins from `n` distinct pids, and `n` applied outcomes, each on the
/// connection of the pid that checked in.
fn assert_own_sessions(daemon: &FakeDaemon, n: usize) {
    let outcomes = daemon.outcomes_with_pids(n);
    std::thread::sleep(std::time::Duration::from_millis(100));
    let pids: BTreeSet<u32> = daemon.check_in_pids().into_iter().collect();
    assert_eq!(daemon.check_ins(), n as u64, "{pids:?}");
    assert_eq!(pids.len(), n, "distinct pids: {pids:?}");
    let outcome_pids: BTreeSet<u32> = outcomes.iter().map(|(pid, _)| *pid).collect();
    assert_eq!(outcome_pids, pids, "{outcomes:?}");
    for (_, outcome) in &outcomes {
        assert_eq!(outcome.result, OutcomeResult::Applied, "{outcome:?}");
    }
    assert_eq!(daemon.outcomes_now().len(), n);
}

fn pids_in(stdout: &[u8]) -> BTreeSet<u32> {
    String::from_utf8_lossy(stdout)
        .lines()
        .map(|line| line.split(' ').nth(1).unwrap().parse().unwrap())
        .collect()
}

fn fork_case(program: &str, env: &[(&str, &str)]) {
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(hostile(program), &daemon.socket);
    cmd.arg("fork").envs(env.iter().copied());
    let output = run(cmd, b"");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        stdout.contains("family 7") && !stdout.contains("family 5"),
        "{stdout}"
    );
    assert_own_sessions(&daemon, 2);
    let printed = pids_in(&output.stdout);
    let seen: BTreeSet<u32> = daemon.check_in_pids().into_iter().collect();
    assert_eq!(printed, seen, "the daemon saw the child's own pid");

    let daemon = FakeDaemon::start(stock(Mode::Enforce, false));
    let mut cmd = injected(hostile(program), &daemon.socket);
    cmd.arg("fork").envs(env.iter().copied());
    let output = run(cmd, b"");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout)
            .matches("family 5")
            .count(),
        2
    );
}

#[test]
fn a_child_forked_before_any_device_registers_its_own_and_checks_in_itself() {
    fork_case("metalift-hostile", &[]);
}

#[test]
fn a_child_forked_before_metal_is_loaded_registers_its_own_and_checks_in_itself() {
    let metal = simmetal("normal").join("libsimmetal.so");
    fork_case(
        "metalift-hostile-late",
        &[("HOSTILE_METAL", metal.to_str().unwrap())],
    );
}

#[test]
fn a_fork_while_the_first_device_waits_for_its_verdict_is_not_held_and_the_child_dies_on_metals_lock(
) {
    // The daemon answers after 2 s: the fork lands (300 ms in) while the first
    // device's thread holds the shim's locks and Metal's registration lock. The
    // fork is not held for the verdict (the prepare handler only tries the
    // shim's locks). The child inherits Metal's lock held by a thread it does
    // not have and dies when its own device creation takes it, as
    // os_unfair_lock does (SIGTRAP: probe/simmetal/simmetal.m,
    // sim_register_lock), before the shim sees anything: one check-in, the
    // parent's. Red with the simulation's old atfork reset of its lock (the
    // child checked in itself and printed family 7).
    let daemon = FakeDaemon::start_delayed(unlock(APPLE7), std::time::Duration::from_secs(2));
    let mut cmd = injected(hostile("metalift-hostile"), &daemon.socket);
    cmd.arg("forkwait");
    let output = run(cmd, b"");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{output:?}");
    assert!(
        stdout.contains(&format!("child ended: signal {}", libc::SIGTRAP)),
        "{stdout}\n{stderr}"
    );
    assert!(
        stderr.contains("os_unfair_lock is corrupt, or owner thread exited without unlocking"),
        "{stderr}"
    );
    assert!(
        !stdout
            .lines()
            .any(|l| l.starts_with("child ") && l.contains("family")),
        "the child printed no family: {stdout}"
    );
    assert!(
        stdout.contains("parent") && stdout.contains("family 7"),
        "{stdout}"
    );
    assert_eq!(daemon.check_ins(), 1, "only the parent checked in");
    let fork_ms: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("fork took "))
        .and_then(|l| l.trim_end_matches(" ms").parse().ok())
        .unwrap_or_else(|| panic!("no fork time: {stdout}"));
    assert!(
        fork_ms < 300,
        "fork() was held {fork_ms} ms for the verdict"
    );
}

#[test]
fn a_program_that_links_metal_but_creates_no_device_makes_no_connection_and_execs_untouched() {
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let (plain, shimmed) = both("metalift-hostile", &["exec"], &daemon, &[]);
    assert_identical(&plain, &shimmed);
    assert_eq!(daemon.connections(), 0, "no device, no connection");
}

#[test]
fn a_program_that_execs_with_the_check_in_open_hands_the_new_image_no_descriptor_of_the_shim() {
    // devexec creates a device and asks it nothing, then execs. Since v4 the
    // outcome has gone out (and the connection closed) inside the device's
    // creation; the new image must hold no descriptor of the shim either way.
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let (plain, shimmed) = both("metalift-hostile", &["devexec"], &daemon, &[]);
    assert_identical(&plain, &shimmed);
    assert_eq!(daemon.check_ins(), 1, "the Metal program checked in");
    // The exec'd `sh` and `ls` never touch Metal: one connection in all.
    assert_eq!(daemon.connections(), 1);
}

/// What `metalift-hostile[-late] dlerror [nodevice]` printed, with the shim.
fn dlerror_lines(program: &str, args: &[&str], daemon: &FakeDaemon) -> Vec<String> {
    let mut cmd = injected(hostile(program), &daemon.socket);
    cmd.arg("dlerror").args(args);
    let output = run(cmd, b"");
    assert!(output.status.success(), "{output:?}");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

fn assert_no_stale_dlerror(lines: &[String]) {
    assert_eq!(lines[0], "start: NULL", "{lines:?}");
    assert_eq!(lines[1], "device: NULL", "{lines:?}");
    assert!(
        lines[2].starts_with("own: ") && lines[2].contains("metalift_hostile_no_such_symbol"),
        "the program's own failed dlsym is still reported: {lines:?}"
    );
}

#[test]
fn given_a_metal_program_then_the_shim_leaves_nothing_in_its_dlerror() {
    let daemon = FakeDaemon::start(unlock(APPLE7));
    assert_no_stale_dlerror(&dlerror_lines("metalift-hostile", &[], &daemon));
    assert_no_stale_dlerror(&dlerror_lines("metalift-hostile", &["nodevice"], &daemon));
}

#[test]
fn given_a_program_without_metal_then_the_shim_leaves_nothing_in_its_dlerror() {
    let daemon = FakeDaemon::start(unlock(APPLE7));
    assert_no_stale_dlerror(&dlerror_lines(
        "metalift-hostile-late",
        &["nodevice"],
        &daemon,
    ));
    assert_eq!(daemon.connections(), 0);
}

#[test]
fn the_hostile_programs_run_as_expected_without_the_shim() {
    let out = tempfile::NamedTempFile::new().unwrap();
    let status = Command::new(hostile("metalift-hostile"))
        .arg("closefds")
        .arg(out.path())
        .status()
        .unwrap();
    assert!(status.success());
    assert_eq!(
        std::fs::read_to_string(out.path()).unwrap(),
        "before the device\nfamily 5\nafter the device: still open\n"
    );
}

#[test]
fn a_debug_line_to_a_stderr_nobody_reads_raises_no_sigpipe_in_the_host() {
    use std::os::unix::process::ExitStatusExt;
    let daemon = FakeDaemon::start(unlock(APPLE7));
    // A C program keeps SIGPIPE's default action (Rust programs ignore it).
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let mut cmd = injected(hostile("metalift-hostile"), &daemon.socket);
    cmd.arg("dlerror")
        .env("METALIFT_DEBUG", "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(writer);
    let output = cmd.output().unwrap();
    assert_eq!(output.status.signal(), None, "killed: {output:?}");
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert!(
        String::from_utf8_lossy(&output.stdout).contains("device:"),
        "{output:?}"
    );
}
