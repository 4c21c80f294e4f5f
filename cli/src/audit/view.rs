//! How the joined view prints: one text line per process (fixed columns, the
//! executable last), one JSON object per process, and the `--summary` counts.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde_json::json;

use super::join::Process;

/// Characters of the policy hash shown in text.
const HASH_PREFIX: usize = 12;

/// Characters of the boot id shown in the GUEST column.
pub const BOOT_PREFIX: usize = 8;

/// The columns chosen on the command line: the host labels `--show-label` names.
#[derive(Debug, Default, Clone)]
pub struct Columns {
    labels: Vec<String>,
}

impl Columns {
    /// The view with these label columns.
    #[must_use]
    pub fn new(labels: &[String]) -> Columns {
        Columns {
            labels: labels.to_vec(),
        }
    }

    /// The label names, in order.
    #[must_use]
    pub fn labels(&self) -> &[String] {
        &self.labels
    }

    /// The value of each label column for `p` (`-` when the guest has none).
    #[must_use]
    pub fn label_values<'p>(&self, p: &'p Process) -> Vec<&'p str> {
        self.labels
            .iter()
            .map(|key| {
                p.host
                    .as_ref()
                    .and_then(|h| h.labels.get(key))
                    .map_or("-", String::as_str)
            })
            .collect()
    }
}

/// The guest as one word: its clone's name (`host.instance`) or else host name,
/// and the start of its boot id (`-` when the record has no host part).
#[must_use]
pub fn guest(p: &Process) -> String {
    match &p.host {
        None => "-".to_owned(),
        Some(h) => {
            let boot: String = h
                .boot_id
                .as_deref()
                .unwrap_or("?")
                .chars()
                .take(BOOT_PREFIX)
                .collect();
            format!("{}/{boot}", h.instance.as_deref().unwrap_or(&h.name))
        }
    }
}

/// Writes the header of the text view.
pub fn header(out: &mut dyn Write, columns: &Columns) -> io::Result<()> {
    write!(
        out,
        "{:<20}  {:<24}  {:>7}  {:<20}  {:<12}  {:<10}  {:<12}",
        "TIME", "GUEST", "PID", "RULE", "ACTION", "RESULT", "POLICY"
    )?;
    for label in columns.labels() {
        write!(out, "  {:<12}", label.to_uppercase())?;
    }
    writeln!(out, "  EXE")
}

/// Writes one process as a text line (and why, when it is failed or stock).
pub fn line(out: &mut dyn Write, p: &Process, columns: &Columns) -> io::Result<()> {
    let policy: String = p
        .policy_sha256
        .as_deref()
        .unwrap_or("-")
        .chars()
        .take(HASH_PREFIX)
        .collect();
    let mut why = if p.reason.is_empty() {
        String::new()
    } else {
        format!("  ({})", p.reason)
    };
    if let Some(other) = &p.other_shim {
        why.push_str(&format!(
            "  [other shim {} patched {} metalift]",
            other.image, other.patched
        ));
    }
    if !p.job.is_empty() {
        let claims: Vec<String> = p.job.iter().map(|(k, v)| format!("{k}={v}")).collect();
        why.push_str(&format!("  [job {}]", claims.join(" ")));
    }
    write!(
        out,
        "{:<20}  {:<24}  {:>7}  {:<20}  {:<12}  {:<10}  {:<12}",
        humantime::format_rfc3339_seconds(p.time).to_string(),
        guest(p),
        p.pid,
        p.rule.as_deref().unwrap_or("-"),
        p.action,
        p.result,
        policy,
    )?;
    for value in columns.label_values(p) {
        write!(out, "  {value:<12}")?;
    }
    writeln!(out, "  {}{why}", p.exe)
}

/// Writes one process as one JSON object on its own line.
pub fn json_line(out: &mut dyn Write, p: &Process) -> io::Result<()> {
    serde_json::to_writer(&mut *out, p)?;
    writeln!(out)
}

/// `--summary`: counts by result, rule and executable. Memory grows with the
/// number of distinct rules and executables, not with the log.
#[derive(Debug, Default)]
pub struct Summary {
    processes: u64,
    by_result: BTreeMap<String, u64>,
    by_rule: BTreeMap<String, u64>,
    by_exe: BTreeMap<String, u64>,
}

impl Summary {
    /// Counts one process.
    pub fn add(&mut self, p: &Process) {
        self.processes += 1;
        *self.by_result.entry(p.result.clone()).or_default() += 1;
        let rule = p.rule.clone().unwrap_or_else(|| "(no rule)".to_owned());
        *self.by_rule.entry(rule).or_default() += 1;
        *self.by_exe.entry(p.exe.clone()).or_default() += 1;
    }

    /// The counts as text, largest first.
    pub fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        writeln!(out, "processes  {}", self.processes)?;
        for (title, counts) in [
            ("by result", &self.by_result),
            ("by rule", &self.by_rule),
            ("by executable", &self.by_exe),
        ] {
            writeln!(out, "{title}")?;
            let mut sorted: Vec<_> = counts.iter().collect();
            sorted.sort_by(|a, b| b.1.cmp(a.1).then(a.0.cmp(b.0)));
            for (name, n) in sorted {
                writeln!(out, "  {n:>8}  {name}")?;
            }
        }
        Ok(())
    }

    /// The counts as one JSON object.
    pub fn write_json(&self, out: &mut dyn Write) -> io::Result<()> {
        let value = json!({
            "processes": self.processes,
            "by_result": self.by_result,
            "by_rule": self.by_rule,
            "by_exe": self.by_exe,
        });
        serde_json::to_writer(&mut *out, &value)?;
        writeln!(out)
    }
}
