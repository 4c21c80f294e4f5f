//! Stage 3, the compiled matcher: finds the rules that can match a subject without
//! scanning every rule.
//!
//! Each rule is indexed once, under its most specific identity matcher (the one that
//! sets its [`Specificity`]): a hash map per exact identity (cdhash, sha256,
//! signing_id, team_id, exact path, name) and one [`GlobSet`] for path globs. Every
//! rule that matches a subject must match its own index key, so looking a subject up
//! in each index finds every candidate; candidates are then checked in full
//! ([`Rule::holds`]). Indexes are consulted from the most specific down, and the
//! search stops at the first level with a matching rule: nothing below can win.

use std::collections::HashMap;
use std::ffi::OsString;
use std::hash::Hash;
use std::path::PathBuf;

use globset::{GlobSet, GlobSetBuilder};

use crate::rule::{PathPattern, PrecedenceKey, Rule, Specificity};
use crate::subject::Subject;

/// Rule indices (into the policy's rule list) by index key, in file order.
type Index<K> = HashMap<K, Vec<usize>>;

/// The indexes over one policy's rules.
#[derive(Debug, Default)]
pub(crate) struct Matcher {
    cdhash: Index<Vec<u8>>,
    sha256: Index<[u8; 32]>,
    signing_id: Index<String>,
    team_id: Index<String>,
    exact_path: Index<PathBuf>,
    /// Path globs, one entry per rule; `glob_rules[i]` is the rule of glob `i`.
    globs: GlobSet,
    glob_rules: Vec<usize>,
    name: Index<OsString>,
}

fn add<K: Hash + Eq>(index: &mut Index<K>, key: K, rule: usize) {
    index.entry(key).or_default().push(rule);
}

impl Matcher {
    /// Indexes `rules`. Fails only if globset cannot build a set of globs that each
    /// compiled on their own (e.g. a size limit).
    pub(crate) fn build(rules: &[Rule]) -> Result<Matcher, globset::Error> {
        let mut m = Matcher::default();
        let mut globs = GlobSetBuilder::new();
        for (i, rule) in rules.iter().enumerate() {
            match rule.specificity() {
                Specificity::Cdhash => {
                    if let Some(k) = &rule.cdhash {
                        add(&mut m.cdhash, k.clone(), i);
                    }
                }
                Specificity::Sha256 => {
                    if let Some(k) = rule.sha256 {
                        add(&mut m.sha256, k, i);
                    }
                }
                Specificity::SigningId => {
                    if let Some(k) = &rule.signing_id {
                        add(&mut m.signing_id, k.clone(), i);
                    }
                }
                Specificity::TeamId => {
                    if let Some(k) = &rule.team_id {
                        add(&mut m.team_id, k.clone(), i);
                    }
                }
                Specificity::ExactPath | Specificity::GlobPath => match &rule.path {
                    Some(PathPattern::Exact(p)) => add(&mut m.exact_path, p.clone(), i),
                    Some(PathPattern::Glob { matcher, .. }) => {
                        globs.add(matcher.glob().clone());
                        m.glob_rules.push(i);
                    }
                    None => {}
                },
                Specificity::Name => {
                    if let Some(k) = &rule.name {
                        add(&mut m.name, k.clone(), i);
                    }
                }
            }
        }
        m.globs = globs.build()?;
        Ok(m)
    }

    /// The index of the winning rule for `s`, or `None` when no rule matches.
    pub(crate) fn best(&self, rules: &[Rule], s: &Subject) -> Option<usize> {
        // From the most specific level down; a level with a match ends the search.
        let levels: [&dyn Fn() -> Option<usize>; 7] = [
            &|| pick(rules, s, s.cdhash.as_ref().and_then(|k| self.cdhash.get(k))),
            &|| pick(rules, s, s.sha256.as_ref().and_then(|k| self.sha256.get(k))),
            &|| {
                pick(
                    rules,
                    s,
                    s.signing_id.as_ref().and_then(|k| self.signing_id.get(k)),
                )
            },
            &|| {
                pick(
                    rules,
                    s,
                    s.team_id.as_ref().and_then(|k| self.team_id.get(k)),
                )
            },
            &|| pick(rules, s, self.exact_path.get(&s.path)),
            &|| self.best_glob(rules, s),
            &|| pick(rules, s, s.path.file_name().and_then(|n| self.name.get(n))),
        ];
        levels.iter().find_map(|level| level())
    }

    fn best_glob(&self, rules: &[Rule], s: &Subject) -> Option<usize> {
        if self.glob_rules.is_empty() {
            return None;
        }
        let hits: Vec<usize> = self
            .globs
            .matches(&s.path)
            .into_iter()
            .filter_map(|g| self.glob_rules.get(g).copied())
            .collect();
        pick(rules, s, Some(&hits))
    }
}

/// The best of `candidates` that holds for `s`, by precedence.
fn pick(rules: &[Rule], s: &Subject, candidates: Option<&Vec<usize>>) -> Option<usize> {
    let mut best: Option<(PrecedenceKey, usize)> = None;
    for &i in candidates? {
        let Some(rule) = rules.get(i) else { continue };
        if rule.holds(s) {
            let key = rule.precedence_key();
            if best.as_ref().is_none_or(|(k, _)| key < *k) {
                best = Some((key, i));
            }
        }
    }
    best.map(|(_, i)| i)
}
