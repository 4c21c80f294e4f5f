//! PolicyStore without the watcher: what the daemon starts with, what a reload
//! audits, and that a check-in never sees a half-loaded policy.

#[path = "record_schema.rs"]
mod record_schema;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use metalift_daemon::audit::{AuditLog, Rotation};
use metalift_daemon::live_policy::store::{PolicyStore, ReloadOutcome};
use metalift_policy::{LoadOptions, Policy};
use serde_json::Value;

fn policy_with_rules(n: usize) -> String {
    let mut text = String::from("version = 1\n\n[profile.apple7]\napple_family_max = 7\n");
    for i in 0..n {
        text.push_str(&format!(
            "\n[[rule]]\nid = \"rule-{i}\"\npath = \"/opt/tool-{i}/bin/*\"\nunlock = \"apple7\"\n"
        ));
    }
    text
}

fn records(path: &Path) -> Vec<Value> {
    record_schema::valid_records(path)
}

fn kinds(path: &Path) -> Vec<String> {
    records(path)
        .iter()
        .map(|r| {
            format!(
                "{}:{}",
                r["kind"].as_str().unwrap(),
                r["reason"].as_str().unwrap_or("")
            )
        })
        .collect()
}

struct Setup {
    _tmp: tempfile::TempDir,
    policy: std::path::PathBuf,
    audit_path: std::path::PathBuf,
    audit: AuditLog,
}

fn setup(initial: Option<&str>) -> Setup {
    let tmp = tempfile::tempdir().unwrap();
    let policy = tmp.path().join("policy.toml");
    if let Some(text) = initial {
        std::fs::write(&policy, text).unwrap();
    }
    let audit_path = tmp.path().join("audit.jsonl");
    let audit = AuditLog::open(&audit_path, Rotation::default()).unwrap();
    Setup {
        _tmp: tmp,
        policy,
        audit_path,
        audit,
    }
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
fn given_no_policy_file_at_start_then_no_rules_the_start_is_audited_and_the_missing_file_stands() {
    let s = setup(None);
    let store = PolicyStore::load_initial(&s.policy, LoadOptions::default(), &s.audit).unwrap();
    let live = store.current();
    assert_eq!(live.rule_count, 0);
    assert_eq!(live.sha256, Policy::empty().sha256_hex());
    // Nothing to keep at start, but the missing file stands as a refusal (status: degraded).
    let error = store
        .last_error()
        .expect("the missing file is a standing refusal");
    assert!(error.contains("no such policy file"), "{error}");
    assert!(store
        .published()
        .refusal
        .as_ref()
        .is_some_and(|r| r.missing));
    assert_eq!(kinds(&s.audit_path), vec!["policy_loaded:missing"]);
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
fn given_a_deleted_policy_then_the_last_good_stays_live_drop_ins_included_and_the_refusal_is_audited(
) {
    let s = setup(Some(&policy_with_rules(2)));
    let dropins = s.policy.parent().unwrap().join("policy.d");
    std::fs::create_dir(&dropins).unwrap();
    std::fs::write(
        dropins.join("10-fleet.toml"),
        "[[rule]]\nid = \"fleet\"\nname = \"fleet-tool\"\nunlock = \"apple7\"\n",
    )
    .unwrap();
    let store = PolicyStore::load_initial(&s.policy, LoadOptions::default(), &s.audit).unwrap();
    let good = store.current();
    assert_eq!(good.rule_count, 3, "{:?}", store.last_error());

    std::fs::remove_file(&s.policy).unwrap();
    assert_eq!(store.reload(&s.audit), ReloadOutcome::Missing);
    let live = store.current();
    assert_eq!(live.sha256, good.sha256, "the last good policy stays live");
    assert_eq!(live.rule_count, 3, "drop-ins included");
    let published = store.published();
    let refusal = published.refusal.as_ref().expect("a standing refusal");
    assert!(refusal.missing);
    let rejected: Vec<Value> = records(&s.audit_path)
        .into_iter()
        .filter(|r| r["kind"] == "policy_rejected")
        .collect();
    assert_eq!(rejected.len(), 1, "{rejected:?}");
    assert_eq!(rejected[0]["kept_sha256"], good.sha256.as_str());
    assert!(
        rejected[0]["errors"][0]
            .as_str()
            .is_some_and(|e| e.contains("no such policy file")),
        "{rejected:?}"
    );
    // Still missing: no second record. Back: the refusal clears.
    assert_eq!(store.reload(&s.audit), ReloadOutcome::Unchanged);
    std::fs::write(&s.policy, policy_with_rules(2)).unwrap();
    assert!(matches!(
        store.reload(&s.audit),
        ReloadOutcome::Loaded { .. }
    ));
    assert!(store.last_error().is_none());
    assert_eq!(store.current().sha256, good.sha256);
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
fn given_invalid_policy_at_start_then_the_daemon_runs_stock_and_says_why() {
    let s = setup(Some("version = 1\nrule = 3\n"));
    let store = PolicyStore::load_initial(&s.policy, LoadOptions::default(), &s.audit).unwrap();
    assert_eq!(store.current().rule_count, 0);
    let error = store
        .last_error()
        .expect("the refusal is kept for `metalift status`");
    assert!(
        error.contains(&format!("{}:2:", s.policy.display())),
        "{error}"
    );
    assert_eq!(
        kinds(&s.audit_path),
        vec!["policy_rejected:", "policy_loaded:rejected_at_start"]
    );
    let rejected = &records(&s.audit_path)[0];
    assert_eq!(rejected["kept_sha256"], Policy::empty().sha256_hex());
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
fn given_the_same_content_again_then_reload_changes_and_audits_nothing() {
    let s = setup(Some(&policy_with_rules(1)));
    let store = PolicyStore::load_initial(&s.policy, LoadOptions::default(), &s.audit).unwrap();
    let before = store.current();
    // Rewritten with identical bytes (a `touch` or a no-op save).
    std::fs::write(&s.policy, policy_with_rules(1)).unwrap();
    assert_eq!(store.reload(&s.audit), ReloadOutcome::Unchanged);
    assert!(Arc::ptr_eq(&before, &store.current()), "nothing swapped");
    assert_eq!(kinds(&s.audit_path), vec!["policy_loaded:start"]);
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
fn given_the_same_refusal_twice_then_it_is_audited_once() {
    let s = setup(Some(&policy_with_rules(1)));
    let store = PolicyStore::load_initial(&s.policy, LoadOptions::default(), &s.audit).unwrap();
    std::fs::write(&s.policy, "version = 2\n").unwrap();
    assert!(matches!(
        store.reload(&s.audit),
        ReloadOutcome::Rejected { .. }
    ));
    assert_eq!(store.reload(&s.audit), ReloadOutcome::Unchanged);
    assert_eq!(
        kinds(&s.audit_path),
        vec!["policy_loaded:start", "policy_rejected:"]
    );
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
fn given_a_refused_edit_reverted_then_the_error_clears_and_the_revert_is_audited() {
    let good = policy_with_rules(1);
    let s = setup(Some(&good));
    let store = PolicyStore::load_initial(&s.policy, LoadOptions::default(), &s.audit).unwrap();
    let sha = store.current().sha256.clone();
    std::fs::write(&s.policy, "version = 1\nmode = 7\n").unwrap();
    assert!(matches!(
        store.reload(&s.audit),
        ReloadOutcome::Rejected { .. }
    ));
    std::fs::write(&s.policy, &good).unwrap();
    assert!(matches!(
        store.reload(&s.audit),
        ReloadOutcome::Loaded { .. }
    ));
    assert!(store.last_error().is_none());
    assert_eq!(store.current().sha256, sha);
    assert_eq!(
        kinds(&s.audit_path),
        vec![
            "policy_loaded:start",
            "policy_rejected:",
            "policy_loaded:restored"
        ]
    );
}

#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
fn given_reloads_under_load_then_every_check_in_sees_one_whole_policy() {
    let s = setup(Some(&policy_with_rules(1)));
    let store =
        Arc::new(PolicyStore::load_initial(&s.policy, LoadOptions::default(), &s.audit).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, done) = (Arc::clone(&store), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut seen = 0u64;
                while !done.load(Ordering::Relaxed) || seen == 0 {
                    let live = store.current();
                    // The snapshot's facts and its compiled policy always agree.
                    assert_eq!(live.sha256, live.policy.sha256_hex());
                    assert_eq!(live.rule_count, live.policy.rule_count());
                    seen += 1;
                }
                seen
            })
        })
        .collect();
    for round in 0..20 {
        std::fs::write(&s.policy, policy_with_rules(1 + round % 7)).unwrap();
        let _ = store.reload(&s.audit);
    }
    done.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    assert_eq!(store.current().rule_count, 1 + 19 % 7);
}

/// The flake this guards: the store once published the new policy and cleared the
/// old error in two steps, so `metalift status` could show a new policy beside
/// the error that an older edit drew. Each published snapshot must be one state.
#[test]
#[cfg_attr(
    not(target_os = "linux"),
    ignore = "the default LoadOptions accept only root-owned policy files: macos.yml runs these under sudo"
)]
fn given_refusals_and_loads_racing_readers_then_no_snapshot_mixes_a_policy_with_another_ones_error()
{
    let s = setup(Some(&policy_with_rules(1)));
    let store =
        Arc::new(PolicyStore::load_initial(&s.policy, LoadOptions::default(), &s.audit).unwrap());
    let done = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, done) = (Arc::clone(&store), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut refusals_seen = 0u64;
                while !done.load(Ordering::Relaxed) {
                    let published = store.published();
                    if let Some(refusal) = &published.refusal {
                        // Each refused text names the rule count of the policy
                        // that was live when it was refused, which stays live.
                        let tag = format!("loud-{}", published.live.rule_count);
                        assert!(
                            refusal.errors.iter().any(|e| e.contains(&tag)),
                            "policy with {} rules shown with another state's error: {:?}",
                            published.live.rule_count,
                            refusal.errors
                        );
                        refusals_seen += 1;
                    }
                }
                refusals_seen
            })
        })
        .collect();
    for round in 1..=60usize {
        let rules = 1 + round % 5;
        std::fs::write(&s.policy, policy_with_rules(rules)).unwrap();
        let _ = store.reload(&s.audit);
        std::fs::write(&s.policy, format!("version = 1\nmode = \"loud-{rules}\"\n")).unwrap();
        let _ = store.reload(&s.audit);
    }
    done.store(true, Ordering::Relaxed);
    let seen: u64 = readers.into_iter().map(|r| r.join().unwrap()).sum();
    assert!(seen > 0, "the readers never saw a refusal");
}
