//! `apple_family_max = "host"`: accepted, resolved from the host's chip brand, and
//! every other word refused.

use metalift_policy::{compile_sources_with, Action, CompileOptions, HostFamily, Source};

use crate::{at, problems};

const HOST_POLICY: &str = "version = 1\n[profile.native]\napple_family_max = \"host\"\n[[rule]]\nid = \"llama\"\npath = \"/opt/llama\"\nunlock = \"native\"\n";

fn compile_on(brand: Option<&str>) -> metalift_policy::Loaded {
    let opts = CompileOptions {
        host: HostFamily {
            brand: brand.map(str::to_owned),
        },
        now: None,
    };
    match compile_sources_with(vec![Source::new("policy.toml", HOST_POLICY)], &opts) {
        Ok(l) => l,
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn host_resolves_to_the_family_of_the_brand_and_reaches_the_verdict() {
    for (brand, family) in [
        ("Apple M1 Max", 7),
        ("Apple M2 (Virtual)", 8),
        ("Apple M3 Max (Virtual)", 9),
        ("Apple M4 Pro (Virtual)", 9),
        ("Apple M5 (Virtual)", 10),
    ] {
        let loaded = compile_on(Some(brand));
        assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
        let v = loaded
            .policy
            .evaluate(&at("/opt/llama"), std::time::SystemTime::now());
        match v.action {
            Action::Unlock { capabilities, .. } => {
                assert_eq!(capabilities.apple_family_max, family, "{brand}");
            }
            Action::Stock => panic!("stock for {brand}"),
        }
        let host = loaded
            .policy
            .profile_host("native")
            .expect("a host profile");
        assert_eq!(host.describe(), format!("host: {brand}"));
    }
}

#[test]
fn an_unknown_host_chip_resolves_to_7_with_a_warning_at_the_value() {
    let loaded = compile_on(Some("Apple M9"));
    assert_eq!(
        loaded.policy.profile("native").map(|c| c.apple_family_max),
        Some(7)
    );
    let w: Vec<String> = loaded.warnings.iter().map(ToString::to_string).collect();
    assert_eq!(
        w,
        ["policy.toml:3:20: warning: apple_family_max = \"host\": the chip `Apple M9` is not one this metalift knows (M1 → 7, M2 → 8, M3/M4 → 9, M5 → 10): the ceiling is 7, the family every Apple silicon Mac has (metaliftd reads its host's chip from `sysctl machdep.cpu.brand_string`, or METALIFT_HOST_CHIP_BRAND in its own environment)"]
    );
    let unread = compile_on(None);
    assert!(unread.warnings[0]
        .message
        .contains("the host chip could not be read here: the ceiling is 7"));
}

#[test]
fn a_numeric_ceiling_is_not_a_host_profile() {
    let loaded = match compile_sources_with(
        vec![Source::new(
            "policy.toml",
            HOST_POLICY.replace("\"host\"", "8"),
        )],
        &CompileOptions::default(),
    ) {
        Ok(l) => l,
        Err(e) => panic!("{e}"),
    };
    assert!(loaded.policy.profile_host("native").is_none());
}

#[test]
fn apple_family_max_words_other_than_host_are_errors() {
    assert_eq!(
        problems(&HOST_POLICY.replace("\"host\"", "\"Host\""))[0],
        ["3:20: error: apple_family_max must be a number (Apple5..Apple10) or \"host\", not \"Host\""][0]
    );
    assert_eq!(
        problems(&HOST_POLICY.replace("\"host\"", "7.5"))[0],
        ["3:20: error: `apple_family_max` must be an integer or \"host\", found float"][0]
    );
}
