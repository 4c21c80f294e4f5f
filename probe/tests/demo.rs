//! `metalift demo` end to end: the real metaliftd, the real policy engine, the
//! real audit log, the shim injected into the probe on the simulated Metal.
//!
//! Needs the workspace's binaries (`metalift`, `metaliftd`) next to the probe:
//! `scripts/test.sh` builds them first (`cargo build --workspace --all-targets`).
//! Linux only (the simulated Metal).
#![cfg(target_os = "linux")]

mod support;

use support::*;

#[test]
fn given_the_real_daemon_then_only_the_allowed_probe_is_unlocked_and_every_run_is_audited() {
    let bin_dir = probe().parent().unwrap().to_path_buf();
    let metalift = bin_dir.join("metalift");
    assert!(
        metalift.is_file() && bin_dir.join("metaliftd").is_file(),
        "metalift and metaliftd must be built first: cargo build --workspace (scripts/test.sh does)"
    );
    let mut cmd = clean(&metalift);
    // A loaded CI box must not turn an answer into a timeout.
    cmd.args(["demo", "--timeout-ms", "10000"]);
    let output = run(cmd, b"");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "metalift demo failed ({}):\n{stdout}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    let row = |case: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(case))
            .unwrap_or_else(|| panic!("no row {case:?} in:\n{stdout}"))
            .to_owned()
    };
    assert!(
        row("allowed: metalift-probe").contains("Apple7"),
        "{stdout}"
    );
    for case in ["before", "denied", "monitor mode", "daemon stopped"] {
        assert!(row(case).contains("Apple5"), "{case}: {stdout}");
    }
    // The audit trail: the decision and the shim's outcome for each run.
    assert!(stdout.contains(r#""result":"applied""#), "{stdout}");
    assert!(
        stdout.contains(r#""rule":"demo-untrusted","action":"stock""#),
        "{stdout}"
    );
    assert!(stdout.contains(r#""would_unlock":true"#), "{stdout}");
    assert!(
        stdout.contains(r#""reason":"monitor mode: would unlock (demo-probe)""#),
        "{stdout}"
    );
}
