//! Lints: rules that are valid but almost certainly not what the admin meant. Each is
//! a warning (`metalift validate --strict` makes warnings errors), reported where
//! the rule is written.
//!
//! What this stage can judge from the text alone (checks of the machine, such as a
//! rule path that is a symlink, are in [`crate::host`]):
//!
//! - **match-everything**: an `unlock` rule whose path glob starts with a wildcard at
//!   the root (`/**`, `/*`, `/*/bin/*`): every injected process it reaches is unlocked.
//! - **shadowed**: a rule that can never win, because another rule holds whenever it
//!   does and takes precedence (same matchers, or the same plus fewer qualifiers, or
//!   a `P/**` glob over its glob; at equal specificity stock beats unlock, then file
//!   order). Across files too.
//! - **drop-in override**: a `policy.d/` rule naming the same executable as a
//!   main-file rule with a different verdict. (The same rule id twice is already an
//!   error.)
//! - **conflicting verdicts**: two rules on one exact path with different verdicts or
//!   profiles whose qualifiers neither keep them apart (uid 0 / uid 501) nor make one
//!   an exception to the other (no qualifier / `user = "ci"`).
//!
//! At most one of these is reported per pair of rules, in that order of preference.
//!
//! Cost: linear in the number of rules (rules are grouped by their most specific
//! matcher; only rules of one group are compared pairwise). A group larger than
//! [`MAX_PAIRWISE`] is compared only within its first [`MAX_PAIRWISE`] rules, so a
//! daemon reload stays fast at any size.

use std::collections::{HashMap, HashSet};
use std::ops::Range;

use super::Validator;
use crate::rule::{path_bytes, Effect, PathPattern, Rule, Specificity};

/// Largest group of rules sharing one most-specific matcher compared pairwise.
pub(crate) const MAX_PAIRWISE: usize = 256;

/// Where a built rule was written, for locating its lint warnings.
#[derive(Debug, Clone)]
pub(crate) struct Site {
    /// Index of its source.
    pub file: usize,
    /// Its `id` (or its table when it has none).
    pub anchor: Range<usize>,
    /// Its `path` value, when it has one.
    pub path: Option<Range<usize>>,
}

/// The value of a rule's most specific identity matcher: rules that can shadow or
/// override each other share it (or, for globs, one covers the other).
/// Borrowed from the rule: grouping 10,000 rules must not copy every key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum TopKey<'r> {
    Cdhash(&'r [u8]),
    Sha256(&'r [u8; 32]),
    SigningId(&'r str),
    TeamId(&'r str),
    ExactPath(std::borrow::Cow<'r, [u8]>),
    Glob(&'r str),
    Name(&'r std::ffi::OsStr),
}

fn top_key(r: &Rule) -> Option<TopKey<'_>> {
    Some(match r.specificity() {
        Specificity::Cdhash => TopKey::Cdhash(r.cdhash.as_deref()?),
        Specificity::Sha256 => TopKey::Sha256(r.sha256.as_ref()?),
        Specificity::SigningId => TopKey::SigningId(r.signing_id.as_deref()?),
        Specificity::TeamId => TopKey::TeamId(r.team_id.as_deref()?),
        Specificity::ExactPath | Specificity::GlobPath => match r.path.as_ref()? {
            PathPattern::Exact(p) => TopKey::ExactPath(path_bytes(p)),
            PathPattern::Glob { pattern, .. } => TopKey::Glob(pattern),
        },
        Specificity::Name => TopKey::Name(r.name.as_deref()?),
    })
}

fn is_glob_meta(c: char) -> bool {
    matches!(c, '*' | '?' | '[' | ']' | '{' | '}' | '\\')
}

/// For a glob `P/**` whose `P` is literal, `P` (`"/**"` → `""`): it matches every
/// path under `P/`.
fn recursive_prefix(pattern: &str) -> Option<&str> {
    let prefix = pattern.strip_suffix("/**")?;
    (!prefix.contains(is_glob_meta)).then_some(prefix)
}

/// Whether glob `outer` matches every path glob `inner` can match.
fn glob_covers(outer: &str, inner: &str) -> bool {
    if outer == inner {
        return true;
    }
    match recursive_prefix(outer) {
        Some(prefix) => inner
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('/') && rest.len() > 1),
        None => false,
    }
}

fn path_text(p: &PathPattern) -> String {
    match p {
        PathPattern::Exact(p) => p.display().to_string(),
        PathPattern::Glob { pattern, .. } => pattern.clone(),
    }
}

/// Whether `a` holds for every subject `b` holds for, whenever `b` does: each
/// matcher of `a` is also a matcher of `b` with the same value (a `P/**` path glob
/// covers globs under `P/`), and `a`'s window covers `b`'s.
fn covers(a: &Rule, b: &Rule) -> bool {
    if !a.window.covers(&b.window) {
        return false;
    }
    fn same<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
        a.is_none() || a == b
    }
    let path = match (&a.path, &b.path) {
        (None, _) => true,
        (Some(_), None) => false,
        (Some(PathPattern::Exact(x)), Some(PathPattern::Exact(y))) => {
            path_bytes(x) == path_bytes(y)
        }
        (
            Some(PathPattern::Glob { pattern: x, .. }),
            Some(PathPattern::Glob { pattern: y, .. }),
        ) => glob_covers(x, y),
        (Some(PathPattern::Glob { pattern: x, .. }), Some(PathPattern::Exact(y))) => {
            recursive_prefix(x).is_some_and(|p| {
                y.to_str()
                    .and_then(|y| y.strip_prefix(p))
                    .is_some_and(|rest| rest.starts_with('/'))
            })
        }
        (Some(PathPattern::Exact(_)), Some(PathPattern::Glob { .. })) => false,
    };
    let parent = match (&a.parent, &b.parent) {
        (None, _) => true,
        (Some(x), Some(y)) => path_text(x) == path_text(y),
        (Some(_), None) => false,
    };
    path && parent
        && same(&a.cdhash, &b.cdhash)
        && same(&a.sha256, &b.sha256)
        && same(&a.signing_id, &b.signing_id)
        && same(&a.team_id, &b.team_id)
        && same(&a.name, &b.name)
        && same(&a.uid, &b.uid)
        && same(&a.user, &b.user)
        && (!a.platform || b.platform)
}

/// Whether some subject could match both: false only when a matcher both rules set
/// has two different exact values (uid 0 and uid 501, two users, two parents...),
/// or their windows never meet.
fn may_overlap(a: &Rule, b: &Rule) -> bool {
    if !a.window.overlaps(&b.window) {
        return false;
    }
    fn apart<T: PartialEq>(a: &Option<T>, b: &Option<T>) -> bool {
        matches!((a, b), (Some(x), Some(y)) if x != y)
    }
    let exact_apart = |x: &Option<PathPattern>, y: &Option<PathPattern>| matches!((x, y), (Some(PathPattern::Exact(p)), Some(PathPattern::Exact(q))) if p != q);
    !(apart(&a.cdhash, &b.cdhash)
        || apart(&a.sha256, &b.sha256)
        || apart(&a.signing_id, &b.signing_id)
        || apart(&a.team_id, &b.team_id)
        || apart(&a.name, &b.name)
        || apart(&a.uid, &b.uid)
        || apart(&a.user, &b.user)
        || exact_apart(&a.path, &b.path)
        || exact_apart(&a.parent, &b.parent))
}

fn verdict_text(e: &Effect) -> String {
    match e {
        Effect::Stock => "stock".to_owned(),
        Effect::Unlock { profile, .. } => format!("unlock `{profile}`"),
    }
}

fn same_verdict(a: &Effect, b: &Effect) -> bool {
    match (a, b) {
        (Effect::Stock, Effect::Stock) => true,
        (Effect::Unlock { profile: x, .. }, Effect::Unlock { profile: y, .. }) => x == y,
        _ => false,
    }
}

/// Why `winner` beats `loser` when both hold (they are equally specific here).
fn why_first(winner: &Rule, loser: &Rule) -> &'static str {
    if winner.specificity() != loser.specificity() {
        "it is more specific"
    } else if matches!(winner.effect, Effect::Stock) && !matches!(loser.effect, Effect::Stock) {
        "stock beats unlock"
    } else {
        "it comes first in file order"
    }
}

impl Validator<'_> {
    /// Runs every text-only lint over the built rules (`sites[i]` locates `rules[i]`).
    pub(super) fn lint(&mut self, rules: &[Rule], sites: &[Site]) {
        let sources = self.sources;
        let files: Vec<&str> = sources.iter().map(|s| s.name.as_str()).collect();
        let mut reported: HashSet<(usize, usize)> = HashSet::new();
        for (rule, site) in rules.iter().zip(sites) {
            self.match_everything(rule, site);
        }

        let mut groups: HashMap<TopKey, Vec<usize>> = HashMap::new();
        // `P/**` globs by `P`: each covers every glob under `P/`.
        let mut recursive: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, rule) in rules.iter().enumerate() {
            if let Some(key) = top_key(rule) {
                groups.entry(key).or_default().push(i);
            }
            if let (Specificity::GlobPath, Some(PathPattern::Glob { pattern, .. })) =
                (rule.specificity(), &rule.path)
            {
                if let Some(prefix) = recursive_prefix(pattern) {
                    recursive.entry(prefix).or_default().push(i);
                }
            }
        }

        for (b, rule) in rules.iter().enumerate() {
            let Some(key) = top_key(rule) else { continue };
            let mut candidates: Vec<usize> = groups
                .get(&key)
                .map(|g| g.iter().copied().take(MAX_PAIRWISE).collect())
                .unwrap_or_default();
            if let TopKey::Glob(pattern) = &key {
                let literal_end = pattern.find(is_glob_meta).unwrap_or(pattern.len());
                let literal = pattern.get(..literal_end).unwrap_or("");
                for (pos, _) in literal.match_indices('/') {
                    if let Some(rs) = literal.get(..pos).and_then(|p| recursive.get(p)) {
                        candidates.extend(rs.iter().copied().take(MAX_PAIRWISE));
                    }
                }
            }
            let shadower = candidates
                .iter()
                .copied()
                .filter(|&a| a != b)
                .filter_map(|a| rules.get(a).map(|r| (a, r)))
                .filter(|(_, a)| a.precedence_key() < rule.precedence_key() && covers(a, rule))
                .min_by_key(|(_, a)| a.precedence_key());
            if let (Some((a, winner)), Some(site)) = (shadower, sites.get(b)) {
                reported.insert((a.min(b), a.max(b)));
                let verdicts = if same_verdict(&winner.effect, &rule.effect) {
                    format!("both say {}", verdict_text(&rule.effect))
                } else {
                    format!(
                        "it says {}, this rule {}",
                        verdict_text(&winner.effect),
                        verdict_text(&rule.effect)
                    )
                };
                self.warn(
                    site.file,
                    site.anchor.clone(),
                    format!(
                        "rule `{}` can never win: rule `{}` ({}) holds whenever it does and takes precedence ({}); {verdicts}",
                        rule.id,
                        winner.id,
                        winner.location(&files),
                        why_first(winner, rule),
                    ),
                );
            }
        }

        for group in groups.values() {
            let group = group.get(..group.len().min(MAX_PAIRWISE)).unwrap_or(group);
            for (n, &x) in group.iter().enumerate() {
                for &y in group.iter().skip(n + 1) {
                    if reported.contains(&(x.min(y), x.max(y))) {
                        continue;
                    }
                    let (Some(a), Some(b)) = (rules.get(x), rules.get(y)) else {
                        continue;
                    };
                    if same_verdict(&a.effect, &b.effect) || !may_overlap(a, b) {
                        continue;
                    }
                    let (Some(sa), Some(sb)) = (sites.get(x), sites.get(y)) else {
                        continue;
                    };
                    let (winner, loser) = if a.precedence_key() < b.precedence_key() {
                        (a, b)
                    } else {
                        (b, a)
                    };
                    let when_both = format!(
                        "when both hold, `{}` wins ({})",
                        winner.id,
                        why_first(winner, loser)
                    );
                    if (sa.file == 0) != (sb.file == 0) {
                        let (main, drop, site) = if sa.file == 0 { (a, b, sb) } else { (b, a, sa) };
                        reported.insert((x.min(y), x.max(y)));
                        self.warn(
                            site.file,
                            site.anchor.clone(),
                            format!(
                                "rule `{}` in a policy.d/ file overrides the main policy's rule `{}` ({}) for the same executable: {} here, {} there; {when_both}",
                                drop.id,
                                main.id,
                                main.location(&files),
                                verdict_text(&drop.effect),
                                verdict_text(&main.effect),
                            ),
                        );
                    } else if let Some(PathPattern::Exact(p)) = a
                        .path
                        .as_ref()
                        .filter(|_| a.specificity() == Specificity::ExactPath)
                        // A narrower rule that is an exception to a broader one (the
                        // same path, plus `user = "ci"`) is meant; only rules whose
                        // qualifiers overlap without one containing the other are not.
                        .filter(|_| !covers(a, b) && !covers(b, a))
                    {
                        reported.insert((x.min(y), x.max(y)));
                        let (first, later, site) = if a.order < b.order {
                            (a, b, sb)
                        } else {
                            (b, a, sa)
                        };
                        let at = site.path.clone().unwrap_or_else(|| site.anchor.clone());
                        self.warn(
                            site.file,
                            at,
                            format!(
                                "`{}` has two different verdicts: rule `{}` says {}, rule `{}` ({}) says {}; {when_both}",
                                p.display(),
                                later.id,
                                verdict_text(&later.effect),
                                first.id,
                                first.location(&files),
                                verdict_text(&first.effect),
                            ),
                        );
                    }
                }
            }
        }
    }

    fn match_everything(&mut self, rule: &Rule, site: &Site) {
        let (Some(PathPattern::Glob { pattern, .. }), Effect::Unlock { profile, .. }) =
            (&rule.path, &rule.effect)
        else {
            return;
        };
        // A rule with a more specific identity (team_id, sha256...) is narrowed by it.
        if rule.specificity() != Specificity::GlobPath || rule.name.is_some() {
            return;
        }
        let first = pattern.trim_start_matches('/');
        if !first.starts_with(is_glob_meta) {
            return;
        }
        let reach = if recursive_prefix(pattern) == Some("") || pattern == "/**/*" {
            "every executable on the machine".to_owned()
        } else {
            "executables under every top-level directory".to_owned()
        };
        let at = site.path.clone().unwrap_or_else(|| site.anchor.clone());
        self.warn(
            site.file,
            at,
            format!(
                "rule `{}`: `{pattern}` starts with a wildcard at the root and matches {reach}: every injected process it reaches (sh, git, compilers) is unlocked with `{profile}`; name the directory (e.g. \"/opt/llama.cpp/bin/*\")",
                rule.id
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::{glob_covers, recursive_prefix};

    #[test]
    fn a_recursive_glob_covers_the_globs_under_its_prefix() {
        assert_eq!(recursive_prefix("/**"), Some(""));
        assert_eq!(recursive_prefix("/opt/**"), Some("/opt"));
        assert_eq!(recursive_prefix("/op*/**"), None);
        assert!(glob_covers("/opt/**", "/opt/llama/bin/*"));
        assert!(glob_covers("/**", "/opt/x*"));
        assert!(!glob_covers("/opt/**", "/optional/*"));
        assert!(!glob_covers("/opt/*", "/opt/x*"));
        assert!(glob_covers("/opt/*", "/opt/*"));
    }
}
