//! 64 concurrent clients while the policy is rewritten every few milliseconds,
//! valid and invalid editions alternating.
//!
//! Every edition carries a rule for this test binary with an id naming the
//! edition: `gen-<n>` in a valid one (unlock for even `n`, stock for odd), and
//! `bad-<n>` in an invalid one, placed first so that a daemon using any part of a
//! refused file would answer with it. The test computes the sha256 metaliftd
//! records for each valid edition, so each decision can be traced to exactly one
//! edition and checked against what that edition decides.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, SystemTime};

use metalift_policy::wire::WireAction;

use crate::support::{self, Env, Jitter, PROFILE};

/// A valid edition `n`: the rule for `exe`, plus `n % 7` filler rules so the
/// editions differ in size too.
fn valid_edition(exe: &Path, n: usize) -> String {
    let mut text = support::policy_for(exe, &format!("gen-{n}"), n % 2 == 0);
    for i in 0..n % 7 {
        text.push_str(&format!(
            "\n[[rule]]\nid = \"filler-{i}\"\npath = \"/opt/tool-{i}/bin/*\"\nunlock = \"apple7\"\n"
        ));
    }
    text
}

/// An invalid edition `n`: a winning rule `bad-<n>` for `exe`, then one of three
/// kinds of error (unknown profile, unknown key, TOML cut mid-table).
fn invalid_edition(exe: &Path, n: usize) -> String {
    let head = format!(
        "version = 1\nmode = \"enforce\"\n\n{PROFILE}\n[[rule]]\nid = \"bad-{n}\"\npath = {}\nunlock = \"apple7\"\n",
        support::toml_string(&exe.display().to_string())
    );
    // Each error names `n`: metaliftd audits a refusal once, not again when the
    // next edition fails with the very same message.
    let tail = match n % 3 {
        0 => {
            format!("\n[[rule]]\nid = \"broken\"\nname = \"x\"\nunlock = \"no-such-profile-{n}\"\n")
        }
        1 => format!(
            "\n[[rule]]\nid = \"broken\"\nname = \"x\"\nunlock = \"apple7\"\ncolour{n} = \"red\"\n"
        ),
        _ => format!("\n[[rule]]\nid = \"broken-{n}\nname = "),
    };
    head + &tail
}

/// Counts `policy_loaded` and `policy_rejected` lines in the audit log as it
/// grows, reading only what was appended since the last look (the log grows by
/// hundreds of thousands of decisions in the long form).
struct PolicyRecords {
    offset: u64,
    count: usize,
}

impl PolicyRecords {
    fn new() -> PolicyRecords {
        PolicyRecords {
            offset: 0,
            count: 0,
        }
    }

    /// Reads the whole lines appended since the last call; returns the count so far.
    fn update(&mut self, env: &Env) -> usize {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut f) = std::fs::File::open(env.audit_log()) else {
            return self.count;
        };
        let mut new = Vec::new();
        f.seek(SeekFrom::Start(self.offset)).expect("seek");
        f.read_to_end(&mut new).expect("read the audit log");
        let whole = new.iter().rposition(|&b| b == b'\n').map_or(0, |i| i + 1);
        let text = String::from_utf8_lossy(&new[..whole]);
        self.count += text.matches("\"kind\":\"policy_loaded\"").count()
            + text.matches("\"kind\":\"policy_rejected\"").count();
        self.offset += whole as u64;
        self.count
    }

    /// Waits until the log holds a policy record not seen before.
    fn wait_for_new(&mut self, env: &Env) {
        let seen = self.count;
        let start = std::time::Instant::now();
        while self.update(env) <= seen {
            assert!(
                start.elapsed() < support::HANG_GUARD,
                "metaliftd did not act on a policy edition"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// What a client was told.
struct Answer {
    decision_id: u64,
    rule: Option<String>,
    unlock: bool,
}

#[test]
fn given_64_clients_and_reloads_every_few_ms_then_every_check_in_is_answered_audited_once_and_decided_by_one_whole_valid_policy(
) {
    let env = Env::new("rel-load-");
    let exe = support::this_exe();
    let policy = env.policy();
    let mut valid_shas: HashMap<String, usize> = HashMap::new();
    let first = valid_edition(&exe, 0);
    valid_shas.insert(support::policy_sha(&policy, &first), 0);
    env.write_policy(&first);
    // The policy is the test's own file: ownership is the subject of another test.
    let daemon = env.start(&["--allow-insecure-owner"]);

    let clients = 64;
    let per_client = support::scale(60, 1000);
    let writes = support::scale(100, 1000);
    let writing = AtomicBool::new(true);
    let started = std::time::Instant::now();
    let answers: Mutex<Vec<Answer>> = Mutex::new(Vec::new());
    let failures: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let socket = env.socket();

    let written: Vec<(usize, String, bool)> = std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let _stop_clients = support::StopOnDrop(&writing);
            let mut jitter = Jitter::new(0x5eed);
            let mut policy_records = PolicyRecords::new();
            policy_records.update(&env);
            let mut written = Vec::new();
            for n in 1..=writes {
                let valid = n % 2 == 0;
                let text = if valid {
                    valid_edition(&exe, n)
                } else {
                    invalid_edition(&exe, n)
                };
                support::write_atomically(&policy, &text, 0o644);
                written.push((n, text, valid));
                // Mostly a few ms apart (bursts the watcher must debounce), now
                // and then a pause until the daemon has acted on the last edition
                // (a new policy_loaded or policy_rejected record), so reloads of
                // both kinds happen however loaded the machine is; which edition
                // is last before a pause varies.
                if jitter.below(4) == 0 {
                    policy_records.wait_for_new(&env);
                } else {
                    std::thread::sleep(Duration::from_millis(1 + jitter.below(7)));
                }
            }
            writing.store(false, Ordering::SeqCst);
            written
        });
        for _ in 0..clients {
            s.spawn(|| {
                let mut mine = Vec::new();
                while mine.len() < per_client || writing.load(Ordering::SeqCst) {
                    match support::check_in(&socket) {
                        Ok(v) => mine.push(Answer {
                            decision_id: v.decision_id,
                            rule: v.rule,
                            unlock: v.action == WireAction::Unlock,
                        }),
                        Err(e) => {
                            failures.lock().unwrap().push(e.to_string());
                            break;
                        }
                    }
                }
                answers.lock().unwrap().extend(mine);
            });
        }
        writer.join().expect("policy writer")
    });
    let elapsed = started.elapsed();
    // The last edition is invalid or valid; let the watcher settle on it before stopping.
    std::thread::sleep(Duration::from_millis(200));
    let status = daemon.stop().expect("metaliftd stops");
    assert!(status.success(), "metaliftd exited with {status}");

    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} check-ins were not answered, e.g. {:?}",
        failures.len(),
        &failures[..failures.len().min(5)]
    );
    let answers = answers.into_inner().unwrap();
    assert!(answers.len() >= clients * per_client);
    for (n, text, valid) in &written {
        if *valid {
            valid_shas.insert(support::policy_sha(&policy, text), *n);
        }
    }

    // Reloads really happened, both kinds, while the clients were checking in.
    let loaded = env.records_of("policy_loaded");
    let rejected = env.records_of("policy_rejected");
    let changes = loaded.iter().filter(|r| r["reason"] != "start").count();
    assert!(
        changes >= 2 && rejected.len() >= 2,
        "too few reloads to prove anything: {changes} loads, {} refusals",
        rejected.len()
    );
    // Every policy that became live is one of the valid editions.
    let mut live_since: HashMap<String, SystemTime> = HashMap::new();
    for r in &loaded {
        let sha = r["sha256"].as_str().expect("sha256").to_owned();
        assert!(
            valid_shas.contains_key(&sha),
            "a policy no valid edition hashes to became live: {r}"
        );
        let t = support::time_of(r);
        live_since
            .entry(sha)
            .and_modify(|e| *e = (*e).min(t))
            .or_insert(t);
    }

    // Every answered decision is in the log exactly once, and nothing else is.
    let decisions = env.records_of("decision");
    let mut by_id: HashMap<u64, &serde_json::Value> = HashMap::new();
    for d in &decisions {
        let id = d["decision_id"].as_u64().expect("decision_id");
        assert!(by_id.insert(id, d).is_none(), "decision {id} audited twice");
    }
    let answered: HashSet<u64> = answers.iter().map(|a| a.decision_id).collect();
    assert_eq!(
        answered.len(),
        answers.len(),
        "a decision id was given twice"
    );
    let logged: HashSet<u64> = by_id.keys().copied().collect();
    let missing: Vec<_> = answered.difference(&logged).take(5).collect();
    assert!(missing.is_empty(), "answered but not audited: {missing:?}");
    let extra: Vec<_> = logged.difference(&answered).take(5).collect();
    assert!(extra.is_empty(), "audited but never answered: {extra:?}");

    // Each verdict came from one whole valid edition, live at the time, and is
    // what that edition decides.
    for a in &answers {
        let d = by_id[&a.decision_id];
        let sha = d["policy_sha256"].as_str().expect("policy_sha256");
        let Some(&n) = valid_shas.get(sha) else {
            panic!("decision from a policy that is no valid edition: {d}");
        };
        assert!(
            support::time_of(d) >= live_since[sha],
            "decided by a policy before it was live: {d}"
        );
        let want_rule = format!("gen-{n}");
        assert_eq!(a.rule.as_deref(), Some(want_rule.as_str()), "{d}");
        assert_eq!(d["rule"], want_rule.as_str(), "{d}");
        assert_eq!(a.unlock, n % 2 == 0, "edition {n} decides otherwise: {d}");
        assert_eq!(d["action"], if a.unlock { "unlock" } else { "stock" });
    }
    eprintln!(
        "RELIABILITY load: {} check-ins from {clients} clients in {:.1} s ({:.0}/s, debug build), \
         {} policy writes, {changes} reloads to a new policy, {} refusals, every decision \
         audited once and traced to its valid edition",
        answers.len(),
        elapsed.as_secs_f64(),
        answers.len() as f64 / elapsed.as_secs_f64(),
        written.len(),
        rejected.len()
    );
}
