//! `metalift validate`: checks a policy (and its `policy.d/`) the way metaliftd would
//! load it, plus what only the machine can tell (rule paths that are symlinks or do
//! not exist, a `uid` that is not the rule's `user`), and prints every problem with
//! its location.
//!
//! Like `visudo -c -f`, it checks any file: a candidate in a checkout is judged on
//! its contents; its owner and mode are reported as warnings (metaliftd refuses a
//! policy file not owned by root or writable by group/other where it is installed).
//! `--main /etc/metalift/policy.toml DROPIN.toml` checks a drop-in in the context of
//! the installed main policy and its other drop-ins (replacing an installed drop-in
//! of the same file name), and prints the hash the policy will have once installed.
//!
//! With `--socket` (or `METALIFT_SOCKET`) it asks that daemon first: the policy is
//! judged with the daemon's `--max-policy-bytes` and host chip (its status), not
//! the compiled defaults, and the daemon's state is printed as every tool prints
//! it ([`crate::judgement`]); it does not change the exit status, which is the file's.
//!
//! Exit codes: 0 valid (warnings allowed), 1 invalid (or, with `--strict`, any
//! warning about the policy's contents), 2 unreadable (missing file, I/O error).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use metalift_policy::{
    compile_sources_with, host_lints, read_file_within, read_policy_within, Basis, CompileOptions,
    Diagnostic, HostFamily, LoadError, PermissionProblem, Severity, Source,
};

use crate::judgement::{Judgement, Limits};
use serde_json::{json, Value};

use metalift_daemon::service::config::DEFAULT_POLICY;

/// Arguments of `metalift validate`.
#[derive(Debug, clap::Args)]
#[command(mut_arg("socket", |a| a.help(
    "Ask the daemon on this socket for its policy size limit and host chip (used \
     instead of the compiled defaults) and print its state as `status` judges it \
     [default: none is asked]"
)))]
pub struct Args {
    /// The policy file to check: the main policy (`policy.d/*.toml` beside it is read
    /// too), or with `--main` a drop-in candidate.
    #[arg(default_value = DEFAULT_POLICY, env = "METALIFT_POLICY")]
    pub path: PathBuf,
    /// Check PATH as a `policy.d/` drop-in of this installed main policy: with the
    /// main file and its other drop-ins, replacing one of the same file name.
    #[arg(long, value_name = "MAIN")]
    pub main: Option<PathBuf>,
    /// Treat warnings about the policy's contents (lints included) as errors: exit 1.
    /// Owner and mode problems stay warnings.
    #[arg(long)]
    pub strict: bool,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Skip every check against this machine (rule paths that are symlinks or
    /// missing, uid vs user, and its chip: `"host"` and the ceiling no profile is
    /// applied above; a chip named with --host-chip-brand is still judged): for
    /// checking a policy somewhere other than where it will run.
    #[arg(long)]
    pub skip_host_checks: bool,
    /// Do not report files not owned by root or writable by group/other.
    #[arg(long)]
    pub allow_insecure_owner: bool,
    /// The host chip's brand: what `apple_family_max = "host"` resolves to, and the
    /// family no profile is applied above (default: this machine's
    /// `machdep.cpu.brand_string` on macOS; where the chip is unknown, `"host"` draws a
    /// note and a ceiling of 9 or more a warning).
    #[arg(long, value_name = "BRAND")]
    pub host_chip_brand: Option<String>,
    // Only a daemon given (--socket or METALIFT_SOCKET) is asked: for its policy
    // size limit and host chip (used instead of the compiled defaults), and its
    // state is printed as `status` judges it.
    #[command(flatten)]
    pub daemon: crate::daemon_args::DaemonArgs,
}

/// Exit code for a valid policy.
pub const VALID: u8 = 0;
/// Exit code for a policy with errors (or warnings under `--strict`).
pub const INVALID: u8 = 1;
/// Exit code when the policy could not be read at all.
pub const UNREADABLE: u8 = 2;

/// What was checked and what was found.
struct Report {
    /// The sources in load order (a `--main` candidate in its place).
    sources: Vec<Source>,
    /// Every problem, errors and warnings, in file order.
    diagnostics: Vec<Diagnostic>,
    /// Owner/mode problems: warnings here, a refusal by metaliftd.
    ownership: Vec<PermissionProblem>,
    /// The compiled policy's facts, when it compiled.
    policy: Option<Facts>,
    /// With `--main`: where the candidate goes.
    placement: Option<String>,
}

struct Facts {
    sha256: String,
    mode: &'static str,
    rules: usize,
    profiles: Vec<String>,
    /// Profiles with `require_verified = true`, and whether one would unlock here now.
    verification: Vec<(String, metalift_daemon::live_policy::verification::Coverage)>,
}

/// Runs `metalift validate`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let judged = args
        .daemon
        .given()
        .map(|socket| crate::judgement::ask(&args.daemon, socket));
    let limits = Limits::of(judged.as_ref());
    let daemon_json = judged.as_ref().map(Judgement::to_json);
    if let (Some(judged), false) = (&judged, args.json) {
        println!("{}", judged.line());
    }
    let report = match check(&args, &limits) {
        Ok(r) => r,
        Err(e) => {
            let message = match &e {
                LoadError::NotFound { .. } => {
                    format!("{e} (metaliftd would run with no rules: everything stock)")
                }
                _ => e.to_string(),
            };
            if args.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&json!({
                        "path": args.path.display().to_string(),
                        "status": "unreadable",
                        "strict": args.strict,
                        "errors": 0,
                        "warnings": 0,
                        "notes": 0,
                        "diagnostics": [],
                        "ownership": [],
                        "files": [],
                        "policy": null,
                        "daemon": daemon_json,
                        "error": message,
                    }))?
                );
            } else {
                println!("{message}");
            }
            return Ok(ExitCode::from(UNREADABLE));
        }
    };
    let errors = report.diagnostics.iter().filter(|d| d.is_error()).count();
    let warnings = count(&report.diagnostics, Severity::Warning);
    let refused_by_strict = args.strict && warnings > 0;
    let code = if errors > 0 || refused_by_strict {
        INVALID
    } else {
        VALID
    };
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report_json(&args, &report, code, daemon_json))?
        );
    } else {
        print!("{}", report_text(&args, &report, errors, warnings));
    }
    Ok(ExitCode::from(code))
}

/// Reads, compiles and lints; `Err` only when nothing could be read.
/// `limits`: the daemon's size limit and chip when one answered, else the defaults.
fn check(args: &Args, limits: &Limits) -> Result<Report, LoadError> {
    let max = limits.max_policy_bytes;
    let (mut sources, mut ownership, mut diagnostics, placement) = match &args.main {
        None => {
            let read = read_policy_within(&args.path, max)?;
            (
                read.sources,
                read.permission_problems,
                read.encoding_errors,
                None,
            )
        }
        Some(main) => {
            let read = read_policy_within(main, max)?;
            let (candidate, problem, encoding) = read_file_within(&args.path, max)?;
            let mut ownership = read.permission_problems;
            ownership.extend(problem);
            let mut diagnostics = read.encoding_errors;
            diagnostics.extend(encoding);
            let (sources, placement) = place_drop_in(read.sources, candidate, main);
            // Together, as metaliftd will read them (its limit is on all files).
            let bytes = sources
                .iter()
                .map(|s| s.text.len() as u64)
                .fold(0, u64::saturating_add);
            if bytes > max {
                return Err(LoadError::TooLarge {
                    path: main.clone(),
                    bytes,
                    limit: max,
                });
            }
            (sources, ownership, diagnostics, Some(placement))
        }
    };
    if args.allow_insecure_owner {
        ownership.clear();
    }
    let host = HostFamily {
        brand: match &args.host_chip_brand {
            Some(brand) => Some(brand.clone()),
            None if args.skip_host_checks => None,
            None => limits.host_chip_brand.clone(),
        },
    };
    let host_warnings = if args.skip_host_checks {
        Vec::new()
    } else {
        host_lints(&sources, &crate::macho::lint_host::LintHost)
    };
    let policy = if diagnostics.is_empty() {
        let chip = host.brand.clone();
        match compile_sources_with(
            sources.clone(),
            &CompileOptions {
                host,
                // A rule whose window has closed draws a warning at its `until`.
                now: Some(std::time::SystemTime::now()),
            },
        ) {
            Ok(loaded) => {
                diagnostics.extend(loaded.warnings);
                let p = &loaded.policy;
                Some(Facts {
                    sha256: p.sha256_hex().to_owned(),
                    mode: p.mode().as_str(),
                    rules: p.rule_count(),
                    profiles: p.profiles().keys().cloned().collect(),
                    // verified unlock: judged against verifications.jsonl beside the main file.
                    verification: crate::verify::coverage_here(
                        p,
                        &crate::verify::store_here(
                            args.main.as_deref().unwrap_or(&args.path),
                            chip,
                            args.allow_insecure_owner,
                        ),
                    ),
                })
            }
            Err(LoadError::Invalid {
                diagnostics: found,
                sources: back,
            }) => {
                diagnostics.extend(found);
                sources = back;
                None
            }
            Err(other) => return Err(other),
        }
    } else {
        None
    };
    diagnostics.extend(host_warnings);
    let no_chip = args.skip_host_checks && args.host_chip_brand.is_none();
    let diagnostics = judged_here(diagnostics, no_chip);
    let mut diagnostics = diagnostics;
    let rank = |name: &str| sources.iter().position(|s| s.name == name);
    diagnostics.sort_by_key(|d| (rank(&d.file), d.line, d.col, d.severity));
    Ok(Report {
        sources,
        diagnostics,
        ownership,
        policy,
        placement,
    })
}

/// The diagnostics as this machine can judge them. With `no_chip`
/// (`--skip-host-checks` and no `--host-chip-brand`) none about the host chip;
/// otherwise `"host"` on a chip unknown here weighs what [`crate::host_severity`]
/// decides for every tool (a note: `--strict` passes it on every machine).
fn judged_here(diagnostics: Vec<Diagnostic>, no_chip: bool) -> Vec<Diagnostic> {
    crate::host_severity::judged(
        diagnostics
            .into_iter()
            .filter(|d| !no_chip || d.basis == Basis::Text)
            .collect(),
    )
}

/// Puts `candidate` among the installed sources as metaliftd would read it from
/// `policy.d/`: in place of an installed file of the same name, or in name order.
fn place_drop_in(
    mut sources: Vec<Source>,
    candidate: Source,
    main: &Path,
) -> (Vec<Source>, String) {
    let name = metalift_policy::file_name(&candidate.name).to_owned();
    let dir = main
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("policy.d");
    let installed_as = dir.join(&name).display().to_string();
    let drop_ins = sources.get(1..).unwrap_or_default();
    let same = drop_ins
        .iter()
        .position(|s| metalift_policy::file_name(&s.name) == name);
    let placement = match same {
        Some(i) => {
            if let Some(slot) = sources.get_mut(i + 1) {
                *slot = candidate;
            }
            format!("replacing the installed {installed_as}")
        }
        None => {
            let at = drop_ins
                .iter()
                .position(|s| metalift_policy::file_name(&s.name) > name.as_str())
                .map_or(sources.len(), |i| i + 1);
            sources.insert(at.max(1), candidate);
            format!("as a new {installed_as}")
        }
    };
    let placement = if name.starts_with('.') || !name.ends_with(".toml") {
        format!(
            "{placement}; note: metaliftd reads only policy.d/*.toml files not starting with `.`, so it would ignore `{name}`"
        )
    } else {
        placement
    };
    (sources, placement)
}

fn count(diagnostics: &[Diagnostic], severity: Severity) -> usize {
    diagnostics
        .iter()
        .filter(|d| d.severity == severity)
        .count()
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

fn ownership_line(p: &PermissionProblem) -> String {
    format!(
        "{}: warning: {}: metaliftd refuses a policy file that is not owned by root or is writable by group or other; install it with `sudo install -o root -m 0644` (a directory: `sudo chown root` and `sudo chmod go-w`)",
        p.path.display(),
        p.reason
    )
}

/// Every diagnostic rendered with its line and underline, then a one-line summary.
fn report_text(args: &Args, r: &Report, errors: usize, warnings: usize) -> String {
    let path = args.path.display();
    let mut out = String::new();
    for d in &r.diagnostics {
        let rendered = d.render(&r.sources);
        if args.strict && d.severity == Severity::Warning {
            out.push_str(&rendered.replacen(": warning: ", ": error (--strict): ", 1));
        } else {
            out.push_str(&rendered);
        }
        out.push_str("\n\n");
    }
    for p in &r.ownership {
        out.push_str(&ownership_line(p));
        out.push_str("\n\n");
    }
    if let Some(placement) = &r.placement {
        out.push_str(&format!(
            "{path}: checked as a drop-in of {} ({placement})\n",
            args.main.as_deref().unwrap_or(Path::new("?")).display()
        ));
    }
    let all_warnings = warnings + r.ownership.len();
    let notes = match count(&r.diagnostics, Severity::Note) {
        0 => String::new(),
        n => format!(", {}", plural(n, "note")),
    };
    match (&r.policy, errors) {
        (Some(p), 0) if !(args.strict && warnings > 0) => {
            let extra = r.sources.len().saturating_sub(1);
            out.push_str(&format!(
                "{path}: valid: {} and {} in {}{}, mode {}, {}{notes}; sha256 {}\n",
                plural(p.rules, "rule"),
                plural(p.profiles.len(), "profile"),
                plural(1 + extra, "file"),
                if extra > 0 { " (with policy.d/)" } else { "" },
                p.mode,
                plural(all_warnings, "warning"),
                p.sha256,
            ));
            out.push_str(&crate::verify::coverage_text(&args.path, &p.verification));
        }
        (Some(_), 0) => out.push_str(&format!(
            "{path}: invalid (--strict): 0 errors, {}\n",
            plural(all_warnings, "warning")
        )),
        _ => out.push_str(&format!(
            "{path}: invalid: {}, {}\n",
            plural(errors, "error"),
            plural(all_warnings, "warning")
        )),
    }
    out
}

fn diagnostic_json(d: &Diagnostic) -> Value {
    json!({
        "severity": d.severity.as_str(),
        "file": d.file,
        "line": d.line,
        "col": d.col,
        "len": d.len,
        "message": d.message,
    })
}

/// `{"path", "status": "valid"|"invalid"|"unreadable", "strict", "errors", "warnings",
/// "diagnostics": [...], "ownership": [{"path", "reason"}], "files": [...],
/// "placement": str|null, "policy": {...}|null, "daemon": {...}|null, "error": str|null}`;
/// `daemon` is the judgement of the daemon asked with `--socket` (`null`: none asked).
fn report_json(args: &Args, r: &Report, code: u8, daemon: Option<Value>) -> Value {
    let errors = r.diagnostics.iter().filter(|d| d.is_error()).count();
    json!({
        "path": args.path.display().to_string(),
        "status": if code == VALID { "valid" } else { "invalid" },
        "strict": args.strict,
        "errors": errors,
        "warnings": count(&r.diagnostics, Severity::Warning) + r.ownership.len(),
        "notes": count(&r.diagnostics, Severity::Note),
        "diagnostics": r.diagnostics.iter().map(diagnostic_json).collect::<Vec<_>>(),
        "ownership": r.ownership.iter().map(|p| json!({
            "path": p.path.display().to_string(),
            "reason": p.reason,
        })).collect::<Vec<_>>(),
        "files": r.sources.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
        "placement": r.placement,
        "policy": r.policy.as_ref().map(|p| json!({
            "sha256": p.sha256,
            "mode": p.mode,
            "rules": p.rules,
            "profiles": p.profiles,
            "require_verified": crate::verify::coverage_json(&p.verification),
        })),
        "daemon": daemon,
        "error": null,
    })
}
