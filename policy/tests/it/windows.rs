//! Rules that end (and start): `from`/`until`, decided at the time each decision is given.

use std::time::{Duration, SystemTime};

use metalift_policy::window::{format_rfc3339, parse_rfc3339, Edge};
use metalift_policy::{compile_sources_with, Action, CompileOptions, LoadError, Source};

use super::{at, policy, problems, HEADER};

fn t(text: &str) -> SystemTime {
    parse_rfc3339(text).unwrap()
}

const WINDOWED: &str = r#"
[[rule]]
id = "experiment"
path = "/opt/llama/bin/llama-server"
unlock = "apple7"
from = 2026-12-01T00:00:00Z
until = "2026-12-08T09:00:00+09:00"
"#;

#[test]
fn given_a_window_the_rule_matches_only_inside_it_and_no_recompile_is_needed() {
    let p = policy(&format!("{HEADER}{WINDOWED}"));
    let s = at("/opt/llama/bin/llama-server");
    let second = Duration::from_secs(1);
    let rule_at = |when: SystemTime| p.evaluate(&s, when).rule;
    assert_eq!(rule_at(t("2026-12-01T00:00:00Z") - second), None);
    assert_eq!(
        rule_at(t("2026-12-01T00:00:00Z")).as_deref(),
        Some("experiment")
    );
    // `until` is 2026-12-08T00:00:00Z, written with its offset.
    let last = p.evaluate(&s, t("2026-12-08T00:00:00Z") - second);
    assert!(matches!(last.action, Action::Unlock { .. }));
    let window = last.window.expect("the verdict names the window");
    assert_eq!(window.until, Some(t("2026-12-08T00:00:00Z")));
    let after = p.evaluate(&s, t("2026-12-08T00:00:00Z"));
    assert_eq!((after.action, after.rule), (Action::Stock, None));
}

#[test]
fn explain_says_whether_the_window_is_not_yet_open_or_closed_and_when() {
    let p = policy(&format!("{HEADER}{WINDOWED}"));
    let s = at("/opt/llama/bin/llama-server");
    let before = p.explain(&s, t("2026-11-30T00:00:00Z"));
    assert_eq!(before.rule, None);
    assert!(
        before.trace[0]
            .why
            .contains("window not yet open: opens at 2026-12-01T00:00:00Z"),
        "{:?}",
        before.trace
    );
    let after = p.explain(&s, t("2026-12-09T00:00:00Z"));
    assert!(
        after.trace[0]
            .why
            .contains("window closed at 2026-12-08T00:00:00Z"),
        "{:?}",
        after.trace
    );
    let inside = p.explain(&s, t("2026-12-02T00:00:00Z"));
    assert!(inside.trace[0].matched);
    assert!(
        inside.trace[0].why.contains("window open"),
        "{:?}",
        inside.trace
    );
}

#[test]
fn an_ended_rule_lets_a_less_specific_rule_win() {
    // The exact path outranks the glob only while its window is open.
    let p = policy(&format!(
        "{HEADER}{WINDOWED}\n[[rule]]\nid = \"llama-stock\"\npath = \"/opt/llama/bin/*\"\nstock = true\n"
    ));
    let s = at("/opt/llama/bin/llama-server");
    assert_eq!(
        p.evaluate(&s, t("2026-12-02T00:00:00Z")).rule.as_deref(),
        Some("experiment")
    );
    assert_eq!(
        p.evaluate(&s, t("2026-12-10T00:00:00Z")).rule.as_deref(),
        Some("llama-stock")
    );
}

#[test]
fn the_next_change_is_the_nearest_edge_ahead() {
    let p = policy(&format!(
        "{HEADER}{WINDOWED}\n[[rule]]\nid = \"later\"\nname = \"x\"\nstock = true\nfrom = 2026-12-05T00:00:00Z\n"
    ));
    let next = |when| {
        p.next_change(t(when))
            .map(|c| (format_rfc3339(c.at), c.rule, c.edge))
    };
    assert_eq!(
        next("2026-11-01T00:00:00Z"),
        Some((
            "2026-12-01T00:00:00Z".into(),
            "experiment".into(),
            Edge::Opens
        ))
    );
    assert_eq!(
        next("2026-12-01T00:00:00Z"),
        Some(("2026-12-05T00:00:00Z".into(), "later".into(), Edge::Opens))
    );
    assert_eq!(
        next("2026-12-06T00:00:00Z"),
        Some((
            "2026-12-08T00:00:00Z".into(),
            "experiment".into(),
            Edge::Closes
        ))
    );
    assert_eq!(next("2026-12-08T00:00:00Z"), None);
}

#[test]
fn an_expired_rule_is_warned_about_at_its_until_with_its_location() {
    let text = format!("{HEADER}{WINDOWED}");
    let compile = |now: Option<SystemTime>| {
        let opts = CompileOptions {
            now,
            ..CompileOptions::default()
        };
        match compile_sources_with(vec![Source::new("policy.toml", &text)], &opts) {
            Ok(loaded) => loaded
                .warnings
                .iter()
                .map(ToString::to_string)
                .collect::<Vec<_>>(),
            Err(LoadError::Invalid { diagnostics, .. }) => panic!("{diagnostics:?}"),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(
        compile(Some(t("2026-12-02T00:00:00Z"))),
        Vec::<String>::new()
    );
    assert_eq!(compile(None), Vec::<String>::new());
    let warnings = compile(Some(t("2026-12-08T00:00:01Z")));
    // `until` is on line 10, its value at column 9.
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with("policy.toml:10:9: warning: rule `experiment` has expired: its window closed at 2026-12-08T00:00:00Z"),
        "{warnings:?}"
    );
}

#[test]
fn bad_windows_are_refused_with_their_location() {
    let local = problems(&format!(
        "{HEADER}[[rule]]\nid = \"a\"\nname = \"x\"\nstock = true\nuntil = 2026-12-08T00:00:00\n"
    ));
    assert!(
        local
            .iter()
            .any(|p| p.starts_with("8:9: error: `until`: `2026-12-08T00:00:00` has no UTC offset")),
        "{local:?}"
    );
    let backwards = problems(&format!(
        "{HEADER}[[rule]]\nid = \"a\"\nname = \"x\"\nstock = true\nfrom = 2026-12-08T00:00:00Z\nuntil = 2026-12-01T00:00:00Z\n"
    ));
    assert!(
        backwards.iter().any(|p| p.starts_with(
            "9:9: error: rule `a`: `until` (2026-12-01T00:00:00Z) must be after `from`"
        )),
        "{backwards:?}"
    );
    let word = problems(&format!(
        "{HEADER}[[rule]]\nid = \"a\"\nname = \"x\"\nstock = true\nuntil = \"next week\"\n"
    ));
    assert!(
        word.iter().any(
            |p| p.starts_with("8:9: error: `until`: `next week` has no UTC offset")
                || p.starts_with("8:9: error: `until`: `next week` is not")
        ),
        "{word:?}"
    );
    let number = problems(&format!(
        "{HEADER}[[rule]]\nid = \"a\"\nname = \"x\"\nstock = true\nuntil = 3\n"
    ));
    assert!(
        number
            .iter()
            .any(|p| p.contains("`until` must be an RFC 3339 date-time")),
        "{number:?}"
    );
}

#[test]
fn a_windowed_rule_does_not_shadow_a_rule_it_only_sometimes_covers() {
    // Without the window, `broad` (same path, stock beats unlock) would always win
    // and `narrow` would draw "can never win". With it, `narrow` wins after `until`.
    let text = format!(
        "{HEADER}[[rule]]\nid = \"broad\"\npath = \"/opt/x\"\nstock = true\nuntil = 2026-12-08T00:00:00Z\n[[rule]]\nid = \"narrow\"\npath = \"/opt/x\"\nunlock = \"apple7\"\n"
    );
    let warnings = problems(&text);
    assert!(
        !warnings.iter().any(|w| w.contains("can never win")),
        "{warnings:?}"
    );
    let p = policy(&text);
    assert_eq!(
        p.evaluate(&at("/opt/x"), t("2026-12-09T00:00:00Z"))
            .rule
            .as_deref(),
        Some("narrow")
    );
}
