//! Property tests: the indexed matcher agrees with the linear explanation, stock rules
//! only ever make a policy stricter, monitor mode never unlocks, and nothing panics.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use metalift_policy::{compile_sources, Action, Anchor, Policy, Source, Subject};
use proptest::prelude::*;

const PATHS: &[&str] = &[
    "/opt/llama/bin/llama-server",
    "/opt/llama/bin/llama-cli",
    "/usr/bin/ls",
    "/Users/ci/work/a/bin/llama-bench",
];
const GLOBS: &[&str] = &[
    "/opt/llama/bin/*",
    "/opt/**",
    "/opt/llama/bin/llama-*",
    "/Users/*/work/**",
    "/**",
    "/usr/bin/l?",
];
const NAMES: &[&str] = &["llama-server", "ls", "llama-cli", "llama-bench"];
const SHAS: &[u8] = &[0xaa, 0xbb];
const CDHASHES: &[u8] = &[0xcc, 0xdd];
const TEAMS: &[&str] = &["ABCDE12345", "ZZZZZ99999"];
const SIGNING: &[&str] = &["org.ggml.llama", "com.example.x"];
const UIDS: &[u32] = &[0, 501];
const USERS: &[&str] = &["ci", "root"];
const PARENTS: &[&str] = &["/bin/zsh", "/bin/*", "/opt/**"];

/// A rule as index choices into the pools above (`None`: matcher absent).
#[derive(Debug, Clone)]
struct GenRule {
    exact: Option<usize>,
    glob: Option<usize>,
    name: Option<usize>,
    sha: Option<usize>,
    cdhash: Option<usize>,
    team: Option<usize>,
    signing: Option<usize>,
    uid: Option<usize>,
    user: Option<usize>,
    parent: Option<usize>,
    stock: bool,
    profile: bool,
}

fn pick(n: usize) -> impl Strategy<Value = Option<usize>> {
    prop::option::weighted(0.25, 0..n)
}

fn gen_rule() -> impl Strategy<Value = GenRule> {
    (
        (
            pick(PATHS.len()),
            pick(GLOBS.len()),
            pick(NAMES.len()),
            pick(SHAS.len()),
            pick(CDHASHES.len()),
        ),
        (
            pick(TEAMS.len()),
            pick(SIGNING.len()),
            pick(UIDS.len()),
            pick(USERS.len()),
            pick(PARENTS.len()),
        ),
        any::<bool>(),
        any::<bool>(),
        0..NAMES.len(),
    )
        .prop_map(
            |(
                (exact, glob, name, sha, cdhash),
                (team, signing, uid, user, parent),
                stock,
                profile,
                fallback,
            )| {
                let mut r = GenRule {
                    exact,
                    glob,
                    name,
                    sha,
                    cdhash,
                    team,
                    signing,
                    uid,
                    user,
                    parent,
                    stock,
                    profile,
                };
                // A path is exact or a glob, not both; every rule needs an identity.
                if r.exact.is_some() {
                    r.glob = None;
                }
                if [r.exact, r.glob, r.name, r.sha, r.cdhash, r.team, r.signing]
                    .iter()
                    .all(Option::is_none)
                {
                    r.name = Some(fallback);
                }
                r
            },
        )
}

fn render_rule(id: &str, r: &GenRule) -> String {
    let mut t = format!("[[rule]]\nid = \"{id}\"\n");
    let mut line = |k: &str, v: String| t.push_str(&format!("{k} = {v}\n"));
    if let Some(i) = r.exact {
        line("path", format!("\"{}\"", PATHS[i]));
    }
    if let Some(i) = r.glob {
        line("path", format!("\"{}\"", GLOBS[i]));
    }
    if let Some(i) = r.name {
        line("name", format!("\"{}\"", NAMES[i]));
    }
    if let Some(i) = r.sha {
        line("sha256", format!("\"{}\"", hex(SHAS[i], 32)));
    }
    if let Some(i) = r.cdhash {
        line("cdhash", format!("\"{}\"", hex(CDHASHES[i], 20)));
    }
    if let Some(i) = r.team {
        line("team_id", format!("\"{}\"", TEAMS[i]));
    }
    if let Some(i) = r.signing {
        line("signing_id", format!("\"{}\"", SIGNING[i]));
        if r.team.is_none() {
            // A signing id alone must name Apple's own code.
            line("platform", "true".into());
        }
    }
    if let Some(i) = r.uid {
        line("uid", UIDS[i].to_string());
    }
    if let Some(i) = r.user {
        line("user", format!("\"{}\"", USERS[i]));
    }
    if let Some(i) = r.parent {
        line("parent", format!("\"{}\"", PARENTS[i]));
    }
    if r.stock {
        line("stock", "true".into());
    } else {
        line(
            "unlock",
            if r.profile {
                "\"p7\"".into()
            } else {
                "\"p9\"".into()
            },
        );
    }
    t
}

fn hex(byte: u8, n: usize) -> String {
    format!("{byte:02x}").repeat(n)
}

fn render(mode: &str, rules: &[GenRule]) -> String {
    let mut t = format!("version = 1\nmode = \"{mode}\"\n[profile.p7]\napple_family_max = 7\n[profile.p9]\napple_family_max = 9\n");
    for (i, r) in rules.iter().enumerate() {
        t.push_str(&render_rule(&format!("r{i}"), r));
    }
    t
}

fn compile(text: String) -> Policy {
    match compile_sources(vec![Source::new("policy.toml", text)]) {
        Ok(l) => l.policy,
        Err(e) => panic!("generated policy is invalid: {e}"),
    }
}

/// Subjects drawn from the same pools, so rules often match.
fn gen_subject() -> impl Strategy<Value = Subject> {
    (
        prop::sample::select(PATHS),
        prop::sample::select(&[0u32, 501, 1000][..]),
        prop::option::of(prop::sample::select(USERS)),
        prop::option::of(prop::sample::select(
            &["/bin/zsh", "/opt/x/y", "/sbin/launchd"][..],
        )),
        prop::option::of(prop::sample::select(&[0xaau8, 0xbb, 0xee][..])),
        prop::option::of(prop::sample::select(&[0xccu8, 0xdd][..])),
        prop::option::of(prop::sample::select(TEAMS)),
        prop::option::of(prop::sample::select(SIGNING)),
        prop::option::of(prop::sample::select(&Anchor::ALL[..])),
    )
        .prop_map(
            |(path, uid, user, parent, sha, cd, team, signing, anchor)| Subject {
                path: path.into(),
                uid,
                user: user.map(str::to_owned),
                parent_path: parent.map(PathBuf::from),
                sha256: sha.map(|b| [b; 32]),
                cdhash: cd.map(|b| vec![b; 20]),
                team_id: team.map(str::to_owned),
                signing_id: signing.map(str::to_owned),
                anchor,
                unreadable: None,
            },
        )
}

/// Subjects with anything at all in them, including non-UTF-8 paths.
fn wild_subject() -> impl Strategy<Value = Subject> {
    (
        prop::collection::vec(any::<u8>(), 0..64),
        any::<u32>(),
        prop::option::of(".*"),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..32)),
        prop::option::of(any::<[u8; 32]>()),
        prop::option::of(prop::collection::vec(any::<u8>(), 0..40)),
        prop::option::of(".*"),
        prop::option::of(".*"),
    )
        .prop_map(
            |(path, uid, user, parent, sha256, cdhash, team_id, signing_id)| Subject {
                path: PathBuf::from(OsStr::from_bytes(&path)),
                uid,
                user,
                parent_path: parent.map(|p| PathBuf::from(OsStr::from_bytes(&p))),
                sha256,
                cdhash,
                team_id,
                signing_id,
                anchor: None,
                unreadable: None,
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn the_indexed_matcher_agrees_with_the_linear_explanation(
        rules in prop::collection::vec(gen_rule(), 0..12),
        subjects in prop::collection::vec(gen_subject(), 1..8),
    ) {
        let p = compile(render("enforce", &rules));
        for s in &subjects {
            let fast = p.evaluate(s, std::time::SystemTime::now());
            let slow = p.explain(s, std::time::SystemTime::now());
            prop_assert_eq!(&fast.rule, &slow.rule);
            prop_assert_eq!(&fast.action, &slow.action);
            prop_assert_eq!(slow.trace.len(), rules.len());
        }
    }

    #[test]
    fn adding_a_stock_rule_never_turns_a_stock_verdict_into_unlock(
        rules in prop::collection::vec(gen_rule(), 0..12),
        extra in gen_rule(),
        position in any::<prop::sample::Index>(),
        subject in gen_subject(),
    ) {
        let before = compile(render("enforce", &rules)).evaluate(&subject, std::time::SystemTime::now());
        let mut with_stock = rules.clone();
        let stock = GenRule { stock: true, ..extra };
        with_stock.insert(position.index(rules.len() + 1), stock);
        let after = compile(render("enforce", &with_stock)).evaluate(&subject, std::time::SystemTime::now());
        if before.action == Action::Stock {
            prop_assert_eq!(after.action, Action::Stock);
        } else if let Action::Unlock { .. } = &after.action {
            // Nor does it turn one unlock into a different one.
            prop_assert_eq!(&after.action, &before.action);
        }
    }

    #[test]
    fn monitor_mode_never_unlocks_and_names_what_enforce_would(
        rules in prop::collection::vec(gen_rule(), 0..12),
        subject in gen_subject(),
    ) {
        let enforce = compile(render("enforce", &rules)).evaluate(&subject, std::time::SystemTime::now());
        let monitor = compile(render("monitor", &rules)).evaluate(&subject, std::time::SystemTime::now());
        prop_assert_eq!(&monitor.action, &Action::Stock);
        prop_assert_eq!(&monitor.rule, &enforce.rule);
        let would = match &enforce.action {
            Action::Unlock { profile, .. } => Some(profile.clone()),
            Action::Stock => None,
        };
        prop_assert_eq!(monitor.would_unlock, would);
    }

    #[test]
    fn evaluation_never_panics_on_arbitrary_subjects(
        rules in prop::collection::vec(gen_rule(), 0..8),
        subject in wild_subject(),
    ) {
        let p = compile(render("enforce", &rules));
        let fast = p.evaluate(&subject, std::time::SystemTime::now());
        let slow = p.explain(&subject, std::time::SystemTime::now());
        prop_assert_eq!(fast.rule, slow.rule);
    }

    #[test]
    fn compile_sources_never_panics_on_arbitrary_text(text in ".*", drop_in in ".*") {
        let _ = compile_sources(vec![Source::new("policy.toml", text), Source::new("policy.d/a.toml", drop_in)]);
    }

    #[test]
    fn compile_sources_never_panics_on_policy_shaped_text(
        lines in prop::collection::vec(
            prop::sample::select(&[
                "version = 1", "version = 99999999999999999999", "mode = \"monitor\"", "[profile.p]",
                "apple_family_max = 7", "apple_family_max = -3", "max_threadgroup_memory = 0x10000",
                "recommended_working_set = \"1.5 TiB\"", "recommended_working_set = \"99999999 TB\"",
                "[[rule]]", "id = \"r\"", "id = \"é\"", "path = \"/opt/[\"", "path = \"/opt/**/x\"",
                "name = \"\"", "sha256 = \"zz\"", "cdhash = \"ccccccccccccccccccccccccccccccccccccccc\u{e9}\"",
                "uid = 4294967296", "user = \"\"", "parent = \"/\"", "unlock = \"p\"", "stock = true",
                "stock = false", "[rule.x]", "rule = []", "profile = 1", "= =", "\u{0}", "[[profile]]",
            ][..]),
            0..40,
        ),
    ) {
        let _ = compile_sources(vec![Source::new("policy.toml", lines.join("\n"))]);
    }
}

const SEGMENTS: &[&str] = &["opt", "bin", ".", "..", "", "llama-x", "tool1", "a"];
const GLOB_SEGMENTS: &[&str] = &[
    "opt",
    "bin",
    "*",
    "**",
    "l*",
    "{a,bin}",
    "?",
    "tool[0-9]",
    "a",
    ".",
];

fn joined(pool: &'static [&'static str], max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(pool), 0..max)
        .prop_map(|parts| format!("/{}", parts.join("/")))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn glob_buckets_find_every_glob_the_linear_scan_finds(
        globs in prop::collection::vec(joined(GLOB_SEGMENTS, 5), 1..20),
        paths in prop::collection::vec(joined(SEGMENTS, 6), 1..10),
    ) {
        let mut text = String::from("version = 1\n[profile.p]\napple_family_max = 7\n");
        for (i, g) in globs.iter().enumerate() {
            let effect = if i % 3 == 0 { "stock = true" } else { "unlock = \"p\"" };
            text.push_str(&format!("[[rule]]\nid = \"g{i}\"\npath = \"{g}\"\n{effect}\n"));
        }
        // Some generated paths are plain (no glob character): those are exact-path rules.
        let p = compile(text);
        for path in &paths {
            let s = Subject { path: path.into(), ..Subject::default() };
            prop_assert_eq!(p.evaluate(&s, std::time::SystemTime::now()).rule, p.explain(&s, std::time::SystemTime::now()).rule, "path {}", path);
        }
    }
}
