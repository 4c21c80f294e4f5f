//! `metalift audit --markdown`: a job's unlocks as a Markdown table (process,
//! rule, result), for `$GITHUB_STEP_SUMMARY` or a merge-request note. Only
//! processes a rule unlocked (or, in monitor mode, would have) are listed; the
//! rest of the view's filters (`--job`, `--since`, ...) choose which.

use std::io::{self, Write};

use super::join::Process;
use super::view::{guest, Columns};

/// Rows kept; past it the table says how many more there were (a step summary
/// is for reading, and GitHub caps its size at 1 MiB).
pub const MAX_ROWS: usize = 500;

/// The unlocks seen so far.
#[derive(Debug, Default)]
pub struct Table {
    rows: Vec<Process>,
    more: u64,
    columns: Columns,
}

impl Table {
    /// A table with a column for each host label in `labels` (`--show-label`).
    #[must_use]
    pub fn new(labels: &[String]) -> Table {
        Table {
            columns: Columns::new(labels),
            ..Table::default()
        }
    }

    /// Takes one joined process; keeps it when it was an unlock.
    pub fn add(&mut self, p: Process) {
        if p.action != "unlock" && p.action != "would-unlock" {
            return;
        }
        if self.rows.len() < MAX_ROWS {
            self.rows.push(p);
        } else {
            self.more += 1;
        }
    }

    /// Writes the heading and the table (or a sentence when there is none).
    pub fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "### metalift: GPU unlocks")?;
        writeln!(out)?;
        if self.rows.is_empty() {
            return writeln!(out, "No process was unlocked.");
        }
        let labels = self.columns.labels();
        let mut head = String::from("| Process | Guest |");
        for label in labels {
            head.push_str(&format!(" {} |", cell(label)));
        }
        writeln!(out, "{head} Rule | Result |")?;
        writeln!(out, "{}", "| --- ".repeat(4 + labels.len()) + "|")?;
        for p in &self.rows {
            let result = match (p.action.as_str(), p.reason.is_empty()) {
                ("would-unlock", _) => format!("would unlock (monitor); {}", p.result),
                (_, true) => p.result.clone(),
                (_, false) => format!("{} ({})", p.result, p.reason),
            };
            let mut row = format!(
                "| `{}` (pid {}) | {} |",
                cell(&p.exe),
                p.pid,
                cell(&guest(p))
            );
            for value in self.columns.label_values(p) {
                row.push_str(&format!(" {} |", cell(value)));
            }
            writeln!(
                out,
                "{row} {} | {} |",
                cell(p.rule.as_deref().unwrap_or("-")),
                cell(&result)
            )?;
        }
        if self.more > 0 {
            writeln!(out)?;
            writeln!(
                out,
                "… and {} more (`metalift audit` lists them all).",
                self.more
            )?;
        }
        Ok(())
    }
}

/// Text safe inside one table cell: `|` escaped, newlines and backticks replaced.
pub fn cell(text: &str) -> String {
    text.replace('|', "\\|")
        .replace(['\n', '\r'], " ")
        .replace('`', "'")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cell_cannot_break_the_table() {
        assert_eq!(cell("a|b\nc`d"), "a\\|b c'd");
    }
}
