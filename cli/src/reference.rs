//! Facts the CLI owns, written once and rendered everywhere they are shown: the
//! exit status table (`metalift --help`, metalift(1) and the guide's
//! `docs/src/reference/exit-codes.md`) and the command-line reference
//! (`docs/src/reference/cli.md`, from the same clap definitions as the man pages).
//!
//! Each row names the constant the command returns, so a code changes in one
//! place; `cli/tests/docs_facts.rs` checks the committed pages against these rows
//! and each command's own `--help`.

use std::fmt::Write as _;

use crate::{doctor, edit, exec, explain, report, status, validate, verify};

/// One exit status of one command (or of every command).
#[derive(Debug, Clone, Copy)]
pub struct ExitStatus {
    /// The status.
    pub code: u8,
    /// Who returns it: `every command`, a command's name, or a command and flag.
    pub command: &'static str,
    /// What it means, in the words `--help` prints.
    pub meaning: &'static str,
}

/// Every exit status `metalift` returns, in the order the table shows them.
pub const METALIFT_EXIT: &[ExitStatus] = &[
    ExitStatus {
        code: 0,
        command: "every command",
        meaning: "success; the answer is yes (valid policy, healthy daemon and installation, installed and live)",
    },
    ExitStatus {
        code: validate::INVALID,
        command: "validate",
        meaning: "the policy has errors (with --strict: warnings about its contents too)",
    },
    ExitStatus {
        code: explain::INVALID_POLICY,
        command: "explain",
        meaning: "the policy to explain with is invalid",
    },
    ExitStatus {
        code: doctor::WARNINGS,
        command: "doctor",
        meaning: "with --strict: warnings (it works, but something will surprise you); without it warnings exit 0",
    },
    ExitStatus {
        code: edit::DISCARDED,
        command: "edit",
        meaning: "the edit was invalid and discarded",
    },
    ExitStatus {
        code: verify::FAILED,
        command: "verify",
        meaning: "a kernel failed to compile, to run, or differed from the CPU (recorded: the profile stays stock)",
    },
    ExitStatus {
        code: report::ERROR,
        command: "every command",
        meaning: "usage or runtime error (an unreadable file or audit log, a lock held, no shim found)",
    },
    ExitStatus {
        code: doctor::FAILURES,
        command: "doctor",
        meaning: "failures: processes will run stock (the shim, the injection, the policy file); when the daemon's state is what fails, its ladder status instead (3, 4, 5 as `status`)",
    },
    ExitStatus {
        code: crate::audit::MATRIX_GATE,
        command: "audit --matrix",
        meaning: "with --require-verified or --fail-on-failed: a row of the matrix has no passing verification, or a failed process (each named on stderr)",
    },
    ExitStatus {
        code: crate::audit::NO_RECORDS,
        command: "audit",
        meaning: "the input is not empty but holds no audit record (not a metalift log, or a format it does not read): the first offending line is named with its file and line",
    },
    ExitStatus {
        code: crate::judgement::EXIT_DISK_NOT_LIVE,
        command: "doctor",
        meaning: "the daemon's state fails as `status` exits 3: the file on disk is not live",
    },
    ExitStatus {
        code: status::EXIT_DISK_NOT_LIVE,
        command: "status",
        meaning: "the daemon refused the file on disk or has not loaded it (the last good policy is live and unlocks)",
    },
    ExitStatus {
        code: crate::judgement::EXIT_DISK_NOT_LIVE,
        command: "explain --live",
        meaning: "explained, but the daemon's state is not healthy: its ladder status as `status` (3, 4, 5), the cause on stderr",
    },
    ExitStatus {
        code: edit::NOT_LIVE,
        command: "edit",
        meaning: "installed, but metaliftd refused it, did not make it live in time, or did not answer",
    },
    ExitStatus {
        code: status::EXIT_DEGRADED,
        command: "status",
        meaning: "degraded: it unlocks, but not all its policy says (policy.toml is missing, a require_verified profile is unverified or the verification file refused, audit records have waited for the collector longer than max_delay_seconds, or the daemon reports no health: unknown, never healthy), the cause printed first",
    },
    ExitStatus {
        code: crate::judgement::EXIT_DEGRADED,
        command: "doctor",
        meaning: "the daemon's state fails as `status` exits 4: degraded",
    },
    ExitStatus {
        code: exec::NOT_UNLOCKED,
        command: "exec --require-unlock",
        meaning: "the command succeeded, but no process of its tree got an unlock with the shim's outcome applied (and the family --expect-family asks), as the audit log records it (or it could not be learned); a command that fails keeps its own status",
    },
    ExitStatus {
        code: edit::NOT_INSTALLED,
        command: "edit",
        meaning: "not installed: the file changed during the edit (the edited copy is kept beside it)",
    },
    ExitStatus {
        code: status::EXIT_UNLOCKS_NOTHING,
        command: "status",
        meaning: "it unlocks nothing, the cause printed first: no daemon answers on the socket (or not in time), no policy has been live since it started, or the audit log cannot take records; never milder than degraded",
    },
    ExitStatus {
        code: crate::judgement::EXIT_UNLOCKS_NOTHING,
        command: "doctor",
        meaning: "the daemon's state fails as `status` exits 5: it unlocks nothing",
    },
    ExitStatus {
        code: exec::UNLOCKS_NOTHING,
        command: "exec --require-unlock",
        meaning: "no unlock, and the daemon unlocks nothing (as `status` exits 5), the cause printed",
    },
    ExitStatus {
        code: exec::NOT_EXECUTABLE,
        command: "exec",
        meaning: "the command is not executable",
    },
    ExitStatus {
        code: exec::NOT_FOUND,
        command: "exec",
        meaning: "the command was not found",
    },
];

/// metaliftd's exit statuses (the daemon binary returns them; its man page and the
/// guide show this table). `cli/tests/docs_facts.rs` provokes the start failures.
pub const METALIFTD_EXIT: &[ExitStatus] = &[
    ExitStatus {
        code: 0,
        command: "metaliftd",
        meaning: "stopped on SIGTERM or SIGINT after finishing the requests in flight",
    },
    ExitStatus {
        code: 1,
        command: "metaliftd",
        meaning: "could not start for another reason (bad flags: 2, from the argument parser)",
    },
    ExitStatus {
        code: 73,
        command: "metaliftd",
        meaning: "could not create or listen on the Unix socket (directory, permissions, in use)",
    },
    ExitStatus {
        code: 74,
        command: "metaliftd",
        meaning: "could not open the audit log for appending, or another metaliftd writes it (holds its lock, `<log>.lock`)",
    },
    ExitStatus {
        code: 78,
        command: "metaliftd",
        meaning:
            "no usable configuration (e.g. no --socket and no $XDG_RUNTIME_DIR for a user's daemon)",
    },
];

/// What `metalift exec` returns when it ran the command (not a row: any number).
const EXEC_PASSES_THROUGH: &str =
    "returns the command's own exit status otherwise (128+N when killed by signal N).";

/// The exit status text of `metalift --help` and metalift(1).
#[must_use]
pub fn exit_status_help() -> String {
    let mut text =
        String::from("Exit status (every command; each command's --help says which apply):\n");
    for row in METALIFT_EXIT {
        let _ = writeln!(text, "  {:<4} {}: {}", row.code, row.command, row.meaning);
    }
    let _ = writeln!(text, "exec {EXEC_PASSES_THROUGH}");
    let _ = writeln!(
        text,
        "With --json, an error is one object on stdout: {}.",
        report::json_error("...", report::ERROR)
    );
    text.push_str("NO_COLOR (any non-empty value) turns colour off.");
    text
}

/// The exit status text of metaliftd(8).
#[must_use]
pub fn metaliftd_exit_help() -> String {
    let mut text = String::from("Exit status:\n");
    for row in METALIFTD_EXIT {
        let _ = writeln!(text, "  {:<2} {}", row.code, row.meaning);
    }
    text.push_str(
        "NO_COLOR (any non-empty value) turns colour off on stderr; colour is used only at a terminal.",
    );
    text
}

/// `docs/src/reference/exit-codes.md`.
#[must_use]
pub fn exit_codes_page() -> String {
    let mut page = String::from(
        "# Exit codes\n\n\
         <!-- Generated by `metalift __generate-docs .` from cli/src/reference.rs: do not edit. -->\n\n\
         Every exit status, written once: `metalift --help`, the man pages and this page \
         are generated from the same table, and `cli/tests/docs_facts.rs` checks it \
         against each command's behaviour and its own `--help`.\n\n\
         ## metalift\n\n\
         | code | command | meaning |\n|---|---|---|\n",
    );
    for row in METALIFT_EXIT {
        let _ = writeln!(
            page,
            "| {} | `{}` | {} |",
            row.code,
            row.command,
            cell(row.meaning)
        );
    }
    let _ = write!(
        page,
        "\n`metalift exec` {EXEC_PASSES_THROUGH}\n\n\
         With `--json`, an error ends the command with one object on stdout, \
         `{}`, where `code` is the exit status \
         ([JSON output](json.md#the-error-object)).\n\n\
         ## metaliftd\n\n\
         | code | meaning |\n|---|---|\n",
        report::json_error("…", report::ERROR)
    );
    for row in METALIFTD_EXIT {
        let _ = writeln!(page, "| {} | {} |", row.code, cell(row.meaning));
    }
    page
}

/// `docs/src/reference/cli.md`: every flag of metaliftd and of each `metalift`
/// command, with its default, from the definitions that parse them.
#[must_use]
pub fn cli_page(metalift: &clap::Command, metaliftd: &clap::Command) -> String {
    let mut page = String::from(
        "# Command-line reference\n\n\
         <!-- Generated by `metalift __generate-docs .` from the clap definitions: do not edit. -->\n\n\
         Every flag of `metaliftd` and of each `metalift` command, with its default, as \
         the programs define them (the same definitions give `--help` and the man pages). \
         Flags that exist only on macOS (`metaliftd --mach-service`, `--no-xpc`) are \
         described in [Running on your own paths](../configuration.md#metaliftd). \
         Exit codes: [reference](exit-codes.md).\n",
    );
    command_section(&mut page, "metaliftd", metaliftd);
    for sub in metalift.get_subcommands().filter(|s| !s.is_hide_set()) {
        command_sections(&mut page, &format!("metalift {}", sub.get_name()), sub);
    }
    page
}

/// `cmd`'s section, then one for each of its subcommands (`metalift audit flush`),
/// at any depth: every command a user can type has its section.
fn command_sections(page: &mut String, name: &str, cmd: &clap::Command) {
    command_section(page, name, cmd);
    for sub in cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
    {
        command_sections(page, &format!("{name} {}", sub.get_name()), sub);
    }
}

/// metaliftd's flags that exist only in a macOS build (`#[cfg]` fields of
/// `DaemonArgs`). Left out of the generated page so it is the same whichever
/// platform generates it; configuration.md describes them.
const MACOS_ONLY: [&str; 2] = ["mach_service", "no_xpc"];

/// One `## name` section: what it does, its usage, its options and its epilogue.
fn command_section(page: &mut String, name: &str, cmd: &clap::Command) {
    let mut cmd = cmd.clone().bin_name(name.to_owned());
    let _ = write!(page, "\n## {name}\n\n");
    if let Some(about) = cmd.get_about() {
        let _ = writeln!(page, "{}\n", cell(&about.to_string()));
    }
    let usage = cmd.render_usage().to_string();
    let _ = writeln!(page, "```text\n{}\n```\n", usage.trim());
    let args: Vec<&clap::Arg> = cmd
        .get_arguments()
        .filter(|a| {
            let id = a.get_id().as_str();
            !a.is_hide_set() && !matches!(id, "help" | "version") && !MACOS_ONLY.contains(&id)
        })
        .collect();
    if !args.is_empty() {
        page.push_str("| option | meaning | default |\n|---|---|---|\n");
        for arg in args {
            let _ = writeln!(
                page,
                "| `{}` | {} | {} |",
                spelling(arg),
                cell(&meaning(arg)),
                default(arg)
            );
        }
    }
    if let Some(after) = cmd.get_after_help() {
        let _ = writeln!(page, "\n```text\n{}\n```", after.to_string().trim_end());
    }
}

/// How an argument is typed: `--socket <PATH>`, `-n, --lines <N>`, `<COMMAND>...`.
fn spelling(arg: &clap::Arg) -> String {
    let values = arg
        .get_value_names()
        .map(|names| {
            names
                .iter()
                .map(|n| format!("<{n}>"))
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or_else(|| format!("<{}>", arg.get_id().as_str().to_uppercase()));
    if arg.is_positional() {
        let many = matches!(arg.get_num_args(), Some(r) if r.max_values() > 1);
        return if many { format!("{values}...") } else { values };
    }
    let mut s = String::new();
    if let Some(short) = arg.get_short() {
        let _ = write!(s, "-{short}, ");
    }
    if let Some(long) = arg.get_long() {
        let _ = write!(s, "--{long}");
    }
    if arg.get_action().takes_values() {
        let _ = write!(s, " {values}");
    }
    s
}

/// The argument's help, with its possible values.
fn meaning(arg: &clap::Arg) -> String {
    let mut text = arg
        .get_long_help()
        .or_else(|| arg.get_help())
        .map(|h| h.to_string().replace('\n', " "))
        .unwrap_or_default();
    let possible: Vec<String> = arg
        .get_possible_values()
        .iter()
        .filter(|v| !v.is_hide_set())
        .map(|v| format!("`{}`", v.get_name()))
        .collect();
    if !possible.is_empty() && arg.get_action().takes_values() {
        let _ = write!(text, " (one of {})", possible.join(", "));
    }
    text
}

/// The default, as clap shows it, or nothing.
fn default(arg: &clap::Arg) -> String {
    if !arg.get_action().takes_values() {
        return String::new();
    }
    let values: Vec<String> = arg
        .get_default_values()
        .iter()
        .map(|v| v.to_string_lossy().into_owned())
        .collect();
    if values.is_empty() {
        String::new()
    } else {
        format!("`{}`", values.join(" "))
    }
}

/// Text made safe for one Markdown table cell (no pipe, no HTML tag). Inside a
/// code span (between backticks) an entity is shown as written, so `<` and `>`
/// stay as they are there: a code span is never read as HTML.
fn cell(text: &str) -> String {
    text.split('`')
        .enumerate()
        .map(|(i, part)| {
            let part = part.replace('|', "\\|");
            if i % 2 == 1 {
                part
            } else {
                part.replace('<', "&lt;").replace('>', "&gt;")
            }
        })
        .collect::<Vec<_>>()
        .join("`")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_code_has_one_meaning_per_command() {
        let mut seen = std::collections::HashSet::new();
        for row in METALIFT_EXIT.iter().chain(METALIFTD_EXIT) {
            assert!(
                seen.insert((row.code, row.command)),
                "{} {}: twice",
                row.command,
                row.code
            );
        }
    }

    #[test]
    fn a_table_cell_cannot_break_the_table() {
        assert_eq!(cell("a|b <PATH>"), "a\\|b &lt;PATH&gt;");
        // In a code span an entity would show literally (issue 43: `&lt;log&gt;.lock`).
        assert_eq!(
            cell("its lock, `<log>.lock` <x>"),
            "its lock, `<log>.lock` &lt;x&gt;"
        );
    }
}
