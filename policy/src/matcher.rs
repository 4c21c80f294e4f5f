//! Stage 3, the compiled matcher: finds the rules that can match a subject without
//! scanning every rule.
//!
//! Each rule is indexed once, under its most specific identity matcher (the one that
//! sets its [`Specificity`]): a hash map per exact identity (cdhash, sha256,
//! signing_id, team_id, exact path, name), and for path globs a [`GlobBuckets`].
//! Every rule that matches a subject must match its own index key, so looking the
//! subject up in each index finds every candidate; candidates are then checked in
//! full ([`Rule::holds`]). Indexes are consulted from the most specific down, and the
//! search stops at the first level with a matching rule: nothing below can win.

use std::collections::HashMap;
use std::ffi::OsString;
use std::hash::Hash;

use globset::{GlobSet, GlobSetBuilder};

use crate::rule::{path_bytes, PathPattern, PrecedenceKey, Rule, Specificity};
use crate::subject::Subject;

/// Rule indices (into the policy's rule list) by index key, in file order.
type Index<K> = HashMap<K, Vec<usize>>;

/// A bucket with more globs than this is matched through one [`GlobSet`]; smaller
/// ones check their few globs directly.
const GLOBSET_THRESHOLD: usize = 8;

/// The indexes over one policy's rules.
#[derive(Debug, Default)]
pub(crate) struct Matcher {
    cdhash: Index<Vec<u8>>,
    sha256: Index<[u8; 32]>,
    signing_id: Index<String>,
    team_id: Index<String>,
    /// Exact paths by their bytes.
    exact_path: Index<Vec<u8>>,
    globs: GlobBuckets,
    name: Index<OsString>,
}

/// Path globs grouped by their literal directory: the bytes of the pattern before its
/// first glob character, up to (not including) the last `/` (`/opt/llama/bin/llama-*`
/// → `/opt/llama/bin`, `/opt/**` → `/opt`, `/**` → the empty string). A glob matches
/// only paths that start with its literal directory and a `/`, so a lookup visits only
/// the buckets named by the subject's own prefixes ending before a `/` (one hash
/// lookup per path component) instead of every glob.
#[derive(Debug, Default)]
struct GlobBuckets {
    buckets: HashMap<Vec<u8>, GlobBucket>,
}

#[derive(Debug, Default)]
struct GlobBucket {
    /// The bucket's rules, in file order.
    rules: Vec<usize>,
    /// Built when the bucket is large: glob `i` of the set is `rules[i]`'s.
    set: Option<GlobSet>,
}

/// The literal directory of a glob pattern (see [`GlobBuckets`]).
fn literal_dir(pattern: &str) -> &[u8] {
    let first_meta = pattern
        .find(['*', '?', '[', ']', '{', '}', '\\'])
        .unwrap_or(pattern.len());
    let literal = pattern.get(..first_meta).unwrap_or("");
    let end = literal.rfind('/').unwrap_or(0);
    literal.as_bytes().get(..end).unwrap_or_default()
}

impl GlobBuckets {
    fn add(&mut self, pattern: &str, rule: usize) {
        self.buckets
            .entry(literal_dir(pattern).to_vec())
            .or_default()
            .rules
            .push(rule);
    }

    /// Builds a [`GlobSet`] for each large bucket.
    fn finish(&mut self, rules: &[Rule]) -> Result<(), globset::Error> {
        for bucket in self.buckets.values_mut() {
            if bucket.rules.len() <= GLOBSET_THRESHOLD {
                continue;
            }
            let mut set = GlobSetBuilder::new();
            for &i in &bucket.rules {
                if let Some(Rule {
                    path: Some(PathPattern::Glob { matcher, .. }),
                    ..
                }) = rules.get(i)
                {
                    set.add(matcher.glob().clone());
                }
            }
            bucket.set = Some(set.build()?);
        }
        Ok(())
    }

    /// The best glob rule that holds for `s`.
    fn best(&self, rules: &[Rule], s: &Subject) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let mut best: Option<(PrecedenceKey, usize)> = None;
        let mut hits = Vec::new();
        let path = path_bytes(&s.path);
        let dirs = path
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'/')
            .filter_map(|(i, _)| path.get(..i));
        for dir in dirs {
            let Some(bucket) = self.buckets.get(dir) else {
                continue;
            };
            let candidates: &[usize] = match &bucket.set {
                Some(set) => {
                    hits.clear();
                    set.matches_into(&s.path, &mut hits);
                    for h in hits.iter_mut() {
                        *h = bucket.rules.get(*h).copied().unwrap_or(usize::MAX);
                    }
                    &hits
                }
                None => &bucket.rules,
            };
            best = better(best, pick(rules, s, candidates));
        }
        best.map(|(_, i)| i)
    }
}

fn add<K: Hash + Eq>(index: &mut Index<K>, key: K, rule: usize) {
    index.entry(key).or_default().push(rule);
}

impl Matcher {
    /// Indexes `rules`. Fails only if globset cannot build a set of globs that each
    /// compiled on their own (e.g. a size limit).
    pub(crate) fn build(rules: &[Rule]) -> Result<Matcher, globset::Error> {
        let mut m = Matcher::default();
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
                    Some(PathPattern::Exact(p)) => {
                        add(&mut m.exact_path, path_bytes(p).into_owned(), i);
                    }
                    Some(PathPattern::Glob { pattern, .. }) => m.globs.add(pattern, i),
                    None => {}
                },
                Specificity::Name => {
                    if let Some(k) = &rule.name {
                        add(&mut m.name, k.clone(), i);
                    }
                }
            }
        }
        m.globs.finish(rules)?;
        Ok(m)
    }

    /// The index of the winning rule for `s`, or `None` when no rule matches.
    pub(crate) fn best(&self, rules: &[Rule], s: &Subject) -> Option<usize> {
        let exact = |c: Option<&Vec<usize>>| c.and_then(|c| pick(rules, s, c)).map(|(_, i)| i);
        // From the most specific level down; a level with a match ends the search.
        exact(s.cdhash.as_ref().and_then(|k| self.cdhash.get(k)))
            .or_else(|| exact(s.sha256.as_ref().and_then(|k| self.sha256.get(k))))
            .or_else(|| exact(s.signing_id.as_ref().and_then(|k| self.signing_id.get(k))))
            .or_else(|| exact(s.team_id.as_ref().and_then(|k| self.team_id.get(k))))
            .or_else(|| exact(self.exact_path.get(path_bytes(&s.path).as_ref())))
            .or_else(|| self.globs.best(rules, s))
            .or_else(|| exact(s.path.file_name().and_then(|n| self.name.get(n))))
    }
}

/// The best of `candidates` that holds for `s`, by precedence, with its key.
fn pick(rules: &[Rule], s: &Subject, candidates: &[usize]) -> Option<(PrecedenceKey, usize)> {
    let mut best = None;
    for &i in candidates {
        let Some(rule) = rules.get(i) else { continue };
        if rule.holds(s) {
            best = better(best, Some((rule.precedence_key(), i)));
        }
    }
    best
}

fn better(
    a: Option<(PrecedenceKey, usize)>,
    b: Option<(PrecedenceKey, usize)>,
) -> Option<(PrecedenceKey, usize)> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
        (a, None) => a,
        (None, b) => b,
    }
}

#[cfg(test)]
mod tests {
    use super::literal_dir;

    #[test]
    fn a_glob_is_bucketed_under_the_directory_before_its_first_glob_character() {
        assert_eq!(literal_dir("/opt/llama/bin/llama-*"), b"/opt/llama/bin");
        assert_eq!(literal_dir("/opt/**"), b"/opt");
        assert_eq!(literal_dir("/opt/**/x"), b"/opt");
        assert_eq!(literal_dir("/**"), b"");
        assert_eq!(literal_dir("/*/bin"), b"");
        assert_eq!(literal_dir("/opt/{a,b/c}/x"), b"/opt");
        assert_eq!(literal_dir("/usr/bin/l?"), b"/usr/bin");
        assert_eq!(literal_dir("//x*"), b"/");
    }
}
