//! `[audit.labels]`: the admin's labels for this machine (e.g. `image =
//! "macos-26-xcode-17"`), set once when the image is baked, usually in a drop-in
//! such as `/etc/metalift/policy.d/00-image.toml`. metaliftd copies them into the
//! `host` part of every audit record, so a record copied off a cloned guest says
//! which image it came from. They are descriptive only: no rule reads them.
//!
//! Stage 1 ([`parse`]) keeps each key and value with its span and reports wrong
//! types; stage 2 ([`validate`]) judges them (key syntax, lengths, the count, a key
//! set in two files) with the location of each problem.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::ops::Range;

use toml::de::DeValue;
use toml::Spanned;

use crate::diagnostic::Source;
use crate::model::{At, Sink};

/// Most labels a policy may set, over all its files: the host part rides every record.
pub const MAX_LABELS: usize = 32;
/// Longest label key, in bytes.
pub const MAX_KEY_LEN: usize = 64;
/// Longest label value, in bytes.
pub const MAX_VALUE_LEN: usize = 256;

/// One `key = "value"` of `[audit.labels]`, as written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawLabel {
    pub key: At<String>,
    pub value: At<String>,
}

/// Reads the `labels` table of `[audit]` into `out`.
pub(crate) fn parse(sink: &mut Sink<'_>, value: &Spanned<DeValue<'_>>, out: &mut Vec<RawLabel>) {
    let Some(table) = sink.table(value, "audit.labels") else {
        return;
    };
    for (key, v) in table.iter() {
        let name = key.get_ref().to_string();
        let Some(text) = sink.string(v, &format!("audit.labels.{name}")) else {
            continue;
        };
        out.push(RawLabel {
            key: At {
                value: name,
                span: key.span(),
            },
            value: text,
        });
    }
}

/// Whether `key` is a label name: ASCII letters, digits, `_`, `-`, `.`, starting
/// with a letter (so it reads the same in JSON, syslog structured data and a shell).
fn key_ok(key: &str) -> bool {
    key.bytes().next().is_some_and(|b| b.is_ascii_alphabetic())
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
}

/// Judges every file's labels (`files[i]` from `sources[i]`), calling `error(file,
/// span, message)` for each problem, and returns the labels that passed.
pub(crate) fn validate(
    sources: &[Source],
    files: &[&[RawLabel]],
    mut error: impl FnMut(usize, Range<usize>, String),
) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut first_file: BTreeMap<&str, usize> = BTreeMap::new();
    let mut count = 0usize;
    for (i, raw) in files.iter().enumerate() {
        for label in raw.iter() {
            let key = label.key.value.as_str();
            if !key_ok(key) || key.len() > MAX_KEY_LEN {
                error(
                    i,
                    label.key.span.clone(),
                    format!(
                        "label key `{key}` must start with a letter, hold only letters, digits, `_`, `-`, `.`, and be at most {MAX_KEY_LEN} bytes"
                    ),
                );
                continue;
            }
            let value = label.value.value.as_str();
            if value.len() > MAX_VALUE_LEN {
                error(
                    i,
                    label.value.span.clone(),
                    format!(
                        "label `{key}` is {} bytes long; at most {MAX_VALUE_LEN}",
                        value.len()
                    ),
                );
                continue;
            }
            if value.chars().any(char::is_control) {
                error(
                    i,
                    label.value.span.clone(),
                    format!("label `{key}` holds a control character (a newline, a tab, ...)"),
                );
                continue;
            }
            if let Some(&first) = first_file.get(key) {
                let first = sources.get(first).map_or("", |s| s.name.as_str());
                error(
                    i,
                    label.key.span.clone(),
                    format!(
                        "label `{key}` is set again (first set in {first}): set each label once"
                    ),
                );
                continue;
            }
            count += 1;
            if count > MAX_LABELS {
                error(
                    i,
                    label.key.span.clone(),
                    format!("more than {MAX_LABELS} labels: every audit record carries them"),
                );
                continue;
            }
            first_file.insert(key, i);
            labels.insert(key.to_owned(), value.to_owned());
        }
    }
    labels
}

#[cfg(test)]
mod tests {
    use crate::{compile_sources, diagnostic::Source, LoadError};

    fn compile(files: &[(&str, &str)]) -> Result<crate::Loaded, LoadError> {
        let sources: Vec<Source> = files
            .iter()
            .map(|(name, text)| Source {
                name: (*name).to_owned(),
                text: (*text).to_owned(),
            })
            .collect();
        compile_sources(sources)
    }

    fn errors(result: Result<crate::Loaded, LoadError>) -> Vec<String> {
        match result {
            Ok(_) => panic!("the policy was accepted"),
            Err(LoadError::Invalid { diagnostics, .. }) => {
                diagnostics.iter().map(ToString::to_string).collect()
            }
            Err(other) => panic!("not a validation error: {other}"),
        }
    }

    #[test]
    fn labels_in_a_drop_in_are_the_policys_labels() {
        let loaded = compile(&[
            ("policy.toml", "version = 1\n"),
            (
                "policy.d/00-image.toml",
                "[audit.labels]\nimage = \"macos-26-xcode-17\"\nfleet = \"ci\"\n",
            ),
        ])
        .expect("valid labels");
        let labels = loaded.policy.labels();
        assert_eq!(
            labels.get("image").map(String::as_str),
            Some("macos-26-xcode-17")
        );
        assert_eq!(labels.len(), 2);
    }

    #[test]
    fn a_bad_key_a_long_value_and_a_label_set_twice_are_located() {
        let long = "x".repeat(super::MAX_VALUE_LEN + 1);
        let errs = errors(compile(&[
            (
                "policy.toml",
                &format!("version = 1\n[audit.labels]\n\"9lives\" = \"a\"\nlong = \"{long}\"\nimage = \"a\"\n"),
            ),
            ("policy.d/00-image.toml", "[audit.labels]\nimage = \"b\"\n"),
        ]));
        assert!(
            errs.iter()
                .any(|e| e.starts_with("policy.toml:3:1:") && e.contains("`9lives`")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("policy.toml:4:8:") && e.contains("at most 256")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("policy.d/00-image.toml:2:1:")
                    && e.contains("first set in policy.toml")),
            "{errs:?}"
        );
    }

    #[test]
    fn a_non_string_label_and_an_unknown_audit_key_are_refused() {
        let errs = errors(compile(&[(
            "policy.toml",
            "version = 1\n[audit]\nlables = {}\n[audit.labels]\nn = 3\n",
        )]));
        assert!(
            errs.iter()
                .any(|e| e.contains("unknown key `lables`") && e.contains("did you mean `labels`")),
            "{errs:?}"
        );
        assert!(
            errs.iter()
                .any(|e| e.starts_with("policy.toml:5:5:") && e.contains("must be a string")),
            "{errs:?}"
        );
    }

    #[test]
    fn more_labels_than_the_bound_are_refused() {
        let mut text = String::from("version = 1\n[audit.labels]\n");
        for i in 0..=super::MAX_LABELS {
            text.push_str(&format!("k{i} = \"v\"\n"));
        }
        let errs = errors(compile(&[("policy.toml", &text)]));
        assert!(
            errs.iter().any(|e| e.contains("more than 32 labels")),
            "{errs:?}"
        );
    }
}
