//! libmetalift injected with LD_PRELOAD into real processes — the probe on the
//! simulated Metal, `/bin/true`, `sh`, `cat` — against a scripted fake metaliftd.
//!
//! Linux only: the simulated Metal and `LD_PRELOAD` (macOS runs the real Metal).
#![cfg(target_os = "linux")]

mod support;

use metalift_policy::profile::Capabilities;
use metalift_policy::verdict::Mode;
use metalift_policy::wire::{self, OutcomeResult, KNOWN_FAMILIES};
use support::*;

fn bit(name: &str) -> u32 {
    let index = KNOWN_FAMILIES.iter().position(|(n, _)| *n == name).unwrap();
    1 << index
}

#[test]
fn given_an_unlock_verdict_then_apple7_and_every_llama_flag_turn_on_but_metal3_stays_off() {
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let report = probe_json(injected(probe(), &daemon.socket));
    assert_apple7(&report);

    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Applied, "{outcome:?}");
    assert_eq!(outcome.decision_id, 1);
    assert_eq!(outcome.device_class, "AppleParavirtDevice");
    assert_eq!(outcome.stock.families & bit("Apple7"), 0);
    assert_ne!(outcome.stock.families & bit("Apple5"), 0);
    assert_ne!(outcome.effective.families & bit("Apple7"), 0);
    assert_eq!(outcome.effective.families & bit("Metal3"), 0);
    assert_eq!(outcome.effective.threadgroup_memory, 32768);
}

#[test]
fn given_a_profile_with_floors_then_threadgroup_memory_and_working_set_rise_to_them() {
    let daemon = FakeDaemon::start(unlock(Capabilities {
        apple_family_max: 9,
        max_threadgroup_memory: 65536,
        recommended_working_set: Some(64 << 30),
    }));
    let report = probe_json(injected(probe(), &daemon.socket));
    assert_eq!(report["apple_family"], 9, "{report}");
    assert_eq!(report["max_threadgroup_memory"], 65536, "{report}");
    assert_eq!(report["recommended_working_set"], 64u64 << 30, "{report}");
    assert_eq!(daemon.outcome().result, OutcomeResult::Applied);
}

#[test]
fn given_a_stock_verdict_then_the_probe_sees_the_paravirtual_answers() {
    let daemon = FakeDaemon::start(stock(Mode::Enforce, false));
    assert_stock(&probe_json(injected(probe(), &daemon.socket)));
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Stock);
    assert_eq!(outcome.reason, "verdict: stock (probe)");
    assert_eq!(outcome.stock, outcome.effective);
}

#[test]
fn given_monitor_mode_then_stock_and_the_outcome_says_it_would_have_unlocked() {
    let daemon = FakeDaemon::start(stock(Mode::Monitor, true));
    assert_stock(&probe_json(injected(probe(), &daemon.socket)));
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Stock);
    assert_eq!(outcome.reason, "monitor mode: would unlock (probe)");
}

#[test]
fn given_no_daemon_then_stock_and_the_reason_is_logged_in_debug_mode() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = injected(probe(), &dir.path().join("absent.sock"));
    cmd.env("METALIFT_DEBUG", "1").arg("--json");
    let output = run(cmd, b"");
    assert!(output.status.success());
    assert_stock(&serde_json::from_slice(&output.stdout).unwrap());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no daemon at"), "{stderr}");
    assert!(stderr.contains("stock for AppleParavirtDevice"), "{stderr}");
}

#[test]
fn given_a_daemon_that_never_answers_then_stock_after_the_deadline_and_the_process_carries_on() {
    let daemon = FakeDaemon::start(Behaviour::Silent);
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("METALIFT_TIMEOUT_MS", "300");
    assert_stock(&probe_json(cmd));
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Stock);
    assert_eq!(outcome.decision_id, 0);
    assert!(outcome.reason.contains("no verdict"), "{}", outcome.reason);
    assert!(outcome.reason.contains("300 ms"), "{}", outcome.reason);
}

#[test]
fn given_a_malformed_verdict_then_stock_with_the_reason_reported() {
    // A frame from a future protocol version.
    let mut frame = wire::encode_frame(&wire::Message::StatusRequest);
    frame[wire::LENGTH_PREFIX] = wire::PROTOCOL_VERSION + 1;
    let daemon = FakeDaemon::start(Behaviour::Raw(frame));
    assert_stock(&probe_json(injected(probe(), &daemon.socket)));
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Stock);
    assert!(
        outcome.reason.starts_with("malformed verdict"),
        "{}",
        outcome.reason
    );
}

#[test]
fn given_a_message_that_is_not_a_verdict_then_stock() {
    let frame = wire::encode_frame(&wire::Message::Status("{}".into()));
    let daemon = FakeDaemon::start(Behaviour::Raw(frame));
    assert_stock(&probe_json(injected(probe(), &daemon.socket)));
    assert!(daemon.outcome().reason.contains("unexpected status"));
}

#[test]
fn given_metal_without_init_gpu_family_support_then_failed_and_nothing_is_hooked() {
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("LD_LIBRARY_PATH", simmetal("noinit"));
    assert_stock(&probe_json(cmd));
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Failed);
    assert!(
        outcome.reason.contains("initGPUFamilySupport] is missing"),
        "{}",
        outcome.reason
    );
}

#[test]
fn given_a_selector_the_profile_needs_is_missing_then_failed_and_nothing_is_installed() {
    // The profile sets a working-set floor, but this Metal has no
    // recommendedMaxWorkingSetSize: every selector is checked before the first
    // replacement, so nothing is installed at all.
    let daemon = FakeDaemon::start(unlock(Capabilities {
        recommended_working_set: Some(1 << 40),
        max_threadgroup_memory: 65536,
        ..APPLE7
    }));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("LD_LIBRARY_PATH", simmetal("nows"));
    let report = probe_json(cmd);
    assert_stock(&report);
    assert!(report["recommended_working_set"].is_null());
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Failed);
    assert!(
        outcome
            .reason
            .contains("recommendedMaxWorkingSetSize] is missing; nothing was installed"),
        "{}",
        outcome.reason
    );
    assert_eq!(outcome.effective, outcome.stock);
    assert_eq!(report["shim_imps"], 0, "{report}");
}

#[test]
fn given_metalift_disable_then_stock_and_no_check_in() {
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("METALIFT_DISABLE", "1");
    assert_stock(&probe_json(cmd));
    assert_eq!(daemon.check_ins(), 0);
}

#[test]
fn given_metal_is_dlopened_after_start_up_then_the_unlock_still_applies() {
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(probe_dlopen(), &daemon.socket);
    cmd.arg(simmetal("normal").join("libsimmetal.so"));
    assert_apple7(&probe_json(cmd));
    assert_eq!(daemon.outcome().result, OutcomeResult::Applied);
}

#[test]
fn given_metal_is_dlopened_without_a_daemon_then_stock() {
    let dir = tempfile::tempdir().unwrap();
    let mut cmd = injected(probe_dlopen(), &dir.path().join("absent.sock"));
    cmd.arg(simmetal("normal").join("libsimmetal.so"));
    assert_stock(&probe_json(cmd));
}

#[test]
fn the_uninjected_probe_sees_the_paravirtual_device() {
    let report = probe_json(clean(probe()));
    assert_stock(&report);
    assert_eq!(report["name"], "Apple Paravirtual device");
    assert_eq!(report["families"]["Common3"], true);
    assert_eq!(report["families"]["Metal3"], false);
}

#[test]
fn given_an_unlock_then_the_capability_imps_live_in_the_shim() {
    // The positive control for every `shim_imps == 0` below: the probe does see
    // the shim's IMPs when they are installed.
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let report = probe_json(injected(probe(), &daemon.socket));
    assert_apple7(&report);
    assert_eq!(report["shim_imps"], 2, "{report}");
}

#[test]
fn given_a_stock_verdict_then_no_shim_imp_is_left_installed() {
    let daemon = FakeDaemon::start(stock(Mode::Enforce, false));
    let report = probe_json(injected(probe(), &daemon.socket));
    assert_stock(&report);
    assert_eq!(report["shim_imps"], 0, "{report}");
    assert_eq!(daemon.outcome().result, OutcomeResult::Stock);
}

#[test]
fn given_answers_set_after_init_gpu_family_support_then_the_stock_answers_are_read_after_init() {
    // lateanswers: mid-init the device claims only Common1 and 16 KiB; reading
    // the stock answers there would expect the wrong answers and roll back.
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("LD_LIBRARY_PATH", simmetal("lateanswers"));
    assert_apple7(&probe_json(cmd));
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Applied, "{outcome:?}");
    assert_ne!(outcome.stock.families & bit("Apple5"), 0, "{outcome:?}");
    assert_ne!(outcome.stock.families & bit("Common3"), 0, "{outcome:?}");
    assert_eq!(outcome.stock.families & bit("Apple6"), 0, "{outcome:?}");
    assert_eq!(outcome.stock.threadgroup_memory, 32768, "{outcome:?}");
}

#[test]
fn given_replaced_answers_that_do_not_take_effect_then_rolled_back_failed_and_no_hook_left() {
    // noeffect: -init swaps the device to a subclass that overrides the getters.
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("LD_LIBRARY_PATH", simmetal("noeffect"));
    let report = probe_json(cmd);
    assert_stock(&report);
    assert_eq!(report["shim_imps"], 0, "{report}");
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Failed, "{outcome:?}");
    assert!(
        outcome.reason.contains("did not take effect") && outcome.reason.contains("rolled back"),
        "{}",
        outcome.reason
    );
    assert_eq!(outcome.effective, outcome.stock, "{outcome:?}");
}

#[test]
fn given_inherited_capability_methods_and_an_unlock_then_failed_and_nothing_installed() {
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("LD_LIBRARY_PATH", simmetal("inherited"));
    let report = probe_json(cmd);
    assert_stock(&report);
    assert_eq!(report["shim_imps"], 0, "{report}");
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Failed, "{outcome:?}");
    assert!(
        outcome.reason.contains("is inherited from _MTLDevice"),
        "{}",
        outcome.reason
    );
}

#[test]
fn given_inherited_capability_methods_and_a_stock_verdict_then_stock() {
    let daemon = FakeDaemon::start(stock(Mode::Enforce, false));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("LD_LIBRARY_PATH", simmetal("inherited"));
    assert_stock(&probe_json(cmd));
    assert_eq!(daemon.outcome().result, OutcomeResult::Stock);
}

#[test]
fn given_metal_classes_registered_after_metal_appears_then_the_linked_probe_is_unlocked() {
    // lateclasses: when libsimmetal.so is mapped, _MTLDevice does not exist yet
    // (dyld's order on macOS); the shim must retry on the driver's dlopen.
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("LD_LIBRARY_PATH", simmetal("lateclasses"));
    assert_apple7(&probe_json(cmd));
    assert_eq!(daemon.outcome().result, OutcomeResult::Applied);
}

#[test]
fn given_metal_dlopened_late_with_its_classes_later_still_then_the_unlock_applies() {
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(probe_dlopen(), &daemon.socket);
    cmd.arg(simmetal("lateclasses").join("libsimmetal.so"));
    assert_apple7(&probe_json(cmd));
    assert_eq!(daemon.outcome().result, OutcomeResult::Applied);
    assert_eq!(daemon.check_ins(), 1);
}

#[test]
fn given_two_threads_create_the_first_device_at_once_then_one_check_in_and_one_outcome() {
    for _ in 0..3 {
        let daemon = FakeDaemon::start(unlock(APPLE7));
        let mut cmd = injected(probe(), &daemon.socket);
        cmd.args(["--threads", "2"]);
        assert_apple7(&probe_json(cmd));
        assert_eq!(daemon.outcome().result, OutcomeResult::Applied);
        // The process has exited: anything it sent has arrived or is in flight.
        std::thread::sleep(std::time::Duration::from_millis(200));
        assert_eq!(daemon.check_ins(), 1);
        assert_eq!(
            daemon.outcomes_now().len(),
            1,
            "{:?}",
            daemon.outcomes_now()
        );
    }
}

#[test]
fn expect_family_exits_3_unless_the_device_answers_exactly_that_apple_family() {
    let code = |mut cmd: std::process::Command, n: &str| {
        cmd.args(["--expect-family", n]);
        run(cmd, b"").status.code()
    };
    assert_eq!(code(clean(probe()), "5"), Some(0));
    assert_eq!(code(clean(probe()), "7"), Some(3));
    assert_eq!(code(clean(probe()), "4"), Some(3));
    let daemon = FakeDaemon::start(unlock(APPLE7));
    assert_eq!(code(injected(probe(), &daemon.socket), "7"), Some(0));
}

#[test]
fn given_a_daemon_that_answers_after_3_s_then_a_metal_program_starts_at_once_and_still_gets_its_verdict(
) {
    let daemon = FakeDaemon::start_delayed(unlock(APPLE7), std::time::Duration::from_secs(3));
    // Links Metal (checks in from the constructor) but never creates a device:
    // nothing may wait for the verdict before main.
    let mut cmd = injected(hostile("metalift-hostile"), &daemon.socket);
    cmd.arg("exec");
    let start = std::time::Instant::now();
    let output = run(cmd, b"");
    let took = start.elapsed();
    assert!(output.status.success());
    assert!(took < std::time::Duration::from_secs(1), "took {took:?}");
    assert_eq!(daemon.check_ins(), 1);
    // A Metal program that creates a device waits at its first device init.
    assert_apple7(&probe_json(injected(probe(), &daemon.socket)));
    assert_eq!(daemon.outcome().result, OutcomeResult::Applied);
}
