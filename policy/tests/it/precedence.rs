//! Which rule wins when several match, and what monitor mode answers.

use metalift_policy::{Action, Mode, Source, Subject};

use crate::{at, policy, policy_from, winner, HEADER};

const SHA: &str = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb";
const CDHASH: &str = "cccccccccccccccccccccccccccccccccccccccc";

/// A subject that every matcher kind below matches.
fn everything() -> Subject {
    Subject {
        path: "/opt/llama/bin/llama-server".into(),
        uid: 501,
        user: Some("ci".into()),
        parent_path: Some("/bin/zsh".into()),
        sha256: Some([0xbb; 32]),
        cdhash: Some(vec![0xcc; 20]),
        team_id: Some("ABCDE12345".into()),
        signing_id: Some("org.ggml.llama-server".into()),
        anchor: Some(metalift_policy::Anchor::DeveloperId),
        unreadable: None,
    }
}

/// One rule per identity kind, least specific first, alternating unlock/stock so
/// that the winner's action also shows which one won.
const LADDER: [(&str, &str); 7] = [
    ("name", "name = \"llama-server\""),
    ("glob", "path = \"/opt/llama/bin/*\""),
    ("exact", "path = \"/opt/llama/bin/llama-server\""),
    ("team", "team_id = \"ABCDE12345\""),
    (
        "signing",
        "team_id = \"ABCDE12345\"\nsigning_id = \"org.ggml.llama-server\"",
    ),
    ("sha", "sha256 = \"SHA\""),
    ("cdhash", "cdhash = \"CDHASH\""),
];

fn ladder(upto: usize) -> String {
    let mut text = HEADER.to_owned();
    for (id, matcher) in LADDER.iter().take(upto) {
        text.push_str(&format!(
            "[[rule]]\nid = \"{id}\"\n{}\nunlock = \"apple7\"\n",
            matcher.replace("CDHASH", CDHASH).replace("SHA", SHA)
        ));
    }
    text
}

#[test]
fn the_most_specific_identity_wins_at_every_level() {
    // cdhash > sha256 > signing_id > team_id > exact path > glob path > name
    for upto in 1..=LADDER.len() {
        let p = policy(&ladder(upto));
        assert_eq!(
            winner(&p, &everything()).as_deref(),
            Some(LADDER[upto - 1].0),
            "with the first {upto} levels"
        );
    }
}

#[test]
fn a_more_specific_rule_wins_even_when_it_comes_later_in_the_file() {
    let reversed: String = {
        let text = ladder(LADDER.len());
        let (head, rules) = text.split_at(HEADER.len());
        let mut parts: Vec<&str> = rules.split("[[rule]]").filter(|s| !s.is_empty()).collect();
        parts.reverse();
        format!("{head}[[rule]]{}", parts.join("[[rule]]"))
    };
    let p = policy(&reversed);
    assert_eq!(winner(&p, &everything()).as_deref(), Some("cdhash"));
}

#[test]
fn a_less_specific_rule_decides_when_the_more_specific_one_does_not_match() {
    let p = policy(&ladder(LADDER.len()));
    let mut s = everything();
    s.cdhash = None;
    s.sha256 = None;
    assert_eq!(winner(&p, &s).as_deref(), Some("signing"));
    s.signing_id = Some("other".into());
    assert_eq!(winner(&p, &s).as_deref(), Some("team"));
    s.team_id = None;
    assert_eq!(winner(&p, &s).as_deref(), Some("exact"));
    s.path = "/opt/llama/bin/other".into();
    assert_eq!(winner(&p, &s).as_deref(), Some("glob"));
    s.path = "/usr/bin/llama-server".into();
    assert_eq!(winner(&p, &s).as_deref(), Some("name"));
}

#[test]
fn a_signing_id_rule_counts_at_its_most_specific_matcher() {
    // "signing" has team_id + signing_id; a plain team_id rule that says stock loses to it.
    let text = format!(
        "{HEADER}[[rule]]\nid = \"team-stock\"\nteam_id = \"ABCDE12345\"\nstock = true\n\
         [[rule]]\nid = \"signing\"\nteam_id = \"ABCDE12345\"\nsigning_id = \"org.ggml.llama-server\"\nunlock = \"apple7\"\n"
    );
    assert_eq!(
        winner(&policy(&text), &everything()).as_deref(),
        Some("signing")
    );
}

#[test]
fn at_equal_specificity_stock_beats_unlock_whatever_the_order() {
    for stock_first in [true, false] {
        let stock = "[[rule]]\nid = \"stock\"\npath = \"/opt/llama/bin/*\"\nstock = true\n";
        let unlock =
            "[[rule]]\nid = \"unlock\"\npath = \"/opt/llama/bin/llama-*\"\nunlock = \"apple7\"\n";
        let text = if stock_first {
            format!("{HEADER}{stock}{unlock}")
        } else {
            format!("{HEADER}{unlock}{stock}")
        };
        let p = policy(&text);
        let v = p.evaluate(&everything(), std::time::SystemTime::now());
        assert_eq!(v.rule.as_deref(), Some("stock"));
        assert_eq!(v.action, Action::Stock);
    }
}

#[test]
fn qualifiers_do_not_raise_specificity_so_a_qualified_unlock_loses_to_a_plain_stock() {
    let text = format!(
        "{HEADER}[[rule]]\nid = \"for-ci\"\nname = \"llama-server\"\nuser = \"ci\"\nuid = 501\nparent = \"/bin/*\"\nunlock = \"apple7\"\n\
         [[rule]]\nid = \"never\"\nname = \"llama-server\"\nstock = true\n"
    );
    assert_eq!(
        winner(&policy(&text), &everything()).as_deref(),
        Some("never")
    );
}

#[test]
fn at_equal_specificity_and_action_the_earlier_rule_wins() {
    let text = format!(
        "{HEADER}[profile.apple9]\napple_family_max = 9\n\
         [[rule]]\nid = \"first\"\npath = \"/opt/llama/bin/*\"\nunlock = \"apple7\"\n\
         [[rule]]\nid = \"second\"\npath = \"/opt/**\"\nunlock = \"apple9\"\n"
    );
    let p = policy(&text);
    assert_eq!(winner(&p, &everything()).as_deref(), Some("first"));
    let e = p.explain(&everything(), std::time::SystemTime::now());
    assert!(e.trace[0].why.contains("wins"), "{:?}", e.trace);
    assert!(
        e.trace[1].why.contains("comes first in file order"),
        "{:?}",
        e.trace
    );
}

#[test]
fn file_order_runs_across_policy_d_files_after_the_main_file() {
    let main = Source::new(
        "policy.toml",
        format!("{HEADER}[profile.apple9]\napple_family_max = 9\n"),
    );
    let a = Source::new(
        "policy.d/10-a.toml",
        "[[rule]]\nid = \"a\"\nname = \"llama-server\"\nunlock = \"apple9\"\n",
    );
    let b = Source::new(
        "policy.d/20-b.toml",
        "[[rule]]\nid = \"b\"\nname = \"llama-server\"\nunlock = \"apple7\"\n",
    );
    let p = policy_from(vec![main.clone(), a.clone(), b.clone()]);
    assert_eq!(winner(&p, &everything()).as_deref(), Some("a"));
    // The caller passes policy.d/ in name order; the order given is the order used.
    let p = policy_from(vec![main, b, a]);
    assert_eq!(winner(&p, &everything()).as_deref(), Some("b"));
}

#[test]
fn rules_in_policy_d_may_use_profiles_from_the_main_file_and_from_each_other() {
    let main = Source::new(
        "policy.toml",
        "version = 1\n[[rule]]\nid = \"m\"\nname = \"m\"\nunlock = \"fleet\"\n",
    );
    let d = Source::new(
        "policy.d/fleet.toml",
        "version = 1\n[profile.fleet]\napple_family_max = 8\n",
    );
    let p = policy_from(vec![main, d]);
    assert!(matches!(
        p.evaluate(&at("/bin/m"), std::time::SystemTime::now())
            .action,
        Action::Unlock { .. }
    ));
}

#[test]
fn monitor_mode_never_unlocks_but_says_what_it_would_unlock() {
    let p = policy(
        "version = 1\nmode = \"monitor\"\n[profile.apple7]\napple_family_max = 7\n\
         [[rule]]\nid = \"llama\"\nname = \"llama-server\"\nunlock = \"apple7\"\n\
         [[rule]]\nid = \"no\"\nname = \"ls\"\nstock = true\n",
    );
    assert_eq!(p.mode(), Mode::Monitor);
    let v = p.evaluate(&everything(), std::time::SystemTime::now());
    assert_eq!(v.action, Action::Stock);
    assert_eq!(v.mode, Mode::Monitor);
    assert_eq!(v.rule.as_deref(), Some("llama"));
    assert_eq!(v.would_unlock.as_deref(), Some("apple7"));
    // A stock winner would not unlock anything.
    let v = p.evaluate(&at("/bin/ls"), std::time::SystemTime::now());
    assert_eq!((v.rule.as_deref(), v.would_unlock), (Some("no"), None));
    // No match: nothing.
    let v = p.evaluate(&at("/bin/cat"), std::time::SystemTime::now());
    assert_eq!((v.rule, v.would_unlock), (None, None));
}

#[test]
fn enforce_mode_is_the_default_and_never_sets_would_unlock() {
    let p = policy(&format!(
        "{HEADER}[[rule]]\nid = \"l\"\nname = \"llama-server\"\nunlock = \"apple7\"\n"
    ));
    assert_eq!(p.mode(), Mode::Enforce);
    let v = p.evaluate(&everything(), std::time::SystemTime::now());
    assert!(matches!(v.action, Action::Unlock { .. }));
    assert_eq!(v.would_unlock, None);
}

#[test]
fn explain_lists_every_rule_with_why_it_matched_or_not() {
    let p = policy(&ladder(LADDER.len()));
    let mut s = everything();
    s.sha256 = None;
    s.team_id = Some("OTHER12345".into());
    let e = p.explain(&s, std::time::SystemTime::now());
    assert_eq!(e.trace.len(), LADDER.len());
    let why = |id: &str| {
        e.trace
            .iter()
            .find(|c| c.rule == id)
            .map(|c| (c.matched, c.why.clone()))
            .unwrap_or_default()
    };
    assert_eq!(e.rule.as_deref(), Some("cdhash"));
    assert!(why("cdhash").0 && why("cdhash").1.contains("wins"));
    assert!(!why("sha").0 && why("sha").1.contains("sha256 not computed"));
    assert!(!why("team").0 && why("team").1.contains("not `ABCDE12345`"));
    assert!(
        why("exact").0
            && why("exact")
                .1
                .contains("cdhash is more specific than exact path")
    );
    assert!(why("name").0);
    assert!(e
        .trace
        .iter()
        .all(|c| c.location.starts_with("policy.toml:")));
}

#[test]
fn the_empty_policy_leaves_everything_stock() {
    let p = metalift_policy::Policy::empty();
    assert_eq!(p.rule_count(), 0);
    assert_eq!(
        p.evaluate(&everything(), std::time::SystemTime::now())
            .action,
        Action::Stock
    );
    // The sha256 of the empty input.
    assert_eq!(
        p.sha256_hex(),
        "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    );
}

#[test]
fn the_policy_sha256_covers_texts_and_drop_in_names_but_not_where_the_files_are() {
    let text = ladder(3);
    let a = policy_from(vec![Source::new("policy.toml", text.clone())]);
    let b = policy_from(vec![Source::new("policy.toml", text.clone())]);
    assert_eq!(a.sha256_hex(), b.sha256_hex());
    // The main file is hashed by its contents only: however its path is spelled.
    for spelling in ["./policy.toml", "/etc/metalift/policy.toml", "other.toml"] {
        let moved = policy_from(vec![Source::new(spelling, text.clone())]);
        assert_eq!(a.sha256_hex(), moved.sha256_hex(), "{spelling}");
    }
    let edited = policy_from(vec![Source::new(
        "policy.toml",
        format!("{text}\n# comment\n"),
    )]);
    assert_ne!(a.sha256_hex(), edited.sha256_hex());
    assert_eq!(a.rule_count(), 3);

    // A drop-in counts by its file name and contents, not its directory.
    let with = |name: &str, body: &str| {
        policy_from(vec![
            Source::new("policy.toml", text.clone()),
            Source::new(name, body),
        ])
        .sha256_hex()
        .to_owned()
    };
    let base = with("/etc/metalift/policy.d/10-a.toml", "version = 1\n");
    assert_eq!(base, with("policy.d/10-a.toml", "version = 1\n"));
    assert_ne!(base, with("policy.d/20-a.toml", "version = 1\n"));
    assert_ne!(base, with("policy.d/10-a.toml", "version = 1 \n"));
    assert_ne!(base, a.sha256_hex());
}

#[test]
fn the_policy_sha256_is_sha256_of_main_then_nul_name_nul_contents_per_drop_in() {
    use sha2::{Digest, Sha256};
    let main = ladder(1);
    let p = policy_from(vec![
        Source::new("x/policy.toml", main.clone()),
        Source::new("x/policy.d/a.toml", "version = 1\n"),
    ]);
    let mut bytes = main.into_bytes();
    bytes.extend_from_slice(b"\0a.toml\0version = 1\n");
    assert_eq!(p.sha256_hex(), hex::encode(Sha256::digest(&bytes)));
}
