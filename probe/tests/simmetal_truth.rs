//! The simulated Metal against the evidence, where the shim's tests lean on it
//! (issue 31 items 5 and 9): Metal's registration lock behaves as an
//! `os_unfair_lock` (recursion and a dead owner kill the process), devices are
//! registered once per process (a forked child gets its parent's), profile 10001
//! pushes no Apple family, `readWriteTextureSupport` is 2 or 0, and the compute
//! path honours Metal's bf16 emulation, which it derives from the Apple9 answer.
//! Each modelled behaviour names its evidence in `probe/simmetal/simmetal.m` or
//! `compute.m`.
//!
//! Linux only: the simulated Metal and `LD_PRELOAD`.
#![cfg(target_os = "linux")]

mod support;

use std::process::Output;

use metalift_policy::profile::Capabilities;
use support::*;

/// The fields of `hostile answers`' output, `name value` per line.
fn answer(stdout: &[u8], name: &str) -> String {
    String::from_utf8_lossy(stdout)
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .unwrap_or_else(|| panic!("no {name}: {}", String::from_utf8_lossy(stdout)))
        .to_owned()
}

/// `metalift-hostile answers` without the shim, the driver returning `profile`
/// (`None`: the simulation's own).
fn answers(profile: Option<&str>) -> Output {
    let mut cmd = clean(hostile("metalift-hostile"));
    cmd.arg("answers");
    match profile {
        Some(p) => cmd.env("SIMMETAL_FEATURE_PROFILE", p),
        None => cmd.env_remove("SIMMETAL_FEATURE_PROFILE"),
    };
    let output = run(cmd, b"");
    assert!(output.status.success(), "{output:?}");
    output
}

#[test]
fn profile_10001_answers_no_apple_family_as_in_the_decompile() {
    // Red with build_families giving 10001 the paravirtual families.
    let output = answers(Some("10001"));
    assert_eq!(answer(&output.stdout, "apple"), "0", "{output:?}");
    // The simulation's own profile does answer Apple5 (REAL-METAL 6).
    assert_eq!(answer(&answers(None).stdout, "apple"), "5");
}

#[test]
fn read_write_texture_support_is_tier_2_with_apple4_and_none_without() {
    // The decompile's two values; red with the old 2/1.
    let with = answers(None);
    assert_eq!(answer(&with.stdout, "apple"), "5", "{with:?}");
    assert_eq!(answer(&with.stdout, "rwtexture"), "2", "{with:?}");
    let without = answers(Some("10001"));
    assert_eq!(answer(&without.stdout, "rwtexture"), "0", "{without:?}");
}

#[test]
fn a_child_forked_after_its_parent_registered_gets_the_parents_device_and_never_checks_in() {
    // Metal registers once per process (decompiled MTLRegisterDevices): the
    // child's MTLCreateSystemDefaultDevice takes the free lock, finds the
    // registration it inherited and returns the parent's device, patched as the
    // parent left it. No -initGPUFamilySupport, so no second check-in. Red with
    // the child registering a device of its own (two check-ins, another pointer).
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(hostile("metalift-hostile"), &daemon.socket);
    cmd.arg("forkafter");
    let output = run(cmd, b"");
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let device = |role: &str| {
        stdout
            .lines()
            .find(|l| l.starts_with(role))
            .and_then(|l| l.split(" device ").nth(1))
            .unwrap_or_else(|| panic!("no {role} device: {stdout}"))
            .to_owned()
    };
    assert_eq!(device("parent "), device("child "), "{stdout}");
    assert_eq!(
        stdout.matches("family 7").count(),
        2,
        "the child's device answers as the parent's: {stdout}"
    );
    assert_eq!(daemon.check_ins(), 1, "only the parent checked in");
    assert_eq!(daemon.outcomes_now().len(), 1, "one outcome, the parent's");
}

#[test]
fn creating_a_device_inside_its_own_registration_dies_as_a_recursive_os_unfair_lock() {
    // A hook of the program's on -initWorkarounds (which Metal runs under its
    // registration lock) creates the default device again: libplatform's
    // "Trying to recursively lock an os_unfair_lock" trap. Red with the old
    // pthread mutex, which waits for itself (the program's alarm ends it with
    // SIGALRM after 15 s).
    let daemon = FakeDaemon::start(unlock(APPLE7));
    let mut cmd = injected(hostile("metalift-hostile"), &daemon.socket);
    cmd.arg("recurse");
    let output = run(cmd, b"");
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(output.status.signal(), Some(libc::SIGTRAP), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("Trying to recursively lock an os_unfair_lock"),
        "{stderr}"
    );
}

/// `metalift-probe --verify --json` under the shim unlocking `capabilities`, on a
/// simulated host whose chip is `brand`.
fn verify_on(brand: &str, capabilities: Capabilities) -> (Output, serde_json::Value) {
    let daemon = FakeDaemon::start(unlock(capabilities));
    let mut cmd = injected(probe(), &daemon.socket);
    cmd.env("SIMMETAL_HOST_CHIP_BRAND", brand)
        .args(["--verify", "--json"]);
    run_json(cmd)
}

fn result_of(json: &serde_json::Value, kernel: &str) -> String {
    json["verification"]["kernels"]
        .as_array()
        .unwrap_or_else(|| panic!("no kernels: {json}"))
        .iter()
        .find(|k| k["kernel"] == kernel)
        .and_then(|k| k["result"].as_str())
        .unwrap_or_else(|| panic!("no {kernel}: {json}"))
        .to_owned()
}

const APPLE9: Capabilities = Capabilities {
    apple_family_max: 9,
    ..APPLE7
};

#[test]
fn verify_catches_an_apple9_claim_on_an_m2_host_in_the_bfloat_kernel() {
    // Apple9 switches Metal's bf16 emulation off (requiresBFloat16Emulation is
    // !Apple9, REAL-METAL 4); an M2 (Apple8) GPU has no native bf16. Red with
    // the compute path ignoring the emulation flag (every kernel passed).
    let (output, json) = verify_on("Apple M2 (Virtual)", APPLE9);
    assert_eq!(json["requires_bf16_emulation"], false, "{json}");
    assert_eq!(output.status.code(), Some(4), "{json}");
    assert_eq!(result_of(&json, "metalift_bfloat"), "differs", "{json}");
    for kernel in [
        "metalift_simd_sum",
        "metalift_simd_max",
        "metalift_simdgroup_mm",
        "metalift_threadgroup",
    ] {
        assert_eq!(result_of(&json, kernel), "pass", "{kernel}: {json}");
    }
}

#[test]
fn an_apple7_claim_on_an_m2_host_and_an_apple9_claim_on_an_m3_host_pass_the_bfloat_kernel() {
    // Apple7: Metal keeps emulating bf16, which computes right on any GPU.
    let (output, json) = verify_on("Apple M2 (Virtual)", APPLE7);
    assert_eq!(json["requires_bf16_emulation"], true, "{json}");
    assert!(output.status.success(), "{json}");
    assert_eq!(result_of(&json, "metalift_bfloat"), "pass", "{json}");
    // Apple9 on an M3 (Apple9) host: native bf16, also right.
    let (output, json) = verify_on("Apple M3 (Virtual)", APPLE9);
    assert!(output.status.success(), "{json}");
    assert_eq!(result_of(&json, "metalift_bfloat"), "pass", "{json}");
}
