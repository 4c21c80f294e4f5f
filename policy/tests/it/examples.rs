//! The example policies in examples/ are valid, warning-free, and decide as their comments say.

use std::path::PathBuf;

use metalift_policy::{compile_sources, Action, Mode, Policy, Source, Subject};

use crate::{at, render_all, winner};

fn example(name: &str) -> Policy {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples")
        .join(name);
    let text = std::fs::read_to_string(&path).expect("example exists");
    match compile_sources(vec![Source::new(name, text)]) {
        Ok(loaded) => {
            assert!(
                loaded.warnings.is_empty(),
                "{}",
                render_all(&loaded.warnings, &loaded.sources)
            );
            loaded.policy
        }
        Err(e) => panic!("{name}: {e}"),
    }
}

#[test]
fn the_default_policy_is_enforcing_defines_a_profile_and_unlocks_nothing() {
    let p = example("default-policy.toml");
    assert_eq!(p.mode(), Mode::Enforce);
    assert_eq!(p.rule_count(), 0);
    assert!(p.profile("apple7").is_some());
    assert_eq!(
        p.evaluate(&at("/opt/llama.cpp/bin/llama-server")).action,
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
        p.evaluate(&at("/opt/llama.cpp/bin/llama-quantize")).action,
        Action::Stock
    );

    let server = |user: &str| Subject {
        user: Some(user.into()),
        ..at("/opt/llama.cpp/bin/llama-server")
    };
    match p.evaluate(&server("inference")).action {
        Action::Unlock {
            profile,
            capabilities,
        } => {
            assert_eq!(profile, "apple7-big");
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
    let v = p.evaluate(&at("/work/main/target/debug/metalift-probe"));
    assert_eq!(v.rule.as_deref(), Some("probe"));
    assert!(matches!(v.action, Action::Unlock { .. }));
    assert_eq!(p.evaluate(&at("/bin/sh")).action, Action::Stock);
}
