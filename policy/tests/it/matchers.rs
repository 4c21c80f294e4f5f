//! Each matcher on its own, holding and failing.

use metalift_policy::{Action, Subject};

use crate::{at, policy, winner, HEADER};

fn one_rule(matchers: &str) -> metalift_policy::Policy {
    policy(&format!(
        "{HEADER}[[rule]]\nid = \"r\"\n{matchers}\nunlock = \"apple7\"\n"
    ))
}

const SHA: &str = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
const CDHASH: &str = "0123456789abcdef0123456789abcdef01234567";

#[test]
fn exact_path_matches_only_that_path() {
    let p = one_rule("path = \"/opt/bin/llama-server\"");
    assert_eq!(
        winner(&p, &at("/opt/bin/llama-server")).as_deref(),
        Some("r")
    );
    assert_eq!(winner(&p, &at("/opt/bin/llama-server2")), None);
    assert_eq!(winner(&p, &at("/other/bin/llama-server")), None);
}

#[test]
fn glob_star_stays_within_one_component_and_double_star_crosses() {
    let p = one_rule("path = \"/opt/*/llama-*\"");
    assert!(winner(&p, &at("/opt/bin/llama-cli")).is_some());
    assert!(winner(&p, &at("/opt/a/b/llama-cli")).is_none());
    let p = one_rule("path = \"/opt/**/llama-*\"");
    assert!(winner(&p, &at("/opt/a/b/llama-cli")).is_some());
    assert!(winner(&p, &at("/usr/bin/llama-cli")).is_none());
}

#[test]
fn glob_classes_and_alternatives() {
    let p = one_rule("path = \"/opt/{llama,whisper}-[0-9]\"");
    assert!(winner(&p, &at("/opt/llama-1")).is_some());
    assert!(winner(&p, &at("/opt/whisper-7")).is_some());
    assert!(winner(&p, &at("/opt/llama-x")).is_none());
}

#[test]
fn name_matches_the_file_name_anywhere() {
    let p = one_rule("name = \"metalift-probe\"");
    assert!(winner(&p, &at("/usr/local/bin/metalift-probe")).is_some());
    assert!(winner(&p, &at("/tmp/x/metalift-probe")).is_some());
    assert!(winner(&p, &at("/tmp/metalift-probe-2")).is_none());
    assert!(winner(&p, &at("/")).is_none());
}

#[test]
fn sha256_matches_the_digest_case_insensitively_and_never_an_uncomputed_one() {
    let p = one_rule(&format!("sha256 = \"{}\"", SHA.to_uppercase()));
    let mut s = at("/x");
    assert!(winner(&p, &s).is_none(), "no digest computed: no match");
    s.sha256 = Some([0xaa; 32]);
    assert!(winner(&p, &s).is_some());
    s.sha256 = Some([0xab; 32]);
    assert!(winner(&p, &s).is_none());
    assert!(p.needs().sha256);
}

#[test]
fn cdhash_matches_the_code_directory_hash() {
    let p = one_rule(&format!("cdhash = \"{CDHASH}\""));
    let mut s = at("/x");
    assert!(winner(&p, &s).is_none());
    s.cdhash = hex_bytes(CDHASH);
    assert!(winner(&p, &s).is_some());
    s.cdhash = Some(vec![0; 20]);
    assert!(winner(&p, &s).is_none());
    assert!(p.needs().code_signature);
}

fn hex_bytes(h: &str) -> Option<Vec<u8>> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).ok())
        .collect()
}

#[test]
fn team_id_and_signing_id_need_a_signature_that_says_so() {
    let p = one_rule("team_id = \"ABCDE12345\"\nsigning_id = \"com.example.runner\"");
    let signed = |team: Option<&str>, signing: Option<&str>| Subject {
        team_id: team.map(str::to_owned),
        signing_id: signing.map(str::to_owned),
        ..at("/Applications/Runner.app/Contents/MacOS/runner")
    };
    assert!(winner(&p, &signed(Some("ABCDE12345"), Some("com.example.runner"))).is_some());
    assert!(winner(&p, &signed(Some("ABCDE12345"), Some("com.example.other"))).is_none());
    assert!(winner(&p, &signed(Some("ZZZZZ12345"), Some("com.example.runner"))).is_none());
    assert!(
        winner(&p, &signed(None, None)).is_none(),
        "unsigned never matches"
    );
    assert!(p.needs().code_signature);
    let p = one_rule("team_id = \"ABCDE12345\"");
    assert!(winner(&p, &signed(Some("ABCDE12345"), None)).is_some());
}

#[test]
fn uid_user_and_parent_narrow_a_rule() {
    let p = one_rule("name = \"llama-server\"\nuid = 501");
    let mut s = at("/opt/llama-server");
    s.uid = 501;
    assert!(winner(&p, &s).is_some());
    s.uid = 0;
    assert!(winner(&p, &s).is_none());

    let p = one_rule("name = \"llama-server\"\nuser = \"ci\"");
    assert!(p.needs().user);
    s.user = Some("ci".into());
    assert!(winner(&p, &s).is_some());
    s.user = Some("alice".into());
    assert!(winner(&p, &s).is_none());
    s.user = None;
    assert!(winner(&p, &s).is_none(), "an unresolved user never matches");

    let p = one_rule("name = \"llama-server\"\nparent = \"/opt/actions-runner/**\"");
    assert!(p.needs().parent);
    assert!(winner(&p, &s).is_none(), "unknown parent never matches");
    s.parent_path = Some("/opt/actions-runner/bin/Runner.Worker".into());
    assert!(winner(&p, &s).is_some());
    s.parent_path = Some("/bin/zsh".into());
    assert!(winner(&p, &s).is_none());

    let p = one_rule("name = \"llama-server\"\nparent = \"/bin/zsh\"");
    assert!(winner(&p, &s).is_some(), "an exact parent path");
}

#[test]
fn every_matcher_of_a_rule_must_hold() {
    let p = one_rule("path = \"/opt/*\"\nname = \"tool\"\nuid = 7");
    let mut s = at("/opt/tool");
    s.uid = 7;
    assert!(winner(&p, &s).is_some());
    s.uid = 8;
    assert!(winner(&p, &s).is_none());
    s.uid = 7;
    s.path = "/opt/other".into();
    assert!(winner(&p, &s).is_none());
}

#[test]
fn an_unlock_verdict_carries_the_profile_values() {
    let p = policy(
        "version = 1\n[profile.big]\napple_family_max = 9\nmax_threadgroup_memory = 32768\nrecommended_working_set = \"12 GiB\"\n[[rule]]\nid = \"r\"\nname = \"x\"\nunlock = \"big\"\n",
    );
    match p.evaluate(&at("/x"), std::time::SystemTime::now()).action {
        Action::Unlock {
            profile,
            capabilities,
        } => {
            assert_eq!(profile, "big");
            assert_eq!(capabilities.apple_family_max, 9);
            assert_eq!(capabilities.max_threadgroup_memory, 32768);
            assert_eq!(capabilities.recommended_working_set, Some(12 << 30));
        }
        Action::Stock => panic!("expected unlock"),
    }
}

#[test]
fn needs_is_empty_for_path_and_name_rules() {
    let p = one_rule("path = \"/opt/x\"\nname = \"x\"\nuid = 1");
    assert_eq!(p.needs(), metalift_policy::Needs::default());
}

#[test]
fn unmatched_executables_stay_stock_with_no_rule() {
    let p = one_rule("name = \"llama-server\"");
    let v = p.evaluate(&at("/bin/ls"), std::time::SystemTime::now());
    assert_eq!(v.action, Action::Stock);
    assert_eq!(v.rule, None);
}

#[test]
fn many_globs_in_one_directory_agree_with_the_linear_explanation() {
    // Many globs in one directory: they share one bucket and its GlobSet.
    let mut text = HEADER.to_owned();
    for i in 0..30 {
        let effect = if i % 4 == 0 {
            "stock = true"
        } else {
            "unlock = \"apple7\""
        };
        text.push_str(&format!(
            "[[rule]]\nid = \"g{i}\"\npath = \"/opt/bin/tool{i}*\"\n{effect}\n"
        ));
    }
    text.push_str("[[rule]]\nid = \"deep\"\npath = \"/opt/**/tool1*\"\nstock = true\n");
    text.push_str("[[rule]]\nid = \"root\"\npath = \"/**/tool2?\"\nunlock = \"apple7\"\n");
    let p = policy(&text);
    for path in [
        "/opt/bin/tool1",
        "/opt/bin/tool12",
        "/opt/bin/tool25",
        "/opt/bin/tool4",
        "/opt/x/tool1",
        "/usr/tool21",
        "/opt/bin/nothing",
    ] {
        winner(&p, &at(path));
    }
    assert_eq!(winner(&p, &at("/opt/bin/tool3x")).as_deref(), Some("g3"));
    // tool12 matches g1 (unlock), g12 (stock), deep (stock) and root: stock wins, earliest first.
    assert_eq!(winner(&p, &at("/opt/bin/tool12")).as_deref(), Some("g12"));
    assert_eq!(winner(&p, &at("/opt/bin/tool1")).as_deref(), Some("deep"));
    assert_eq!(winner(&p, &at("/usr/tool21")).as_deref(), Some("root"));
}

#[test]
fn a_path_glob_rule_is_still_narrowed_by_uid_user_parent_and_sha256() {
    // Regression: a rule indexed by its path glob is matched through its bucket's
    // GlobSet and keeps no matcher of its own; the set's match must not stand in for
    // the rule's other matchers. A dozen sibling globs put the bucket past any
    // small-bucket shortcut.
    let mut text = HEADER.to_owned();
    for i in 0..12 {
        text.push_str(&format!(
            "[[rule]]\nid = \"sib{i}\"\npath = \"/opt/bin/sib{i}-*\"\nunlock = \"apple7\"\n"
        ));
    }
    text.push_str(&format!(
        "[[rule]]\nid = \"by-uid\"\npath = \"/opt/bin/llama-*\"\nuid = 501\nunlock = \"apple7\"\n\
         [[rule]]\nid = \"by-user\"\npath = \"/opt/bin/whisper-*\"\nuser = \"ci\"\nunlock = \"apple7\"\n\
         [[rule]]\nid = \"by-parent\"\npath = \"/opt/bin/sd-*\"\nparent = \"/opt/runner/**\"\nunlock = \"apple7\"\n\
         [[rule]]\nid = \"by-sha\"\npath = \"/opt/bin/bench-*\"\nsha256 = \"{SHA}\"\nunlock = \"apple7\"\n"
    ));
    let p = policy(&text);

    let mut s = at("/opt/bin/llama-cli");
    s.uid = 501;
    assert_eq!(winner(&p, &s).as_deref(), Some("by-uid"));
    s.uid = 0;
    assert_eq!(winner(&p, &s), None, "the glob matches, the uid does not");

    let mut s = at("/opt/bin/whisper-cli");
    s.user = Some("ci".into());
    assert_eq!(winner(&p, &s).as_deref(), Some("by-user"));
    s.user = Some("alice".into());
    assert_eq!(winner(&p, &s), None, "the glob matches, the user does not");

    let mut s = at("/opt/bin/sd-cli");
    s.parent_path = Some("/opt/runner/bin/worker".into());
    assert_eq!(winner(&p, &s).as_deref(), Some("by-parent"));
    s.parent_path = Some("/bin/zsh".into());
    assert_eq!(
        winner(&p, &s),
        None,
        "the glob matches, the parent does not"
    );

    // sha256 + path glob is indexed by its sha256: the glob must still hold.
    let sha = hex_bytes(SHA).and_then(|b| <[u8; 32]>::try_from(b).ok());
    let mut s = at("/opt/bin/bench-x");
    s.sha256 = sha;
    assert_eq!(winner(&p, &s).as_deref(), Some("by-sha"));
    s.path = "/opt/elsewhere/bench-x".into();
    assert_eq!(
        winner(&p, &s),
        None,
        "the sha256 matches, the path glob does not"
    );
    s.path = "/opt/bin/bench-x".into();
    s.sha256 = None;
    assert_eq!(winner(&p, &s), None, "the path glob matches, no sha256");
}

#[test]
fn explain_lists_every_glob_rule_with_why_it_matched_or_not() {
    // Regression: explain checks each path glob on its own (the fast path trusts the
    // buckets' GlobSets), and still reports every rule, in file order, with the reason.
    let p = policy(&format!(
        "{HEADER}\
         [[rule]]\nid = \"tools\"\npath = \"/opt/bin/tool*\"\nunlock = \"apple7\"\n\
         [[rule]]\nid = \"other-dir\"\npath = \"/usr/bin/tool*\"\nunlock = \"apple7\"\n\
         [[rule]]\nid = \"deep\"\npath = \"/opt/**/tool1\"\nstock = true\n\
         [[rule]]\nid = \"wrong-uid\"\npath = \"/opt/bin/*\"\nuid = 42\nunlock = \"apple7\"\n"
    ));
    let v = p.explain(&at("/opt/bin/tool1"), std::time::SystemTime::now());
    let trace: Vec<(&str, bool, &str)> = v
        .trace
        .iter()
        .map(|c| (c.rule.as_str(), c.matched, c.why.as_str()))
        .collect();
    assert_eq!(trace.len(), 4, "{trace:#?}");
    assert_eq!(trace[0].0, "tools");
    assert!(trace[0].1);
    assert!(
        trace[0]
            .2
            .starts_with("path matches glob `/opt/bin/tool*`; loses to `deep`"),
        "{trace:#?}"
    );
    assert_eq!(
        trace[1],
        (
            "other-dir",
            false,
            "path `/opt/bin/tool1` does not match glob `/usr/bin/tool*`"
        )
    );
    assert_eq!(trace[2].0, "deep");
    assert!(trace[2].1);
    assert!(trace[2].2.contains("wins"), "{trace:#?}");
    assert_eq!(
        trace[3],
        (
            "wrong-uid",
            false,
            "uid is 0, not 42 (held: path matches glob `/opt/bin/*`)"
        )
    );
    assert_eq!(v.rule.as_deref(), Some("deep"));
    assert_eq!(winner(&p, &at("/opt/bin/tool1")).as_deref(), Some("deep"));
}

#[test]
fn policies_with_the_same_globs_in_another_order_each_keep_their_own_rules() {
    // Regression: a reload reuses the compiled GlobSet of a live policy's bucket with
    // the same globs. The set's matches are positions; reusing a set built for the
    // same globs in another order would hand one policy's match to another rule.
    let glob_rules = |order: [(&str, &str); 3]| {
        let mut text = HEADER.to_owned();
        for (id, glob) in order {
            text.push_str(&format!(
                "[[rule]]\nid = \"{id}\"\npath = \"{glob}\"\nunlock = \"apple7\"\n"
            ));
        }
        policy(&text)
    };
    let first = glob_rules([
        ("a", "/opt/bin/a*"),
        ("b", "/opt/bin/b*"),
        ("c", "/opt/bin/c*"),
    ]);
    let same = glob_rules([
        ("a2", "/opt/bin/a*"),
        ("b2", "/opt/bin/b*"),
        ("c2", "/opt/bin/c*"),
    ]);
    let reordered = glob_rules([
        ("c3", "/opt/bin/c*"),
        ("a3", "/opt/bin/a*"),
        ("b3", "/opt/bin/b*"),
    ]);
    for (path, want) in [
        ("/opt/bin/apple", ["a", "a2", "a3"]),
        ("/opt/bin/banana", ["b", "b2", "b3"]),
        ("/opt/bin/cherry", ["c", "c2", "c3"]),
    ] {
        let got = [&first, &same, &reordered].map(|p| winner(p, &at(path)));
        assert_eq!(got, want.map(|w| Some(w.to_owned())), "{path}");
    }
    drop(first);
    // A policy compiled after the others are gone still decides on its own.
    let again = glob_rules([
        ("b4", "/opt/bin/b*"),
        ("a4", "/opt/bin/a*"),
        ("c4", "/opt/bin/c*"),
    ]);
    assert_eq!(winner(&again, &at("/opt/bin/apple")).as_deref(), Some("a4"));
    assert_eq!(winner(&same, &at("/opt/bin/apple")).as_deref(), Some("a2"));
}
