//! How `metalift` ends on an error: one line on stderr, or, when the command was
//! asked for `--json`, one stable JSON object on stdout,
//! `{"code":N,"error":"…","ok":false}` (keys in that order), where `code` is the
//! exit status.

use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;

/// Exit status for a usage or runtime error (contract: every `metalift` command).
pub const ERROR: u8 = 2;

/// Whether the command line asks for JSON: a `--json` before any `--`. Never for
/// `metalift exec`, which has no `--json`: its arguments belong to the command it runs.
#[must_use]
pub fn wants_json(args: &[OsString]) -> bool {
    if args.get(1).is_some_and(|a| a.as_os_str() == "exec") {
        return false;
    }
    args.iter()
        .skip(1)
        .take_while(|a| a.as_os_str() != "--")
        .any(|a| a.as_os_str() == "--json")
}

/// The JSON error object.
#[must_use]
pub fn json_error(message: &str, code: u8) -> String {
    serde_json::json!({ "ok": false, "error": message, "code": code }).to_string()
}

/// Ends on `err` (exit 2): text on stderr, or the JSON object on stdout.
pub fn error(err: &anyhow::Error, json: bool) -> ExitCode {
    if json {
        let _ = writeln!(
            std::io::stdout(),
            "{}",
            json_error(&metalift_daemon::service::error_chain::describe(err), ERROR)
        );
    } else {
        eprintln!(
            "metalift: error: {}",
            metalift_daemon::service::error_chain::describe(err)
        );
    }
    ExitCode::from(ERROR)
}

/// Ends on a command-line error from clap; help and version print as usual.
pub fn usage(err: clap::Error, json: bool) -> ExitCode {
    use clap::error::ErrorKind;
    let informational = matches!(
        err.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if !json || informational {
        err.exit();
    }
    let text = err.render().to_string();
    let first = text
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("usage error")
        .trim_start_matches("error: ");
    let _ = writeln!(std::io::stdout(), "{}", json_error(first, ERROR));
    ExitCode::from(ERROR)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_after_a_double_dash_belongs_to_the_child() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(wants_json(&args(&["metalift", "validate", "--json"])));
        assert!(!wants_json(&args(&[
            "metalift", "exec", "--", "p", "--json"
        ])));
    }

    #[test]
    fn the_error_object_has_ok_error_and_code() {
        let v: serde_json::Value = serde_json::from_str(&json_error("boom", 2)).unwrap();
        assert_eq!(
            v,
            serde_json::json!({"ok": false, "error": "boom", "code": 2})
        );
    }
}
