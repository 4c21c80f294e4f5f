//! Every validation problem, at its exact line and column; and every problem at once.

use metalift_policy::{compile_sources, LoadError, Source};

use crate::{problems, problems_from, HEADER};

/// HEADER is 3 lines; rules in these tests start on line 4.
fn rule(body: &str) -> Vec<String> {
    problems(&format!("{HEADER}[[rule]]\n{body}"))
}

#[test]
fn syntax_errors_are_located() {
    let p = problems("version = 1\nmode = \"enforce\n");
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("2:16: error: TOML syntax: invalid basic string"),
        "{p:?}"
    );
}

#[test]
fn duplicate_keys_are_a_syntax_error_at_the_second_one() {
    let p = problems("version = 1\nversion = 1\n");
    assert!(p[0].starts_with("2:1: error: TOML syntax:"), "{p:?}");
}

#[test]
fn unknown_keys_are_reported_where_they_are_with_a_hint() {
    assert_eq!(
        problems("version = 1\nmodee = \"monitor\"\n[profile.p]\napple_family_max = 7\ncolour = 1\n[[rule]]\nid = \"r\"\nname = \"x\"\nteam-id = \"ABCDE12345\"\nstock = true\n"),
        [
            "2:1: error: unknown key `modee` in the top level (did you mean `mode`?)",
            "5:1: error: unknown key `colour` in a profile (expected one of: apple_family_max, max_threadgroup_memory, recommended_working_set, require_verified)",
            "9:1: error: unknown key `team-id` in a rule (did you mean `team_id`?)",
        ]
    );
}

#[test]
fn version_must_be_1_and_is_required_in_the_main_file() {
    assert_eq!(
        problems("version = 2\n"),
        ["1:11: error: unsupported policy version 2 (this build reads version 1)"]
    );
    assert_eq!(
        problems("mode = \"enforce\"\n"),
        ["1:1: error: missing `version = 1` at the top of the main policy file"]
    );
    assert_eq!(
        problems("version = \"1\"\n"),
        ["1:11: error: `version` must be an integer, found string"]
    );
}

#[test]
fn mode_is_enforce_or_monitor_and_only_in_the_main_file() {
    assert_eq!(
        problems("version = 1\nmode = \"loud\"\n"),
        ["2:8: error: unknown mode `loud` (expected \"enforce\" or \"monitor\")"]
    );
    let p = problems_from(vec![
        Source::new("policy.toml", "version = 1\n"),
        Source::new("policy.d/x.toml", "\nmode = \"monitor\"\n"),
    ]);
    assert_eq!(p, ["policy.d/x.toml:2:8: error: `mode` may only be set in the main policy file, not in policy.d/"]);
}

#[test]
fn unknown_profile_lists_the_defined_ones() {
    assert_eq!(
        rule("id = \"r\"\nname = \"x\"\nunlock = \"apple8\"\n"),
        ["7:10: error: unknown profile `apple8` (defined: apple7)"]
    );
    assert_eq!(
        problems("version = 1\n[[rule]]\nid = \"r\"\nname = \"x\"\nunlock = \"p\"\n"),
        ["5:10: error: unknown profile `p` (no profile is defined; add a [profile.NAME] table)"]
    );
}

#[test]
fn duplicate_rule_ids_across_policy_d_files_point_at_both() {
    let r = "[[rule]]\nid = \"same\"\nname = \"x\"\nstock = true\n";
    let p = problems_from(vec![
        Source::new("policy.toml", format!("version = 1\n{r}")),
        Source::new("policy.d/10-fleet.toml", format!("\n\n{r}")),
    ]);
    assert_eq!(
        p,
        [
            "3:6: error: rule id `same` is defined again at policy.d/10-fleet.toml:4:6",
            "policy.d/10-fleet.toml:4:6: error: duplicate rule id `same` (first defined at policy.toml:3:6)",
        ]
    );
}

#[test]
fn duplicate_profiles_across_files_point_at_both() {
    let p = problems_from(vec![
        Source::new("policy.toml", HEADER),
        Source::new(
            "policy.d/a.toml",
            "[profile.apple7]\napple_family_max = 8\n",
        ),
    ]);
    assert_eq!(
        p,
        [
            "2:10: error: profile `apple7` is defined again at policy.d/a.toml:1:10",
            "policy.d/a.toml:1:10: error: duplicate profile `apple7` (first defined at policy.toml:2:10)",
        ]
    );
}

#[test]
fn a_rule_needs_an_identity_matcher_not_only_qualifiers() {
    assert_eq!(
        rule("id = \"r\"\nuid = 501\nuser = \"ci\"\nparent = \"/bin/*\"\nstock = true\n"),
        ["5:6: error: rule `r` has no identity matcher: add path, name, sha256, cdhash, team_id or signing_id (uid, user and parent only narrow a rule)"]
    );
}

#[test]
fn a_rule_needs_an_id() {
    assert_eq!(
        rule("name = \"x\"\nstock = true\n"),
        ["4:1: error: rule has no `id`"]
    );
    assert_eq!(
        rule("id = \"has space\"\nname = \"x\"\nstock = true\n"),
        ["5:6: error: rule `id` must be 1 to 128 characters without spaces or control characters"]
    );
}

#[test]
fn unlock_and_stock_are_exclusive_and_one_is_required() {
    assert_eq!(
        rule("id = \"r\"\nname = \"x\"\nunlock = \"apple7\"\nstock = true\n"),
        ["8:9: error: rule `r` has both `unlock` and `stock`: choose one"]
    );
    assert_eq!(
        rule("id = \"r\"\nname = \"x\"\n"),
        ["5:6: error: rule `r` says neither `unlock = \"PROFILE\"` nor `stock = true`"]
    );
    assert_eq!(
        rule("id = \"r\"\nname = \"x\"\nstock = false\n"),
        ["7:9: error: `stock = false` means nothing: write `stock = true` or `unlock = \"PROFILE\"`"]
    );
}

#[test]
fn sha256_must_be_64_hex_digits() {
    assert_eq!(
        rule("id = \"r\"\nsha256 = \"abc\"\nstock = true\n"),
        ["6:10: error: `sha256` must be 64 hex digits, found 3"]
    );
    let bad = format!("{}g", "a".repeat(63));
    assert_eq!(
        rule(&format!("id = \"r\"\nsha256 = \"{bad}\"\nstock = true\n")),
        ["6:10: error: `sha256` must be 64 hex digits; `g` at position 64 is not one"]
    );
}

#[test]
fn cdhash_must_be_40_hex_digits() {
    assert_eq!(
        rule(&format!(
            "id = \"r\"\ncdhash = \"{}\"\nstock = true\n",
            "a".repeat(64)
        )),
        ["6:10: error: `cdhash` must be 40 hex digits, found 64"]
    );
    assert_eq!(
        rule("id = \"r\"\ncdhash = \"0x12\"\nstock = true\n"),
        ["6:10: error: `cdhash` must be 40 hex digits; `x` at position 2 is not one"]
    );
}

#[test]
fn bad_globs_and_relative_paths_are_errors() {
    let p = rule("id = \"r\"\npath = \"/opt/[llama\"\nstock = true\n");
    assert_eq!(p.len(), 1);
    assert!(
        p[0].starts_with(
            "6:14: error: bad glob in `path`: this `[` opens a character class that is never closed"
        ),
        "{p:?}"
    );
    let p = rule("id = \"r\"\nname = \"x\"\nparent = \"/opt/{a,b\"\nstock = true\n");
    assert!(
        p[0].starts_with("7:16: error: bad glob in `parent`: this `{` opens alternatives"),
        "{p:?}"
    );
    assert_eq!(
        rule("id = \"r\"\npath = \"bin/llama\"\nstock = true\n"),
        ["6:8: error: `path` must be an absolute path or glob (starting with `/`)"]
    );
    assert_eq!(
        rule("id = \"r\"\nname = \"bin/llama\"\nstock = true\n"),
        ["6:8: error: `name` is a file name: it cannot contain `/` (use `path`)"]
    );
}

#[test]
fn families_outside_apple5_to_apple10_are_errors() {
    for (family, ok) in [(4, false), (5, true), (10, true), (11, false), (-1, false)] {
        let p = problems(&format!(
            "version = 1\n[profile.p]\napple_family_max = {family}\n"
        ));
        if ok && family >= 9 {
            // Valid; with the host chip unknown here, Apple9 and above draw the
            // bf16 warning (tests/it/host_ceiling.rs).
            assert_eq!(p.len(), 1, "{family}: {p:?}");
            assert!(p[0].starts_with("3:20: warning: "), "{family}: {p:?}");
        } else if ok {
            assert!(p.is_empty(), "{family}: {p:?}");
        } else {
            assert_eq!(
                p,
                [format!(
                    "3:20: error: apple_family_max {family} is outside Apple5..Apple10"
                )]
            );
        }
    }
    assert_eq!(
        problems("version = 1\n[profile.p]\nmax_threadgroup_memory = 32768\n"),
        ["2:10: error: profile `p` has no `apple_family_max`"]
    );
}

#[test]
fn threadgroup_memory_out_of_range_is_an_error_and_above_32k_a_warning() {
    let tg = |n: &str| {
        problems(&format!(
            "version = 1\n[profile.p]\napple_family_max = 7\nmax_threadgroup_memory = {n}\n"
        ))
    };
    assert_eq!(
        tg("0"),
        ["4:26: error: max_threadgroup_memory 0 is out of range (1..=65536)"]
    );
    assert_eq!(
        tg("65537"),
        ["4:26: error: max_threadgroup_memory 65537 is out of range (1..=65536)"]
    );
    assert!(tg("32768").is_empty());
    assert_eq!(
        tg("65536"),
        ["4:26: warning: max_threadgroup_memory 65536 exceeds 32768: no shipping Mac reports more, kernels sized for it may fail"]
    );
    assert_eq!(
        tg("16384"),
        ["4:26: warning: max_threadgroup_memory 16384 has no effect: it is a floor and the paravirtual device already reports 32768"]
    );
}

#[test]
fn working_set_sizes_are_checked() {
    let ws = |v: &str| {
        problems(&format!(
            "version = 1\n[profile.p]\napple_family_max = 7\nrecommended_working_set = {v}\n"
        ))
    };
    assert!(ws("\"12 GiB\"").is_empty());
    assert!(ws("1073741824").is_empty());
    assert_eq!(ws("\"12 G\""), ["4:27: error: recommended_working_set: `12 G`: `G` is ambiguous; write `GiB` (1024-based) or `GB` (1000-based)"]);
    assert_eq!(
        ws("0"),
        ["4:27: error: recommended_working_set must be above 0"]
    );
    assert_eq!(ws("true"), ["4:27: error: `recommended_working_set` must be a size such as \"12 GiB\" or a byte count, found boolean"]);
}

#[test]
fn wrong_types_and_shapes_are_errors() {
    assert_eq!(
        rule("id = 5\nname = \"x\"\nstock = true\n"),
        ["5:6: error: `id` must be a string, found integer"]
    );
    assert_eq!(
        rule("id = \"r\"\nname = \"x\"\nuid = -1\nstock = true\n"),
        ["7:7: error: uid -1 is out of range"]
    );
    assert_eq!(
        problems("version = 1\n[rule]\nid = \"r\"\n"),
        ["2:1: error: `rule` must be an array of tables: write each rule under `[[rule]]`"]
    );
    assert_eq!(
        problems("version = 1\nprofile = 3\n"),
        ["2:11: error: `profile` must be a table, found integer"]
    );
}

#[test]
fn questionable_but_valid_values_draw_warnings() {
    assert_eq!(
        rule("id = \"r\"\nteam_id = \"apple\"\nstock = true\n"),
        ["6:11: warning: team_id `apple` does not look like an Apple team identifier (10 characters A-Z, 0-9)"]
    );
    assert_eq!(
        rule("id = \"r\"\npath = \"/opt//x\"\nstock = true\n"),
        ["6:8: warning: `path` is not a normalized path: the kernel reports resolved paths, so it may never match"]
    );
}

#[test]
fn a_name_that_looks_like_a_pattern_or_contradicts_the_path_draws_a_warning() {
    assert_eq!(
        rule("id = \"r\"\nname = \"llama-*\"\nstock = true\n"),
        ["6:8: warning: `name` matches the file name exactly: `llama-*` is not a pattern here (for a pattern, use a `path` glob such as \"/**/llama-*\")"]
    );
    assert_eq!(
        rule("id = \"r\"\npath = \"/opt/bin/a\"\nname = \"b\"\nstock = true\n"),
        ["7:8: warning: this rule never matches: its exact `path` ends in `a`, not `b`"]
    );
    assert!(rule("id = \"r\"\npath = \"/opt/bin/a\"\nname = \"a\"\nstock = true\n").is_empty());
}

#[test]
fn every_problem_is_reported_not_only_the_first() {
    let text = "version = 2\nmode = \"loud\"\n[profile.p]\napple_family_max = 4\n[[rule]]\nid = \"a\"\nsha256 = \"x\"\nunlock = \"q\"\n[[rule]]\nid = \"b\"\nuid = 1\nstock = true\n";
    let p = problems(text);
    assert_eq!(
        p.iter()
            .map(|s| s.split(": ").next().unwrap_or(""))
            .collect::<Vec<_>>(),
        ["1:11", "2:8", "4:20", "7:10", "8:10", "10:6"],
        "{p:#?}"
    );
}

#[test]
fn a_warning_alone_does_not_refuse_the_policy() {
    let loaded = compile_sources(vec![Source::new(
        "policy.toml",
        "version = 1\n[profile.p]\napple_family_max = 7\nmax_threadgroup_memory = 65536\n",
    )]);
    match loaded {
        Ok(l) => assert_eq!(l.warnings.len(), 1),
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn invalid_error_display_names_the_first_error_and_counts_the_rest() {
    match compile_sources(vec![Source::new("/etc/metalift/policy.toml", "version = 3\nmode = 1\n")]) {
        Err(e @ LoadError::Invalid { .. }) => assert_eq!(
            e.to_string(),
            "/etc/metalift/policy.toml:1:11: error: unsupported policy version 3 (this build reads version 1) (and 1 more error)"
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_file_with_a_syntax_error_does_not_cause_follow_on_unknown_profile_errors() {
    let p = problems_from(vec![
        Source::new(
            "policy.toml",
            "version = 1\n[[rule]]\nid = \"r\"\nname = \"x\"\nunlock = \"fleet\"\n",
        ),
        Source::new(
            "policy.d/fleet.toml",
            "[profile.fleet\napple_family_max = 7\n",
        ),
    ]);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(p[0].starts_with("policy.d/fleet.toml:1:"), "{p:?}");
}

#[test]
fn forward_max_delay_defaults_to_30_seconds_and_out_of_range_values_are_located() {
    let forward = |extra: &str| {
        let text = format!("version = 1\n[audit.forward]\naddress = \"logs:514\"\n{extra}");
        compile_sources(vec![Source {
            name: "policy.toml".into(),
            text,
        }])
    };
    let default = forward("").expect("valid");
    assert_eq!(
        default.policy.forward().map(|f| f.max_delay_seconds),
        Some(30)
    );
    let set = forward("max_delay_seconds = 5\n").expect("valid");
    assert_eq!(set.policy.forward().map(|f| f.max_delay_seconds), Some(5));
    assert_eq!(
        problems("version = 1\n[audit.forward]\naddress = \"logs:514\"\nmax_delay_seconds = 0\n"),
        ["4:21: error: `max_delay_seconds` must be 1 to 3600, found 0"]
    );
    assert_eq!(
        problems(
            "version = 1\n[audit.forward]\naddress = \"logs:514\"\nmax_delay_seconds = \"30s\"\n"
        ),
        ["4:21: error: `max_delay_seconds` must be an integer, found string"]
    );
}
