//! One validated rule: its matchers, its effect, its specificity, and how it is checked.
//!
//! Identity matchers (`cdhash`, `sha256`, `signing_id`, `team_id`, `path`, `name`) say
//! *which executable*; qualifiers (`uid`, `user`, `parent`, `platform`) only narrow a
//! rule to some launches of it. Every matcher of a rule must hold. A rule's [`Specificity`] is that
//! of its most specific identity matcher; qualifiers do not raise it, so a qualified
//! `unlock` never outranks an unqualified `stock` for the same identity.

use std::borrow::Cow;
use std::cmp::Reverse;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::SystemTime;

use globset::{Glob, GlobBuilder, GlobMatcher};

use crate::anchor::Anchor;
use crate::profile::Capabilities;
use crate::subject::Subject;
use crate::window::{format_rfc3339, Window, WindowState};

/// How precisely a rule names its executable; a more specific rule wins.
/// Ordered from least to most specific.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Specificity {
    /// `name`: the executable's file name, anywhere.
    Name,
    /// `path` with glob characters.
    GlobPath,
    /// `path` without glob characters.
    ExactPath,
    /// `team_id`: anything signed by that developer team.
    TeamId,
    /// `signing_id`: one signed program.
    SigningId,
    /// `sha256` of the file's contents.
    Sha256,
    /// `cdhash`: one exact signed build.
    Cdhash,
}

impl Specificity {
    /// How the explanation names this level.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Specificity::Name => "name",
            Specificity::GlobPath => "path glob",
            Specificity::ExactPath => "exact path",
            Specificity::TeamId => "team_id",
            Specificity::SigningId => "signing_id",
            Specificity::Sha256 => "sha256",
            Specificity::Cdhash => "cdhash",
        }
    }
}

/// A `path` or `parent` value: an exact path, or a glob (`*` stays within one path
/// component, `**` crosses them).
#[derive(Debug, Clone)]
pub(crate) enum PathPattern {
    Exact(PathBuf),
    Glob {
        pattern: String,
        /// The glob compiled on its own, kept only where a decision needs it: a
        /// `parent`, or the `path` of a rule indexed under a more specific matcher
        /// (`sha256` + a path glob). A rule indexed by its path glob has none: its
        /// bucket's `GlobSet` matches the path for it (see `matcher`), and a compiled
        /// matcher per glob is most of a large policy's memory and load time.
        matcher: Option<GlobMatcher>,
    },
}

/// Parses a `path` or `parent` glob the one way metalift reads globs: `*` and `?`
/// stop at `/`, `\` escapes.
pub(crate) fn parse_glob(pattern: &str) -> Result<Glob, globset::Error> {
    GlobBuilder::new(pattern)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
}

/// The literal directory of a glob pattern under which the matcher buckets it
/// (`matcher::GlobBuckets`): everything before the `/` that precedes its first glob
/// character.
pub(crate) fn literal_dir(pattern: &str) -> &[u8] {
    let first_meta = pattern
        .find(['*', '?', '[', ']', '{', '}', '\\'])
        .unwrap_or(pattern.len());
    let literal = pattern.get(..first_meta).unwrap_or("");
    let end = literal.rfind('/').unwrap_or(0);
    literal.as_bytes().get(..end).unwrap_or_default()
}

/// A path's bytes as the kernel reported them. Exact paths compare byte for byte (as
/// globs do), not component-wise: `/opt//x` is not `/opt/x` (validation warns about
/// such patterns).
pub(crate) fn path_bytes(path: &Path) -> Cow<'_, [u8]> {
    #[cfg(unix)]
    {
        use std::os::unix::ffi::OsStrExt;
        Cow::Borrowed(path.as_os_str().as_bytes())
    }
    #[cfg(not(unix))]
    {
        Cow::Owned(path.to_string_lossy().into_owned().into_bytes())
    }
}

impl PathPattern {
    /// Whether `path` matches. A glob without a kept matcher is compiled for this
    /// call: only `explain` (which walks every rule) gets here for such a glob; the
    /// hot path finds those rules through their bucket's `GlobSet`.
    pub(crate) fn matches(&self, path: &Path) -> bool {
        match self {
            PathPattern::Exact(p) => path_bytes(p) == path_bytes(path),
            PathPattern::Glob {
                matcher: Some(m), ..
            } => m.is_match(path),
            PathPattern::Glob {
                pattern,
                matcher: None,
            } => parse_glob(pattern).is_ok_and(|g| g.compile_matcher().is_match(path)),
        }
    }

    fn describe(&self) -> String {
        match self {
            PathPattern::Exact(p) => format!("`{}`", p.display()),
            PathPattern::Glob { pattern, .. } => format!("glob `{pattern}`"),
        }
    }
}

/// What a rule decides when it wins.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Effect {
    Unlock {
        /// Shared by every rule naming the profile.
        profile: Arc<str>,
        capabilities: Capabilities,
    },
    Stock,
}

/// A validated rule, ready to be indexed and checked.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    pub id: String,
    /// Where the rule's table is: its source's index and line, for explanations
    /// (see [`Rule::location`]; a string per rule would duplicate the file name).
    pub file: u32,
    pub line: u32,
    /// Position in the merged policy (main file first, then `policy.d/` by name).
    pub order: usize,
    pub path: Option<PathPattern>,
    pub name: Option<OsString>,
    pub sha256: Option<[u8; 32]>,
    pub cdhash: Option<Vec<u8>>,
    pub team_id: Option<String>,
    pub signing_id: Option<String>,
    /// `platform = true`: only Apple's own code ([`Anchor::Apple`]) matches.
    pub platform: bool,
    pub uid: Option<u32>,
    pub user: Option<String>,
    pub parent: Option<PathPattern>,
    pub effect: Effect,
    /// `from`/`until`: outside it the rule does not match ([`crate::window`]).
    pub window: Window,
}

/// Sort key of a matching rule: the smallest key wins (most specific, then stock
/// before unlock, then earliest in file order).
pub(crate) type PrecedenceKey = (Reverse<Specificity>, bool, usize);

impl Rule {
    /// The specificity of the rule's most specific identity matcher. Validation
    /// guarantees there is one; `Name` is the floor.
    pub(crate) fn specificity(&self) -> Specificity {
        if self.cdhash.is_some() {
            Specificity::Cdhash
        } else if self.sha256.is_some() {
            Specificity::Sha256
        } else if self.signing_id.is_some() {
            Specificity::SigningId
        } else if self.team_id.is_some() {
            Specificity::TeamId
        } else {
            match &self.path {
                Some(PathPattern::Exact(_)) => Specificity::ExactPath,
                Some(PathPattern::Glob { .. }) => Specificity::GlobPath,
                None => Specificity::Name,
            }
        }
    }

    /// `file:line` of the rule's table, given the policy's source names.
    pub(crate) fn location(&self, files: &[impl AsRef<str>]) -> String {
        match usize::try_from(self.file).ok().and_then(|f| files.get(f)) {
            Some(name) => format!("{}:{}", name.as_ref(), self.line),
            None => String::new(),
        }
    }

    pub(crate) fn precedence_key(&self) -> PrecedenceKey {
        (
            Reverse(self.specificity()),
            matches!(self.effect, Effect::Unlock { .. }),
            self.order,
        )
    }

    /// Whether every matcher holds for `s` at `at` (the rule's window included).
    /// The fast path: no allocation (for a rule indexed by its path glob, see
    /// [`Rule::holds_besides_path`]).
    pub(crate) fn holds(&self, s: &Subject, at: SystemTime) -> bool {
        self.path.as_ref().is_none_or(|p| p.matches(&s.path)) && self.holds_besides_path(s, at)
    }

    /// Whether every matcher but `path` holds for `s` at `at`: for a rule whose path
    /// glob the caller has already matched (a bucket's `GlobSet` said so).
    pub(crate) fn holds_besides_path(&self, s: &Subject, at: SystemTime) -> bool {
        self.window.contains(at)
            && self
                .cdhash
                .as_ref()
                .is_none_or(|want| s.cdhash.as_deref() == Some(want.as_slice()))
            && self.sha256.is_none_or(|want| s.sha256 == Some(want))
            && self
                .signing_id
                .as_ref()
                .is_none_or(|want| s.signing_id.as_ref() == Some(want))
            && self
                .team_id
                .as_ref()
                .is_none_or(|want| s.team_id.as_ref() == Some(want))
            && (!self.platform || s.anchor == Some(Anchor::Apple))
            && self
                .name
                .as_ref()
                .is_none_or(|want| s.path.file_name() == Some(want.as_os_str()))
            && self.uid.is_none_or(|want| s.uid == want)
            && self
                .user
                .as_ref()
                .is_none_or(|want| s.user.as_ref() == Some(want))
            && self.parent.as_ref().is_none_or(|p| {
                s.parent_path
                    .as_deref()
                    .is_some_and(|parent| p.matches(parent))
            })
    }

    /// Checks every matcher, and the window at `at`, and says why: `Ok(what held)`
    /// or `Err(what failed)`.
    pub(crate) fn check(&self, s: &Subject, at: SystemTime) -> Result<String, String> {
        let mut held = Vec::new();
        let mut failed = Vec::new();
        match self.window.state(at) {
            _ if self.window.is_always() => {}
            WindowState::Open => held.push(format!("window open ({})", self.window.describe())),
            WindowState::NotYetOpen { opens } => failed.push(format!(
                "window not yet open: opens at {} (`from`)",
                format_rfc3339(opens)
            )),
            WindowState::Closed { closed } => failed.push(format!(
                "window closed at {} (`until`)",
                format_rfc3339(closed)
            )),
        }
        let mut note = |ok: bool, yes: String, no: String| {
            if ok {
                held.push(yes);
            } else {
                failed.push(no);
            }
        };
        if let Some(want) = &self.cdhash {
            let got = s.cdhash.as_deref().map(hex::encode);
            note(
                s.cdhash.as_deref() == Some(want.as_slice()),
                format!("cdhash is {}", hex::encode(want)),
                match got {
                    Some(g) => format!("cdhash is {g}, not {}", hex::encode(want)),
                    None => match &s.unreadable {
                        Some(why) => format!("cdhash unknown (identity unreadable: {why})"),
                        None => "no cdhash (unsigned, invalid signature, or not macOS)".to_owned(),
                    },
                },
            );
        }
        if let Some(want) = &self.sha256 {
            note(
                s.sha256 == Some(*want),
                format!("sha256 is {}", hex::encode(want)),
                match &s.sha256 {
                    Some(g) => format!("sha256 is {}, not {}", hex::encode(g), hex::encode(want)),
                    None => match &s.unreadable {
                        Some(why) => format!("sha256 unknown (identity unreadable: {why})"),
                        None => "sha256 not computed".to_owned(),
                    },
                },
            );
        }
        for (key, want, got) in [
            ("signing_id", &self.signing_id, &s.signing_id),
            ("team_id", &self.team_id, &s.team_id),
        ] {
            if let Some(want) = want {
                note(
                    got.as_ref() == Some(want),
                    format!("{key} is `{want}`"),
                    match got {
                        Some(g) => format!("{key} is `{g}`, not `{want}`"),
                        None => format!("no {key} ({})", why_no_signing_ids(s)),
                    },
                );
            }
        }
        if self.platform {
            note(
                s.anchor == Some(Anchor::Apple),
                "signature is Apple's own (anchor `apple`)".to_owned(),
                match (s.anchor, &s.unreadable) {
                    (_, Some(why)) => {
                        format!("not known to be Apple's own code (identity unreadable: {why})")
                    }
                    (Some(a), None) => {
                        format!("not Apple's own code (anchor is `{a}`, not `apple`)")
                    }
                    (None, None) => {
                        "not Apple's own code (no code signature on this platform)".to_owned()
                    }
                },
            );
        }
        if let Some(p) = &self.path {
            note(
                p.matches(&s.path),
                format!("path matches {}", p.describe()),
                format!(
                    "path `{}` does not match {}",
                    s.path.display(),
                    p.describe()
                ),
            );
        }
        if let Some(want) = &self.name {
            let got = s.path.file_name();
            note(
                got == Some(want.as_os_str()),
                format!("name is `{}`", want.to_string_lossy()),
                format!(
                    "name is `{}`, not `{}`",
                    got.unwrap_or_default().to_string_lossy(),
                    want.to_string_lossy()
                ),
            );
        }
        if let Some(want) = self.uid {
            note(
                s.uid == want,
                format!("uid is {want}"),
                format!("uid is {}, not {want}", s.uid),
            );
        }
        if let Some(want) = &self.user {
            note(
                s.user.as_ref() == Some(want),
                format!("user is `{want}`"),
                match &s.user {
                    Some(g) => format!("user is `{g}`, not `{want}`"),
                    None => format!("uid {} has no user name", s.uid),
                },
            );
        }
        if let Some(p) = &self.parent {
            let ok = s.parent_path.as_deref().is_some_and(|pp| p.matches(pp));
            note(
                ok,
                format!("parent matches {}", p.describe()),
                match &s.parent_path {
                    Some(pp) => {
                        format!("parent `{}` does not match {}", pp.display(), p.describe())
                    }
                    None => "parent unknown".to_owned(),
                },
            );
        }
        if failed.is_empty() {
            Ok(held.join(", "))
        } else {
            let mut why = failed.join("; ");
            if !held.is_empty() {
                let _ = write!(why, " (held: {})", held.join(", "));
            }
            Err(why)
        }
    }
}

/// Why a subject has no team id or signing id, for explanations: the anchor says
/// whether there was none, or one that does not count.
fn why_no_signing_ids(s: &Subject) -> String {
    if let Some(why) = &s.unreadable {
        return format!("identity unreadable: {why}");
    }
    match s.anchor {
        None => "unsigned or ad-hoc signature".to_owned(),
        Some(Anchor::Untrusted) => {
            "the signature does not chain to Apple (anchor `untrusted`): its identifiers are claims anyone can make".to_owned()
        }
        Some(a) if a.chains_to_apple() => format!("the signature (anchor `{a}`) carries none"),
        Some(a) => format!("anchor `{a}`"),
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
