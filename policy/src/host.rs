//! Lints that need the machine: rule paths that are symlinks or do not exist, and a
//! `uid` that is not the rule's `user`. The facts come through the small [`Host`]
//! trait, so this crate stays pure: `metalift validate` passes the real file system
//! and user database; tests pass a fake.
//!
//! Semantics these lints enforce: **rules match the resolved executable**. The kernel
//! reports the file a process runs (`/proc/<pid>/exe`, the audit token's path), with
//! every symlink resolved, so a rule naming a symlink (a Homebrew `bin/` link into
//! the Cellar) never matches. `metalift explain --path` resolves the same way.
//!
//! `uid` and `user` in one rule: the daemon fills a subject's user name from its uid
//! (`getpwuid`), so such a rule matches only when `user` is the name of `uid`. When
//! the host says otherwise, the rule never matches (a "contradictory qualifiers"
//! warning); when they agree, `user` is redundant and nothing is said.

use std::path::{Path, PathBuf};

use crate::diagnostic::{Diagnostic, LineIndex, Severity, Source};
use crate::model::{parse_file, At, RawRule};

/// What the machine says about a path named in a rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PathFact {
    /// It exists and is already resolved (no symlink on the way).
    Resolved,
    /// It does not exist.
    Missing,
    /// It exists but resolves elsewhere.
    ResolvesTo {
        /// The resolved path (every symlink followed).
        resolved: PathBuf,
        /// Whether the path itself is a symlink (else a directory on the way is).
        is_link: bool,
    },
    /// It could not be checked (permission denied...).
    Unknown(String),
}

/// The machine, as far as the lints need it.
pub trait Host {
    /// Resolves `path` (absolute).
    fn resolve(&self, path: &Path) -> PathFact;
    /// The entries of directory `dir` (full paths), or empty when it cannot be read.
    fn entries(&self, dir: &Path) -> Vec<PathBuf>;
    /// The user name of `uid`, as the daemon would look it up.
    fn user_name(&self, uid: u32) -> Option<String>;
    /// Why the executable at `path` (exists, resolved) cannot take the shim, each
    /// with what to do (`metalift validate` reads the Mach-O; default: nothing).
    fn shim_problems(&self, _path: &Path) -> Vec<String> {
        Vec::new()
    }
}

/// Checks every rule of `sources` (main file first) against `host`; warnings only.
/// Files that do not parse are skipped (their syntax errors come from compiling).
pub fn host_lints(sources: &[Source], host: &dyn Host) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    for source in sources {
        let mut ignored = Vec::new();
        let file = parse_file(source, &mut ignored);
        let lines = LineIndex::new(&source.text);
        let mut warn = |span: std::ops::Range<usize>, msg: String| {
            out.push(Diagnostic::located(
                Severity::Warning,
                source,
                &lines,
                span,
                msg,
            ));
        };
        for rule in &file.rules {
            let label = rule
                .id
                .as_ref()
                .map_or_else(|| "rule".to_owned(), |id| format!("rule `{}`", id.value));
            for (key, at) in [("path", &rule.path), ("parent", &rule.parent)] {
                if let Some(at) = at {
                    if let Some(msg) = path_problem(&label, key, at, host) {
                        warn(at.span.clone(), msg);
                    }
                }
            }
            if let Some((span, msg)) = qualifier_problem(&label, rule, host) {
                warn(span, msg);
            }
            // An unlock rule naming an executable that will not take the shim.
            if let (Some(_), Some(at)) = (&rule.unlock, &rule.path) {
                let text = at.value.as_str();
                if text.starts_with('/')
                    && !is_glob(text)
                    && host.resolve(Path::new(text)) == PathFact::Resolved
                {
                    for problem in host.shim_problems(Path::new(text)) {
                        warn(
                            at.span.clone(),
                            format!("{label}: the unlock never applies: {problem}"),
                        );
                    }
                }
            }
        }
    }
    out
}

fn is_glob(text: &str) -> bool {
    text.contains(['*', '?', '[', ']', '{', '}', '\\'])
}

/// For a Homebrew keg path `<prefix>/Cellar/<formula>/<version>/<rest>`, the glob
/// over every version: `<prefix>/Cellar/<formula>/*/<rest>`.
fn cellar_glob(resolved: &Path) -> Option<String> {
    let text = resolved.to_str()?;
    let at = text.find("/Cellar/")?;
    let (prefix, rest) = text.split_at(at + "/Cellar/".len());
    let mut parts = rest.splitn(3, '/');
    let (formula, _version, tail) = (parts.next()?, parts.next()?, parts.next()?);
    Some(format!("{prefix}{formula}/*/{tail}"))
}

fn fix_hint(resolved: &Path) -> String {
    match cellar_glob(resolved) {
        Some(glob) => format!(
            "use the resolved path or a glob over the Cellar (\"{glob}\", which survives `brew upgrade`)"
        ),
        None => format!("use the resolved path \"{}\"", resolved.display()),
    }
}

fn path_problem(label: &str, key: &str, at: &At<String>, host: &dyn Host) -> Option<String> {
    let text = at.value.as_str();
    if !text.starts_with('/') {
        return None; // An error already.
    }
    let subject = if key == "path" {
        "this rule never matches"
    } else {
        "this `parent` never matches"
    };
    if !is_glob(text) {
        return match host.resolve(Path::new(text)) {
            PathFact::Resolved | PathFact::Unknown(_) => None,
            PathFact::Missing => Some(format!(
                "{label}: {text} does not exist on this machine: {subject} until it does (check the spelling; rules match the resolved executable)"
            )),
            PathFact::ResolvesTo { resolved, is_link } => Some(format!(
                "{label}: {text} {} {}; rules match the resolved executable, so {subject}: {}",
                if is_link { "is a symlink to" } else { "resolves (through a symlinked directory) to" },
                resolved.display(),
                fix_hint(&resolved),
            )),
        };
    }
    // A glob: its literal directory must be resolved too...
    let meta = text
        .find(['*', '?', '[', ']', '{', '}', '\\'])
        .unwrap_or(text.len());
    let dir = text
        .get(..meta)
        .and_then(|l| l.rfind('/').map(|i| l.get(..i).unwrap_or("")))?;
    if dir.is_empty() {
        return None;
    }
    match host.resolve(Path::new(dir)) {
        PathFact::ResolvesTo { resolved, .. } => {
            let rest = text.get(dir.len()..).unwrap_or("");
            return Some(format!(
                "{label}: the directory {dir} of `{text}` resolves to {}; rules match the resolved executable, so {subject}: write \"{}{rest}\"",
                resolved.display(),
                resolved.display(),
            ));
        }
        PathFact::Missing => {
            return Some(format!(
                "{label}: the directory {dir} of `{text}` does not exist on this machine: {subject} until it does"
            ))
        }
        PathFact::Resolved | PathFact::Unknown(_) => {}
    }
    // ...and when what it matches here are all symlinks (Homebrew's bin/), it never
    // matches a running program.
    let glob = globset::GlobBuilder::new(text)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .ok()?
        .compile_matcher();
    let mut links = Vec::new();
    for entry in host.entries(Path::new(dir)) {
        if !glob.is_match(&entry) {
            continue;
        }
        match host.resolve(&entry) {
            PathFact::ResolvesTo { resolved, .. } if !glob.is_match(&resolved) => {
                links.push((entry, resolved));
            }
            _ => return None, // Something it matches is a real file.
        }
    }
    let (entry, resolved) = links.first()?;
    Some(format!(
        "{label}: everything `{text}` matches here is a symlink (e.g. {} is a symlink to {}); rules match the resolved executable, so {subject}: {}",
        entry.display(),
        resolved.display(),
        fix_hint(resolved),
    ))
}

fn qualifier_problem(
    label: &str,
    rule: &RawRule,
    host: &dyn Host,
) -> Option<(std::ops::Range<usize>, String)> {
    let (uid, user) = (rule.uid.as_ref()?, rule.user.as_ref()?);
    let n = u32::try_from(uid.value).ok()?;
    let span = user.span.clone();
    match host.user_name(n) {
        Some(name) if name == user.value => None,
        Some(name) => Some((
            span,
            format!(
                "{label}: contradictory qualifiers: uid {n} is `{name}` on this machine, not `{}`, so this rule never matches (keep one of `uid` and `user`)",
                user.value
            ),
        )),
        None => Some((
            span,
            format!(
                "{label}: contradictory qualifiers: uid {n} has no user name on this machine, so `user = \"{}\"` never holds and this rule never matches (keep one of `uid` and `user`)",
                user.value
            ),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::cellar_glob;
    use std::path::Path;

    #[test]
    fn a_cellar_keg_path_becomes_a_glob_over_its_versions() {
        assert_eq!(
            cellar_glob(Path::new(
                "/opt/homebrew/Cellar/llama.cpp/1234/bin/llama-server"
            ))
            .as_deref(),
            Some("/opt/homebrew/Cellar/llama.cpp/*/bin/llama-server")
        );
        assert_eq!(cellar_glob(Path::new("/usr/local/bin/x")), None);
    }
}
