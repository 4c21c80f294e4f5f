//! Signing identifiers count only with the team that signed, or for Apple's own
//! code when the rule says `platform = true`.

use metalift_policy::{Anchor, Subject};

use crate::{at, policy, problems, winner, HEADER};

/// HEADER is 3 lines; rules in these tests start on line 4.
fn rule(body: &str) -> Vec<String> {
    problems(&format!("{HEADER}[[rule]]\n{body}"))
}

fn signed(signing_id: &str, anchor: Anchor) -> Subject {
    Subject {
        signing_id: Some(signing_id.to_owned()),
        anchor: Some(anchor),
        ..at("/bin/ls")
    }
}

#[test]
fn given_a_signing_id_without_team_id_or_platform_then_the_policy_is_refused() {
    assert_eq!(
        rule("id = \"r\"\nsigning_id = \"com.example.x\"\nunlock = \"apple7\"\n"),
        ["6:14: error: `signing_id` without `team_id` matches any developer who signs with that identifier: add `team_id = \"TEAMID\"`, or `platform = true` if it names Apple's own code (e.g. `com.apple.ls`)"]
    );
}

#[test]
fn given_platform_true_then_a_signing_id_alone_is_valid_and_matches_only_apples_own_code() {
    assert!(
        rule("id = \"r\"\nsigning_id = \"com.apple.ls\"\nplatform = true\nstock = true\n")
            .is_empty()
    );
    let p = policy(&format!(
        "{HEADER}[[rule]]\nid = \"ls\"\nsigning_id = \"com.apple.ls\"\nplatform = true\nunlock = \"apple7\"\n"
    ));
    assert_eq!(
        winner(&p, &signed("com.apple.ls", Anchor::Apple)).as_deref(),
        Some("ls")
    );
    for other in [
        Anchor::DeveloperId,
        Anchor::AppleDevelopment,
        Anchor::AppStore,
    ] {
        assert_eq!(winner(&p, &signed("com.apple.ls", other)), None, "{other}");
    }
    assert_eq!(winner(&p, &at("/bin/ls")), None, "no signature, no match");
    assert!(p.needs().code_signature);

    let why = &p
        .explain(
            &signed("com.apple.ls", Anchor::DeveloperId),
            std::time::SystemTime::now(),
        )
        .trace[0]
        .why;
    assert!(
        why.contains("not Apple's own code (anchor is `developer-id`, not `apple`)"),
        "{why}"
    );
}

#[test]
fn given_platform_false_or_with_a_team_then_validation_says_what_is_wrong() {
    assert_eq!(
        rule("id = \"r\"\nsigning_id = \"com.apple.ls\"\nplatform = false\nstock = true\n"),
        ["7:12: error: `platform = false` means nothing: write `platform = true` (Apple's own code) or leave it out"]
    );
    assert_eq!(
        rule("id = \"r\"\nteam_id = \"ABCDE12345\"\nplatform = true\nstock = true\n"),
        ["7:12: warning: Apple's platform binaries carry no team id: with `team_id` this rule may never match"]
    );
    assert_eq!(
        rule("id = \"r\"\nplatform = \"yes\"\nsigning_id = \"com.apple.ls\"\nstock = true\n"),
        ["6:12: error: `platform` must be a boolean, found string"],
        "a mistyped platform draws one error, not a second about the signing id"
    );
}

#[test]
fn given_platform_alone_then_the_rule_has_no_identity() {
    // `platform = true` alone would unlock every binary Apple ships (`ls`, `sh`, ...).
    assert_eq!(
        rule("id = \"r\"\nplatform = true\nunlock = \"apple7\"\n"),
        ["5:6: error: rule `r` has no identity matcher: add path, name, sha256, cdhash, team_id or signing_id (uid, user and parent only narrow a rule)"]
    );
}

#[test]
fn given_an_unreadable_executable_then_explain_says_so_instead_of_unsigned() {
    let p = policy(&format!(
        "{HEADER}[[rule]]\nid = \"t\"\nteam_id = \"ABCDE12345\"\nunlock = \"apple7\"\n\
         [[rule]]\nid = \"h\"\nsha256 = \"{}\"\nunlock = \"apple7\"\n",
        "ab".repeat(32)
    ));
    let s = Subject {
        anchor: Some(Anchor::Unreadable),
        unreadable: Some("permission denied".into()),
        ..at("/Users/me/Downloads/tool")
    };
    let explained = p.explain(&s, std::time::SystemTime::now());
    let whys: Vec<&str> = explained.trace.iter().map(|c| c.why.as_str()).collect();
    assert!(
        whys.iter()
            .any(|w| w.contains("no team_id (identity unreadable: permission denied)")),
        "{whys:?}"
    );
    assert!(
        whys.iter()
            .any(|w| w.contains("sha256 unknown (identity unreadable: permission denied)")),
        "{whys:?}"
    );
    assert!(whys.iter().all(|w| !w.contains("unsigned")), "{whys:?}");
}

#[test]
fn given_a_self_signed_team_id_claim_then_explain_says_it_does_not_count() {
    let p = policy(&format!(
        "{HEADER}[[rule]]\nid = \"t\"\nteam_id = \"ABCDE12345\"\nunlock = \"apple7\"\n"
    ));
    // The daemon never fills team_id for an untrusted anchor; explain says why.
    let s = Subject {
        anchor: Some(Anchor::Untrusted),
        ..at("/tmp/impostor")
    };
    assert_eq!(winner(&p, &s), None);
    let why = &p.explain(&s, std::time::SystemTime::now()).trace[0].why;
    assert!(
        why.contains("does not chain to Apple (anchor `untrusted`)"),
        "{why}"
    );
}

#[test]
fn given_a_platform_only_stock_rule_then_it_does_not_shadow_the_same_rule_for_everyone() {
    // `apple` holds only for Apple's own `ls`; `ours` for any `ls` (say a
    // Homebrew one): `ours` can still win, so no "can never win" warning.
    let p = problems(&format!(
        "{HEADER}[[rule]]\nid = \"apple\"\nname = \"ls\"\nplatform = true\nstock = true\n\
         [[rule]]\nid = \"ours\"\nname = \"ls\"\nunlock = \"apple7\"\n"
    ));
    assert!(p.iter().all(|w| !w.contains("can never win")), "{p:?}");
}
