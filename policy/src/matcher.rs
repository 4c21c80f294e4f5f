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
use std::hash::{Hash, Hasher};
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError, Weak};
use std::time::SystemTime;

use globset::{GlobSet, GlobSetBuilder};

use crate::component_glob::{ComponentGlob, ComponentGlobs};
use crate::rule::{
    literal_dir, parse_glob, path_bytes, PathPattern, PrecedenceKey, Rule, Specificity,
};
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
///
/// A bucket's globs whose only glob character is one `*` in the last component
/// (`/opt/fleet7/bin/*`) are matched by comparing bytes ([`ComponentGlobs`]); the
/// others through one [`GlobSet`], which names the bucket's globs that match a path.
/// The rules indexed here keep no compiled matcher of their own (one per glob cost
/// several times the memory and load time of the sets), and a bucket of byte-compared
/// globs only has no set at all: a set's automata cost several KiB however few globs
/// it holds, which made memory grow with the number of directories (issue 19).
#[derive(Debug, Default)]
struct GlobBuckets {
    buckets: HashMap<Vec<u8>, GlobBucket>,
}

#[derive(Debug, Default)]
struct GlobBucket {
    /// The rules whose globs `set` holds, in file order.
    rules: Vec<usize>,
    /// Glob `i` of the set is `rules[i]`'s path glob; `None` when every glob of the
    /// bucket is in `by_bytes`. Shared with other policies whose bucket has the same
    /// globs (see [`SHARED_SETS`]).
    set: Option<Arc<GlobSet>>,
    /// The bucket's `<dir>/<prefix>*<suffix>` globs, each with its rule.
    by_bytes: ComponentGlobs,
}

/// [`GlobBuckets`] being built, by literal directory.
#[derive(Default)]
struct GlobBucketsBuilder<'r> {
    buckets: HashMap<&'r [u8], BucketBuilder<'r>>,
}

/// One bucket being built, in file order.
#[derive(Default)]
struct BucketBuilder<'r> {
    /// The globs for the bucket's [`GlobSet`], each with its rule.
    rules: Vec<usize>,
    patterns: Vec<&'r str>,
    /// The globs matched by comparing bytes.
    by_bytes: Vec<(ComponentGlob, usize)>,
}

impl<'r> GlobBucketsBuilder<'r> {
    fn add(&mut self, pattern: &'r str, rule: usize) {
        let dir = literal_dir(pattern);
        let bucket = self.buckets.entry(dir).or_default();
        if let Some(glob) = ComponentGlob::after(pattern, dir) {
            bucket.by_bytes.push((glob, rule));
        } else {
            bucket.rules.push(rule);
            bucket.patterns.push(pattern);
        }
    }

    /// Builds each bucket's [`GlobSet`] (if it needs one), or reuses the one a live
    /// policy already has for the same globs ([`SHARED_SETS`]).
    fn build(self) -> Result<GlobBuckets, globset::Error> {
        let mut buckets = HashMap::with_capacity(self.buckets.len());
        for (dir, b) in self.buckets {
            let set = if b.patterns.is_empty() {
                None
            } else {
                Some(shared_set(&b.patterns)?)
            };
            let bucket = GlobBucket {
                rules: b.rules,
                set,
                by_bytes: ComponentGlobs::new(b.by_bytes),
            };
            buckets.insert(dir.to_vec(), bucket);
        }
        shared_sets().retain(|_, sets| {
            sets.retain(|(_, set)| set.strong_count() > 0);
            !sets.is_empty()
        });
        Ok(GlobBuckets { buckets })
    }
}

/// The compiled [`GlobSet`] of every bucket some policy in this process still uses,
/// by the hash of the bucket's globs (in order). A reload that leaves a bucket's globs
/// as they were (most edits touch a few rules) reuses its set instead of compiling
/// it again: compiling the sets is the largest part of loading many globs. A set is
/// a pure function of its globs, so sharing it changes no decision; entries are weak,
/// so a set lives only as long as a policy using it.
type SharedSets = HashMap<u64, Vec<(Vec<Box<str>>, Weak<GlobSet>)>>;
static SHARED_SETS: LazyLock<Mutex<SharedSets>> = LazyLock::new(Mutex::default);

fn shared_sets() -> MutexGuard<'static, SharedSets> {
    // Entries are replaced whole: a poisoned lock still holds a consistent map.
    SHARED_SETS.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The set matching `patterns` (glob `i` of the set is `patterns[i]`).
fn shared_set(patterns: &[&str]) -> Result<Arc<GlobSet>, globset::Error> {
    let key = {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        patterns.hash(&mut h);
        h.finish()
    };
    let same = |kept: &[Box<str>]| kept.iter().map(|p| &**p).eq(patterns.iter().copied());
    let found = shared_sets().get(&key).and_then(|sets| {
        sets.iter()
            .find(|(kept, _)| same(kept))
            .and_then(|(_, set)| set.upgrade())
    });
    if let Some(set) = found {
        return Ok(set);
    }
    // Compiled without holding the lock: another compile may build the same set
    // meanwhile, which costs time, never a wrong answer.
    let mut builder = GlobSetBuilder::new();
    for pattern in patterns {
        builder.add(parse_glob(pattern)?);
    }
    let set = Arc::new(builder.build()?);
    shared_sets().entry(key).or_default().push((
        patterns.iter().map(|p| Box::<str>::from(*p)).collect(),
        Arc::downgrade(&set),
    ));
    Ok(set)
}

impl GlobBuckets {
    /// The best glob rule that holds for `s` at `at`.
    fn best(&self, rules: &[Rule], s: &Subject, at: SystemTime) -> Option<usize> {
        if self.buckets.is_empty() {
            return None;
        }
        let mut best: Option<(PrecedenceKey, usize)> = None;
        // The bucket has matched the path glob; the rest of the rule is checked here.
        let mut consider = |i: usize| {
            let Some(rule) = rules.get(i) else { return };
            if rule.holds_besides_path(s, at) {
                best = better(best, Some((rule.precedence_key(), i)));
            }
        };
        let mut hits = Vec::new();
        let path = path_bytes(&s.path);
        let dirs = path
            .iter()
            .enumerate()
            .filter(|(_, b)| **b == b'/')
            .filter_map(|(i, _)| Some((path.get(..i)?, path.get(i + 1..)?)));
        for (dir, component) in dirs {
            let Some(bucket) = self.buckets.get(dir) else {
                continue;
            };
            bucket.by_bytes.matches(component, &mut consider);
            let Some(set) = &bucket.set else { continue };
            set.matches_into(&s.path, &mut hits);
            for &h in &hits {
                if let Some(&i) = bucket.rules.get(h) {
                    consider(i);
                }
            }
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
        let mut globs = GlobBucketsBuilder::default();
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
                    Some(PathPattern::Glob { pattern, .. }) => globs.add(pattern, i),
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

    /// The index of the winning rule for `s` at `at`, or `None` when no rule
    /// matches. A rule outside its window does not match, so a level whose only
    /// match has ended lets the search go on to the levels below.
    pub(crate) fn best(&self, rules: &[Rule], s: &Subject, at: SystemTime) -> Option<usize> {
        let exact = |c: Option<&Vec<usize>>| c.and_then(|c| pick(rules, s, at, c)).map(|(_, i)| i);
        // From the most specific level down; a level with a match ends the search.
        exact(s.cdhash.as_ref().and_then(|k| self.cdhash.get(k)))
            .or_else(|| exact(s.sha256.as_ref().and_then(|k| self.sha256.get(k))))
            .or_else(|| exact(s.signing_id.as_ref().and_then(|k| self.signing_id.get(k))))
            .or_else(|| exact(s.team_id.as_ref().and_then(|k| self.team_id.get(k))))
            .or_else(|| exact(self.exact_path.get(path_bytes(&s.path).as_ref())))
            .or_else(|| self.globs.best(rules, s, at))
            .or_else(|| exact(s.path.file_name().and_then(|n| self.name.get(n))))
    }
}

/// The best of `candidates` that holds for `s` at `at`, by precedence, with its key.
fn pick(
    rules: &[Rule],
    s: &Subject,
    at: SystemTime,
    candidates: &[usize],
) -> Option<(PrecedenceKey, usize)> {
    let mut best = None;
    for &i in candidates {
        let Some(rule) = rules.get(i) else { continue };
        if rule.holds(s, at) {
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
