//! metalift's policy engine: pure, with no I/O beyond reading the files it is asked to load.
//!
//! # Layout
//!
//! A policy goes through three stages, each with its own module:
//!
//! 1. `model` (private): the raw file model — TOML parsed with spans, unknown keys
//!    and wrong types reported.
//! 2. `validate` (private): every value and cross-file reference judged; the result
//!    is a list of rules (`rule`) and profiles.
//! 3. `matcher` (private): the rules indexed by hash maps, and path globs bucketed
//!    by their literal directory, so a decision never scans every rule. A glob whose
//!    only glob character is one `*` in its last component is matched by comparing
//!    bytes (`component_glob`); the others through one `GlobSet` per bucket.
//!
//! After validation, the lints (`validate/lint.rs`): valid rules that cannot be
//! meant (match-everything unlocks, rules that can never win, a drop-in overriding a
//! main-file rule, two verdicts on one exact path), reported as warnings. Checks that
//! need the machine (symlinked or missing rule paths, uid vs user) are [`host`]'s,
//! behind a trait, run by `metalift validate` only.
//!
//! Around them: [`load`] reads `policy.toml` and `policy.d/*.toml` (refusing files
//! root does not own); [`compile_sources`] does the same from memory; [`Policy`]
//! decides ([`Policy::evaluate`]) and explains ([`Policy::explain`]). The public
//! modules: [`profile`] (capability profiles), [`subject`] (who is asking),
//! [`verdict`] (the `#[must_use]` decision and its trace), [`diagnostic`]
//! (`file:line:col` problems), [`size`] (human sizes), [`wire`] (the check-in
//! protocol shared with the shim), [`socket_path`] (where the daemon listens by default),
//! [`chip`] (the host chip's family), [`ceiling`] (a profile is applied at most at
//! the host chip's family: never above the host) and [`expect_family`] (what a CI
//! check's `--expect-family` asks of the answers).
//!
//! # The policy file
//!
//! ```toml
//! version = 1
//! mode = "enforce"                 # or "monitor": decide and log, never unlock
//!
//! [profile.apple7]
//! apple_family_max = 7             # Apple5..=Apple10, or "host" (see [`chip`]);
//!                                  # never above the host chip's (see [`ceiling`])
//! max_threadgroup_memory = 32768   # 1..=65536, a floor; warning above 32768
//! recommended_working_set = "12 GiB"   # optional floor
//!
//! [[rule]]
//! id = "llama-cpp"
//! path = "/opt/llama.cpp/bin/llama-*"
//! unlock = "apple7"
//! ```
//!
//! A rule has an `id`, exactly one of `unlock = "PROFILE"` or `stock = true`, at least
//! one **identity matcher** — `cdhash` (40 hex digits), `sha256` (64 hex digits),
//! `signing_id`, `team_id`, `path` (absolute; a glob when it has `*?[]{}`, where `*`
//! stays inside one path component and `**` crosses them), `name` (the file name) —
//! and optionally **qualifiers**: `uid`, `user`, `parent` (path or glob of the
//! parent's executable), `platform = true` (Apple's own code, see [`Anchor`]), and a
//! **window**, `from`/`until` (RFC 3339 times: outside it the rule does not match,
//! see [`window`]).
//! Every matcher of a rule must hold. A `team_id` or `signing_id` matches only a
//! signature that chains to Apple ([`Anchor::chains_to_apple`]); a `signing_id`
//! needs its `team_id`, or `platform = true` for Apple's code (which has no team). A rule may also carry
//! a free-text `description`. Exact paths compare byte for byte with the path the kernel reports.
//!
//! Why a rule needs an identity: `uid`/`user`/`parent` alone would unlock every
//! program a user runs, including each injected `ls` and `sh`. metalift injects
//! broadly and unlocks narrowly; an admin who really means "everything" writes
//! `path = "/**"` and says so.
//!
//! # Precedence
//!
//! Among the rules that match, the winner is the one with the most specific identity
//! matcher: cdhash > sha256 > signing_id > team_id > exact path > path glob > name. A
//! rule counts at its most specific matcher (`team_id` + `signing_id` counts as
//! `signing_id`). Qualifiers never raise specificity: they only narrow, so an
//! unlock rule for `user = "ci"` cannot outrank a stock rule for the same binary. At
//! equal specificity `stock` beats `unlock`; then the rule earlier in the merged file
//! order wins (`policy.toml` first, then `policy.d/` by file name).
//!
//! Worked example:
//!
//! ```
//! use metalift_policy::{compile_sources, Action, Source, Subject};
//!
//! let text = r#"
//! version = 1
//! [profile.apple7]
//! apple_family_max = 7
//!
//! [[rule]]                      # A: a path glob
//! id = "llama-tools"
//! path = "/opt/llama.cpp/bin/llama-*"
//! unlock = "apple7"
//!
//! [[rule]]                      # B: an exact path: more specific than A
//! id = "no-quantize"
//! path = "/opt/llama.cpp/bin/llama-quantize"
//! stock = true
//!
//! [[rule]]                      # C: the same glob as A, but stock: beats A
//! id = "ci-stays-stock"
//! path = "/opt/llama.cpp/bin/llama-*"
//! user = "ci"
//! stock = true
//! "#;
//! let policy = compile_sources(vec![Source::new("policy.toml", text)]).unwrap().policy;
//! let now = std::time::SystemTime::now(); // every decision is given its time
//! let run = |path: &str, user: &str| Subject {
//!     path: path.into(),
//!     user: Some(user.into()),
//!     ..Subject::default()
//! };
//!
//! // Only A matches: unlock.
//! let v = policy.evaluate(&run("/opt/llama.cpp/bin/llama-server", "alice"), now);
//! assert!(matches!(v.action, Action::Unlock { .. }));
//! assert_eq!(v.rule.as_deref(), Some("llama-tools"));
//!
//! // A and B match: the exact path wins.
//! let v = policy.evaluate(&run("/opt/llama.cpp/bin/llama-quantize", "alice"), now);
//! assert_eq!((v.action, v.rule.as_deref()), (Action::Stock, Some("no-quantize")));
//!
//! // A and C match at equal specificity (C's `user` does not count): stock wins.
//! let v = policy.evaluate(&run("/opt/llama.cpp/bin/llama-server", "ci"), now);
//! assert_eq!((v.action, v.rule.as_deref()), (Action::Stock, Some("ci-stays-stock")));
//!
//! // `explain` reaches the same decision and says why for every rule.
//! let e = policy.explain(&run("/opt/llama.cpp/bin/llama-server", "ci"), now);
//! assert_eq!(e.rule.as_deref(), Some("ci-stays-stock"));
//! assert!(e.trace[0].why.contains("stock beats unlock"));
//! ```
//!
//! In `monitor` mode the verdict's action is always stock; when the winner would
//! unlock, [`Verdict::would_unlock`] names its profile.
//!
//! # Files
//!
//! `version = 1` is required in the main file and optional (but must be 1) in
//! `policy.d/` files; `mode` may only be set in the main file, so a dropped-in file
//! cannot turn enforcement on or off. Profiles and rule ids share one namespace over
//! all files; defining one twice is an error reported at both places.
//!
//! The policy hash ([`Policy::sha256_hex`], [`sources_sha256`]) is over contents only:
//! the main file's text, then for each `policy.d/` file a NUL, its file name, a NUL
//! and its text, so every path spelling gives one hash, and without drop-ins it is
//! `sha256sum < policy.toml`.
#![forbid(unsafe_code)]

pub mod anchor;
pub mod ceiling;
pub mod chip;
mod component_glob;
pub mod diagnostic;
pub mod expect_family;
pub mod host;
pub mod job;
mod load;
mod matcher;
mod model;
// `[audit.forward]` and `[audit.labels]` are model's submodules (the file model
// parses them with its Sink; validation reads the models back): one unit, no
// import circle between them.
pub use model::{forward, labels};
mod policy;
pub mod profile;
mod rule;
pub mod size;
pub mod socket_path;
pub mod subject;
mod validate;
pub mod verdict;
pub mod window;
pub mod wire;

pub use anchor::Anchor;
pub use ceiling::FamilyCap;
pub use chip::{
    apple_family_for_brand, known_chips_line, CompileOptions, HostFamily, UNKNOWN_HOST_FAMILY,
};
pub use diagnostic::{Basis, Diagnostic, Severity, Source};
pub use expect_family::FamilyExpectation;
pub use host::{host_lints, Host, PathFact};
pub use load::{
    load, load_with, load_within, policy_files, read_file, read_file_within, read_policy,
    read_policy_within, LoadError, LoadOptions, PermissionProblem, ReadPolicy,
    DEFAULT_MAX_POLICY_BYTES,
};
#[doc(hidden)]
pub use model::fast_parse_agrees;
pub use policy::{
    compile_sources, compile_sources_with, file_name, sources_sha256, Loaded, Needs, NextChange,
    Policy,
};
pub use profile::Capabilities;
pub use rule::Specificity;
pub use subject::Subject;
pub use validate::{DEFAULT_THREADGROUP_MEMORY, MAX_THREADGROUP_MEMORY, POLICY_VERSION};
pub use verdict::{Action, Considered, Mode, Verdict};
pub use window::Window;
