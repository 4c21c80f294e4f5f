//! The example policies in examples/ are valid, warning-free on the guest they are
//! written for, and decide as their comments say.

use std::path::PathBuf;

use metalift_policy::{
    compile_sources_with, Action, CompileOptions, HostFamily, Loaded, Mode, Policy, Source, Subject,
};

use crate::{at, render_all, winner};

/// The brand a macOS guest on an M2 host reads (`machdep.cpu.brand_string`).
const GUEST_BRAND: &str = "Apple M2 (Virtual)";

fn compile_example(name: &str, brand: Option<&str>) -> Loaded {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("example exists");
    let opts = CompileOptions {
        host: HostFamily {
            brand: brand.map(str::to_owned),
        },
        now: None,
    };
    match compile_sources_with(vec![Source::new(name, text)], &opts) {
        Ok(loaded) => loaded,
        Err(e) => panic!("{name}: {e}"),
    }
}

/// The example as metaliftd in an M2 guest compiles it, asserting it draws no warning.
fn example(name: &str) -> Policy {
    let loaded = compile_example(name, Some(GUEST_BRAND));
    assert!(
        loaded.warnings.is_empty(),
        "{}",
        render_all(&loaded.warnings, &loaded.sources)
    );
    loaded.policy
}

#[test]
fn the_shipped_profiles_follow_the_host_chip() {
    for name in ["default-policy.toml", "llama-fleet.toml"] {
        let p = example(name);
        for (profile, caps) in p.profiles() {
            assert_eq!(caps.apple_family_max, 8, "{name}: {profile}");
            assert!(p.profile_host(profile).is_some(), "{name}: {profile}");
        }
        // Where the chip cannot be read, "host" still loads, at 7, with a warning
        // naming it (and nothing else).
        let unread = compile_example(name, None);
        assert!(!unread.warnings.is_empty(), "{name}");
        for w in &unread.warnings {
            assert!(
                w.message
                    .contains("apple_family_max = \"host\": the host chip could not be read here"),
                "{name}: {w}"
            );
        }
    }
    // The development policy is for Linux rigs: no chip to follow, no warning there.
    let dev = compile_example("dev-policy.toml", None);
    assert!(dev.warnings.is_empty(), "{:?}", dev.warnings);
}

#[test]
fn the_default_policy_is_enforcing_defines_a_profile_and_unlocks_nothing() {
    let p = example("default-policy.toml");
    assert_eq!(p.mode(), Mode::Enforce);
    assert_eq!(p.rule_count(), 0);
    assert!(p.profile("native").is_some());
    assert_eq!(
        p.evaluate(
            &at("/opt/llama.cpp/bin/llama-server"),
            std::time::SystemTime::now()
        )
        .action,
        Action::Stock
    );
}

#[test]
fn the_llama_fleet_policy_decides_as_documented() {
    let p = example("llama-fleet.toml");
    assert_eq!(p.mode(), Mode::Enforce);
    assert_eq!(
        winner(&p, &at("/opt/llama.cpp/bin/llama-cli")).as_deref(),
        Some("llama-cpp-tools")
    );
    assert_eq!(
        winner(&p, &at("/opt/llama.cpp/bin/llama-quantize")).as_deref(),
        Some("quantize-stays-stock")
    );
    assert_eq!(
        p.evaluate(
            &at("/opt/llama.cpp/bin/llama-quantize"),
            std::time::SystemTime::now()
        )
        .action,
        Action::Stock
    );

    let server = |user: &str| Subject {
        user: Some(user.into()),
        ..at("/opt/llama.cpp/bin/llama-server")
    };
    match p
        .evaluate(&server("inference"), std::time::SystemTime::now())
        .action
    {
        Action::Unlock {
            profile,
            capabilities,
        } => {
            assert_eq!(profile, "native-big");
            assert_eq!(capabilities.recommended_working_set, Some(20 << 30));
        }
        Action::Stock => panic!("the server is unlocked"),
    }
    // Run by someone else, the server falls back to the tools glob.
    assert_eq!(
        winner(&p, &server("alice")).as_deref(),
        Some("llama-cpp-tools")
    );

    let runner = Subject {
        team_id: Some("ABCDE12345".into()),
        signing_id: Some("com.example.bench-runner".into()),
        ..at("/Applications/Bench.app/Contents/MacOS/bench")
    };
    assert_eq!(winner(&p, &runner).as_deref(), Some("bench-runner"));

    let ci = Subject {
        parent_path: Some("/Users/runner/actions-runner/bin/Runner.Worker".into()),
        ..at("/Users/runner/work/app/app/build/bin/llama-bench")
    };
    assert_eq!(winner(&p, &ci).as_deref(), Some("ci-job-builds"));
    assert_eq!(winner(&p, &at("/bin/ls")), None);
}

#[test]
fn the_dev_policy_unlocks_metalift_probe_by_name() {
    let p = example("dev-policy.toml");
    let v = p.evaluate(
        &at("/work/main/target/debug/metalift-probe"),
        std::time::SystemTime::now(),
    );
    assert_eq!(v.rule.as_deref(), Some("probe"));
    assert!(matches!(v.action, Action::Unlock { .. }));
    assert_eq!(
        p.evaluate(&at("/bin/sh"), std::time::SystemTime::now())
            .action,
        Action::Stock
    );
}
