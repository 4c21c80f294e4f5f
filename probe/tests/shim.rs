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

    // Metal's own derived answer (!supportsFamily:Apple9) is unchanged.
    assert_eq!(report["requires_bf16_emulation"], true, "{report}");

    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Applied, "{outcome:?}");
    assert_eq!(outcome.decision_id, 1);
    assert_eq!(outcome.device_class, "AppleParavirtDevice");
    // The true stock answers of the finished device.
    assert_eq!(
        outcome.stock.families,
        paravirtual_families(),
        "{outcome:?}"
    );
    assert_eq!(outcome.stock.threadgroup_memory, 32768, "{outcome:?}");
    assert_ne!(outcome.effective.families & bit("Apple7"), 0);
    assert_ne!(outcome.effective.families & bit("Mac2"), 0);
    assert_eq!(outcome.effective.families & bit("Apple8"), 0);
    assert_eq!(outcome.effective.families & bit("Metal3"), 0);
    assert_eq!(outcome.effective.threadgroup_memory, 32768);
}

/// What the paravirtual device answers: Apple1..5, Mac2, Common1..3.
fn paravirtual_families() -> u32 {
    ["Apple1", "Apple2", "Apple3", "Apple4", "Apple5", "Mac2"]
        .into_iter()
        .chain(["Common1", "Common2", "Common3"])
        .map(bit)
        .fold(0, |a, b| a | b)
}

/// `-[Class selector]` -> the image its IMP lives in, from a probe report.
fn capability_imps(report: &serde_json::Value) -> std::collections::BTreeMap<String, String> {
    report["capability_imps"]
        .as_object()
        .unwrap_or_else(|| panic!("no capability_imps: {report}"))
        .iter()
        .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
        .collect()
}

/// The same map from the probe run without the shim, on `variant`.
fn metals_own_imps(variant: &str) -> std::collections::BTreeMap<String, String> {
    let mut cmd = clean(probe());
    cmd.env("LD_LIBRARY_PATH", simmetal(variant));
    capability_imps(&probe_json(cmd))
}

#[test]
fn given_metal_asks_the_device_during_its_creation_then_the_outcome_reports_the_finished_devices_answers(
) {
    // The real order: the driver's init is complete before MTLAddDevice, and
    // Metal's feature queries ask the device (under the registration lock)
    // right after the vector is built. The stock answers are the finished
    // device's, read when the original -initGPUFamilySupport returns.
    let daemon = FakeDaemon::start(unlock(APPLE7));
    assert_apple7(&probe_json(injected(probe(), &daemon.socket)));
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Applied, "{outcome:?}");
    assert_eq!(outcome.stock.threadgroup_memory, 32768, "{outcome:?}");
    assert_eq!(
        outcome.stock.families,
        paravirtual_families(),
        "{outcome:?}"
    );
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
    // The floor applies through the getter IOGPUMetalDevice defines.
    let imps = capability_imps(&report);
    assert_eq!(
        imps["-[IOGPUMetalDevice recommendedMaxWorkingSetSize]"], "libmetalift.so",
        "{imps:?}"
    );
    // Apple9 switches Metal's own bf16 emulation off: why the daemon never
    // grants a family above the host's.
    assert_eq!(report["requires_bf16_emulation"], false, "{report}");
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Applied, "{outcome:?}");
    assert_eq!(outcome.stock.working_set, 11453251584, "{outcome:?}");
}

#[test]
fn given_a_stock_verdict_then_the_probe_sees_the_paravirtual_answers_and_the_outcome_their_true_values(
) {
    let daemon = FakeDaemon::start(stock(Mode::Enforce, false));
    assert_stock(&probe_json(injected(probe(), &daemon.socket)));
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Stock);
    assert_eq!(outcome.reason, "verdict: stock (probe)");
    assert_eq!(outcome.stock, outcome.effective);
    // All three answers, read from the finished device: never a 0 for "not read".
    assert_eq!(
        outcome.stock.families,
        paravirtual_families(),
        "{outcome:?}"
    );
    assert_eq!(outcome.stock.threadgroup_memory, 32768, "{outcome:?}");
    assert_eq!(outcome.stock.working_set, 11453251584, "{outcome:?}");
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
fn given_the_daemon_declines_as_busy_then_stock_at_once_with_the_reason() {
    let frame = wire::encode_frame(&wire::Message::Declined(wire::Declined {
        reason: wire::DeclineReason::Busy,
        detail: "every place is taken".into(),
    }));
    let daemon = FakeDaemon::start(Behaviour::Raw(frame));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("METALIFT_TIMEOUT_MS", "5000");
    let start = std::time::Instant::now();
    assert_stock(&probe_json(cmd));
    assert!(start.elapsed() < std::time::Duration::from_secs(2));
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Stock);
    assert!(
        outcome
            .reason
            .contains("declined the check-in: every place"),
        "{}",
        outcome.reason
    );
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
    let report = probe_json(cmd);
    assert_stock(&report);
    assert_eq!(report["shim_imps"], 0, "{report}");
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Failed);
    assert!(
        outcome.reason.contains("initGPUFamilySupport] is missing"),
        "{}",
        outcome.reason
    );
    // Reported once the device exists, asking it nothing (on this Metal the
    // real supportsFamily: may read a vector that is not there): no answers.
    assert!(
        outcome.reason.contains("the device was asked nothing"),
        "{}",
        outcome.reason
    );
    assert_eq!(outcome.stock.families, 0, "{outcome:?}");
    assert_eq!(outcome.effective.families, 0, "{outcome:?}");
    assert_eq!(outcome.stock.threadgroup_memory, 0, "{outcome:?}");
}

#[test]
fn given_metal_without_init_gpu_family_support_then_a_program_that_creates_no_device_neither_waits_nor_reports(
) {
    // Every AppKit tool links Metal: loading it must never check in (the old
    // shim did, from the loader's callback, and waited there).
    let daemon = FakeDaemon::start_delayed(unlock(APPLE7), std::time::Duration::from_secs(3));
    let mut cmd = injected(hostile("metalift-hostile"), &daemon.socket);
    cmd.env("LD_LIBRARY_PATH", simmetal("noinit")).arg("exec");
    let start = std::time::Instant::now();
    assert!(run(cmd, b"").status.success());
    let took = start.elapsed();
    assert!(took < std::time::Duration::from_secs(1), "took {took:?}");
    assert_eq!(daemon.connections(), 0);
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
    // Patched where Metal defines them: supportsFamily: in _MTLDevice (it is
    // defined nowhere else), the threadgroup memory in the driver class.
    let imps = capability_imps(&report);
    assert_eq!(
        imps["-[_MTLDevice supportsFamily:]"], "libmetalift.so",
        "{imps:?}"
    );
    assert_eq!(
        imps["-[AppleParavirtDevice maxThreadgroupMemoryLength]"], "libmetalift.so",
        "{imps:?}"
    );
    assert_eq!(
        imps["-[IOGPUMetalDevice recommendedMaxWorkingSetSize]"], "libsimmetal.so",
        "no working-set floor in this profile: {imps:?}"
    );
    assert_eq!(
        imps.len(),
        metals_own_imps("normal").len(),
        "no method added"
    );
}

#[test]
fn given_a_stock_verdict_then_the_capability_methods_are_exactly_metals_own() {
    let daemon = FakeDaemon::start(stock(Mode::Enforce, false));
    let report = probe_json(injected(probe(), &daemon.socket));
    assert_stock(&report);
    assert_eq!(report["shim_imps"], 0, "{report}");
    let imps = capability_imps(&report);
    assert!(
        imps.values().all(|image| image == "libsimmetal.so"),
        "{imps:?}"
    );
    assert_eq!(imps, metals_own_imps("normal"));
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Stock);
    assert_eq!(
        outcome.stock.families,
        paravirtual_families(),
        "{outcome:?}"
    );
}

#[test]
fn given_replaced_answers_that_do_not_take_effect_then_rolled_back_failed_and_no_hook_left() {
    // cached: the original -initGPUFamilySupport moves the device to a subclass
    // that answers from copies; the patched methods are never called.
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("LD_LIBRARY_PATH", simmetal("cached"));
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
    assert_eq!(outcome.stock.threadgroup_memory, 32768, "{outcome:?}");
    // Rolled back exactly: every capability method is Metal's own again.
    assert_eq!(capability_imps(&report), metals_own_imps("cached"));
}

#[test]
fn given_a_device_the_program_never_asks_then_the_outcome_still_goes_out_at_its_creation() {
    // devexec creates a device, asks it nothing and execs `sh`: the outcome was
    // sent when Metal's -initGPUFamilySupport returned.
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(hostile("metalift-hostile"), &daemon.socket);
    cmd.arg("devexec");
    assert!(run(cmd, b"").status.success());
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Applied, "{outcome:?}");
    assert_eq!(outcome.stock.threadgroup_memory, 32768, "{outcome:?}");
    assert_ne!(outcome.effective.families & bit("Apple7"), 0, "{outcome:?}");
}

#[test]
fn given_the_getters_moved_into_the_driver_class_then_the_drivers_methods_are_patched() {
    // `moved`: a macOS update in which AppleParavirtDevice defines supportsFamily:
    // itself (calling super). class_getInstanceMethod finds the driver's Method.
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("LD_LIBRARY_PATH", simmetal("moved"));
    let report = probe_json(cmd);
    assert_apple7(&report);
    let imps = capability_imps(&report);
    assert_eq!(
        imps["-[AppleParavirtDevice supportsFamily:]"], "libmetalift.so",
        "{imps:?}"
    );
    assert_eq!(
        imps["-[_MTLDevice supportsFamily:]"], "libsimmetal.so",
        "{imps:?}"
    );
    assert_eq!(daemon.outcome().result, OutcomeResult::Applied);
}

#[test]
fn given_a_wrapper_device_that_forwards_to_the_real_one_then_the_unlock_applies() {
    // `wrapper`: the program holds a forwarding wrapper from another image (as
    // with an API-validation layer); its questions reach the patched methods.
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("LD_LIBRARY_PATH", simmetal("wrapper"));
    assert_apple7(&probe_json(cmd));
    let outcome = daemon.outcome();
    assert_eq!(outcome.result, OutcomeResult::Applied, "{outcome:?}");
    assert_eq!(outcome.device_class, "AppleParavirtDevice");
    assert_eq!(outcome.stock.threadgroup_memory, 32768, "{outcome:?}");
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
fn expect_family_n_is_at_least_apple_n_and_equals_n_is_exactly() {
    let code = |mut cmd: std::process::Command, n: &str| {
        cmd.args(["--expect-family", n]);
        run(cmd, b"").status.code()
    };
    assert_eq!(code(clean(probe()), "5"), Some(0));
    assert_eq!(code(clean(probe()), "7"), Some(3));
    assert_eq!(
        code(clean(probe()), "4"),
        Some(0),
        "Apple5 is Apple4 or above"
    );
    assert_eq!(code(clean(probe()), "=4"), Some(3));
    assert_eq!(code(clean(probe()), "=5"), Some(0));
    let daemon = FakeDaemon::start(unlock(APPLE7));
    assert_eq!(code(injected(probe(), &daemon.socket), "7"), Some(0));
    assert_eq!(code(injected(probe(), &daemon.socket), "6"), Some(0));
    assert_eq!(code(injected(probe(), &daemon.socket), "=6"), Some(3));
}

#[test]
fn probe_help_prints_the_usage_on_stdout_and_exits_0() {
    for flag in ["--help", "-h"] {
        let mut cmd = clean(probe());
        cmd.arg(flag);
        let out = run(cmd, b"");
        assert_eq!(out.status.code(), Some(0), "{flag}");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.contains("--expect-family =N"), "{text}");
    }
    let mut cmd = clean(probe());
    cmd.arg("--bogus");
    assert_eq!(run(cmd, b"").status.code(), Some(2));
}

#[test]
fn given_a_daemon_that_answers_after_3_s_then_a_program_without_a_device_never_waits_and_one_with_a_device_gets_its_verdict(
) {
    let daemon = FakeDaemon::start_delayed(unlock(APPLE7), std::time::Duration::from_secs(3));
    // Links Metal but never creates a device: no connection, nothing waits.
    let mut cmd = injected(hostile("metalift-hostile"), &daemon.socket);
    cmd.arg("exec");
    let start = std::time::Instant::now();
    let output = run(cmd, b"");
    let took = start.elapsed();
    assert!(output.status.success());
    assert!(took < std::time::Duration::from_secs(1), "took {took:?}");
    assert_eq!(daemon.connections(), 0);
    // A Metal program that creates a device waits at its first device init.
    assert_apple7(&probe_json(injected(probe(), &daemon.socket)));
    assert_eq!(daemon.outcome().result, OutcomeResult::Applied);
}
