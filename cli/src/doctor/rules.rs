//! The executables named by exact-path rules: would the loader accept the shim in
//! them? The same checks `metalift exec` warns with (SIP-protected paths, the
//! Hardened Runtime without `allow-dyld-environment-variables`, setuid, missing
//! architecture slices).
//!
//! The compiled policy does not expose its rules, so the rules' `path` values are
//! read from the loaded sources here (a local helper; the validator has already
//! accepted these texts).

use std::path::Path;

use metalift_policy::Loaded;

use super::check::{Check, Status};
use crate::exec::injection_warnings;

/// `(rule id, path)` of every rule whose `path` is exact (not a glob).
#[must_use]
pub fn exact_paths(loaded: &Loaded) -> Vec<(String, String)> {
    use toml::de::{DeTable, DeValue};
    let string = |table: &DeTable<'_>, key: &str| {
        table
            .iter()
            .find(|(k, _)| k.get_ref().as_ref() == key)
            .and_then(|(_, v)| match v.get_ref() {
                DeValue::String(s) => Some(s.to_string()),
                _ => None,
            })
    };
    let mut found = Vec::new();
    for source in &loaded.sources {
        let Ok(doc) = DeTable::parse(&source.text) else {
            continue;
        };
        for (key, value) in doc.get_ref().iter() {
            let (true, DeValue::Array(rules)) = (key.get_ref().as_ref() == "rule", value.get_ref())
            else {
                continue;
            };
            for rule in rules.iter() {
                let DeValue::Table(rule) = rule.get_ref() else {
                    continue;
                };
                let (Some(id), Some(path)) = (string(rule, "id"), string(rule, "path")) else {
                    continue;
                };
                if !path.contains(['*', '?', '[', ']', '{', '}']) {
                    found.push((id, path));
                }
            }
        }
    }
    found
}

/// One check per exact-path rule.
pub fn executables(loaded: Option<&Loaded>, shim: &Path, shim_ok: bool) -> Vec<Check> {
    let Some(loaded) = loaded else {
        return vec![Check::new(
            "rules",
            Status::NotApplicable,
            "no loadable policy to check",
        )];
    };
    if !shim_ok {
        return vec![Check::new(
            "rules",
            Status::NotApplicable,
            "no usable shim to check against",
        )];
    }
    let paths = exact_paths(loaded);
    if paths.is_empty() {
        return vec![Check::new(
            "rules",
            Status::Ok,
            "no exact-path rules to check",
        )];
    }
    paths
        .into_iter()
        .map(|(id, path)| {
            if !Path::new(&path).exists() {
                return Check::new(
                    "rules",
                    Status::Warn,
                    format!("rule {id}: {path} does not exist"),
                )
                .fix("install the program, or fix the rule's path");
            }
            let warnings = injection_warnings(Path::new(&path), shim);
            if warnings.is_empty() {
                Check::new("rules", Status::Ok, format!("rule {id}: {path} can load the shim"))
            } else {
                Check::new(
                    "rules",
                    Status::Warn,
                    format!("rule {id}: {}", warnings.join("; ")),
                )
                .fix("unlock the workload's own binary (not a wrapper), or re-sign it with allow-dyld-environment-variables")
            }
        })
        .collect()
}
