//! libmetalift against the real metaliftd: a process that never touches Metal
//! leaves no audit record and no daemon log line; a Metal process leaves its
//! decision and outcome (the positive control); a profile above the host chip's
//! family is applied at the host's.
//!
//! Needs `metaliftd` next to the probe (`cargo build --workspace`, as
//! `scripts/test.sh` does). Linux only (the simulated Metal).
#![cfg(target_os = "linux")]

mod support;

use std::time::{Duration, Instant};

use support::*;

/// The real daemon, with what these tests ask of it.
struct Daemon(RealDaemon);

impl std::ops::Deref for Daemon {
    type Target = RealDaemon;
    fn deref(&self) -> &RealDaemon {
        &self.0
    }
}

impl Daemon {
    fn start() -> Daemon {
        Daemon::start_with(7, None)
    }

    /// A daemon whose `apple7` profile asks `family`, on a host whose chip brand
    /// is `brand` (METALIFT_HOST_CHIP_BRAND, the daemon's own environment).
    fn start_with(family: u8, brand: Option<&str>) -> Daemon {
        Daemon::start_full(family, brand, "unlock = \"apple7\"")
    }

    /// A daemon whose policy says `probe_action` for the probe.
    fn start_full(family: u8, brand: Option<&str>, probe_action: &str) -> Daemon {
        // Unlocks the probe and, were they to ask, /bin/true and sh as well.
        let mut policy = String::from(
            "version = 1\nmode = \"enforce\"\n\n[profile.apple7]\napple_family_max = FAMILY\n\
             max_threadgroup_memory = 32768\n",
        )
        .replace("FAMILY", &family.to_string());
        for (id, path, action) in [
            ("probe", probe(), probe_action),
            ("true", "/usr/bin/true".into(), "unlock = \"apple7\""),
            ("sh", "/usr/bin/dash".into(), "unlock = \"apple7\""),
        ] {
            policy.push_str(&format!(
                "\n[[rule]]\nid = \"{id}\"\npath = {:?}\n{action}\n",
                path.display().to_string()
            ));
        }
        Daemon(RealDaemon::start(&policy, brand))
    }

    /// The audit records of kind decision or outcome.
    fn records(&self) -> Vec<serde_json::Value> {
        std::thread::sleep(Duration::from_millis(300));
        self.records_of(&["decision", "outcome"])
    }

    /// The log once the daemon has stopped writing its start-up lines (the
    /// watcher's DEBUG lines can land after the socket exists): unchanged for
    /// 300 ms. Without this the snapshot raced the start-up and the test flaked.
    fn settled_log(&self) -> String {
        let deadline = Instant::now() + PATIENCE;
        let mut last = self.log();
        loop {
            std::thread::sleep(Duration::from_millis(300));
            let now = self.log();
            if now == last {
                return now;
            }
            assert!(Instant::now() < deadline, "metaliftd kept logging: {now}");
            last = now;
        }
    }
}

#[test]
fn a_process_without_metal_leaves_no_audit_record_and_no_daemon_log_line() {
    let daemon = Daemon::start();
    let log_before = daemon.settled_log();
    for program in [
        vec!["/usr/bin/true"],
        vec!["sh", "-c", "echo hi | cat >/dev/null; ls / >/dev/null"],
    ] {
        let mut cmd = injected(program[0], &daemon.socket());
        cmd.args(&program[1..]);
        assert!(cmd.status().unwrap().success());
    }
    assert_eq!(daemon.records(), Vec::<serde_json::Value>::new());
    assert_eq!(daemon.log(), log_before, "the daemon logged something");

    // The positive control: the probe (Metal) is decided, unlocked and reported.
    assert_apple7(&probe_json(injected(probe(), &daemon.socket())));
    let records = daemon.records();
    let kinds: Vec<&str> = records.iter().filter_map(|r| r["kind"].as_str()).collect();
    assert_eq!(kinds, ["decision", "outcome"], "{records:?}");
    assert_eq!(records[1]["result"], "applied", "{records:?}");
}

#[test]
fn given_an_m1_host_and_a_profile_asking_apple9_then_the_probe_is_apple7_and_the_record_says_why() {
    let daemon = Daemon::start_with(9, Some("Apple M1 (Virtual)"));
    let report = probe_json(injected(probe(), &daemon.socket()));
    assert_apple7(&report);
    // Metal's own bf16 emulation stays on: Apple9 was not claimed.
    assert_eq!(report["requires_bf16_emulation"], true, "{report}");
    let records = daemon.records();
    let decision = &records[0];
    assert_eq!(decision["kind"], "decision", "{records:?}");
    assert_eq!(decision["apple_family_requested"], 9, "{decision}");
    assert_eq!(decision["apple_family_max"], 7, "{decision}");
    let why = decision["apple_family_capped"].as_str().unwrap_or_default();
    assert!(
        why.contains("Apple M1 (Virtual)") && why.contains("Apple7"),
        "{decision}"
    );
    assert_eq!(records[1]["result"], "applied", "{records:?}");
}

#[test]
fn given_an_m3_host_and_a_profile_asking_apple9_then_the_probe_is_apple9() {
    let daemon = Daemon::start_with(9, Some("Apple M3 Max (Virtual)"));
    let report = probe_json(injected(probe(), &daemon.socket()));
    assert_eq!(report["apple_family"], 9, "{report}");
    assert_eq!(report["requires_bf16_emulation"], false, "{report}");
    assert!(daemon.records()[0]["apple_family_capped"].is_null());
}

/// What the probe's capability IMPs are (`-[Class selector]` -> image).
fn capability_imps(report: &serde_json::Value) -> serde_json::Value {
    report["capability_imps"].clone()
}

#[test]
fn given_the_policy_allows_the_probe_then_apple7_every_llama_flag_no_metal3_and_an_applied_outcome_with_true_stock_answers(
) {
    let daemon = Daemon::start();
    let report = probe_json(injected(probe(), &daemon.socket()));
    assert_apple7(&report);
    assert_eq!(report["requires_bf16_emulation"], true, "{report}");
    let records = daemon.records();
    let outcome = &records[1];
    assert_eq!(outcome["kind"], "outcome", "{records:?}");
    assert_eq!(outcome["result"], "applied", "{outcome}");
    assert_eq!(
        outcome["decision_id"], records[0]["decision_id"],
        "{records:?}"
    );
    assert_eq!(outcome["stock"]["threadgroup_memory"], 32768, "{outcome}");
    assert_eq!(outcome["stock"]["working_set"], 11453251584u64, "{outcome}");
}

#[test]
fn given_the_policy_denies_the_probe_then_metals_own_methods_and_a_stock_outcome_with_true_answers()
{
    let daemon = Daemon::start_full(7, None, "stock = true");
    let report = probe_json(injected(probe(), &daemon.socket()));
    assert_stock(&report);
    assert_eq!(report["shim_imps"], 0, "{report}");
    assert_eq!(
        capability_imps(&report),
        capability_imps(&probe_json(clean(probe()))),
        "exactly Metal's own methods"
    );
    let records = daemon.records();
    let outcome = &records[1];
    assert_eq!(outcome["kind"], "outcome", "{records:?}");
    assert_eq!(outcome["result"], "stock", "{outcome}");
    assert_eq!(outcome["stock"]["threadgroup_memory"], 32768, "{outcome}");
    assert_eq!(outcome["stock"]["working_set"], 11453251584u64, "{outcome}");
    assert_eq!(outcome["stock"], outcome["effective"], "{outcome}");
}

#[test]
fn given_a_rule_whose_window_ends_during_the_test_then_unlock_before_and_stock_after_without_a_reload(
) {
    use metalift_policy::window::{format_rfc3339, parse_rfc3339};
    // Far enough ahead for a loaded machine to start the daemon and run the probe
    // once; the test then waits past it. `until` is written to the second.
    let until = format_rfc3339(std::time::SystemTime::now() + Duration::from_secs(12));
    let until_at = parse_rfc3339(&until).expect("our own time");
    let daemon = Daemon::start_full(7, None, &format!("unlock = \"apple7\"\nuntil = {until}"));

    let status =
        metalift_daemon::service::status::request(&daemon.socket(), PATIENCE).expect("status");
    let next = status
        .next_change
        .clone()
        .expect("status shows the next change");
    assert_eq!(
        (next.at.as_str(), next.rule.as_str(), next.edge.as_str()),
        (until.as_str(), "probe", "closes")
    );
    assert!(
        status
            .to_text()
            .contains(&format!("next change     {until} rule `probe` closes")),
        "{}",
        status.to_text()
    );

    assert_apple7(&probe_json(injected(probe(), &daemon.socket())));
    let before = daemon.records();
    assert_eq!(before[0]["action"], "unlock", "{before:?}");
    assert_eq!(before[0]["window"]["until"], until.as_str(), "{before:?}");
    assert!(
        parse_rfc3339(before[0]["time"].as_str().unwrap_or_default()).expect("time") < until_at,
        "the first decision must fall inside the window: {before:?}"
    );

    while std::time::SystemTime::now() < until_at + Duration::from_millis(200) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_stock(&probe_json(injected(probe(), &daemon.socket())));
    let after = daemon.records();
    let decision = &after[2];
    assert_eq!(decision["kind"], "decision", "{after:?}");
    assert_eq!(decision["action"], "stock", "{decision}");
    assert!(
        decision["rule"].is_null() && decision["window"].is_null(),
        "{decision}"
    );
    assert_eq!(
        decision["policy_sha256"], before[0]["policy_sha256"],
        "{decision}"
    );
    // No reload in between: the policy loaded once, at start.
    let loads = daemon.records_of(&["policy_loaded", "policy_rejected"]);
    assert_eq!(loads.len(), 1, "{loads:?}");
    assert_eq!(loads[0]["reason"], "start", "{loads:?}");
    let status =
        metalift_daemon::service::status::request(&daemon.socket(), PATIENCE).expect("status");
    assert_eq!(status.next_change, None);
}

#[test]
fn given_a_generic_job_claim_then_the_decision_and_its_outcome_carry_it_and_the_verdict_is_unchanged(
) {
    let daemon = Daemon::start();
    let mut cmd = injected(probe(), &daemon.socket());
    cmd.env("METALIFT_JOB_ID", "tart-nightly-17")
        .env("METALIFT_JOB_URL", "https://ci.example/jobs/17")
        .env("METALIFT_JOB_SECRET", "not allow-listed");
    assert_apple7(&probe_json(cmd));
    let records = daemon.records();
    let (decision, outcome) = (&records[0], &records[1]);
    assert_eq!(decision["action"], "unlock", "{decision}");
    let job = serde_json::json!({
        "METALIFT_JOB_ID": "tart-nightly-17",
        "METALIFT_JOB_URL": "https://ci.example/jobs/17",
    });
    assert_eq!(decision["advisory"]["job"], job, "{decision}");
    assert_eq!(outcome["kind"], "outcome", "{records:?}");
    assert_eq!(
        outcome["decision_id"], decision["decision_id"],
        "{records:?}"
    );
    assert_eq!(
        outcome["job"], job,
        "the outcome carries its decision's job: {outcome}"
    );

    // Without a claim, the outcome has no `job` key at all.
    assert_apple7(&probe_json(injected(probe(), &daemon.socket())));
    let records = daemon.records();
    assert!(records[3].get("job").is_none(), "{:?}", records[3]);
}
