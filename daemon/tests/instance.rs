//! The clone's name (issue 43 item 3): an orchestrator names a running clone by
//! writing the `instance` file beside the policy after the daemon started (a
//! clone boots from the image, then `tart exec`/ssh names it): records written
//! from the next re-check on carry it in `host.instance`, with no restart and no
//! policy change. A file holding no valid name changes nothing.
#![cfg(target_os = "linux")]

#[path = "forward_support/mod.rs"]
mod support;

use std::path::Path;
use std::time::{Duration, Instant};

use metalift_daemon::scratch::ScratchDir;
use serde_json::Value;
use support::check_in;

const GUARD: Duration = Duration::from_secs(30);

fn last_decision_host(scratch: &ScratchDir) -> Value {
    let text = std::fs::read_to_string(scratch.audit_log()).unwrap();
    let last = text
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .rfind(|v| v["kind"] == "decision")
        .expect("a decision");
    last["host"].clone()
}

#[test]
fn a_clone_named_after_start_carries_its_name_from_the_next_recheck_on() {
    let dir = tempfile::tempdir().unwrap();
    let scratch = ScratchDir::new(dir.path()).unwrap();
    std::fs::write(scratch.policy(), "version = 1\n").unwrap();
    let _daemon = scratch
        .start::<&str>(Path::new(env!("CARGO_BIN_EXE_metaliftd")), &[], &[])
        .unwrap_or_else(|e| panic!("{e}"));
    check_in(&scratch.socket(), None);
    assert!(
        last_decision_host(&scratch).get("instance").is_none(),
        "no name given yet"
    );
    let instance = scratch.policy().with_file_name("instance");
    // Not a name: ignored, the records keep what they had.
    std::fs::write(&instance, "two words\n").unwrap();
    std::thread::sleep(Duration::from_millis(2500));
    check_in(&scratch.socket(), None);
    assert!(last_decision_host(&scratch).get("instance").is_none());

    std::fs::write(&instance, "tart-ci-17\n").unwrap();
    let start = Instant::now();
    loop {
        check_in(&scratch.socket(), None);
        if last_decision_host(&scratch)["instance"] == "tart-ci-17" {
            break;
        }
        assert!(
            start.elapsed() < GUARD,
            "the name never reached the records: {}",
            last_decision_host(&scratch)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!("named after {:?}", start.elapsed());
}
