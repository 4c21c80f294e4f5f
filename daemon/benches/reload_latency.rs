//! Reload latency: from an atomic save of `policy.toml` to the first `current()`
//! that returns the new policy, through the real watcher with its default debounce.
//!
//! `cargo bench -p metalift-daemon --bench reload_latency` prints a table; the
//! target is p99 ≤ 100 ms. Resolution is about 1 ms (the observer polls).

use std::sync::Arc;
use std::time::{Duration, Instant};

use metalift_daemon::audit::{AuditLog, Rotation};
use metalift_daemon::live_policy::store::PolicyStore;
use metalift_daemon::live_policy::watcher;
use metalift_policy::LoadOptions;

const EDITS: usize = 200;

fn policy(generation: usize) -> String {
    format!(
        "version = 1\n[profile.apple7]\napple_family_max = 7\n\n[[rule]]\nid = \"gen-{generation}\"\npath = \"/opt/gen-{generation}/bin/*\"\nunlock = \"apple7\"\n"
    )
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let tmp = tempfile::tempdir().expect("temp dir");
        let path = tmp.path().join("policy.toml");
        std::fs::write(&path, policy(0)).expect("write policy");
        let audit = Arc::new(
            AuditLog::open(&tmp.path().join("audit.jsonl"), Rotation::default())
                .expect("audit log"),
        );
        let store = Arc::new(
            PolicyStore::load_initial(&path, LoadOptions::default(), &audit).expect("load"),
        );
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = watcher::spawn(
            Arc::clone(&store),
            Arc::clone(&audit),
            watcher::Timing::default(),
            async move {
                let _ = stopped.await;
            },
        );

        let mut samples = Vec::with_capacity(EDITS);
        for generation in 1..=EDITS {
            let before = store.current().sha256.clone();
            let staged = tmp.path().join(".policy.toml.new");
            std::fs::write(&staged, policy(generation)).expect("write staged");
            let start = Instant::now();
            std::fs::rename(&staged, &path).expect("rename over");
            while store.current().sha256 == before {
                if start.elapsed() > Duration::from_secs(10) {
                    panic!("edit {generation} never became live");
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            samples.push(start.elapsed());
            // Let the watcher go idle so every edit is measured on its own.
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = stop.send(());
        let _ = task.await;

        samples.sort_unstable();
        let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
        println!(
            "reload latency over {EDITS} atomic saves (debounce {:?})",
            watcher::DEFAULT_DEBOUNCE
        );
        println!(
            "{:>8} {:>8} {:>8} {:>8} {:>8}",
            "min", "p50", "p90", "p99", "max"
        );
        println!(
            "{:>8.1?} {:>8.1?} {:>8.1?} {:>8.1?} {:>8.1?}",
            at(0.0),
            at(0.5),
            at(0.9),
            at(0.99),
            at(1.0)
        );
    });
}
