//! libmetalift beside a second shim that patches the same methods the way Cua's
//! does (`probe/second_shim/peer_shim.m`, built as `libsimpeer.so`), through the
//! real metaliftd, in both `LD_PRELOAD` orders:
//!
//! - `libmetalift.so:libsimpeer.so`: glibc runs the later preload's constructor
//!   first, so the peer replaces `-initGPUFamilySupport` first and metalift's
//!   replacement wraps it: metalift patches, then the peer patches over it
//!   (`patched: "after"`).
//! - `libsimpeer.so:libmetalift.so`: the peer's replacement wraps metalift's: the
//!   peer patches first and metalift finds its IMPs (`patched: "before"`).
//!
//! Either way the outcome names the peer's image, metalift's self-check and
//! rollback leave the peer's IMPs in place, and answers that were already the
//! peer's are labelled as found (`stock.found_through`), never as stock.
//!
//! Needs `metaliftd` next to the probe (`cargo build --workspace`). Linux only.
#![cfg(target_os = "linux")]

mod support;

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use support::*;

/// A real metaliftd whose policy gives the probe `probe_action` (`apple7` is
/// Apple7 with 32768 bytes of threadgroup memory: the simulated host's own).
struct Daemon(RealDaemon);

impl std::ops::Deref for Daemon {
    type Target = RealDaemon;
    fn deref(&self) -> &RealDaemon {
        &self.0
    }
}

impl Daemon {
    fn start(probe_action: &str) -> Daemon {
        let policy = format!(
            "version = 1\nmode = \"enforce\"\n\n[profile.apple7]\napple_family_max = 7\n\
             max_threadgroup_memory = 32768\n\n[[rule]]\nid = \"probe\"\npath = {:?}\n{}\n",
            probe().display().to_string(),
            probe_action
        );
        Daemon(RealDaemon::start(&policy, None))
    }

    /// The one outcome record (waits for it: the shim sends it as the device is made).
    fn outcome(&self) -> serde_json::Value {
        let deadline = Instant::now() + PATIENCE;
        loop {
            let outcomes = self.records_of(&["outcome"]);
            if let [one] = outcomes.as_slice() {
                return one.clone();
            }
            assert!(outcomes.len() < 2, "more than one outcome: {outcomes:?}");
            assert!(Instant::now() < deadline, "no outcome was recorded");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Which library `LD_PRELOAD` names first.
#[derive(Debug, Clone, Copy)]
enum First {
    /// `libmetalift.so:libsimpeer.so`: the peer patches over metalift.
    Metalift,
    /// `libsimpeer.so:libmetalift.so`: metalift finds the peer's IMPs.
    Peer,
}

fn peer() -> PathBuf {
    let path = simmetal("normal").join("libsimpeer.so");
    assert!(path.is_file(), "probe/build.rs builds {}", path.display());
    path
}

/// The probe with both shims, the peer configured as Cua's is
/// (`LUME_METAL_APPLE_FAMILY_MAX`, `LUME_METAL_MAX_THREADGROUP_MEMORY`).
fn probe_with_peer(daemon: &Daemon, first: First, family_max: u32, tg: u64) -> Command {
    let mut cmd = injected(probe(), &daemon.socket());
    let (a, b) = match first {
        First::Metalift => (shim(), peer()),
        First::Peer => (peer(), shim()),
    };
    cmd.env("LD_PRELOAD", format!("{}:{}", a.display(), b.display()))
        .env("LUME_METAL_APPLE_FAMILY_MAX", family_max.to_string())
        .env("LUME_METAL_MAX_THREADGROUP_MEMORY", tg.to_string());
    cmd
}

fn families(answers: &serde_json::Value) -> Vec<&str> {
    answers["families"]
        .as_array()
        .unwrap_or_else(|| panic!("families: {answers}"))
        .iter()
        .filter_map(|f| f.as_str())
        .collect()
}

/// The outcome names the peer's image, patched `patched`, on both methods it patches.
fn assert_names_the_peer(outcome: &serde_json::Value, patched: &str) {
    let other = &outcome["other_shim"];
    let image = other["image"].as_str().unwrap_or_default();
    assert!(image.ends_with("/libsimpeer.so"), "{outcome}");
    assert_eq!(other["patched"], patched, "{outcome}");
    let methods: Vec<&str> = other["methods"]
        .as_array()
        .unwrap_or_else(|| panic!("methods: {outcome}"))
        .iter()
        .filter_map(|m| m.as_str())
        .collect();
    assert!(
        methods.contains(&"supportsFamily:") && methods.contains(&"maxThreadgroupMemoryLength"),
        "{outcome}"
    );
}

/// The image of the IMP the probe found on `-[class selector]`.
fn imp_image<'a>(report: &'a serde_json::Value, method: &str) -> &'a str {
    report["capability_imps"][method]
        .as_str()
        .unwrap_or_else(|| panic!("{method}: {report}"))
}

#[test]
fn given_a_peer_that_patches_over_metalift_and_claims_more_then_metalift_rolls_back_only_its_own_and_the_peer_still_answers(
) {
    let daemon = Daemon::start("unlock = \"apple7\"");
    // Cua's configured to Apple9 with its default 65536 bytes: more than apple7.
    let report = probe_json(probe_with_peer(&daemon, First::Metalift, 1009, 65536));
    let outcome = daemon.outcome();
    assert_eq!(outcome["result"], "failed", "{outcome}");
    let reason = outcome["reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("rolled back") && reason.contains("another shim"),
        "{outcome}"
    );
    assert_names_the_peer(&outcome, "after");
    // metalift read the stock answers through Metal's own IMPs: stock, not found.
    assert!(outcome["stock"]["found_through"].is_null(), "{outcome}");
    assert!(
        !families(&outcome["stock"]).contains(&"Apple6"),
        "{outcome}"
    );
    assert_eq!(outcome["stock"]["threadgroup_memory"], 32768, "{outcome}");
    // After metalift's rollback the peer's patch still holds, and the outcome says so.
    assert!(
        families(&outcome["effective"]).contains(&"Apple9"),
        "{outcome}"
    );
    assert_eq!(
        outcome["effective"]["threadgroup_memory"], 65536,
        "{outcome}"
    );
    assert_eq!(report["apple_family"], 9, "{report}");
    assert_eq!(report["max_threadgroup_memory"], 65536, "{report}");
    assert_eq!(
        imp_image(&report, "-[_MTLDevice supportsFamily:]"),
        "libsimpeer.so"
    );
    assert_eq!(
        imp_image(&report, "-[AppleParavirtDevice maxThreadgroupMemoryLength]"),
        "libsimpeer.so"
    );
}

#[test]
fn given_a_peer_that_patches_over_metalift_with_the_verdicts_answers_then_the_unlock_holds_and_the_peer_is_named(
) {
    let daemon = Daemon::start("unlock = \"apple7\"");
    let report = probe_json(probe_with_peer(&daemon, First::Metalift, 1007, 32768));
    let outcome = daemon.outcome();
    assert_eq!(outcome["result"], "applied", "{outcome}");
    assert_names_the_peer(&outcome, "after");
    assert!(outcome["stock"]["found_through"].is_null(), "{outcome}");
    assert_apple7(&report);
    assert_eq!(
        imp_image(&report, "-[_MTLDevice supportsFamily:]"),
        "libsimpeer.so"
    );
}

#[test]
fn given_a_peer_that_patched_before_metalift_then_metalift_unlocks_over_it_and_labels_its_answers_as_found(
) {
    let daemon = Daemon::start("unlock = \"apple7\"");
    // Cua's at Apple6 and 65536 bytes, under metalift's apple7 (32768).
    let report = probe_json(probe_with_peer(&daemon, First::Peer, 1006, 65536));
    let outcome = daemon.outcome();
    assert_eq!(outcome["result"], "applied", "{outcome}");
    assert_names_the_peer(&outcome, "before");
    let found = outcome["stock"]["found_through"]
        .as_str()
        .unwrap_or_default();
    assert!(found.ends_with("/libsimpeer.so"), "{outcome}");
    // The answers metalift found were the peer's, and metalift's unlock wraps them.
    assert!(families(&outcome["stock"]).contains(&"Apple6"), "{outcome}");
    assert_eq!(outcome["stock"]["threadgroup_memory"], 65536, "{outcome}");
    assert_eq!(report["apple_family"], 7, "{report}");
    assert_eq!(report["max_threadgroup_memory"], 65536, "{report}");
    assert_eq!(
        imp_image(&report, "-[_MTLDevice supportsFamily:]"),
        "libmetalift.so"
    );
}

#[test]
fn given_a_stock_verdict_beside_a_peer_in_either_order_then_only_answers_that_were_already_the_peers_are_labelled_found(
) {
    for (first, patched, labelled) in [
        (First::Peer, "before", true),
        (First::Metalift, "after", false),
    ] {
        let daemon = Daemon::start("stock = true");
        let report = probe_json(probe_with_peer(&daemon, first, 1009, 65536));
        let outcome = daemon.outcome();
        assert_eq!(outcome["result"], "stock", "{first:?}: {outcome}");
        assert_names_the_peer(&outcome, patched);
        assert_eq!(
            outcome["stock"]["found_through"].is_string(),
            labelled,
            "{first:?}: {outcome}"
        );
        // Before: what metalift found was already the peer's (Apple9); after:
        // metalift saw Metal's own (Apple5), and the peer patched while the device
        // was built.
        assert_eq!(
            families(&outcome["stock"]).contains(&"Apple9"),
            labelled,
            "{first:?}: {outcome}"
        );
        assert!(
            families(&outcome["effective"]).contains(&"Apple9"),
            "{first:?}: {outcome}"
        );
        assert_eq!(report["apple_family"], 9, "{first:?}: {report}");
    }
}

#[test]
fn given_a_peer_that_patched_before_metalift_and_a_metal_that_defeats_the_unlock_then_the_rollback_restores_the_peers_imps(
) {
    let daemon = Daemon::start("unlock = \"apple7\"");
    // `cached`: -initGPUFamilySupport moves the device to a subclass answering
    // from copies, so metalift's self-check fails and it rolls back.
    let mut cmd = probe_with_peer(&daemon, First::Peer, 1006, 65536);
    cmd.env("LD_LIBRARY_PATH", simmetal("cached"));
    let report = probe_json(cmd);
    let outcome = daemon.outcome();
    assert_eq!(outcome["result"], "failed", "{outcome}");
    assert_names_the_peer(&outcome, "before");
    // The methods metalift patched hold the peer's IMPs again, not Metal's.
    assert_eq!(
        imp_image(&report, "-[_MTLDevice supportsFamily:]"),
        "libsimpeer.so",
        "{report}"
    );
    assert_eq!(
        imp_image(&report, "-[AppleParavirtDevice maxThreadgroupMemoryLength]"),
        "libsimpeer.so",
        "{report}"
    );
}
