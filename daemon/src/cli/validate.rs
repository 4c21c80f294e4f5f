//! `metalift validate`: checks a policy (and its `policy.d/`) the way metaliftd would
//! load it, and prints every problem with its location.
//!
//! Exit codes: 0 valid (warnings allowed), 1 invalid, 2 unreadable (missing file,
//! I/O error, or refused ownership/permissions).

use std::path::PathBuf;
use std::process::ExitCode;

use metalift_policy::{load, Diagnostic, LoadError, LoadOptions, Loaded, Source};
use serde_json::{json, Value};

use crate::config::DEFAULT_POLICY;

/// Arguments of `metalift validate`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The main policy file; `policy.d/*.toml` beside it is read too.
    #[arg(default_value = DEFAULT_POLICY)]
    pub path: PathBuf,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Accept files not owned by root or writable by group/other (development only).
    #[arg(long)]
    pub allow_insecure_owner: bool,
}

/// Exit code for a valid policy.
const VALID: u8 = 0;
/// Exit code for a policy with errors.
const INVALID: u8 = 1;
/// Exit code when the policy could not be read at all.
const UNREADABLE: u8 = 2;

/// Runs `metalift validate`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let opts = LoadOptions {
        allow_insecure_owner: args.allow_insecure_owner,
    };
    let result = load(&args.path, &opts);
    let code = exit_code(&result);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report_json(&args, &result))?
        );
    } else {
        print!("{}", report_text(&args, &result));
    }
    Ok(ExitCode::from(code))
}

fn exit_code(result: &Result<Loaded, LoadError>) -> u8 {
    match result {
        Ok(_) => VALID,
        Err(LoadError::Invalid { .. }) => INVALID,
        Err(_) => UNREADABLE,
    }
}

fn counts(diagnostics: &[Diagnostic]) -> (usize, usize) {
    let errors = diagnostics.iter().filter(|d| d.is_error()).count();
    (errors, diagnostics.len() - errors)
}

fn plural(n: usize, word: &str) -> String {
    if n == 1 {
        format!("{n} {word}")
    } else {
        format!("{n} {word}s")
    }
}

/// Every diagnostic rendered with its line and underline, then a one-line summary.
fn report_text(args: &Args, result: &Result<Loaded, LoadError>) -> String {
    let path = args.path.display();
    let render = |diagnostics: &[Diagnostic], sources: &[Source]| {
        diagnostics
            .iter()
            .map(|d| format!("{}\n\n", d.render(sources)))
            .collect::<String>()
    };
    match result {
        Ok(loaded) => {
            let p = &loaded.policy;
            let extra = loaded.sources.len().saturating_sub(1);
            format!(
                "{}{path}: valid: {} and {} in {}{}, mode {}, {}; sha256 {}\n",
                render(&loaded.warnings, &loaded.sources),
                plural(p.rule_count(), "rule"),
                plural(p.profiles().len(), "profile"),
                plural(1 + extra, "file"),
                if extra > 0 { " (with policy.d/)" } else { "" },
                p.mode().as_str(),
                plural(loaded.warnings.len(), "warning"),
                p.sha256_hex(),
            )
        }
        Err(LoadError::Invalid {
            diagnostics,
            sources,
        }) => {
            let (errors, warnings) = counts(diagnostics);
            format!(
                "{}{path}: invalid: {}, {}\n",
                render(diagnostics, sources),
                plural(errors, "error"),
                plural(warnings, "warning")
            )
        }
        Err(e @ LoadError::NotFound { .. }) => {
            format!("{e} (metaliftd would run with no rules: everything stock)\n")
        }
        Err(e) => format!("{e}\n"),
    }
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

/// `{"path", "status": "valid"|"invalid"|"unreadable", "errors", "warnings",
/// "diagnostics": [...], "files": [...], "policy": {...}|null, "error": str|null}`.
fn report_json(args: &Args, result: &Result<Loaded, LoadError>) -> Value {
    let path = args.path.display().to_string();
    match result {
        Ok(loaded) => {
            let p = &loaded.policy;
            json!({
                "path": path,
                "status": "valid",
                "errors": 0,
                "warnings": loaded.warnings.len(),
                "diagnostics": loaded.warnings.iter().map(diagnostic_json).collect::<Vec<_>>(),
                "files": loaded.sources.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
                "policy": {
                    "sha256": p.sha256_hex(),
                    "mode": p.mode().as_str(),
                    "rules": p.rule_count(),
                    "profiles": p.profiles().keys().collect::<Vec<_>>(),
                },
                "error": null,
            })
        }
        Err(LoadError::Invalid {
            diagnostics,
            sources,
        }) => {
            let (errors, warnings) = counts(diagnostics);
            json!({
                "path": path,
                "status": "invalid",
                "errors": errors,
                "warnings": warnings,
                "diagnostics": diagnostics.iter().map(diagnostic_json).collect::<Vec<_>>(),
                "files": sources.iter().map(|s| s.name.clone()).collect::<Vec<_>>(),
                "policy": null,
                "error": null,
            })
        }
        Err(e) => json!({
            "path": path,
            "status": "unreadable",
            "errors": 0,
            "warnings": 0,
            "diagnostics": [],
            "files": [],
            "policy": null,
            "error": e.to_string(),
        }),
    }
}
