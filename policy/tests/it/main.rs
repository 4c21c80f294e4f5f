//! Integration tests of the policy engine, one module per concern, in one test binary.

mod examples;
mod host_ceiling;
mod host_family;
mod lints;
mod load;
mod matchers;
mod precedence;
mod properties;
mod signatures;
mod validation;
mod windows;

use metalift_policy::{compile_sources, Diagnostic, LoadError, Policy, Source, Subject};

/// A profile every test policy can unlock with.
pub const HEADER: &str = "version = 1\n[profile.apple7]\napple_family_max = 7\n";

/// Compiles one main file, panicking with the rendered diagnostics if it is invalid.
pub fn policy(text: &str) -> Policy {
    policy_from(vec![Source::new("policy.toml", text)])
}

/// Compiles several sources (main first), panicking if invalid.
pub fn policy_from(sources: Vec<Source>) -> Policy {
    match compile_sources(sources) {
        Ok(loaded) => loaded.policy,
        Err(LoadError::Invalid {
            diagnostics,
            sources,
        }) => panic!("{}", render_all(&diagnostics, &sources)),
        Err(e) => panic!("{e}"),
    }
}

/// The diagnostics of an invalid single-file policy as `line:col: severity: message`.
pub fn problems(text: &str) -> Vec<String> {
    problems_from(vec![Source::new("policy.toml", text)])
}

/// The diagnostics (errors and warnings) of a set of sources, as `file:line:col: severity: message`
/// (the file part is dropped for `policy.toml`).
pub fn problems_from(sources: Vec<Source>) -> Vec<String> {
    let diagnostics = match compile_sources(sources) {
        Ok(loaded) => loaded.warnings,
        Err(LoadError::Invalid { diagnostics, .. }) => diagnostics,
        Err(e) => panic!("{e}"),
    };
    diagnostics
        .iter()
        .map(|d| {
            d.to_string()
                .strip_prefix("policy.toml:")
                .map_or_else(|| d.to_string(), str::to_owned)
        })
        .collect()
}

pub fn render_all(diagnostics: &[Diagnostic], sources: &[Source]) -> String {
    diagnostics
        .iter()
        .map(|d| d.render(sources))
        .collect::<Vec<_>>()
        .join("\n")
}

/// A subject with just a path.
pub fn at(path: &str) -> Subject {
    Subject {
        path: path.into(),
        ..Subject::default()
    }
}

/// The winning rule's id for `s`, checking that `explain` agrees with `evaluate`.
pub fn winner(policy: &Policy, s: &Subject) -> Option<String> {
    let now = std::time::SystemTime::now();
    let fast = policy.evaluate(s, now);
    let slow = policy.explain(s, now);
    assert_eq!(
        fast.rule, slow.rule,
        "evaluate and explain disagree for {s:?}"
    );
    assert_eq!(fast.action, slow.action);
    assert_eq!(fast.would_unlock, slow.would_unlock);
    fast.rule
}
