//! `metalift explain --live` and `--decision`, the policy archive behind them, one
//! policy hash across every tool, and `apple_family_max = "host"` — against the real
//! metaliftd binary on a temporary socket, started with the development flag.
//!
//! This test process is the client: it checks in over the raw wire protocol, so the
//! daemon decides for this test binary's own (resolved) executable.
#![cfg(target_os = "linux")]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use metalift_policy::wire::{VerdictMsg, WireAction};
use serde_json::Value;

mod support;

use support::{Daemon, HANG_GUARD};

/// The daemon's directory, and what this file does with it.
struct Env(support::DaemonDir);

impl std::ops::Deref for Env {
    type Target = support::DaemonDir;
    fn deref(&self) -> &support::DaemonDir {
        &self.0
    }
}

impl Env {
    fn new() -> Env {
        Env(support::DaemonDir::new("explain-"))
    }

    /// A policy whose rule `me` decides `verdict` for this test binary.
    fn write_policy(&self, profile_family: &str, verdict: &str) {
        let text = format!(
            "version = 1\n[profile.native]\napple_family_max = {profile_family}\n\n[[rule]]\nid = \"me\"\npath = \"{}\"\n{verdict}\n",
            me().display()
        );
        std::fs::write(self.policy(), text).expect("write policy");
    }

    fn explain(&self, args: &[&str]) -> Output {
        let log = self.audit_log();
        let socket = self.socket();
        let mut all = vec!["explain", "--log", s(&log)];
        all.extend_from_slice(args);
        if args.contains(&"--live") {
            all.extend(["--socket", s(&socket)]);
        }
        metalift(&all)
    }
}

impl Daemon {
    fn live_sha256(&self) -> String {
        metalift_daemon::service::status::request(&self.socket, Duration::from_secs(5))
            .expect("status")
            .policy_sha256
    }

    /// Waits until the live policy's hash is `sha256`.
    fn wait_live(&self, sha256: &str) {
        let start = Instant::now();
        while self.live_sha256() != sha256 {
            assert!(start.elapsed() < HANG_GUARD, "the edit never went live");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Checks in as this process and returns the verdict.
    fn check_in(&self) -> VerdictMsg {
        support::check_in(&self.socket)
    }
}

/// This test binary, resolved, as the kernel reports it to the daemon.
fn me() -> PathBuf {
    std::fs::canonicalize(std::env::current_exe().expect("current exe")).expect("resolve")
}

fn metalift(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(args)
        .env_remove("METALIFT_HOST_CHIP_BRAND")
        .output()
        .expect("run metalift")
}

fn s(p: &Path) -> &str {
    p.to_str().expect("utf-8 temp path")
}

fn out(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The sha256 `metalift validate --json` prints for the policy at `path`.
fn validate_sha256(path: &str) -> String {
    let o = metalift(&["validate", path, "--json", "--skip-host-checks"]);
    let doc: Value = serde_json::from_slice(&o.stdout).expect("validate --json");
    doc["policy"]["sha256"]
        .as_str()
        .unwrap_or_else(|| panic!("no hash: {doc}"))
        .to_owned()
}

/// The contents-only hash of the policy at `path`, valid or not.
fn validate_sha256_any(path: &Path) -> String {
    let read = metalift_policy::read_policy(path).expect("readable");
    metalift_policy::sources_sha256(&read.sources)
}

#[test]
fn given_the_override_brand_apple_m3_max_the_daemon_unlocks_with_ceiling_9() {
    let env = Env::new();
    env.write_policy("\"host\"", "unlock = \"native\"");
    let daemon = env.start(
        &[],
        &[("METALIFT_HOST_CHIP_BRAND", "Apple M3 Max (Virtual)")],
    );
    let v = daemon.check_in();
    assert_eq!(v.action, WireAction::Unlock, "{v:?}");
    assert_eq!(v.capabilities.map(|c| c.apple_family_max), Some(9), "{v:?}");
    // The audit's decision record shows the resolved ceiling, not "host".
    let decisions = env.records_of("decision");
    assert_eq!(
        decisions.last().map(|d| d["apple_family_max"].clone()),
        Some(serde_json::json!(9)),
        "{decisions:?}"
    );
    // A known chip: the load drew no "unknown chip" warning.
    let loaded = env.records_of("policy_loaded");
    assert_eq!(loaded[0]["warnings"], serde_json::json!([]), "{loaded:?}");
    // explain, told the same brand, shows the resolved value and where it came from.
    let o = env.explain(&[
        "--live",
        "--path",
        s(&me()),
        "--host-chip-brand",
        "Apple M3 Max (Virtual)",
    ]);
    assert!(
        out(&o).contains(
            "apple_family_max         9 (\"host\": host: Apple M3 Max (Virtual)) (supportsFamily: YES for Apple1..Apple9"
        ),
        "{}",
        out(&o)
    );
}

#[test]
fn given_an_m1_brand_a_profile_asking_apple9_is_unlocked_at_apple7_and_the_decision_says_why() {
    let env = Env::new();
    env.write_policy("9", "unlock = \"native\"");
    let daemon = env.start(&[], &[("METALIFT_HOST_CHIP_BRAND", "Apple M1 (Virtual)")]);
    let v = daemon.check_in();
    assert_eq!(v.action, WireAction::Unlock, "{v:?}");
    // The shim is told the applied value: never above the host.
    assert_eq!(v.capabilities.map(|c| c.apple_family_max), Some(7), "{v:?}");
    let why = "profile `native` asks Apple9; this host (Apple M1 (Virtual)) has Apple7: applied as Apple7";
    let decision = env.records_of("decision").pop().expect("a decision record");
    assert_eq!(decision["apple_family_max"], 7, "{decision}");
    assert_eq!(decision["apple_family_requested"], 9, "{decision}");
    assert_eq!(decision["apple_family_capped"], why, "{decision}");
    // The policy's load said so too.
    let loaded = env.records_of("policy_loaded");
    assert!(
        loaded[0]["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains(why) && w.contains("bf16 emulation off")),
        "{loaded:?}"
    );
    // explain --decision shows what was recorded...
    let o = env.explain(&["--decision", &v.decision_id.to_string()]);
    let text = out(&o);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(
        text.contains(&format!(
            "apple_family_max 7, mode enforce)\n  never above the host: {why}\n"
        )),
        "{text}"
    );
    // ...and explain --live, told the same brand, shows the cap under the value.
    let o = env.explain(&[
        "--live",
        "--path",
        s(&me()),
        "--host-chip-brand",
        "Apple M1 (Virtual)",
    ]);
    let text = out(&o);
    assert!(
        text.contains(&format!(
            "  apple_family_max         7 (supportsFamily: YES for Apple1..Apple7; Metal3/Common/Mac unchanged)\n                           {why} (never above the host)\n"
        )),
        "{text}"
    );
}

#[test]
fn given_an_m3_brand_a_profile_asking_apple9_stays_apple9() {
    let env = Env::new();
    env.write_policy("9", "unlock = \"native\"");
    let daemon = env.start(
        &[],
        &[("METALIFT_HOST_CHIP_BRAND", "Apple M3 Max (Virtual)")],
    );
    let v = daemon.check_in();
    assert_eq!(v.capabilities.map(|c| c.apple_family_max), Some(9), "{v:?}");
    let decision = env.records_of("decision").pop().expect("a decision record");
    assert_eq!(decision["apple_family_max"], 9, "{decision}");
    assert_eq!(decision["apple_family_requested"], 9, "{decision}");
    assert!(decision.get("apple_family_capped").is_none(), "{decision}");
    let loaded = env.records_of("policy_loaded");
    assert_eq!(loaded[0]["warnings"], serde_json::json!([]), "{loaded:?}");
}

#[test]
fn without_a_brand_the_daemon_resolves_host_to_7_and_warns() {
    let env = Env::new();
    env.write_policy("\"host\"", "unlock = \"native\"");
    let daemon = env.start(&[], &[]);
    let v = daemon.check_in();
    assert_eq!(v.capabilities.map(|c| c.apple_family_max), Some(7), "{v:?}");
    let loaded = env.records_of("policy_loaded");
    assert!(
        loaded[0]["warnings"][0]
            .as_str()
            .is_some_and(|w| w.contains("the host chip could not be read here: the ceiling is 7")),
        "{loaded:?}"
    );
}

#[test]
fn one_policy_hash_in_status_the_audit_log_validate_explain_and_sha256sum() {
    let env = Env::new();
    env.write_policy("7", "unlock = \"native\"");
    std::fs::create_dir_all(env.path("etc/policy.d")).expect("policy.d");
    std::fs::write(
        env.path("etc/policy.d/10-extra.toml"),
        "version = 1\n# fleet\n",
    )
    .expect("write");
    let daemon = env.start(&[], &[]);
    let live = daemon.live_sha256();
    let loaded = env.records_of("policy_loaded");
    assert_eq!(loaded[0]["sha256"], live.as_str());
    assert_eq!(validate_sha256(s(&env.policy())), live);
    let o = metalift(&["explain", "--policy", s(&env.policy()), "--path", s(&me())]);
    assert!(out(&o).contains(&format!("sha256 {live}")), "{}", out(&o));
    let sh = Command::new("sh")
        .arg("-c")
        .arg(readme_drop_in_one_liner().replace("/etc/metalift", s(&env.path("etc"))))
        .output()
        .expect("sh");
    assert_eq!(
        String::from_utf8_lossy(&sh.stdout)
            .split_whitespace()
            .next(),
        Some(live.as_str())
    );
}

/// The guide's command for a policy with drop-ins (docs/src/policy/hash.md), as documented.
fn readme_drop_in_one_liner() -> String {
    let page = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/src/policy/hash.md");
    std::fs::read_to_string(page)
        .expect("docs/src/policy/hash.md")
        .lines()
        .find(|l| l.starts_with("(cd /etc/metalift && "))
        .expect("the guide documents the drop-in one-liner")
        .to_owned()
}

#[test]
fn explain_live_uses_the_daemons_policy_when_the_file_on_disk_is_refused() {
    let env = Env::new();
    env.write_policy("7", "unlock = \"native\"");
    let daemon = env.start(&[], &[]);
    let good = daemon.live_sha256();
    // A broken edit: the daemon keeps the last good policy, the file explains nothing.
    std::fs::write(env.policy(), "version = 1\nmode = \"loud\"\n").expect("break policy");
    let start = Instant::now();
    while env.records_of("policy_rejected").is_empty() {
        assert!(start.elapsed() < HANG_GUARD, "the refusal never came");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(daemon.live_sha256(), good);
    let from_file = metalift(&["explain", "--policy", s(&env.policy()), "--path", s(&me())]);
    assert_eq!(from_file.status.code(), Some(1), "{}", out(&from_file));

    let o = env.explain(&["--live", "--path", s(&me())]);
    let text = out(&o);
    // Explained with the live policy, and the daemon's state as `status` judges
    // it: the file on disk is not live (3), the cause named.
    assert_eq!(o.status.code(), Some(3), "{text}");
    assert!(
        String::from_utf8_lossy(&o.stderr)
            .contains("disk_not_live: the last policy load was refused"),
        "{text}"
    );
    assert!(text.contains("policy   live in metaliftd (pid "), "{text}");
    assert!(
        text.contains(&format!(
            "has sha256 {}, not the live {good}",
            validate_sha256_any(&env.policy())
        )),
        "{text}"
    );
    assert!(text.contains(&format!("sha256 {good}")), "{text}");
    assert!(text.contains("WINS  me ("), "{text}");
    assert!(
        text.contains("unlock with profile `native` (rule `me`"),
        "{text}"
    );
}

#[test]
fn explain_live_says_so_when_the_archive_lacks_the_live_policy() {
    let env = Env::new();
    env.write_policy("7", "unlock = \"native\"");
    let daemon = env.start(&[], &[]);
    let live = daemon.live_sha256();
    let archived = env.path(&format!("log/policies/{live}.json"));
    assert!(
        archived.exists(),
        "the daemon archived its policy at {}",
        archived.display()
    );
    std::fs::remove_file(&archived).expect("remove");
    let o = env.explain(&["--live", "--path", s(&me())]);
    assert_eq!(o.status.code(), Some(2), "{}", out(&o));
    assert!(
        out(&o).contains(&format!(
            "the policy {live} live in metaliftd is not in the archive"
        )),
        "{}",
        out(&o)
    );
}

#[test]
fn explain_decision_reexplains_with_the_policy_that_was_live_then() {
    let env = Env::new();
    env.write_policy("7", "unlock = \"native\"");
    let daemon = env.start(&[], &[]);
    let then = daemon.live_sha256();
    let v = daemon.check_in();
    assert_eq!(v.action, WireAction::Unlock);
    // The policy changes: this executable is now stock.
    env.write_policy("7", "stock = true");
    let now = validate_sha256(s(&env.policy()));
    assert_ne!(now, then);
    daemon.wait_live(&now);

    let id = v.decision_id.to_string();
    let o = env.explain(&["--decision", &id]);
    let text = out(&o);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains(&format!("decision {id} at ")), "{text}");
    assert!(text.contains(&format!("ran {}", me().display())), "{text}");
    assert!(
        text.contains("decided: unlock (rule `me`, profile `native`"),
        "{text}"
    );
    assert!(text.contains(&format!("policy sha256 {then}")), "{text}");
    assert!(
        text.contains("unlock with profile `native` (rule `me`"),
        "{text}"
    );
    assert!(text.contains("same decision as recorded"), "{text}");
    // Today's file would say stock: explain without --decision does.
    let today = metalift(&["explain", "--policy", s(&env.policy()), "--path", s(&me())]);
    assert!(
        out(&today).contains("stock: rule `me` says stock"),
        "{}",
        out(&today)
    );
}

#[test]
fn explain_decision_says_so_when_the_policy_live_then_is_no_longer_archived() {
    let env = Env::new();
    env.write_policy("7", "unlock = \"native\"");
    let daemon = env.start(&[], &[]);
    let then = daemon.live_sha256();
    let v = daemon.check_in();
    std::fs::remove_dir_all(env.path("log/policies")).expect("remove archive");
    let o = env.explain(&["--decision", &v.decision_id.to_string()]);
    let text = out(&o);
    assert_eq!(o.status.code(), Some(2), "{text}");
    // What was decided is still shown, from the log alone.
    assert!(text.contains("decided: unlock (rule `me`"), "{text}");
    assert!(
        text.contains(&format!(
            "the policy {then} that was live then is not in the archive"
        )),
        "{text}"
    );
    let missing = env.explain(&["--decision", "1"]);
    assert_eq!(missing.status.code(), Some(2));
    assert!(
        out(&missing).contains("no decision 1 in "),
        "{}",
        out(&missing)
    );
}

#[test]
fn explain_decision_finds_a_decision_in_a_rotated_log_file() {
    let env = Env::new();
    env.write_policy("7", "unlock = \"native\"");
    let daemon = env.start(&["--audit-max-bytes", "2000", "--audit-keep", "20"], &[]);
    let first = daemon.check_in();
    let start = Instant::now();
    while !env.path("log/audit.jsonl.1").exists() {
        assert!(start.elapsed() < HANG_GUARD, "the log never rotated");
        let _ = daemon.check_in();
    }
    let first_in_live = env
        .records_of("decision")
        .iter()
        .any(|r| r["decision_id"] == first.decision_id);
    assert!(
        !first_in_live,
        "the first decision should have rotated out of the live file"
    );
    let o = env.explain(&["--decision", &first.decision_id.to_string()]);
    assert_eq!(o.status.code(), Some(0), "{}", out(&o));
    assert!(out(&o).contains("same decision as recorded"), "{}", out(&o));
}

/// Issue 24 item 5: `explain --live` and `--decision` explain on the host chip the
/// daemon reported (status) or recorded (the decision), not the reader's own
/// (this Linux CLI knows none: `"host"` would be 7 here).
#[test]
fn explain_live_and_decision_use_the_daemons_host_chip_not_the_readers() {
    let env = Env::new();
    env.write_policy("\"host\"", "unlock = \"native\"");
    let daemon = env.start(
        &[],
        &[("METALIFT_HOST_CHIP_BRAND", "Apple M3 Max (Virtual)")],
    );
    let v = daemon.check_in();
    assert_eq!(v.capabilities.map(|c| c.apple_family_max), Some(9), "{v:?}");
    let decision = env.records_of("decision").pop().expect("a decision record");
    assert_eq!(
        decision["host_chip"], "Apple M3 Max (Virtual)",
        "{decision}"
    );

    let nine = "apple_family_max         9 (\"host\": host: Apple M3 Max (Virtual))";
    let o = env.explain(&["--live", "--path", s(&me())]);
    assert!(out(&o).contains(nine), "{}", out(&o));

    let o = env.explain(&["--decision", &v.decision_id.to_string()]);
    let text = out(&o);
    assert_eq!(o.status.code(), Some(0), "{text}");
    assert!(text.contains(nine), "{text}");
    assert!(!text.contains("NOT the recorded decision"), "{text}");
}

#[test]
fn explain_decision_on_an_export_bundle_uses_the_policies_its_decisions_name_not_the_guests() {
    let env = Env::new();
    env.write_policy("7", "unlock = \"native\"");
    // A clone its orchestrator named (issue 43): the bundle carries the name.
    std::fs::write(env.policy().with_file_name("instance"), "clone-7\n").unwrap();
    let daemon = env.start(&[], &[]);
    let then = daemon.live_sha256();
    let unlocked = daemon.check_in();
    assert_eq!(unlocked.action, WireAction::Unlock);
    env.write_policy("7", "stock = true");
    let now = validate_sha256(s(&env.policy()));
    daemon.wait_live(&now);
    let stock = daemon.check_in();
    assert_eq!(stock.action, WireAction::Stock);

    let to = env.path("exported");
    let export = metalift(&[
        "audit",
        "export",
        "--to",
        s(&to),
        "--since",
        "1h",
        "--log",
        s(&env.audit_log()),
        "--socket",
        s(&env.socket()),
    ]);
    assert_eq!(export.status.code(), Some(0), "{}", out(&export));
    let bundle = PathBuf::from(String::from_utf8_lossy(&export.stdout).trim());
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(bundle.join("manifest.json")).unwrap()).unwrap();
    assert!(
        bundle
            .file_name()
            .is_some_and(|n| n.to_string_lossy().starts_with("metalift-clone-7-")),
        "{}",
        bundle.display()
    );
    assert_eq!(manifest["host"]["instance"], "clone-7", "{manifest}");
    let mut both = vec![then.clone(), now.clone()];
    both.sort();
    assert_eq!(manifest["policies"], serde_json::json!(both), "{manifest}");
    assert_eq!(manifest["policies_missing"], serde_json::json!([]));
    // The guest is gone: its log and its archive with it.
    drop(daemon);
    std::fs::remove_dir_all(env.path("log")).expect("remove the guest's log");

    for (v, decided, sha) in [
        (&unlocked, "decided: unlock (rule `me`", &then),
        (&stock, "decided: stock (rule `me`", &now),
    ] {
        let o = metalift(&[
            "explain",
            "--decision",
            &v.decision_id.to_string(),
            "--log",
            s(&bundle),
        ]);
        let text = out(&o);
        assert_eq!(o.status.code(), Some(0), "{text}");
        assert!(text.contains(decided), "{text}");
        assert!(text.contains(&format!("policy sha256 {sha}")), "{text}");
        assert!(text.contains("same decision as recorded"), "{text}");
    }
}
