//! Never above the host: a profile asking more Apple family than the host chip has is
//! applied at the host's family, the verdict says what was asked and what is applied,
//! and the load warns; with the host unknown, Apple9 and above draw a warning.

use metalift_policy::{
    compile_sources_with, Action, CompileOptions, FamilyCap, HostFamily, Loaded, Mode, Source,
};

use crate::at;

fn policy_asking(family: &str, mode: &str) -> String {
    format!(
        "version = 1\nmode = \"{mode}\"\n[profile.apple9]\napple_family_max = {family}\n[[rule]]\nid = \"llama\"\npath = \"/opt/llama\"\nunlock = \"apple9\"\n"
    )
}

fn compile_on(brand: Option<&str>, text: &str) -> Loaded {
    let opts = CompileOptions {
        host: HostFamily {
            brand: brand.map(str::to_owned),
        },
        now: None,
    };
    match compile_sources_with(vec![Source::new("policy.toml", text)], &opts) {
        Ok(l) => l,
        Err(e) => panic!("{e}"),
    }
}

fn warnings(loaded: &Loaded) -> Vec<String> {
    loaded.warnings.iter().map(ToString::to_string).collect()
}

fn applied_family(action: &Action) -> Option<u8> {
    match action {
        Action::Unlock { capabilities, .. } => Some(capabilities.apple_family_max),
        Action::Stock => None,
    }
}

#[test]
fn given_an_m1_host_when_a_profile_asks_apple9_then_the_verdict_applies_apple7_and_says_so() {
    let loaded = compile_on(Some("Apple M1 (Virtual)"), &policy_asking("9", "enforce"));
    let expected_cap = FamilyCap {
        requested: 9,
        applied: 7,
        host: "Apple M1 (Virtual)".into(),
    };
    for v in [
        loaded
            .policy
            .evaluate(&at("/opt/llama"), std::time::SystemTime::now()),
        loaded
            .policy
            .explain(&at("/opt/llama"), std::time::SystemTime::now()),
    ] {
        assert_eq!(applied_family(&v.action), Some(7), "{v:?}");
        assert_eq!(v.family_cap.as_ref(), Some(&expected_cap), "{v:?}");
        assert_eq!(v.requested_family(), Some(9));
    }
    // The compiled profile holds the applied value; the cap is there to say why.
    assert_eq!(
        loaded.policy.profile("apple9").map(|c| c.apple_family_max),
        Some(7)
    );
    assert_eq!(
        loaded.policy.profile_cap("apple9").map(|c| c.describe("apple9")),
        Some("profile `apple9` asks Apple9; this host (Apple M1 (Virtual)) has Apple7: applied as Apple7".to_owned())
    );
    // The load says so, at the value.
    assert_eq!(
        warnings(&loaded),
        ["policy.toml:4:20: warning: profile `apple9` asks Apple9; this host (Apple M1 (Virtual)) has Apple7: applied as Apple7, as metaliftd on this host applies it: an unlock never claims more than the host chip has: Metal derives its own behaviour from the family answers (at Apple9 Metal turns its own bf16 emulation off, which this chip needs); `apple_family_max = \"host\"` follows each host's chip"]
    );
}

#[test]
fn given_an_m1_host_in_monitor_mode_the_would_be_unlock_is_capped_too() {
    let loaded = compile_on(Some("Apple M1 (Virtual)"), &policy_asking("9", "monitor"));
    let v = loaded
        .policy
        .evaluate(&at("/opt/llama"), std::time::SystemTime::now());
    assert_eq!((v.mode, &v.action), (Mode::Monitor, &Action::Stock));
    assert_eq!(v.family_cap.map(|c| (c.requested, c.applied)), Some((9, 7)));
}

#[test]
fn given_an_m2_host_apple10_is_applied_as_apple8() {
    let loaded = compile_on(
        Some("Apple M2 Pro (Virtual)"),
        &policy_asking("10", "enforce"),
    );
    let v = loaded
        .policy
        .evaluate(&at("/opt/llama"), std::time::SystemTime::now());
    assert_eq!(applied_family(&v.action), Some(8));
    assert_eq!(v.requested_family(), Some(10));
}

#[test]
fn given_an_m3_host_apple9_stays_apple9_with_no_warning() {
    let loaded = compile_on(
        Some("Apple M3 Max (Virtual)"),
        &policy_asking("9", "enforce"),
    );
    let v = loaded
        .policy
        .evaluate(&at("/opt/llama"), std::time::SystemTime::now());
    assert_eq!(applied_family(&v.action), Some(9));
    assert_eq!(v.family_cap, None);
    assert_eq!(v.requested_family(), Some(9));
    assert!(loaded.warnings.is_empty(), "{:?}", warnings(&loaded));
}

#[test]
fn at_or_below_the_host_and_with_host_nothing_is_capped() {
    for (brand, family) in [
        ("Apple M1 (Virtual)", "7"),
        ("Apple M1 (Virtual)", "5"),
        ("Apple M1 (Virtual)", "\"host\""),
        ("Apple M2 (Virtual)", "8"),
    ] {
        let loaded = compile_on(Some(brand), &policy_asking(family, "enforce"));
        let v = loaded
            .policy
            .evaluate(&at("/opt/llama"), std::time::SystemTime::now());
        assert_eq!(v.family_cap, None, "{brand} {family}");
        assert!(
            loaded.warnings.is_empty(),
            "{brand} {family}: {:?}",
            warnings(&loaded)
        );
    }
}

#[test]
fn given_an_unknown_host_apple9_and_above_stay_as_asked_with_a_bf16_warning() {
    for brand in [None, Some("Apple M9")] {
        for family in [9, 10] {
            let loaded = compile_on(brand, &policy_asking(&family.to_string(), "enforce"));
            let v = loaded
                .policy
                .evaluate(&at("/opt/llama"), std::time::SystemTime::now());
            // Nothing to cap at: applied as asked.
            assert_eq!(applied_family(&v.action), Some(family));
            assert_eq!(v.family_cap, None);
            let w = warnings(&loaded);
            assert_eq!(w.len(), 1, "{w:?}");
            assert!(
                w[0].starts_with(&format!(
                    "policy.toml:4:20: warning: profile `apple9` asks Apple{family} and "
                )),
                "{w:?}"
            );
            assert!(
                w[0].contains("at Apple9 and above Metal turns its own bf16 emulation off"),
                "{w:?}"
            );
        }
    }
    let unread = compile_on(None, &policy_asking("9", "enforce"));
    assert!(warnings(&unread)[0].contains("the host chip could not be read here"));
    // Below Apple9, an unknown host draws no warning.
    let eight = compile_on(None, &policy_asking("8", "enforce"));
    assert!(eight.warnings.is_empty(), "{:?}", warnings(&eight));
}
