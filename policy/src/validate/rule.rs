//! Validation of one `[[rule]]`: its id, each matcher's value, its effect, and the
//! profile it names; a rule with any error is not built.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::Arc;

use super::Validator;
use crate::model::{At, RawRule};
use crate::profile::Capabilities;
use crate::rule::{parse_glob, Effect, PathPattern, Rule, Specificity};
use crate::window::{format_rfc3339, parse_rfc3339, Window};

impl Validator<'_> {
    /// The source range of bytes `range` of string value `value`, written at `span`
    /// of file `i`: only when the value is written without escapes (then its text
    /// follows the opening quote byte for byte); `None` otherwise.
    fn inside_string(
        &self,
        i: usize,
        span: &std::ops::Range<usize>,
        value: &str,
        range: std::ops::Range<usize>,
    ) -> Option<std::ops::Range<usize>> {
        let written = self.sources.get(i)?.text.get(span.clone())?;
        let quote = written.get(..1).filter(|q| *q == "\"" || *q == "'")?;
        let inner = written.strip_prefix(quote)?.strip_suffix(quote)?;
        (inner == value).then(|| span.start + 1 + range.start..span.start + 1 + range.end)
    }

    fn path_pattern(&mut self, i: usize, key: &str, at: &At<String>) -> Option<PathPattern> {
        let text = at.value.as_str();
        if !text.starts_with('/') {
            self.error(
                i,
                at.span.clone(),
                format!("`{key}` must be an absolute path or glob (starting with `/`)"),
            );
            return None;
        }
        if text.contains("//")
            || text.contains("/./")
            || text.contains("/../")
            || text.ends_with("/.")
            || text.ends_with("/..")
            || (text.len() > 1 && text.ends_with('/'))
        {
            self.warn(
                i,
                at.span.clone(),
                format!("`{key}` is not a normalized path: the kernel reports resolved paths, so it may never match"),
            );
        }
        if !text.contains(['*', '?', '[', ']', '{', '}', '\\']) {
            return Some(PathPattern::Exact(PathBuf::from(text)));
        }
        match parse_glob(text) {
            // Compiled later, only if needed (see `PathPattern::Glob::matcher`).
            Ok(_) => Some(PathPattern::Glob {
                pattern: text.to_owned(),
                matcher: None,
            }),
            Err(e) => {
                let (place, why) = super::glob_error::locate(text, e.kind());
                let span = place
                    .and_then(|range| self.inside_string(i, &at.span, text, range))
                    .unwrap_or_else(|| at.span.clone());
                self.error(i, span, format!("bad glob in `{key}`: {why}"));
                None
            }
        }
    }

    fn hex_digest(
        &mut self,
        i: usize,
        key: &str,
        at: &At<String>,
        bytes: usize,
    ) -> Option<Vec<u8>> {
        let text = at.value.as_str();
        let digits = bytes * 2;
        if let Some((pos, c)) = text.char_indices().find(|(_, c)| !c.is_ascii_hexdigit()) {
            self.error(
                i,
                at.span.clone(),
                format!(
                    "`{key}` must be {digits} hex digits; `{c}` at position {} is not one",
                    pos + 1
                ),
            );
            return None;
        }
        if text.len() != digits {
            self.error(
                i,
                at.span.clone(),
                format!("`{key}` must be {digits} hex digits, found {}", text.len()),
            );
            return None;
        }
        hex::decode(text).ok()
    }

    fn non_empty(&mut self, i: usize, key: &str, at: &Option<At<String>>) -> Option<String> {
        let at = at.as_ref()?;
        if at.value.trim().is_empty() {
            self.error(i, at.span.clone(), format!("`{key}` must not be empty"));
            return None;
        }
        Some(at.value.clone())
    }

    pub(super) fn rule(
        &mut self,
        i: usize,
        raw: &RawRule,
        order: usize,
        profiles: &BTreeMap<Arc<str>, Capabilities>,
        check_references: bool,
    ) -> Option<Rule> {
        let errors_before = self.errors;
        // Problems about the rule as a whole point at its id, or at its table.
        let anchor = raw
            .id
            .as_ref()
            .map_or(raw.span.clone(), |id| id.span.clone());
        let id = match &raw.id {
            None if raw.written("id", false) => String::new(),
            None => {
                self.error(i, raw.span.clone(), "rule has no `id`");
                String::new()
            }
            Some(id) => {
                if id.value.is_empty()
                    || id.value.len() > 128
                    || id
                        .value
                        .chars()
                        .any(|c| c.is_whitespace() || c.is_control())
                {
                    self.error(
                        i,
                        id.span.clone(),
                        "rule `id` must be 1 to 128 characters without spaces or control characters",
                    );
                }
                id.value.clone()
            }
        };
        // Built only for a message: most rules never need it.
        let label = || {
            if id.is_empty() {
                "rule".to_owned()
            } else {
                format!("rule `{id}`")
            }
        };

        let path = raw
            .path
            .as_ref()
            .and_then(|p| self.path_pattern(i, "path", p));
        let parent = raw
            .parent
            .as_ref()
            .and_then(|p| self.path_pattern(i, "parent", p))
            .map(compiled);
        let name = self.non_empty(i, "name", &raw.name);
        if let (Some(n), Some(at)) = (&name, &raw.name) {
            if n.contains('/') {
                self.error(
                    i,
                    at.span.clone(),
                    "`name` is a file name: it cannot contain `/` (use `path`)",
                );
            } else if n.contains(['*', '?', '[', '{']) {
                self.warn(
                    i,
                    at.span.clone(),
                    format!("`name` matches the file name exactly: `{n}` is not a pattern here (for a pattern, use a `path` glob such as \"/**/{n}\")"),
                );
            } else if let Some(PathPattern::Exact(p)) = &path {
                if p.file_name().is_some_and(|f| f != n.as_str()) {
                    self.warn(
                        i,
                        at.span.clone(),
                        format!(
                            "this rule never matches: its exact `path` ends in `{}`, not `{n}`",
                            p.file_name().unwrap_or_default().to_string_lossy()
                        ),
                    );
                }
            }
        }
        let sha256 = raw
            .sha256
            .as_ref()
            .and_then(|s| self.hex_digest(i, "sha256", s, 32))
            .and_then(|b| <[u8; 32]>::try_from(b).ok());
        let cdhash = raw
            .cdhash
            .as_ref()
            .and_then(|s| self.hex_digest(i, "cdhash", s, 20));
        let team_id = self.non_empty(i, "team_id", &raw.team_id);
        if let (Some(t), Some(at)) = (&team_id, &raw.team_id) {
            if t.len() != 10
                || !t
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c.is_ascii_digit())
            {
                self.warn(i, at.span.clone(), format!("team_id `{t}` does not look like an Apple team identifier (10 characters A-Z, 0-9)"));
            }
        }
        let signing_id = self.non_empty(i, "signing_id", &raw.signing_id);
        let platform = self.platform(i, raw, signing_id.is_some());
        let uid = raw.uid.as_ref().and_then(|u| match u32::try_from(u.value) {
            Ok(n) => Some(n),
            Err(_) => {
                self.error(
                    i,
                    u.span.clone(),
                    format!("uid {} is out of range", u.value),
                );
                None
            }
        });
        let user = self.non_empty(i, "user", &raw.user);
        let window = self.window(i, raw, &label());

        let has_identity = [
            ("path", &raw.path),
            ("name", &raw.name),
            ("sha256", &raw.sha256),
            ("cdhash", &raw.cdhash),
            ("team_id", &raw.team_id),
            ("signing_id", &raw.signing_id),
        ]
        .iter()
        .any(|(key, m)| raw.written(key, m.is_some()));
        if !has_identity {
            self.error(
                i,
                anchor.clone(),
                format!("{} has no identity matcher: add path, name, sha256, cdhash, team_id or signing_id (uid, user and parent only narrow a rule)", label()),
            );
        }

        let effect = match (&raw.unlock, &raw.stock) {
            (Some(_), Some(stock)) => {
                self.error(
                    i,
                    stock.span.clone(),
                    format!("{} has both `unlock` and `stock`: choose one", label()),
                );
                None
            }
            (None, None) if raw.written("unlock", false) || raw.written("stock", false) => None,
            (None, None) => {
                self.error(
                    i,
                    anchor.clone(),
                    format!(
                        "{} says neither `unlock = \"PROFILE\"` nor `stock = true`",
                        label()
                    ),
                );
                None
            }
            (None, Some(stock)) if !stock.value => {
                self.error(
                    i,
                    stock.span.clone(),
                    "`stock = false` means nothing: write `stock = true` or `unlock = \"PROFILE\"`",
                );
                None
            }
            (None, Some(_)) => Some(Effect::Stock),
            (Some(unlock), None) => match profiles.get_key_value(unlock.value.as_str()) {
                Some((name, caps)) => Some(Effect::Unlock {
                    profile: Arc::clone(name),
                    capabilities: *caps,
                }),
                None => {
                    if check_references && !self.refused_profiles.contains(unlock.value.as_str()) {
                        let known: Vec<&str> = profiles.keys().map(|k| &**k).collect();
                        let hint = if known.is_empty() {
                            " (no profile is defined; add a [profile.NAME] table)".to_owned()
                        } else {
                            format!(" (defined: {})", known.join(", "))
                        };
                        self.error(
                            i,
                            unlock.span.clone(),
                            format!("unknown profile `{}`{hint}", unlock.value),
                        );
                    }
                    None
                }
            },
        };

        if self.errors != errors_before {
            return None;
        }
        let line = self
            .lines
            .get(i)
            .map_or(0, |lines| lines.line(anchor.start));
        let mut rule = Rule {
            id,
            file: u32::try_from(i).unwrap_or(u32::MAX),
            line: u32::try_from(line).unwrap_or(u32::MAX),
            order,
            path,
            name: name.map(OsString::from),
            sha256,
            cdhash,
            team_id,
            signing_id,
            platform,
            uid,
            user,
            parent,
            effect: effect?,
            window,
        };
        // A path glob under a more specific identity (`sha256` + glob) is indexed by
        // that identity, so checking the rule must match the glob on its own.
        if rule.specificity() != Specificity::GlobPath {
            rule.path = rule.path.map(compiled);
        }
        Some(rule)
    }
}

impl Validator<'_> {
    /// `platform`, judged with the signing identifiers beside it; `true` only for
    /// `platform = true`.
    ///
    /// A `signing_id` names a developer's program only together with the team
    /// that signed it: any Developer ID holder may sign with `com.example.runner`.
    /// Apple's own code has no team id, so a rule for it says `platform = true`
    /// (the signature satisfies `anchor apple`), as Santa spells a signing-id rule
    /// `TEAMID:com.example.app` or `platform:com.apple.curl`.
    fn platform(&mut self, i: usize, raw: &RawRule, has_signing_id: bool) -> bool {
        let platform = match &raw.platform {
            Some(at) if !at.value => {
                self.error(
                    i,
                    at.span.clone(),
                    "`platform = false` means nothing: write `platform = true` (Apple's own code) or leave it out",
                );
                return false;
            }
            Some(at) => Some(at),
            None => None,
        };
        if let (Some(at), Some(_)) = (platform, &raw.team_id) {
            self.warn(
                i,
                at.span.clone(),
                "Apple's platform binaries carry no team id: with `team_id` this rule may never match",
            );
        }
        if let (None, Some(at), None) = (platform, &raw.signing_id, &raw.team_id) {
            if has_signing_id && !raw.written("platform", false) {
                self.error(
                    i,
                    at.span.clone(),
                    "`signing_id` without `team_id` matches any developer who signs with that identifier: add `team_id = \"TEAMID\"`, or `platform = true` if it names Apple's own code (e.g. `com.apple.ls`)",
                );
            }
        }
        platform.is_some()
    }
}

impl Validator<'_> {
    /// `from`/`until` parsed (RFC 3339 with an offset), `from` before `until`, and
    /// a warning when `until` has passed at [`CompileOptions::now`]: the rule will
    /// never match again and only clutters the policy.
    ///
    /// [`CompileOptions::now`]: crate::CompileOptions::now
    fn window(&mut self, i: usize, raw: &RawRule, label: &str) -> Window {
        let mut time = |key: &str, at: &Option<At<String>>| {
            let at = at.as_ref()?;
            match parse_rfc3339(&at.value) {
                Ok(t) => Some((t, at.span.clone())),
                Err(why) => {
                    self.error(i, at.span.clone(), format!("`{key}`: {why}"));
                    None
                }
            }
        };
        let from = time("from", &raw.from);
        let until = time("until", &raw.until);
        if let (Some((f, _)), Some((u, span))) = (&from, &until) {
            if u <= f {
                self.error(
                    i,
                    span.clone(),
                    format!(
                        "{label}: `until` ({}) must be after `from` ({}): the rule would never match",
                        format_rfc3339(*u),
                        format_rfc3339(*f)
                    ),
                );
            }
        }
        if let (Some((u, span)), Some(now)) = (&until, self.opts.now) {
            if *u <= now {
                self.warn(
                    i,
                    span.clone(),
                    format!(
                        "{label} has expired: its window closed at {} (`until`), so it never matches again; remove it, or move `until` to extend the grant",
                        format_rfc3339(*u)
                    ),
                );
            }
        }
        Window {
            from: from.map(|(t, _)| t),
            until: until.map(|(t, _)| t),
        }
    }
}

/// `p` with its glob compiled, for checking it outside a bucket's `GlobSet`.
fn compiled(p: PathPattern) -> PathPattern {
    match p {
        PathPattern::Glob {
            pattern,
            matcher: None,
        } => {
            let matcher = parse_glob(&pattern).ok().map(|g| g.compile_matcher());
            PathPattern::Glob { pattern, matcher }
        }
        other => other,
    }
}
