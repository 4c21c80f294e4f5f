//! Stage 2, validation: judges every value and every cross-file reference of the raw
//! file models and turns them into [`Rule`]s and profiles.
//!
//! This stage may read only what stage 1 ([`crate::model`]) produced; it reports every
//! problem it finds (never only the first) and builds nothing the matcher would have
//! to re-check. The first source is the main `policy.toml`; the others are
//! `policy.d/` files in name order.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsString;
use std::ops::Range;
use std::path::PathBuf;

use globset::GlobBuilder;

use crate::diagnostic::{Diagnostic, LineIndex, Severity, Source};
use crate::model::{At, FileModel, RawProfile, RawRule, SizeText};
use crate::profile::{
    Capabilities, MAX_APPLE_FAMILY, MIN_APPLE_FAMILY, SHIPPING_MAX_THREADGROUP_MEMORY,
};
use crate::rule::{Effect, PathPattern, Rule};
use crate::size::parse_size;
use crate::verdict::Mode;

/// The only policy format version this build reads.
pub const POLICY_VERSION: i64 = 1;
/// Largest accepted `max_threadgroup_memory` (bytes). Twice the largest any Apple GPU
/// reports (32 KiB); beyond it a kernel sized for the claim would fail on real hardware.
pub const MAX_THREADGROUP_MEMORY: u64 = 64 * 1024;
/// `max_threadgroup_memory` when a profile does not set it: the paravirtual device's
/// own answer, so the floor changes nothing.
pub const DEFAULT_THREADGROUP_MEMORY: u64 = 32 * 1024;

/// What validation produced: usable only when `diagnostics` holds no error.
#[derive(Debug, Default)]
pub(crate) struct Validated {
    pub mode: Mode,
    pub profiles: BTreeMap<String, Capabilities>,
    pub rules: Vec<Rule>,
    pub diagnostics: Vec<Diagnostic>,
}

/// Validates the parsed files (`files[i]` parsed from `sources[i]`).
pub(crate) fn validate(sources: &[Source], files: &[FileModel]) -> Validated {
    let mut v = Validator {
        sources,
        lines: sources.iter().map(|s| LineIndex::new(&s.text)).collect(),
        out: Vec::new(),
        errors: 0,
    };
    let mut result = Validated::default();
    let all_parsed = files.iter().all(|f| f.parsed);

    for (i, file) in files.iter().enumerate() {
        if !file.parsed {
            continue;
        }
        v.header(i, file, &mut result.mode);
    }

    let mut profile_sites: HashMap<String, (usize, Range<usize>)> = HashMap::new();
    for (i, file) in files.iter().enumerate() {
        for raw in &file.profiles {
            let Some(name) = &raw.name else { continue };
            if let Some((first_file, first_span)) = profile_sites.get(&name.value) {
                v.duplicate(
                    "profile",
                    &name.value,
                    (*first_file, first_span.clone()),
                    (i, name.span.clone()),
                );
                continue;
            }
            profile_sites.insert(name.value.clone(), (i, name.span.clone()));
            if let Some(caps) = v.profile(i, raw) {
                result.profiles.insert(name.value.clone(), caps);
            }
        }
    }

    let mut rule_sites: HashMap<String, (usize, Range<usize>)> = HashMap::new();
    for (i, file) in files.iter().enumerate() {
        for raw in &file.rules {
            if let Some(id) = &raw.id {
                if let Some((first_file, first_span)) = rule_sites.get(&id.value) {
                    v.duplicate(
                        "rule id",
                        &id.value,
                        (*first_file, first_span.clone()),
                        (i, id.span.clone()),
                    );
                } else {
                    rule_sites.insert(id.value.clone(), (i, id.span.clone()));
                }
            }
            let order = result.rules.len();
            if let Some(rule) = v.rule(i, raw, order, &result.profiles, all_parsed) {
                result.rules.push(rule);
            }
        }
    }
    result.diagnostics = v.out;
    result
}

struct Validator<'a> {
    sources: &'a [Source],
    /// One per source: locating every rule must not rescan the text each time.
    lines: Vec<LineIndex>,
    out: Vec<Diagnostic>,
    /// Errors in `out`, so each rule can tell whether it added one.
    errors: usize,
}

impl Validator<'_> {
    fn push(&mut self, sev: Severity, file: usize, span: Range<usize>, msg: impl Into<String>) {
        if let (Some(source), Some(lines)) = (self.sources.get(file), self.lines.get(file)) {
            self.out
                .push(Diagnostic::located(sev, source, lines, span, msg));
            if sev == Severity::Error {
                self.errors += 1;
            }
        }
    }

    fn error(&mut self, file: usize, span: Range<usize>, msg: impl Into<String>) {
        self.push(Severity::Error, file, span, msg);
    }

    fn warn(&mut self, file: usize, span: Range<usize>, msg: impl Into<String>) {
        self.push(Severity::Warning, file, span, msg);
    }

    fn place(&self, file: usize, span: &Range<usize>) -> String {
        match (self.sources.get(file), self.lines.get(file)) {
            (Some(s), Some(lines)) => {
                let (line, col, _) = lines.line_col_len(&s.text, span.clone());
                format!("{}:{line}:{col}", s.name)
            }
            _ => "?".to_owned(),
        }
    }

    /// Reports a name defined twice, at both places.
    fn duplicate(
        &mut self,
        what: &str,
        name: &str,
        first: (usize, Range<usize>),
        again: (usize, Range<usize>),
    ) {
        let first_at = self.place(first.0, &first.1);
        let again_at = self.place(again.0, &again.1);
        self.error(
            again.0,
            again.1,
            format!("duplicate {what} `{name}` (first defined at {first_at})"),
        );
        self.error(
            first.0,
            first.1,
            format!("{what} `{name}` is defined again at {again_at}"),
        );
    }

    fn header(&mut self, i: usize, file: &FileModel, mode: &mut Mode) {
        match &file.version {
            Some(v) if v.value != POLICY_VERSION => self.error(
                i,
                v.span.clone(),
                format!(
                    "unsupported policy version {} (this build reads version {POLICY_VERSION})",
                    v.value
                ),
            ),
            Some(_) => {}
            None if i == 0 && !file.mistyped.iter().any(|k| k == "version") => self.error(
                i,
                0..0,
                format!("missing `version = {POLICY_VERSION}` at the top of the main policy file"),
            ),
            None => {}
        }
        if let Some(m) = &file.mode {
            if i != 0 {
                self.error(
                    i,
                    m.span.clone(),
                    "`mode` may only be set in the main policy file, not in policy.d/",
                );
            } else {
                match m.value.as_str() {
                    "enforce" => *mode = Mode::Enforce,
                    "monitor" => *mode = Mode::Monitor,
                    other => self.error(
                        i,
                        m.span.clone(),
                        format!("unknown mode `{other}` (expected \"enforce\" or \"monitor\")"),
                    ),
                }
            }
        }
    }

    fn profile(&mut self, i: usize, raw: &RawProfile) -> Option<Capabilities> {
        let name = raw.name.as_ref()?;
        let mut ok = true;
        let family = match &raw.apple_family_max {
            None if raw.mistyped.iter().any(|k| k == "apple_family_max") => {
                ok = false;
                0
            }
            None => {
                self.error(
                    i,
                    name.span.clone(),
                    format!("profile `{}` has no `apple_family_max`", name.value),
                );
                ok = false;
                0
            }
            Some(f) => match u8::try_from(f.value) {
                Ok(n) if (MIN_APPLE_FAMILY..=MAX_APPLE_FAMILY).contains(&n) => n,
                _ => {
                    self.error(
                        i,
                        f.span.clone(),
                        format!(
                            "apple_family_max {} is outside Apple{MIN_APPLE_FAMILY}..Apple{MAX_APPLE_FAMILY}",
                            f.value
                        ),
                    );
                    ok = false;
                    0
                }
            },
        };
        let threadgroup = match &raw.max_threadgroup_memory {
            None => DEFAULT_THREADGROUP_MEMORY,
            Some(t) => match u64::try_from(t.value) {
                Ok(n) if (1..=MAX_THREADGROUP_MEMORY).contains(&n) => {
                    if n > SHIPPING_MAX_THREADGROUP_MEMORY {
                        self.warn(
                            i,
                            t.span.clone(),
                            format!(
                                "max_threadgroup_memory {n} exceeds {SHIPPING_MAX_THREADGROUP_MEMORY}: no shipping Mac reports more, kernels sized for it may fail"
                            ),
                        );
                    } else if n < DEFAULT_THREADGROUP_MEMORY {
                        self.warn(
                            i,
                            t.span.clone(),
                            format!(
                                "max_threadgroup_memory {n} has no effect: it is a floor and the paravirtual device already reports {DEFAULT_THREADGROUP_MEMORY}"
                            ),
                        );
                    }
                    n
                }
                _ => {
                    self.error(
                        i,
                        t.span.clone(),
                        format!(
                            "max_threadgroup_memory {} is out of range (1..={MAX_THREADGROUP_MEMORY})",
                            t.value
                        ),
                    );
                    ok = false;
                    0
                }
            },
        };
        let working_set = match &raw.recommended_working_set {
            None => None,
            Some(At { value, span }) => {
                let parsed = match value {
                    SizeText::Bytes(n) => u64::try_from(*n)
                        .map_err(|_| format!("recommended_working_set {n} is negative")),
                    SizeText::Human(text) => parse_size(text),
                };
                match parsed {
                    Ok(0) => {
                        self.error(i, span.clone(), "recommended_working_set must be above 0");
                        ok = false;
                        None
                    }
                    Ok(n) => Some(n),
                    Err(msg) => {
                        self.error(i, span.clone(), format!("recommended_working_set: {msg}"));
                        ok = false;
                        None
                    }
                }
            }
        };
        ok.then_some(Capabilities {
            apple_family_max: family,
            max_threadgroup_memory: threadgroup,
            recommended_working_set: working_set,
        })
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
        let built = GlobBuilder::new(text)
            .literal_separator(true)
            .backslash_escape(true)
            .build();
        match built {
            Ok(glob) => Some(PathPattern::Glob {
                pattern: text.to_owned(),
                matcher: glob.compile_matcher(),
            }),
            Err(e) => {
                let kind = e.kind().to_string();
                self.error(i, at.span.clone(), format!("bad glob in `{key}`: {kind}"));
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

    fn rule(
        &mut self,
        i: usize,
        raw: &RawRule,
        order: usize,
        profiles: &BTreeMap<String, Capabilities>,
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
        let label = if id.is_empty() {
            "rule".to_owned()
        } else {
            format!("rule `{id}`")
        };

        let path = raw
            .path
            .as_ref()
            .and_then(|p| self.path_pattern(i, "path", p));
        let parent = raw
            .parent
            .as_ref()
            .and_then(|p| self.path_pattern(i, "parent", p));
        let name = self.non_empty(i, "name", &raw.name);
        if let (Some(n), Some(at)) = (&name, &raw.name) {
            if n.contains('/') {
                self.error(
                    i,
                    at.span.clone(),
                    "`name` is a file name: it cannot contain `/` (use `path`)",
                );
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
        if let (Some(_), Some(at), None) = (&signing_id, &raw.signing_id, &raw.team_id) {
            self.warn(i, at.span.clone(), "`signing_id` without `team_id` matches any developer who signs with that identifier; add `team_id`");
        }
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
                format!("{label} has no identity matcher: add path, name, sha256, cdhash, team_id or signing_id (uid, user and parent only narrow a rule)"),
            );
        }

        let effect = match (&raw.unlock, &raw.stock) {
            (Some(_), Some(stock)) => {
                self.error(
                    i,
                    stock.span.clone(),
                    format!("{label} has both `unlock` and `stock`: choose one"),
                );
                None
            }
            (None, None) if raw.written("unlock", false) || raw.written("stock", false) => None,
            (None, None) => {
                self.error(
                    i,
                    anchor.clone(),
                    format!("{label} says neither `unlock = \"PROFILE\"` nor `stock = true`"),
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
            (Some(unlock), None) => match profiles.get(&unlock.value) {
                Some(caps) => Some(Effect::Unlock {
                    profile: unlock.value.clone(),
                    capabilities: *caps,
                }),
                None => {
                    if check_references {
                        let known: Vec<&str> = profiles.keys().map(String::as_str).collect();
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
        let location = match (self.sources.get(i), self.lines.get(i)) {
            (Some(s), Some(lines)) => {
                format!("{}:{}", s.name, lines.line_col_len(&s.text, anchor).0)
            }
            _ => String::new(),
        };
        Some(Rule {
            id,
            location,
            order,
            path,
            name: name.map(OsString::from),
            sha256,
            cdhash,
            team_id,
            signing_id,
            uid,
            user,
            parent,
            effect: effect?,
        })
    }
}
