//! Stage 1, the raw file model: what one policy file says, typed and located.
//!
//! This stage may reject syntax, unknown keys and wrong value types; it may not look
//! across files or judge values (hex, globs, families, profile references): that is
//! [`crate::validate`]'s job. Every problem is collected; nothing stops at the first.

use std::ops::Range;

use toml::de::{DeTable, DeValue};
use toml::Spanned;

use crate::diagnostic::{Diagnostic, LineIndex, Severity, Source};

mod flat;
pub mod forward;
pub mod labels;

/// A value and the byte range of the file it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct At<T> {
    pub value: T,
    pub span: Range<usize>,
}

/// `recommended_working_set` as written: a byte count or a human size such as `"12 GiB"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SizeText {
    Bytes(i64),
    Human(String),
}

/// `apple_family_max` as written: a number, or a word (only `"host"` is valid).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum FamilyText {
    Number(i64),
    Word(String),
}

/// One `[profile.NAME]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RawProfile {
    pub name: Option<At<String>>,
    pub apple_family_max: Option<At<FamilyText>>,
    pub max_threadgroup_memory: Option<At<i64>>,
    pub recommended_working_set: Option<At<SizeText>>,
    /// `require_verified = true`: unlock only while a passing verification exists
    /// for the host chip and macOS build (`metalift verify`).
    pub require_verified: Option<At<bool>>,
    /// Keys present with a value of the wrong type (already reported), so later
    /// stages do not also call them missing.
    pub mistyped: Vec<String>,
}

/// One `[[rule]]` table.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RawRule {
    /// The whole table, for problems that belong to no single key.
    pub span: Range<usize>,
    pub id: Option<At<String>>,
    pub path: Option<At<String>>,
    pub name: Option<At<String>>,
    pub sha256: Option<At<String>>,
    pub cdhash: Option<At<String>>,
    pub team_id: Option<At<String>>,
    pub signing_id: Option<At<String>>,
    /// `platform = true`: Apple's own code (see [`crate::Anchor::Apple`]).
    pub platform: Option<At<bool>>,
    pub uid: Option<At<i64>>,
    pub user: Option<At<String>>,
    pub parent: Option<At<String>>,
    pub unlock: Option<At<String>>,
    pub stock: Option<At<bool>>,
    /// `from`/`until` (see [`crate::window`]) as written: a TOML offset date-time
    /// in its RFC 3339 text, or a string holding one; judged by validation.
    pub from: Option<At<String>>,
    pub until: Option<At<String>>,
    /// Keys present with a value of the wrong type (already reported).
    pub mistyped: Vec<String>,
}

impl RawRule {
    /// Whether `key` was written, whatever its value's type.
    pub(crate) fn written(&self, key: &str, value_ok: bool) -> bool {
        value_ok || self.mistyped.iter().any(|k| k == key)
    }
}

/// Everything one file says.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct FileModel {
    pub version: Option<At<i64>>,
    pub mode: Option<At<String>>,
    pub profiles: Vec<RawProfile>,
    pub rules: Vec<RawRule>,
    /// `[audit.labels]` (see [`crate::labels`]).
    pub labels: Vec<crate::labels::RawLabel>,
    /// `[audit.forward]`, when written (see [`crate::forward`]).
    pub forward: Option<crate::forward::RawForward>,
    /// Top-level keys present with a value of the wrong type (already reported).
    pub mistyped: Vec<String>,
    /// False when the TOML itself did not parse: later stages skip this file's
    /// contents (and cross-file references) rather than report follow-on noise.
    pub parsed: bool,
}

/// The keys a `[[rule]]` accepts, for "did you mean" hints.
pub(crate) const RULE_KEYS: &[&str] = &[
    "id",
    "description",
    "path",
    "name",
    "sha256",
    "cdhash",
    "team_id",
    "signing_id",
    "platform",
    "uid",
    "user",
    "parent",
    "unlock",
    "stock",
    "from",
    "until",
];
const TOP_KEYS: &[&str] = &["version", "mode", "profile", "rule", "audit"];
/// The sub-tables of `[audit]`.
const AUDIT_KEYS: &[&str] = &["labels", "forward"];
const PROFILE_KEYS: &[&str] = &[
    "apple_family_max",
    "max_threadgroup_memory",
    "recommended_working_set",
    "require_verified",
];

/// Whether the fast path for plain policy files agrees with the general one on
/// `text` (see `model/flat.rs`). For the fuzz target only.
#[doc(hidden)]
#[must_use]
pub fn fast_parse_agrees(text: &str) -> bool {
    flat::agrees_with_general(text)
}

/// Parses one source into its file model, pushing every problem onto `out`.
pub(crate) fn parse_file(source: &Source, out: &mut Vec<Diagnostic>) -> FileModel {
    if let Some(model) = flat::parse(&source.text) {
        return model;
    }
    parse_general(source, out)
}

/// [`parse_file`] for any file: through `toml`'s span-carrying tree, reporting
/// every problem.
fn parse_general(source: &Source, out: &mut Vec<Diagnostic>) -> FileModel {
    let mut sink = Sink {
        source,
        lines: LineIndex::new(&source.text),
        out,
        mistyped: Vec::new(),
    };
    let (doc, errors) = DeTable::parse_recoverable(&source.text);
    if !errors.is_empty() {
        for e in errors {
            let span = e.span().unwrap_or(0..0);
            sink.error(span, format!("TOML syntax: {}", e.message().trim_end()));
        }
        return FileModel::default();
    }
    let mut model = FileModel {
        parsed: true,
        ..FileModel::default()
    };
    for (key, value) in doc.get_ref().iter() {
        match key.get_ref().as_ref() {
            "version" => model.version = sink.int(value, "version"),
            "mode" => model.mode = sink.string(value, "mode"),
            "profile" => parse_profiles(&mut sink, value, &mut model.profiles),
            "rule" => parse_rules(&mut sink, value, &mut model.rules),
            "audit" => parse_audit(&mut sink, value, &mut model),
            other => sink.unknown_key(key.span(), other, "the top level", TOP_KEYS),
        }
    }
    model.mistyped = sink.take_mistyped();
    model
}

/// `[audit]`: one sub-table per concern, each read by its own module.
fn parse_audit(sink: &mut Sink<'_>, value: &Spanned<DeValue<'_>>, model: &mut FileModel) {
    let Some(table) = sink.table(value, "audit") else {
        return;
    };
    for (key, v) in table.iter() {
        match key.get_ref().as_ref() {
            "labels" => crate::labels::parse(sink, v, &mut model.labels),
            "forward" => model.forward = crate::forward::parse(sink, v),
            other => sink.unknown_key(key.span(), other, "[audit]", AUDIT_KEYS),
        }
    }
}

fn parse_profiles(sink: &mut Sink<'_>, value: &Spanned<DeValue<'_>>, out: &mut Vec<RawProfile>) {
    let Some(table) = sink.table(value, "profile") else {
        return;
    };
    for (name, body) in table.iter() {
        let mut profile = RawProfile {
            name: Some(At {
                value: name.get_ref().to_string(),
                span: name.span(),
            }),
            ..RawProfile::default()
        };
        let what = format!("profile.{}", name.get_ref());
        let Some(body) = sink.table(body, &what) else {
            continue;
        };
        for (key, v) in body.iter() {
            match key.get_ref().as_ref() {
                "apple_family_max" => profile.apple_family_max = sink.family(v, "apple_family_max"),
                "max_threadgroup_memory" => {
                    profile.max_threadgroup_memory = sink.int(v, "max_threadgroup_memory");
                }
                "recommended_working_set" => {
                    profile.recommended_working_set = sink.size(v, "recommended_working_set");
                }
                "require_verified" => {
                    profile.require_verified = sink.bool(v, "require_verified");
                }
                other => sink.unknown_key(key.span(), other, "a profile", PROFILE_KEYS),
            }
        }
        profile.mistyped = sink.take_mistyped();
        out.push(profile);
    }
}

fn parse_rules(sink: &mut Sink<'_>, value: &Spanned<DeValue<'_>>, out: &mut Vec<RawRule>) {
    let DeValue::Array(items) = value.get_ref() else {
        sink.error(
            value.span(),
            "`rule` must be an array of tables: write each rule under `[[rule]]`",
        );
        return;
    };
    out.reserve(items.len());
    for item in items {
        let Some(table) = sink.table(item, "rule") else {
            continue;
        };
        // Type errors before this rule (e.g. `profile = 3`) belong to the top level.
        let outer = sink.take_mistyped();
        let mut rule = RawRule {
            span: item.span(),
            ..RawRule::default()
        };
        for (key, v) in table.iter() {
            let k = key.get_ref().as_ref();
            match k {
                "id" => rule.id = sink.string(v, k),
                "description" => {
                    // Free text for the admin; only its type is checked.
                    let _ = sink.string(v, k);
                }
                "path" => rule.path = sink.string(v, k),
                "name" => rule.name = sink.string(v, k),
                "sha256" => rule.sha256 = sink.string(v, k),
                "cdhash" => rule.cdhash = sink.string(v, k),
                "team_id" => rule.team_id = sink.string(v, k),
                "signing_id" => rule.signing_id = sink.string(v, k),
                "platform" => rule.platform = sink.bool(v, k),
                "uid" => rule.uid = sink.int(v, k),
                "user" => rule.user = sink.string(v, k),
                "parent" => rule.parent = sink.string(v, k),
                "unlock" => rule.unlock = sink.string(v, k),
                "stock" => rule.stock = sink.bool(v, k),
                "from" => rule.from = sink.datetime(v, k),
                "until" => rule.until = sink.datetime(v, k),
                other => sink.unknown_key(key.span(), other, "a rule", RULE_KEYS),
            }
        }
        rule.mistyped = sink.take_mistyped();
        sink.mistyped = outer;
        out.push(rule);
    }
}

/// Collects diagnostics for one source.
pub(crate) struct Sink<'a> {
    source: &'a Source,
    lines: LineIndex,
    out: &'a mut Vec<Diagnostic>,
    /// Keys that failed their type check since the last [`Sink::take_mistyped`].
    mistyped: Vec<String>,
}

impl Sink<'_> {
    fn error(&mut self, span: Range<usize>, message: impl Into<String>) {
        self.out.push(Diagnostic::located(
            Severity::Error,
            self.source,
            &self.lines,
            span,
            message,
        ));
    }

    pub(crate) fn unknown_key(
        &mut self,
        span: Range<usize>,
        key: &str,
        place: &str,
        known: &[&str],
    ) {
        let hint = match closest(key, known) {
            Some(k) => format!(" (did you mean `{k}`?)"),
            None => format!(" (expected one of: {})", known.join(", ")),
        };
        self.error(span, format!("unknown key `{key}` in {place}{hint}"));
    }

    fn take_mistyped(&mut self) -> Vec<String> {
        std::mem::take(&mut self.mistyped)
    }

    fn wrong_type(&mut self, value: &Spanned<DeValue<'_>>, key: &str, expected: &str) {
        self.mistyped.push(key.to_owned());
        let found = value.get_ref().type_str();
        self.error(
            value.span(),
            format!("`{key}` must be {expected}, found {found}"),
        );
    }

    pub(crate) fn table<'v, 'i>(
        &mut self,
        value: &'v Spanned<DeValue<'i>>,
        key: &str,
    ) -> Option<&'v DeTable<'i>> {
        match value.get_ref() {
            DeValue::Table(t) => Some(t),
            _ => {
                self.wrong_type(value, key, "a table");
                None
            }
        }
    }

    pub(crate) fn string(&mut self, value: &Spanned<DeValue<'_>>, key: &str) -> Option<At<String>> {
        match value.get_ref() {
            DeValue::String(s) => Some(At {
                value: s.to_string(),
                span: value.span(),
            }),
            _ => {
                self.wrong_type(value, key, "a string");
                None
            }
        }
    }

    fn bool(&mut self, value: &Spanned<DeValue<'_>>, key: &str) -> Option<At<bool>> {
        match value.get_ref() {
            DeValue::Boolean(b) => Some(At {
                value: *b,
                span: value.span(),
            }),
            _ => {
                self.wrong_type(value, key, "a boolean");
                None
            }
        }
    }

    /// A date-time as RFC 3339 text: a TOML date-time (written back by its
    /// `Display`, which is RFC 3339) or a string; validation parses and judges it.
    fn datetime(&mut self, value: &Spanned<DeValue<'_>>, key: &str) -> Option<At<String>> {
        let text = match value.get_ref() {
            DeValue::Datetime(d) => d.to_string(),
            DeValue::String(s) => s.to_string(),
            _ => {
                self.wrong_type(
                    value,
                    key,
                    "an RFC 3339 date-time such as 2026-12-31T00:00:00Z",
                );
                return None;
            }
        };
        Some(At {
            value: text,
            span: value.span(),
        })
    }

    fn int(&mut self, value: &Spanned<DeValue<'_>>, key: &str) -> Option<At<i64>> {
        match value.get_ref() {
            DeValue::Integer(i) => {
                match i64::from_str_radix(&i.as_str().replace('_', ""), i.radix()) {
                    Ok(n) => Some(At {
                        value: n,
                        span: value.span(),
                    }),
                    Err(_) => {
                        self.mistyped.push(key.to_owned());
                        self.error(value.span(), format!("`{key}` is out of range"));
                        None
                    }
                }
            }
            _ => {
                self.wrong_type(value, key, "an integer");
                None
            }
        }
    }

    fn family(&mut self, value: &Spanned<DeValue<'_>>, key: &str) -> Option<At<FamilyText>> {
        match value.get_ref() {
            DeValue::String(s) => Some(At {
                value: FamilyText::Word(s.to_string()),
                span: value.span(),
            }),
            DeValue::Integer(_) => self.int(value, key).map(|n| At {
                value: FamilyText::Number(n.value),
                span: n.span,
            }),
            _ => {
                self.wrong_type(value, key, "an integer or \"host\"");
                None
            }
        }
    }

    fn size(&mut self, value: &Spanned<DeValue<'_>>, key: &str) -> Option<At<SizeText>> {
        match value.get_ref() {
            DeValue::String(s) => Some(At {
                value: SizeText::Human(s.to_string()),
                span: value.span(),
            }),
            DeValue::Integer(_) => self.int(value, key).map(|n| At {
                value: SizeText::Bytes(n.value),
                span: n.span,
            }),
            _ => {
                self.wrong_type(value, key, "a size such as \"12 GiB\" or a byte count");
                None
            }
        }
    }
}

/// The known key closest to `key` by edit distance, when it is close enough to be a typo.
pub(crate) fn closest<'k>(key: &str, known: &[&'k str]) -> Option<&'k str> {
    known
        .iter()
        .map(|k| (edit_distance(key, k), *k))
        .filter(|(d, _)| *d < key.chars().count() && *d <= 1.max(key.chars().count() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let cost = usize::from(ca != *cb);
            cur[j + 1] = (prev[j] + cost).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typos_get_a_did_you_mean_hint_and_strangers_get_the_list() {
        assert_eq!(closest("team-id", RULE_KEYS), Some("team_id"));
        assert_eq!(closest("sha265", RULE_KEYS), Some("sha256"));
        assert_eq!(closest("frobnicate", RULE_KEYS), None);
    }
}
