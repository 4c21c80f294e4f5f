//! Path globs whose only glob character is one `*` in the last component
//! (`/opt/fleet7/bin/*`, `/opt/llama/bin/llama-*`, `/usr/lib/lib*.dylib`): matched by
//! comparing bytes, without a compiled automaton.
//!
//! Such globs are the usual way to write one rule per tool, and each usually sits in
//! a directory of its own; a `globset::GlobSet` per directory carries a regex with
//! fixed overheads of several KiB, so 2,000 of them took 12 MiB more than the same
//! globs in 50 directories (issue 19). Under metalift's glob options ([`parse_glob`]:
//! `literal_separator`, so `*` is `[^/]*`, and nothing but `*` special here) the glob
//! `<dir>/<prefix>*<suffix>` matches exactly the paths `<dir>/<c>` whose last
//! component `c` holds no `/`, starts with `<prefix>` and ends with `<suffix>` without
//! the two overlapping: that is what [`ComponentGlobs`] checks. Every other glob
//! stays with globset.
//!
//! One exception, kept so a decision is what the `GlobSet` decided before: a
//! `GlobSet` matches a glob whose suffix holds a `.` through its required-extension
//! strategy, which first looks up the path's extension, and a path whose last
//! component is `..` has none (globset 0.4: `pathutil::file_name` returns `None` for
//! `..`; `RequiredExtensionStrategy::matches_into` returns early without an
//! extension). So `/opt/bin/*.` does not match `/opt/bin/..` although its regex
//! would. The kernel never reports such a path for an executable.
//!
//! [`parse_glob`]: crate::rule::parse_glob

/// Bytes with a meaning in a glob (the characters `rule::literal_dir` and validation treat
/// as glob syntax), plus the separator: a last component holding any of them but
/// one `*` is not a [`ComponentGlob`].
const SPECIAL: &[u8] = b"*?[]{}\\/";

/// `<dir>/<prefix>*<suffix>`: the last component of a glob whose only glob
/// character is that `*`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ComponentGlob {
    /// `<prefix>` then `<suffix>`, without the `*`.
    literal: Box<[u8]>,
    /// Where the `*` was: the length of `<prefix>`.
    star: usize,
}

impl ComponentGlob {
    /// The last component of `pattern` when `pattern` is `<dir>/<component>` and the
    /// component's only glob character is one `*`; `dir` is the pattern's literal
    /// directory (`rule::literal_dir`), which holds no glob character.
    pub(crate) fn after(pattern: &str, dir: &[u8]) -> Option<ComponentGlob> {
        let component = pattern.as_bytes().get(dir.len()..)?.strip_prefix(b"/")?;
        let star = component.iter().position(|&b| b == b'*')?;
        let (prefix, rest) = component.split_at(star);
        let suffix = rest.get(1..)?;
        if prefix.iter().chain(suffix).any(|b| SPECIAL.contains(b)) {
            return None;
        }
        Some(ComponentGlob {
            literal: [prefix, suffix].concat().into_boxed_slice(),
            star,
        })
    }

    fn prefix(&self) -> &[u8] {
        self.literal.get(..self.star).unwrap_or_default()
    }

    fn suffix(&self) -> &[u8] {
        self.literal.get(self.star..).unwrap_or_default()
    }
}

/// Byte-slice equality compared in line: prefixes and suffixes are a few bytes,
/// where a call into libc's `memcmp` costs more than the comparison. (Measured: a
/// lookup in a one-glob directory spent half its time in glibc's AVX-512 `memcmp`,
/// whose masked load through an empty slice's dangling pointer is slow on this
/// benchmark's CPU.)
fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// The [`ComponentGlob`]s of one literal directory, each with the rule it belongs
/// to, ordered by prefix so one directory can hold thousands of them: a lookup
/// binary-searches once per distinct prefix length instead of trying every glob.
#[derive(Debug, Default)]
pub(crate) struct ComponentGlobs {
    /// Sorted by prefix (then rule, for a stable order).
    globs: Vec<(ComponentGlob, usize)>,
    /// Every length a prefix in `globs` has, ascending, once each.
    prefix_lens: Vec<usize>,
}

impl ComponentGlobs {
    pub(crate) fn new(mut globs: Vec<(ComponentGlob, usize)>) -> ComponentGlobs {
        globs.sort_by(|(a, ra), (b, rb)| a.prefix().iter().cmp(b.prefix()).then(ra.cmp(rb)));
        let mut prefix_lens: Vec<usize> = globs.iter().map(|(g, _)| g.star).collect();
        prefix_lens.sort_unstable();
        prefix_lens.dedup();
        globs.shrink_to_fit();
        ComponentGlobs { globs, prefix_lens }
    }

    /// Calls `hit` with the rule of every glob matching `<dir>/<component>`, given
    /// `component`: the path's bytes after its literal directory and that `/`.
    pub(crate) fn matches(&self, component: &[u8], mut hit: impl FnMut(usize)) {
        if self.globs.is_empty() || component.contains(&b'/') {
            return;
        }
        for &len in &self.prefix_lens {
            let Some(key) = component.get(..len) else {
                break;
            };
            let first = self
                .globs
                .partition_point(|(g, _)| g.prefix().iter().lt(key));
            for (glob, rule) in self.globs.get(first..).unwrap_or_default() {
                if !same(glob.prefix(), key) {
                    break;
                }
                let suffix = glob.suffix();
                let tail = component.len().checked_sub(suffix.len());
                if tail.is_some_and(|t| t >= len)
                    && tail
                        .and_then(|t| component.get(t..))
                        .is_some_and(|t| same(t, suffix))
                    && !(same(component, b"..") && suffix.contains(&b'.'))
                {
                    hit(*rule);
                }
            }
        }
    }
}

// The tests give globset raw path bytes, as the kernel reports them (Unix only).
#[cfg(all(test, unix))]
mod tests {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    use globset::GlobSetBuilder;
    use proptest::prelude::*;

    use super::{ComponentGlob, ComponentGlobs};
    use crate::rule::{literal_dir, parse_glob};

    fn component_glob(pattern: &str) -> Option<ComponentGlob> {
        ComponentGlob::after(pattern, literal_dir(pattern))
    }

    /// The rules of `globs` (rule `i` is `patterns[i]`) matching `path`, by the
    /// fast path: the bucket of the glob's literal directory, then the component.
    fn fast_hits(patterns: &[&str], path: &[u8]) -> Vec<usize> {
        let mut by_dir: std::collections::HashMap<&[u8], Vec<(ComponentGlob, usize)>> =
            std::collections::HashMap::new();
        for (i, p) in patterns.iter().enumerate() {
            let dir = literal_dir(p);
            if let Some(g) = ComponentGlob::after(p, dir) {
                by_dir.entry(dir).or_default().push((g, i));
            }
        }
        let mut hits = Vec::new();
        for (dir, globs) in by_dir {
            let set = ComponentGlobs::new(globs);
            let component = path
                .strip_prefix(dir)
                .and_then(|rest| rest.strip_prefix(b"/"));
            if let Some(component) = component {
                set.matches(component, |rule| hits.push(rule));
            }
        }
        hits.sort_unstable();
        hits
    }

    /// What the matcher asked before the fast path existed: one `GlobSet` of
    /// `patterns` (built with [`parse_glob`]), the indices of the globs matching `path`.
    /// `None` if a pattern is not a valid glob (validation refuses those).
    fn globset_hits(patterns: &[&str], path: &[u8]) -> Option<Vec<usize>> {
        let mut builder = GlobSetBuilder::new();
        for p in patterns {
            builder.add(parse_glob(p).ok()?);
        }
        let mut hits = Vec::new();
        let path = Path::new(OsStr::from_bytes(path));
        builder.build().ok()?.matches_into(path, &mut hits);
        Some(hits)
    }

    #[test]
    fn a_glob_with_one_star_in_its_last_component_takes_the_fast_path() {
        for p in [
            "/opt/fleet7/bin/*",
            "/opt/tool-3/bin/t12-*",
            "/usr/lib/lib*.dylib",
            "/*",
            "/opt/a,b/x*",
            "//x*",
        ] {
            assert!(component_glob(p).is_some(), "{p}");
        }
    }

    #[test]
    fn any_other_glob_stays_with_globset() {
        for p in [
            "/opt/**",
            "/opt/*/bin/x",
            "/opt/bin/a*b*",
            "/opt/bin/l?",
            "/opt/bin/t[0-9]*",
            "/opt/bin/{a,b}*",
            "/opt/bin/\\*",
            "/opt/bin/x\\y*",
            "/opt/bin/*]",
            "opt*",
        ] {
            assert_eq!(component_glob(p), None, "{p}");
        }
    }

    #[test]
    fn a_star_stays_within_its_component_and_prefix_and_suffix_do_not_overlap() {
        let globs = [
            "/opt/bin/ab*ba",
            "/opt/bin/*",
            "/opt/bin/a*",
            "/opt/bin/abc*",
        ];
        assert_eq!(fast_hits(&globs, b"/opt/bin/aba"), vec![1, 2]);
        assert_eq!(fast_hits(&globs, b"/opt/bin/abba"), vec![0, 1, 2]);
        assert_eq!(fast_hits(&globs, b"/opt/bin/abcd"), vec![1, 2, 3]);
        assert_eq!(fast_hits(&globs, b"/opt/bin/"), vec![1]);
        assert_eq!(fast_hits(&globs, b"/opt/bin/a/b"), Vec::<usize>::new());
        assert_eq!(fast_hits(&globs, b"/opt/binary"), Vec::<usize>::new());
    }

    #[test]
    fn a_last_component_of_dot_dot_matches_no_glob_whose_suffix_has_a_dot_as_in_globset() {
        let globs = ["/opt/*.", "/opt/.*.", "/opt/*..", "/opt/*", "/opt/.*"];
        assert_eq!(fast_hits(&globs, b"/opt/.."), vec![3, 4]);
        assert_eq!(globset_hits(&globs, b"/opt/.."), Some(vec![3, 4]));
        assert_eq!(fast_hits(&globs, b"/opt/x.."), vec![0, 2, 3]);
    }

    /// Bytes patterns and paths are made of: glob syntax, the separator, a comma
    /// (literal outside braces), dots, a two-byte character, and a few letters that
    /// prefixes and suffixes share.
    const PATTERN_BYTES: &[&str] = &[
        "a", "b", "-", ".", ".", ",", "é", "/", "*", "*", "?", "[", "]", "{", "}", "\\",
    ];
    const LITERAL_BYTES: &[&str] = &["a", "b", "-", ".", ".", ",", "é"];
    const PATH_BYTES: &[&str] = &["a", "b", "-", ".", ".", ",", "é", "/", "*", "\n"];

    /// Globs near the fast path's shape (`/<dir>/<prefix>*<suffix>`, with a glob
    /// character or a separator slipping in now and then), and any glob at all.
    fn pattern() -> impl Strategy<Value = String> {
        let piece = || {
            prop_oneof![
                6 => text(LITERAL_BYTES, 4),
                1 => text(PATTERN_BYTES, 3),
            ]
        };
        let shaped =
            (piece(), piece(), piece()).prop_map(|(dir, pre, suf)| format!("/{dir}/{pre}*{suf}"));
        let any = text(PATTERN_BYTES, 10).prop_map(|t| format!("/{t}"));
        prop_oneof![3 => shaped, 1 => any]
    }

    fn text(pool: &'static [&'static str], max: usize) -> impl Strategy<Value = String> {
        prop::collection::vec(prop::sample::select(pool), 0..max).prop_map(|p| p.concat())
    }

    /// A path made from `pattern` by replacing each `*` with some text (often a
    /// match), or any path at all.
    fn path_for(pattern: String) -> impl Strategy<Value = (String, Vec<u8>)> {
        let instance = prop::collection::vec(text(PATH_BYTES, 4), 8).prop_map({
            let pattern = pattern.clone();
            move |fills| {
                let mut fills = fills.into_iter();
                let mut out = String::new();
                for c in pattern.chars() {
                    if c == '*' {
                        out.push_str(&fills.next().unwrap_or_default());
                    } else {
                        out.push(c);
                    }
                }
                out.into_bytes()
            }
        });
        let random = prop::collection::vec(prop::sample::select(PATH_BYTES), 0..10)
            .prop_map(|p| format!("/{}", p.concat()).into_bytes());
        let raw = prop::collection::vec(any::<u8>(), 0..12);
        (
            Just(pattern),
            prop_oneof![4 => instance, 2 => random, 1 => raw],
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2048))]

        /// The fast path answers exactly as globset, with metalift's options, does
        /// for every glob it takes, and bucket lookup by literal directory misses
        /// none of its matches.
        #[test]
        fn the_fast_path_matches_exactly_what_globset_matches(
            (pattern, path) in pattern().prop_flat_map(path_for),
        ) {
            if component_glob(&pattern).is_none() {
                return Ok(());
            }
            let Some(want) = globset_hits(&[&pattern], &path) else { return Ok(()) };
            prop_assert_eq!(fast_hits(&[&pattern], &path), want);
        }

        /// Many fast-path globs in one directory, with prefixes of several lengths:
        /// every rule globset matches is found, and no other.
        #[test]
        fn a_directory_of_many_fast_path_globs_finds_every_match(
            parts in prop::collection::vec((text(&["a", "b", "-"], 4), text(&["a", "b", "."], 3)), 1..40),
            names in prop::collection::vec(text(&["a", "b", "-", "."], 8), 1..8),
        ) {
            let patterns: Vec<String> =
                parts.iter().map(|(pre, suf)| format!("/opt/bin/{pre}*{suf}")).collect();
            let refs: Vec<&str> = patterns.iter().map(String::as_str).collect();
            for name in &names {
                let path = format!("/opt/bin/{name}");
                let want = globset_hits(&refs, path.as_bytes());
                prop_assert_eq!(Some(fast_hits(&refs, path.as_bytes())), want, "path {}", path);
            }
        }
    }
}
