//! Policy files with the wrong owner or mode, dropped in while clients check in.
//!
//! `reload_watcher.rs` shows one ownership refusal in process; this drives the
//! real daemon without `--allow-insecure-owner` through every way a policy can be
//! badly owned (main file, `policy.d/` file, `policy.d/` itself), each carrying a
//! rule that would win for the clients, while 8 clients check in throughout:
//! every refusal is audited, and not one verdict comes from a refused file.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use metalift_policy::wire::WireAction;

use crate::support::{self, Env};

/// An unprivileged owner (`nobody` on Debian and macOS).
const NOBODY: u32 = 65534;

#[test]
fn given_badly_owned_or_writable_policy_files_under_load_then_each_is_refused_audited_and_the_good_policy_stays(
) {
    // A non-root process cannot create a root-owned policy, so no policy would
    // ever be accepted: the test needs root (CI has it).
    if !support::require_root("ownership") {
        return;
    }
    let env = Env::new("rel-owner-");
    let exe = support::this_exe();
    let good = support::policy_for(&exe, "good", true);
    let good_sha = support::policy_sha(&env.policy(), &good);
    env.write_policy(&good);
    let daemon = env.start(&[]);
    let socket = env.socket();
    let running = AtomicBool::new(true);
    let seen: Mutex<Vec<(Option<String>, WireAction)>> = Mutex::new(Vec::new());
    let failures = Mutex::new(Vec::new());

    std::thread::scope(|s| {
        let _stop_clients = support::StopOnDrop(&running);
        for _ in 0..8 {
            s.spawn(|| {
                let mut mine = Vec::new();
                while running.load(Ordering::SeqCst) {
                    match support::check_in(&socket) {
                        Ok(v) => mine.push((v.rule, v.action)),
                        Err(e) => {
                            failures.lock().unwrap().push(e.to_string());
                            break;
                        }
                    }
                }
                seen.lock().unwrap().extend(mine);
            });
        }

        let policy = env.policy();
        let dropin_dir = env.path("etc/policy.d");
        let evil = |id: &str| support::policy_for(&exe, id, false);
        let mut refusals = 0;
        let mut expect_refusal = |what: &str, needle: &str| {
            let rejected = env.wait_for_records("policy_rejected", refusals);
            refusals = rejected.len();
            let last = rejected.last().expect("a refusal");
            let errors = last["errors"].to_string();
            assert!(errors.contains(needle), "{what}: {last}");
            assert_eq!(last["kept_sha256"], good_sha.as_str(), "{what}: {last}");
        };

        // 1. policy.toml owned by someone else.
        let tmp = policy.with_extension("staged");
        std::fs::write(&tmp, evil("bad-owner")).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o644)).unwrap();
        std::os::unix::fs::chown(&tmp, Some(NOBODY), None).unwrap();
        std::fs::rename(&tmp, &policy).unwrap();
        expect_refusal("policy.toml owned by nobody", "owned by uid 65534");

        // 2. policy.toml root's, but group- and world-writable.
        support::write_atomically(&policy, &evil("bad-mode"), 0o666);
        expect_refusal("policy.toml mode 0666", "writable by group or other");

        // 3. Back to the good text (root, 0644): live again, recorded as restored.
        let loads = env.records_of("policy_loaded").len();
        support::write_atomically(&policy, &good, 0o644);
        let loaded = env.wait_for_records("policy_loaded", loads);
        assert_eq!(loaded.last().unwrap()["sha256"], good_sha.as_str());

        // 4. A policy.d/ drop-in owned by someone else.
        std::fs::create_dir(&dropin_dir).unwrap();
        std::fs::set_permissions(&dropin_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let dropin = dropin_dir.join("50-evil.toml");
        let rule_only = "[[rule]]\nid = \"bad-dropin\"\npath = ".to_owned()
            + &support::toml_string(&exe.display().to_string())
            + "\nstock = true\n";
        std::fs::write(dropin_dir.join(".50-evil.staged"), &rule_only).unwrap();
        std::os::unix::fs::chown(dropin_dir.join(".50-evil.staged"), Some(NOBODY), None).unwrap();
        std::fs::rename(dropin_dir.join(".50-evil.staged"), &dropin).unwrap();
        expect_refusal("policy.d file owned by nobody", "owned by uid 65534");

        // 5. policy.d/ itself world-writable, then the drop-in made root's (in
        // that order: a root-owned drop-in in a sound directory would be valid).
        std::fs::set_permissions(&dropin_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        expect_refusal("policy.d mode 0777", "writable by group or other");
        // Counted before the changes below: nothing loads while policy.d/ is 0777,
        // and counting after them could count the very load being waited for.
        let loads = env.records_of("policy_loaded").len();
        std::os::unix::fs::chown(&dropin, Some(0), None).unwrap();

        // Cleanup of the drop-in: the good policy alone is live again.
        std::fs::remove_file(&dropin).unwrap();
        std::fs::set_permissions(&dropin_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        env.wait_for_records("policy_loaded", loads);
        running.store(false, Ordering::SeqCst);
    });
    assert!(daemon.stop().expect("metaliftd stops").success());

    let failures = failures.into_inner().unwrap();
    assert!(failures.is_empty(), "unanswered check-ins: {failures:?}");
    let seen = seen.into_inner().unwrap();
    assert!(!seen.is_empty());
    for (rule, action) in &seen {
        assert_eq!(
            rule.as_deref(),
            Some("good"),
            "a verdict from a refused file"
        );
        assert_eq!(*action, WireAction::Unlock);
    }
    for d in env.records_of("decision") {
        assert_eq!(d["policy_sha256"], good_sha.as_str(), "{d}");
    }
    let status_errors: Vec<_> = env
        .records_of("policy_rejected")
        .iter()
        .map(|r| r["errors"].to_string())
        .collect();
    assert_eq!(status_errors.len(), 4, "{status_errors:?}");
    eprintln!(
        "RELIABILITY ownership: 4 badly owned/writable policy changes refused and audited; {} \
         check-ins during them, all from the good policy",
        seen.len()
    );
}
