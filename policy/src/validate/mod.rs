//! Stage 2, validation: judges every value and every cross-file reference of the raw
//! file models and turns them into [`Rule`]s and profiles.
//!
//! This stage may read only what stage 1 ([`crate::model`]) produced; it reports every
//! problem it finds (never only the first) and builds nothing the matcher would have
//! to re-check. The first source is the main `policy.toml`; the others are
//! `policy.d/` files in name order.

use std::collections::{BTreeMap, HashMap};
use std::ops::Range;
use std::sync::Arc;

use crate::ceiling::FamilyCap;
use crate::chip::CompileOptions;
use crate::diagnostic::{Basis, Diagnostic, LineIndex, Severity, Source};
use crate::model::{At, FamilyText, FileModel, RawProfile, SizeText};
use crate::profile::{
    Capabilities, MAX_APPLE_FAMILY, MIN_APPLE_FAMILY, SHIPPING_MAX_THREADGROUP_MEMORY,
};
use crate::rule::Rule;
use crate::size::parse_size;
use crate::verdict::Mode;

mod ceiling;
mod glob_error;
mod lint;
mod rule;

pub(crate) use lint::Site;

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
    /// Profiles whose `apple_family_max` is `"host"`.
    pub host_profiles: std::collections::BTreeSet<String>,
    /// Profiles whose `apple_family_max` the host chip lowered (their entry in
    /// `profiles` holds the applied value).
    pub capped: BTreeMap<String, FamilyCap>,
    /// Profiles with `require_verified = true`.
    pub verified_profiles: std::collections::BTreeSet<String>,
    /// `[audit.labels]`, merged over the files.
    pub labels: BTreeMap<String, String>,
    pub diagnostics: Vec<Diagnostic>,
}

/// Validates the parsed files (`files[i]` parsed from `sources[i]`).
pub(crate) fn validate(
    sources: &[Source],
    files: &[FileModel],
    opts: &CompileOptions,
) -> Validated {
    let mut v = Validator {
        opts,
        sources,
        lines: sources.iter().map(|s| LineIndex::new(&s.text)).collect(),
        out: Vec::new(),
        errors: 0,
        refused_profiles: std::collections::HashSet::new(),
    };
    let mut result = Validated::default();
    let all_parsed = files.iter().all(|f| f.parsed);

    for (i, file) in files.iter().enumerate() {
        if !file.parsed {
            continue;
        }
        v.header(i, file, &mut result.mode);
    }

    let label_files: Vec<&[crate::labels::RawLabel]> =
        files.iter().map(|f| f.labels.as_slice()).collect();
    result.labels = crate::labels::validate(sources, &label_files, |i, span, message| {
        v.error(i, span, message);
    });

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
            let Some(caps) = v.profile(i, raw) else {
                v.refused_profiles.insert(name.value.clone());
                continue;
            };
            let (caps, cap) = v.host_ceiling(i, &name.value, raw, caps);
            if let Some(cap) = cap {
                result.capped.insert(name.value.clone(), cap);
            }
            if matches!(
                &raw.apple_family_max,
                Some(At {
                    value: FamilyText::Word(_),
                    ..
                })
            ) {
                result.host_profiles.insert(name.value.clone());
            }
            if raw.require_verified.as_ref().is_some_and(|r| r.value) {
                result.verified_profiles.insert(name.value.clone());
            }
            result.profiles.insert(name.value.clone(), caps);
        }
    }

    // One shared name per profile, for the rules that unlock it.
    let named: BTreeMap<Arc<str>, Capabilities> = result
        .profiles
        .iter()
        .map(|(name, caps)| (Arc::from(name.as_str()), *caps))
        .collect();
    let raw_rules = files.iter().map(|f| f.rules.len()).sum();
    result.rules.reserve_exact(raw_rules);
    let mut rule_sites: HashMap<&str, (usize, Range<usize>)> = HashMap::with_capacity(raw_rules);
    let mut sites = Vec::with_capacity(raw_rules);
    for (i, file) in files.iter().enumerate() {
        for raw in &file.rules {
            if let Some(id) = &raw.id {
                if let Some((first_file, first_span)) = rule_sites.get(id.value.as_str()) {
                    v.duplicate(
                        "rule id",
                        &id.value,
                        (*first_file, first_span.clone()),
                        (i, id.span.clone()),
                    );
                } else {
                    rule_sites.insert(&id.value, (i, id.span.clone()));
                }
            }
            let order = result.rules.len();
            if let Some(rule) = v.rule(i, raw, order, &named, all_parsed) {
                sites.push(Site {
                    file: i,
                    anchor: raw
                        .id
                        .as_ref()
                        .map_or(raw.span.clone(), |id| id.span.clone()),
                    path: raw.path.as_ref().map(|p| p.span.clone()),
                });
                result.rules.push(rule);
            }
        }
    }
    // Lints only judge a policy that would load: on a refused one they are noise.
    if v.errors == 0 {
        v.lint(&result.rules, &sites);
    }
    result.diagnostics = v.out;
    result
}

struct Validator<'a> {
    /// What `"host"` resolves to.
    opts: &'a CompileOptions,
    sources: &'a [Source],
    /// One per source: locating every rule must not rescan the text each time.
    lines: Vec<LineIndex>,
    out: Vec<Diagnostic>,
    /// Errors in `out`, so each rule can tell whether it added one.
    errors: usize,
    /// Profiles that are defined but were refused (their errors say why): a rule
    /// naming one draws no second error, one diagnostic per cause.
    refused_profiles: std::collections::HashSet<String>,
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

    /// A warning judged on `basis` (see [`Basis`]): about the host chip.
    fn warn_on(&mut self, basis: Basis, file: usize, span: Range<usize>, msg: impl Into<String>) {
        self.warn(file, span, msg);
        if let Some(last) = self.out.pop() {
            self.out.push(last.on_basis(basis));
        }
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
            Some(At {
                value: FamilyText::Word(word),
                span,
            }) if word == "host" => {
                let host = &self.opts.host;
                if host.known_family().is_none() {
                    let why = match &host.brand {
                        Some(b) => format!(
                            "the chip `{b}` is not one this metalift knows ({})",
                            crate::chip::known_chips_line()
                        ),
                        None => "the host chip could not be read here".to_owned(),
                    };
                    let message = format!(
                        "apple_family_max = \"host\": {why}: the ceiling is {}, the family every Apple silicon Mac has (metaliftd reads its host's chip from `sysctl machdep.cpu.brand_string`, or METALIFT_HOST_CHIP_BRAND in its own environment)",
                        host.family()
                    );
                    self.warn_on(Basis::HostChipUnknown, i, span.clone(), message);
                }
                host.family()
            }
            Some(At {
                value: FamilyText::Word(word),
                span,
            }) => {
                self.error(
                    i,
                    span.clone(),
                    format!("apple_family_max must be a number (Apple{MIN_APPLE_FAMILY}..Apple{MAX_APPLE_FAMILY}) or \"host\", not \"{word}\""),
                );
                ok = false;
                0
            }
            Some(At {
                value: FamilyText::Number(n),
                span,
            }) => match u8::try_from(*n) {
                Ok(n) if (MIN_APPLE_FAMILY..=MAX_APPLE_FAMILY).contains(&n) => n,
                _ => {
                    self.error(
                        i,
                        span.clone(),
                        format!(
                            "apple_family_max {n} is outside Apple{MIN_APPLE_FAMILY}..Apple{MAX_APPLE_FAMILY}"
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
}
