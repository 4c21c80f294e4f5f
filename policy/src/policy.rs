//! The compiled policy: decides for a subject, explains the decision, and says which
//! subject fields its rules need.

use std::collections::BTreeMap;
use std::time::SystemTime;

use sha2::{Digest, Sha256};

use crate::ceiling::FamilyCap;
use crate::chip::{CompileOptions, HostFamily};
use crate::diagnostic::{Diagnostic, Source};
use crate::matcher::Matcher;
use crate::model::parse_file;
use crate::profile::Capabilities;
use crate::rule::{Effect, Rule};
use crate::subject::Subject;
use crate::validate::validate;
use crate::verdict::{Action, Considered, Mode, Verdict};
use crate::window::Edge;
use crate::LoadError;

/// Which [`Subject`] fields some rule reads, so the daemon computes the costly ones
/// (hashing a 50 MB binary, reading a signature) only when a rule needs them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Needs {
    /// Some rule has `sha256`.
    pub sha256: bool,
    /// Some rule has `parent`.
    pub parent: bool,
    /// Some rule has `user` (a `uid` rule needs only the uid, always known).
    pub user: bool,
    /// Some rule has `cdhash`, `team_id`, `signing_id` or `platform`.
    pub code_signature: bool,
}

/// A validated, compiled policy. Immutable; share it in an `Arc` and swap the `Arc`
/// to reload.
#[derive(Debug)]
pub struct Policy {
    mode: Mode,
    profiles: BTreeMap<String, Capabilities>,
    /// In merged file order; a rule's position is its `order`.
    rules: Vec<Rule>,
    /// The sources' display names, main file first: where each rule is (`Rule::file`).
    files: Vec<String>,
    matcher: Matcher,
    needs: Needs,
    sha256_hex: String,
    /// Profiles whose `apple_family_max` is `"host"`, and the host they resolved for.
    host_profiles: std::collections::BTreeSet<String>,
    host: HostFamily,
    /// Profiles the host chip capped (never above the host), by name.
    capped: BTreeMap<String, FamilyCap>,
    /// Profiles with `require_verified = true` (see [`crate::verification`]).
    verified_profiles: std::collections::BTreeSet<String>,
    /// `[audit.labels]` (see [`crate::labels`]): copied into every audit record.
    labels: BTreeMap<String, String>,
    /// `[audit.forward]`: where the daemon forwards audit records, if anywhere.
    forward: Option<crate::forward::Forward>,
}

/// The next time a rule's window opens or closes ([`Policy::next_change`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NextChange {
    /// When.
    pub at: SystemTime,
    /// The rule whose window it is.
    pub rule: String,
    /// Whether the rule starts (`from`) or stops (`until`) matching then.
    pub edge: Edge,
}

/// A successfully loaded policy, the warnings it drew, and the text it came from.
#[derive(Debug)]
pub struct Loaded {
    /// The compiled policy.
    pub policy: Policy,
    /// Problems that did not refuse the policy.
    pub warnings: Vec<Diagnostic>,
    /// What was read, main file first, for rendering the warnings.
    pub sources: Vec<Source>,
}

/// The policy hash, as [`Policy::sha256_hex`] reports it: computed from contents
/// only, so every path spelling of the same files (relative, absolute, through a
/// symlink) gets the same hash, and standard tools reproduce it.
///
/// The bytes hashed: the main file's contents, then for each `policy.d/` file in
/// load order a NUL, its file name (the last path component of [`Source::name`],
/// never the directory), a NUL, and its contents. A policy with no drop-ins hashes
/// to `sha256sum < policy.toml`; docs/src/policy/hash.md gives the one-liner for drop-ins. No two
/// inputs collide by shifting bytes between fields: a file name cannot contain NUL
/// or `/`, and the policy files are UTF-8 text, which a NUL would make invalid TOML.
/// Public so a refused input can be named by the same hash an accepted one gets.
#[must_use]
pub fn sources_sha256(sources: &[Source]) -> String {
    let mut h = Sha256::new();
    let mut files = sources.iter();
    if let Some(main) = files.next() {
        h.update(main.text.as_bytes());
    }
    for drop_in in files {
        h.update(b"\0");
        h.update(file_name(&drop_in.name).as_bytes());
        h.update(b"\0");
        h.update(drop_in.text.as_bytes());
    }
    hex::encode(h.finalize())
}

/// The last component of a source's display name: `policy.d/10-fleet.toml` →
/// `10-fleet.toml`. What the hash and the policy archive name a file by.
#[must_use]
pub fn file_name(name: &str) -> &str {
    name.rsplit('/').next().unwrap_or(name)
}

/// Parses, validates and compiles in-memory sources: the first is the main policy
/// file, the rest are `policy.d/` files in name order. Pure; the only error is
/// [`LoadError::Invalid`], carrying every error and warning found. `"host"` family
/// ceilings resolve as for an unknown chip; see [`compile_sources_with`].
pub fn compile_sources(sources: Vec<Source>) -> Result<Loaded, LoadError> {
    compile_sources_with(sources, &CompileOptions::default())
}

/// As [`compile_sources`], resolving `apple_family_max = "host"` with `opts`.
pub fn compile_sources_with(
    sources: Vec<Source>,
    opts: &CompileOptions,
) -> Result<Loaded, LoadError> {
    let mut diagnostics = Vec::new();
    let files: Vec<_> = sources
        .iter()
        .map(|s| parse_file(s, &mut diagnostics))
        .collect();
    let validated = validate(&sources, &files, opts);
    diagnostics.extend(validated.diagnostics);
    let forward = crate::forward::compile(&sources, &files, &mut diagnostics);
    sort_by_place(&mut diagnostics, &sources);
    if diagnostics.iter().any(Diagnostic::is_error) {
        return Err(LoadError::Invalid {
            diagnostics,
            sources,
        });
    }
    let matcher = match Matcher::build(&validated.rules) {
        Ok(m) => m,
        Err(e) => {
            diagnostics.push(Diagnostic {
                severity: crate::Severity::Error,
                file: sources.first().map(|s| s.name.clone()).unwrap_or_default(),
                line: 1,
                col: 1,
                len: 1,
                message: format!("the path globs could not be compiled together: {e}"),
                basis: crate::diagnostic::Basis::Text,
            });
            return Err(LoadError::Invalid {
                diagnostics,
                sources,
            });
        }
    };
    let needs = validated.rules.iter().fold(Needs::default(), |n, r| Needs {
        sha256: n.sha256 || r.sha256.is_some(),
        parent: n.parent || r.parent.is_some(),
        user: n.user || r.user.is_some(),
        code_signature: n.code_signature
            || r.cdhash.is_some()
            || r.team_id.is_some()
            || r.signing_id.is_some()
            || r.platform,
    });
    let policy = Policy {
        mode: validated.mode,
        profiles: validated.profiles,
        rules: validated.rules,
        files: sources.iter().map(|s| s.name.clone()).collect(),
        matcher,
        needs,
        sha256_hex: sources_sha256(&sources),
        host_profiles: validated.host_profiles,
        host: opts.host.clone(),
        capped: validated.capped,
        verified_profiles: validated.verified_profiles,
        labels: validated.labels,
        forward,
    };
    Ok(Loaded {
        policy,
        warnings: diagnostics,
        sources,
    })
}

/// Orders diagnostics by file (merged order), then line and column.
fn sort_by_place(diagnostics: &mut [Diagnostic], sources: &[Source]) {
    let file_rank = |name: &str| sources.iter().position(|s| s.name == name);
    diagnostics.sort_by_key(|d| (file_rank(&d.file), d.line, d.col));
}

impl Policy {
    /// No rules: everything stays stock. Its sha256 is that of the empty merged input.
    pub fn empty() -> Policy {
        Policy {
            mode: Mode::Enforce,
            profiles: BTreeMap::new(),
            rules: Vec::new(),
            files: Vec::new(),
            matcher: Matcher::default(),
            needs: Needs::default(),
            sha256_hex: sources_sha256(&[]),
            host_profiles: std::collections::BTreeSet::new(),
            host: HostFamily::default(),
            capped: BTreeMap::new(),
            verified_profiles: std::collections::BTreeSet::new(),
            labels: BTreeMap::new(),
            forward: None,
        }
    }

    /// `[audit.forward]`: the syslog collector records are forwarded to, if any.
    #[must_use]
    pub fn forward(&self) -> Option<&crate::forward::Forward> {
        self.forward.as_ref()
    }

    /// Decides for `s` at `at` (the time of the decision: a rule outside its
    /// window does not match; the policy reads no clock) through the compiled
    /// indexes. The verdict's trace is empty; use [`Policy::explain`] for the reasons.
    pub fn evaluate(&self, s: &Subject, at: SystemTime) -> Verdict {
        match self.matcher.best(&self.rules, s, at) {
            Some(i) => self.verdict_for(i, Vec::new()),
            None => Verdict::stock(self.mode),
        }
    }

    /// The same decision as [`Policy::evaluate`], with a trace of every rule in file
    /// order: whether it matched, what held or failed (its window included), and
    /// why a matching rule lost. Walks every rule: meant for `metalift explain`,
    /// not the hot path.
    pub fn explain(&self, s: &Subject, at: SystemTime) -> Verdict {
        let checks: Vec<Result<String, String>> =
            self.rules.iter().map(|r| r.check(s, at)).collect();
        let winner = self
            .rules
            .iter()
            .zip(&checks)
            .enumerate()
            .filter(|(_, (_, c))| c.is_ok())
            .min_by_key(|(_, (r, _))| r.precedence_key())
            .map(|(i, _)| i);
        let trace = self
            .rules
            .iter()
            .zip(checks)
            .enumerate()
            .map(|(i, (rule, check))| {
                let matched = check.is_ok();
                let why = match (check, winner) {
                    (Err(failed), _) => failed,
                    (Ok(held), Some(w)) if w == i => format!("{held}; wins ({})", strength(rule)),
                    (Ok(held), Some(w)) => match self.rules.get(w) {
                        Some(win) => {
                            format!("{held}; loses to `{}`: {}", win.id, why_lost(rule, win))
                        }
                        None => held,
                    },
                    (Ok(held), None) => held,
                };
                Considered {
                    rule: rule.id.clone(),
                    location: rule.location(&self.files),
                    matched,
                    why,
                }
            })
            .collect();
        match winner {
            Some(i) => self.verdict_for(i, trace),
            None => Verdict {
                trace,
                ..Verdict::stock(self.mode)
            },
        }
    }

    fn verdict_for(&self, i: usize, trace: Vec<Considered>) -> Verdict {
        let Some(rule) = self.rules.get(i) else {
            return Verdict::stock(self.mode);
        };
        let (action, would_unlock) = match (&rule.effect, self.mode) {
            (Effect::Stock, _) => (Action::Stock, None),
            (
                Effect::Unlock {
                    profile,
                    capabilities,
                },
                Mode::Enforce,
            ) => (
                Action::Unlock {
                    profile: profile.to_string(),
                    capabilities: *capabilities,
                },
                None,
            ),
            (Effect::Unlock { profile, .. }, Mode::Monitor) => {
                (Action::Stock, Some(profile.to_string()))
            }
        };
        let family_cap = match &rule.effect {
            Effect::Unlock { profile, .. } => self.profile_cap(profile).cloned(),
            Effect::Stock => None,
        };
        Verdict {
            action,
            rule: Some(rule.id.clone()),
            mode: self.mode,
            would_unlock,
            family_cap,
            unverified: None,
            window: (!rule.window.is_always()).then_some(rule.window),
            trace,
        }
    }

    /// The nearest rule window edge strictly after `at`: when some rule starts or
    /// stops matching without a reload (`metalift status` shows it). Ties go to the
    /// rule first in file order.
    #[must_use]
    pub fn next_change(&self, at: SystemTime) -> Option<NextChange> {
        self.rules
            .iter()
            .filter_map(|r| {
                r.window
                    .next_edge_after(at)
                    .map(|(when, edge)| (when, r.order, r.id.as_str(), edge))
            })
            .min_by_key(|(when, order, ..)| (*when, *order))
            .map(|(at, _, rule, edge)| NextChange {
                at,
                rule: rule.to_owned(),
                edge,
            })
    }

    /// Which subject fields some rule needs.
    #[must_use]
    pub fn needs(&self) -> Needs {
        self.needs
    }

    /// Hex sha256 of the merged sources (names and texts), for the audit trail.
    #[must_use]
    pub fn sha256_hex(&self) -> &str {
        &self.sha256_hex
    }

    /// How many rules the policy has, over all its files.
    #[must_use]
    pub fn rule_count(&self) -> usize {
        self.rules.len()
    }

    /// The ids of the rules that unlock (a profile, not `stock`), in file order:
    /// none means the policy can unlock nothing, whatever runs.
    #[must_use]
    pub fn unlocking_rules(&self) -> Vec<&str> {
        self.rules
            .iter()
            .filter(|r| matches!(r.effect, Effect::Unlock { .. }))
            .map(|r| r.id.as_str())
            .collect()
    }

    /// The admin's `[audit.labels]` for this machine (descriptive: no rule reads them).
    #[must_use]
    pub fn labels(&self) -> &BTreeMap<String, String> {
        &self.labels
    }

    /// Enforce or monitor.
    #[must_use]
    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Whether profile `name` sets `require_verified = true`: it unlocks only while
    /// a passing verification covers this host (see [`crate::verification`]).
    #[must_use]
    pub fn requires_verification(&self, name: &str) -> bool {
        self.verified_profiles.contains(name)
    }

    /// The defined profiles by name.
    #[must_use]
    pub fn profiles(&self) -> &BTreeMap<String, Capabilities> {
        &self.profiles
    }

    /// When profile `name` has `apple_family_max = "host"`: the host it was resolved
    /// for (its [`Capabilities::apple_family_max`] is [`HostFamily::family`]).
    #[must_use]
    pub fn profile_host(&self, name: &str) -> Option<&HostFamily> {
        self.host_profiles.contains(name).then_some(&self.host)
    }

    /// When profile `name` asked more Apple family than the host chip has: what it
    /// asked and what is applied (its [`Capabilities::apple_family_max`]).
    #[must_use]
    pub fn profile_cap(&self, name: &str) -> Option<&FamilyCap> {
        self.capped.get(name)
    }

    /// The answers of profile `name`, if defined.
    #[must_use]
    pub fn profile(&self, name: &str) -> Option<&Capabilities> {
        self.profiles.get(name)
    }
}

fn effect_word(rule: &Rule) -> &'static str {
    match rule.effect {
        Effect::Stock => "stock",
        Effect::Unlock { .. } => "unlock",
    }
}

fn strength(rule: &Rule) -> String {
    format!(
        "most specific: {}, {}",
        rule.specificity().as_str(),
        effect_word(rule)
    )
}

fn why_lost(loser: &Rule, winner: &Rule) -> String {
    let (ls, ws) = (loser.specificity(), winner.specificity());
    if ws != ls {
        format!("{} is more specific than {}", ws.as_str(), ls.as_str())
    } else if effect_word(winner) != effect_word(loser) {
        format!("equally specific ({}), and stock beats unlock", ws.as_str())
    } else {
        format!(
            "equally specific ({}), both {}, and it comes first in file order",
            ws.as_str(),
            effect_word(winner)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::Policy;

    #[test]
    fn a_policy_can_be_shared_across_threads_in_an_arc() {
        fn shareable<T: Send + Sync + std::fmt::Debug>() {}
        shareable::<Policy>();
    }
}
