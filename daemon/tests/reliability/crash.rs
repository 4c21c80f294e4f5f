//! metaliftd killed with SIGKILL in the middle of 64 clients' check-ins, then
//! restarted on the same socket and audit log.
//!
//! `server_daemon.rs` proves no answered decision is lost for 3 clients and one
//! kill; this extends it to 64 clients, to the shim while the daemon is down, and
//! to the restart (stale socket, same log, ids unique across both runs).

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::support::{self, Env, Injection, HANG_GUARD, PROFILE};

/// 64 clients check in until `stop` is set or the daemon is gone; returns every
/// decision id that was answered. `answered` counts them as they come.
fn load(env: &Env, stop: &AtomicBool, answered: &AtomicUsize) -> Vec<u64> {
    let ids = Mutex::new(Vec::new());
    let socket = env.socket();
    std::thread::scope(|s| {
        for _ in 0..64 {
            s.spawn(|| {
                let mut mine = Vec::new();
                while !stop.load(Ordering::SeqCst) {
                    // Once the daemon is killed, connect or read fails: that client is done.
                    match support::check_in(&socket) {
                        Ok(v) => {
                            mine.push(v.decision_id);
                            answered.fetch_add(1, Ordering::SeqCst);
                        }
                        Err(_) => break,
                    }
                }
                ids.lock().unwrap().extend(mine);
            });
        }
    });
    ids.into_inner().unwrap()
}

#[test]
fn given_sigkill_mid_load_then_no_answered_decision_is_lost_shims_go_stock_and_a_restart_resumes() {
    let env = Env::new("rel-crash-");
    let inject = Injection::locate();
    let exe = support::this_exe();
    env.write_policy(&format!(
        "version = 1\n\n{PROFILE}\n[[rule]]\nid = \"probe\"\npath = {}\nunlock = \"apple7\"\n\n\
         [[rule]]\nid = \"client\"\npath = {}\nunlock = \"apple7\"\n",
        support::toml_string(&inject.probe.display().to_string()),
        support::toml_string(&exe.display().to_string()),
    ));
    let kill_after = support::scale(1_000, 20_000);

    // Run 1: killed while 64 clients are checking in.
    let mut daemon = env.start(&["--allow-insecure-owner"]);
    let stop = AtomicBool::new(false);
    let answered = AtomicUsize::new(0);
    let first_run: Vec<u64> = std::thread::scope(|s| {
        let clients = s.spawn(|| load(&env, &stop, &answered));
        let start = Instant::now();
        while answered.load(Ordering::SeqCst) < kill_after {
            assert!(start.elapsed() < HANG_GUARD * 2, "load did not get going");
            std::thread::sleep(Duration::from_millis(2));
        }
        daemon.kill();
        // The clients stop on their own when the daemon is gone; this is a backstop.
        stop.store(true, Ordering::SeqCst);
        clients.join().expect("clients")
    });
    assert!(first_run.len() >= kill_after);

    // The gap: the socket file is still there, nobody listens. An injected Metal
    // process runs stock, and its reason is "no daemon" (connect refused at once),
    // not a verdict deadline that ran out.
    assert!(
        env.socket().exists(),
        "a SIGKILLed daemon cannot remove its socket"
    );
    let (report, stderr) = inject.run_probe(&env.socket());
    assert_eq!(
        report["apple_family"], 5,
        "not stock during the gap: {report}"
    );
    assert_eq!(
        report["llama_cpp"]["has_simdgroup_reduction"], false,
        "{report}"
    );
    assert!(
        stderr.contains("no daemon at"),
        "the shim did not fail fast on the missing daemon: {stderr}"
    );
    assert!(
        !stderr.contains("deadline"),
        "the shim waited for a deadline: {stderr}"
    );
    let gap_reason = stderr
        .lines()
        .find(|l| l.contains("no daemon at"))
        .unwrap_or_default()
        .trim()
        .to_owned();

    // Run 2: the stale socket is replaced, the same log is appended to.
    let daemon = env.start(&["--allow-insecure-owner"]);
    let (report, _) = inject.run_probe(&env.socket());
    assert_eq!(
        report["apple_family"], 7,
        "not unlocked after restart: {report}"
    );
    let stop = AtomicBool::new(false);
    let answered = AtomicUsize::new(0);
    let second_run: Vec<u64> = std::thread::scope(|s| {
        let clients = s.spawn(|| load(&env, &stop, &answered));
        let start = Instant::now();
        while answered.load(Ordering::SeqCst) < kill_after / 2 {
            assert!(start.elapsed() < HANG_GUARD * 2, "load did not get going");
            std::thread::sleep(Duration::from_millis(2));
        }
        stop.store(true, Ordering::SeqCst);
        clients.join().expect("clients")
    });
    assert!(daemon.stop().expect("metaliftd stops").success());

    // Whole lines only (`records` fails on a torn one), every answered decision
    // present exactly once, ids unique across both runs.
    let decisions = env.records_of("decision");
    let mut count: HashMap<u64, usize> = HashMap::new();
    for d in &decisions {
        *count
            .entry(d["decision_id"].as_u64().expect("id"))
            .or_default() += 1;
    }
    let twice: Vec<_> = count.iter().filter(|(_, n)| **n > 1).take(5).collect();
    assert!(
        twice.is_empty(),
        "decision ids logged more than once: {twice:?}"
    );
    let answered: HashSet<u64> = first_run.iter().chain(&second_run).copied().collect();
    assert_eq!(answered.len(), first_run.len() + second_run.len());
    let missing: Vec<_> = answered
        .iter()
        .filter(|id| !count.contains_key(id))
        .take(5)
        .collect();
    assert!(
        missing.is_empty(),
        "answered but not in the log: {missing:?}"
    );
    assert_eq!(env.records_of("daemon_start").len(), 2);
    assert_eq!(
        env.records_of("daemon_stop").len(),
        1,
        "only the SIGTERMed run can record its stop"
    );
    // The probe's unlock after the restart is both decided and reported.
    let probe = inject.probe.display().to_string();
    let probe_decisions: Vec<_> = decisions
        .iter()
        .filter(|d| d["exe"] == probe.as_str())
        .collect();
    assert_eq!(probe_decisions.len(), 1, "{probe_decisions:?}");
    assert_eq!(probe_decisions[0]["action"], "unlock");
    eprintln!(
        "RELIABILITY crash: {} decisions answered before SIGKILL and {} after the restart, all \
         logged once; the probe during the gap: stock ({})",
        first_run.len(),
        second_run.len(),
        gap_reason
    );
}
