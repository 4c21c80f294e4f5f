//! Lints: each warns on the case it names (at the rule, with its location) and stays
//! quiet on the nearest legitimate policy.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use metalift_policy::{host_lints, Host, PathFact, Source};

use crate::{problems, problems_from, HEADER};

fn rules(body: &str) -> Vec<String> {
    problems(&format!("{HEADER}{body}"))
}

fn rule(id: &str, matchers: &str, verdict: &str) -> String {
    format!("[[rule]]\nid = \"{id}\"\n{matchers}\n{verdict}\n")
}

const UNLOCK: &str = "unlock = \"apple7\"";
const STOCK: &str = "stock = true";

#[test]
fn a_match_everything_unlock_glob_warns_at_its_path() {
    let p = rules(&rule("all", "path = \"/**\"", UNLOCK));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("6:8: warning: rule `all`: `/**` starts with a wildcard at the root and matches every executable on the machine"),
        "{p:?}"
    );
    let p = rules(&rule("tops", "path = \"/*/bin/*\"", UNLOCK));
    assert!(
        p.iter()
            .any(|w| w.contains("matches executables under every top-level directory")),
        "{p:?}"
    );
}

#[test]
fn a_named_directory_glob_or_a_stock_catch_all_is_not_match_everything() {
    assert_eq!(
        rules(&rule("opt", "path = \"/opt/llama.cpp/**\"", UNLOCK)),
        Vec::<String>::new()
    );
    assert_eq!(
        rules(&rule("deny", "path = \"/**\"", STOCK)),
        Vec::<String>::new()
    );
    // Narrowed by a signing identity: not everything.
    assert_eq!(
        rules(&rule(
            "team",
            "path = \"/**\"\nteam_id = \"ABCDE12345\"",
            UNLOCK
        )),
        Vec::<String>::new()
    );
}

#[test]
fn a_rule_with_the_same_matchers_as_an_earlier_one_can_never_win() {
    let p = rules(&format!(
        "{}{}",
        rule("first", "path = \"/opt/x\"", UNLOCK),
        rule("again", "path = \"/opt/x\"", UNLOCK)
    ));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("9:6: warning: rule `again` can never win: rule `first` (policy.toml:5) holds whenever it does and takes precedence (it comes first in file order); both say unlock `apple7`"),
        "{p:?}"
    );
}

#[test]
fn a_later_stock_rule_on_the_same_path_shadows_an_unlock() {
    let p = rules(&format!(
        "{}{}",
        rule("yes", "path = \"/opt/x\"", UNLOCK),
        rule("no", "path = \"/opt/x\"", STOCK)
    ));
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("5:6: warning: rule `yes` can never win: rule `no` (policy.toml:9) holds whenever it does and takes precedence (stock beats unlock); it says stock, this rule unlock `apple7`"),
        "{p:?}"
    );
}

#[test]
fn a_recursive_stock_glob_shadows_the_unlock_globs_under_it() {
    let p = rules(&format!(
        "{}{}",
        rule("tools", "path = \"/opt/llama/bin/llama-*\"", UNLOCK),
        rule("deny-opt", "path = \"/opt/**\"", STOCK)
    ));
    assert!(
        p.iter()
            .any(|w| w.contains("rule `tools` can never win: rule `deny-opt`")),
        "{p:?}"
    );
}

#[test]
fn a_qualified_or_more_specific_rule_is_not_shadowed() {
    // `ci-only` is narrower than `all-users` but it is stock: it wins for ci.
    assert_eq!(
        rules(&format!(
            "{}{}",
            rule("all-users", "path = \"/opt/x*\"", UNLOCK),
            rule("ci-only", "path = \"/opt/x*\"\nuser = \"ci\"", STOCK)
        )),
        Vec::<String>::new()
    );
    // An exact path beats the glob over it.
    assert_eq!(
        rules(&format!(
            "{}{}",
            rule("deny-opt", "path = \"/opt/**\"", STOCK),
            rule("this-one", "path = \"/opt/bin/x\"", UNLOCK)
        )),
        Vec::<String>::new()
    );
}

#[test]
fn shadowing_is_found_across_drop_ins() {
    let p = problems_from(vec![
        Source::new(
            "policy.toml",
            format!("{HEADER}{}", rule("main", "name = \"llama-server\"", STOCK)),
        ),
        Source::new(
            "policy.d/10-fleet.toml",
            rule("fleet", "name = \"llama-server\"", STOCK),
        ),
    ]);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("policy.d/10-fleet.toml:2:6: warning: rule `fleet` can never win: rule `main` (policy.toml:5)"),
        "{p:?}"
    );
}

#[test]
fn a_drop_in_deciding_differently_for_a_main_file_executable_warns() {
    let p = problems_from(vec![
        Source::new(
            "policy.toml",
            format!("{HEADER}{}", rule("main", "path = \"/opt/x\"", UNLOCK)),
        ),
        Source::new(
            "policy.d/50-ci.toml",
            rule("ci", "path = \"/opt/x\"\nuser = \"ci\"", STOCK),
        ),
    ]);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("policy.d/50-ci.toml:2:6: warning: rule `ci` in a policy.d/ file overrides the main policy's rule `main` (policy.toml:5) for the same executable: stock here, unlock `apple7` there; when both hold, `ci` wins (stock beats unlock)"),
        "{p:?}"
    );
}

#[test]
fn a_drop_in_that_agrees_or_names_another_executable_is_quiet() {
    assert_eq!(
        problems_from(vec![
            Source::new(
                "policy.toml",
                format!("{HEADER}{}", rule("main", "path = \"/opt/x\"", UNLOCK))
            ),
            Source::new("policy.d/a.toml", rule("other", "path = \"/opt/y\"", STOCK)),
            // Pinned to one build of /opt/x: more specific, so not an override.
            Source::new(
                "policy.d/b.toml",
                rule(
                    "pinned",
                    &format!("path = \"/opt/x\"\nsha256 = \"{}\"", "ab".repeat(32)),
                    STOCK
                ),
            ),
        ]),
        Vec::<String>::new()
    );
}

#[test]
fn one_exact_path_with_two_profiles_warns_at_the_later_rule() {
    let text = format!(
        "{HEADER}[profile.apple8]\napple_family_max = 8\n{}{}",
        rule("seven", "path = \"/opt/x\"\nuser = \"ci\"", UNLOCK),
        rule("eight", "path = \"/opt/x\"\nuid = 0", "unlock = \"apple8\"")
    );
    let p = problems(&text);
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].starts_with("13:8: warning: `/opt/x` has two different verdicts: rule `eight` says unlock `apple8`, rule `seven` (policy.toml:7) says unlock `apple7`; when both hold, `seven` wins (it comes first in file order)"),
        "{p:?}"
    );
}

#[test]
fn an_exception_for_one_user_on_an_exact_path_is_quiet() {
    assert_eq!(
        rules(&format!(
            "{}{}",
            rule("everyone", "path = \"/opt/x\"", UNLOCK),
            rule("not-ci", "path = \"/opt/x\"\nuser = \"ci\"", STOCK)
        )),
        Vec::<String>::new()
    );
}

#[test]
fn one_exact_path_with_verdicts_kept_apart_by_uid_is_quiet() {
    assert_eq!(
        rules(&format!(
            "{}{}",
            rule("root", "path = \"/opt/x\"\nuid = 0", UNLOCK),
            rule("others", "path = \"/opt/x\"\nuid = 501", STOCK)
        )),
        Vec::<String>::new()
    );
}

/// A fake machine: paths that resolve elsewhere, paths that exist, directory listings, users.
#[derive(Default)]
struct FakeHost {
    links: HashMap<PathBuf, PathBuf>,
    files: Vec<PathBuf>,
    dirs: HashMap<PathBuf, Vec<PathBuf>>,
    users: HashMap<u32, String>,
}

impl Host for FakeHost {
    fn resolve(&self, path: &Path) -> PathFact {
        if let Some(to) = self.links.get(path) {
            return PathFact::ResolvesTo {
                resolved: to.clone(),
                is_link: true,
            };
        }
        if self.files.iter().any(|f| f == path) || self.dirs.contains_key(path) {
            PathFact::Resolved
        } else {
            PathFact::Missing
        }
    }
    fn entries(&self, dir: &Path) -> Vec<PathBuf> {
        self.dirs.get(dir).cloned().unwrap_or_default()
    }
    fn user_name(&self, uid: u32) -> Option<String> {
        self.users.get(&uid).cloned()
    }
}

fn brew() -> FakeHost {
    let link = PathBuf::from("/opt/homebrew/bin/llama-server");
    let keg = PathBuf::from("/opt/homebrew/Cellar/llama.cpp/1234/bin/llama-server");
    let mut h = FakeHost::default();
    h.links.insert(link.clone(), keg.clone());
    h.files.push(keg);
    h.dirs.insert("/opt/homebrew/bin".into(), vec![link]);
    h.dirs
        .insert("/opt/homebrew/Cellar/llama.cpp/1234/bin".into(), Vec::new());
    h.dirs
        .insert("/opt/homebrew/Cellar/llama.cpp".into(), Vec::new());
    h.users.insert(0, "root".into());
    h.users.insert(501, "inference".into());
    h
}

fn host_problems(body: &str, host: &FakeHost) -> Vec<String> {
    let text = format!("{HEADER}{body}");
    host_lints(&[Source::new("policy.toml", text)], host)
        .iter()
        .map(|d| d.to_string())
        .collect()
}

#[test]
fn a_rule_on_a_symlink_warns_with_the_resolved_path_and_a_cellar_glob() {
    let p = host_problems(
        &rule(
            "brew-llama",
            "path = \"/opt/homebrew/bin/llama-server\"",
            UNLOCK,
        ),
        &brew(),
    );
    assert_eq!(
        p,
        ["policy.toml:6:8: warning: rule `brew-llama`: /opt/homebrew/bin/llama-server is a symlink to /opt/homebrew/Cellar/llama.cpp/1234/bin/llama-server; rules match the resolved executable, so this rule never matches: use the resolved path or a glob over the Cellar (\"/opt/homebrew/Cellar/llama.cpp/*/bin/llama-server\", which survives `brew upgrade`)"]
    );
}

#[test]
fn a_rule_on_a_resolved_path_or_a_cellar_glob_is_quiet() {
    let h = brew();
    assert_eq!(
        host_problems(
            &rule(
                "keg",
                "path = \"/opt/homebrew/Cellar/llama.cpp/1234/bin/llama-server\"",
                UNLOCK
            ),
            &h
        ),
        Vec::<String>::new()
    );
    assert_eq!(
        host_problems(
            &rule(
                "kegs",
                "path = \"/opt/homebrew/Cellar/llama.cpp/*/bin/llama-server\"",
                UNLOCK
            ),
            &h
        ),
        Vec::<String>::new()
    );
}

#[test]
fn a_glob_over_homebrew_bin_matches_only_symlinks_and_warns() {
    let p = host_problems(
        &rule("brew-bin", "path = \"/opt/homebrew/bin/llama-*\"", UNLOCK),
        &brew(),
    );
    assert_eq!(p.len(), 1, "{p:?}");
    assert!(
        p[0].contains("everything `/opt/homebrew/bin/llama-*` matches here is a symlink (e.g. /opt/homebrew/bin/llama-server is a symlink to /opt/homebrew/Cellar/llama.cpp/1234/bin/llama-server)"),
        "{p:?}"
    );
}

#[test]
fn a_rule_path_that_does_not_exist_warns() {
    let p = host_problems(
        &rule("typo", "path = \"/opt/homebrew/bin/llama-sever\"", UNLOCK),
        &brew(),
    );
    assert_eq!(
        p,
        ["policy.toml:6:8: warning: rule `typo`: /opt/homebrew/bin/llama-sever does not exist on this machine: this rule never matches until it does (check the spelling; rules match the resolved executable)"]
    );
}

#[test]
fn a_uid_that_is_not_the_rules_user_is_contradictory() {
    let h = brew();
    let p = host_problems(
        &rule(
            "odd",
            "name = \"llama-server\"\nuid = 0\nuser = \"inference\"",
            UNLOCK,
        ),
        &h,
    );
    assert_eq!(
        p,
        ["policy.toml:8:8: warning: rule `odd`: contradictory qualifiers: uid 0 is `root` on this machine, not `inference`, so this rule never matches (keep one of `uid` and `user`)"]
    );
    let p = host_problems(
        &rule(
            "ghost",
            "name = \"llama-server\"\nuid = 4242\nuser = \"inference\"",
            UNLOCK,
        ),
        &h,
    );
    assert!(
        p[0].contains("uid 4242 has no user name on this machine"),
        "{p:?}"
    );
    assert_eq!(
        host_problems(
            &rule(
                "fine",
                "name = \"llama-server\"\nuid = 501\nuser = \"inference\"",
                UNLOCK
            ),
            &h
        ),
        Vec::<String>::new()
    );
}
