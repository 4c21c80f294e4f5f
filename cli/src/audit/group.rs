//! `metalift audit --summary --by KEY[,KEY]`: the fleet's processes counted by
//! guest, image, job, rule, executable, chip, macOS build or result: processes,
//! unlocked, applied, failed (with the most frequent reasons), stock, no outcome.
//! Memory grows with the number of groups, not with the records read.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde_json::json;

use super::join::{Process, NO_OUTCOME};
use super::view::BOOT_PREFIX;

/// Failure reasons listed per group, at most.
const TOP_REASONS: usize = 3;

/// Distinct failure reasons counted per group, at most (the rest are "other").
const MAX_REASONS: usize = 64;

/// One `--by` key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Key {
    /// The guest's host name.
    Host,
    /// The guest's boot id (its first characters).
    Boot,
    /// An `[audit.labels]` value.
    Label(String),
    /// The CI job the process claimed (its values, joined).
    Job,
    /// The winning rule.
    Rule,
    /// The executable.
    Exe,
    /// The host chip the daemon decided on.
    Chip,
    /// The macOS build of the guest.
    Os,
    /// What the shim did.
    Result,
}

/// The words `--by` takes.
pub const KEYS: &str = "host, boot, label:NAME, job, rule, exe, chip, os, result";

/// Parses one `--by` key.
pub fn parse_key(word: &str) -> Result<Key, String> {
    Ok(match word {
        "host" => Key::Host,
        "boot" => Key::Boot,
        "job" => Key::Job,
        "rule" => Key::Rule,
        "exe" => Key::Exe,
        "chip" => Key::Chip,
        "os" => Key::Os,
        "result" => Key::Result,
        _ => match word.strip_prefix("label:") {
            Some(name) if !name.is_empty() => Key::Label(name.to_owned()),
            _ => return Err(format!("{word:?} is not one of: {KEYS}")),
        },
    })
}

impl Key {
    /// The column's title.
    fn title(&self) -> String {
        match self {
            Key::Label(name) => format!("label:{name}"),
            other => format!("{other:?}").to_lowercase(),
        }
    }

    /// `p`'s value for this key (`-` when it has none).
    fn of(&self, p: &Process) -> String {
        let host = p.host.as_ref();
        let value = match self {
            Key::Host => host.map(|h| h.name.clone()),
            Key::Boot => host
                .and_then(|h| h.boot_id.as_deref())
                .map(|b| b.chars().take(BOOT_PREFIX).collect()),
            Key::Label(name) => host.and_then(|h| h.labels.get(name).cloned()),
            Key::Job => {
                (!p.job.is_empty()).then(|| p.job.values().cloned().collect::<Vec<_>>().join(","))
            }
            Key::Rule => p.rule.clone(),
            Key::Exe => Some(p.exe.clone()),
            Key::Chip => p.host_chip.clone(),
            Key::Os => host.and_then(|h| h.os_build.clone()),
            Key::Result => Some(p.result.clone()),
        };
        value.unwrap_or_else(|| "-".to_owned())
    }
}

/// The counts of one group.
#[derive(Debug, Default, Clone, serde::Serialize)]
struct Counts {
    processes: u64,
    unlocked: u64,
    applied: u64,
    failed: u64,
    stock: u64,
    no_outcome: u64,
    #[serde(skip)]
    reasons: BTreeMap<String, u64>,
}

impl Counts {
    fn add(&mut self, p: &Process) {
        self.processes += 1;
        if p.action == "unlock" {
            self.unlocked += 1;
        }
        match p.result.as_str() {
            "applied" => self.applied += 1,
            "stock" => self.stock += 1,
            NO_OUTCOME => self.no_outcome += 1,
            "failed" => {
                self.failed += 1;
                let reason =
                    if self.reasons.len() < MAX_REASONS || self.reasons.contains_key(&p.reason) {
                        p.reason.clone()
                    } else {
                        "(other)".to_owned()
                    };
                *self.reasons.entry(reason).or_default() += 1;
            }
            _ => {}
        }
    }

    /// The most frequent failure reasons, most first.
    fn top_reasons(&self) -> Vec<(&str, u64)> {
        let mut all: Vec<(&str, u64)> =
            self.reasons.iter().map(|(r, n)| (r.as_str(), *n)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
        all.truncate(TOP_REASONS);
        all
    }
}

/// The groups counted so far.
#[derive(Debug)]
pub struct Grouped {
    keys: Vec<Key>,
    groups: BTreeMap<Vec<String>, Counts>,
}

impl Grouped {
    /// Counts by `keys`, in that order.
    #[must_use]
    pub fn new(keys: Vec<Key>) -> Grouped {
        Grouped {
            keys,
            groups: BTreeMap::new(),
        }
    }

    /// Counts one process.
    pub fn add(&mut self, p: &Process) {
        let key: Vec<String> = self.keys.iter().map(|k| k.of(p)).collect();
        self.groups.entry(key).or_default().add(p);
    }

    /// The groups, most processes first.
    fn sorted(&self) -> Vec<(&Vec<String>, &Counts)> {
        let mut rows: Vec<_> = self.groups.iter().collect();
        rows.sort_by(|a, b| b.1.processes.cmp(&a.1.processes).then(a.0.cmp(b.0)));
        rows
    }

    fn reasons_text(c: &Counts) -> String {
        c.top_reasons()
            .iter()
            .map(|(r, n)| format!("{n}× {}", if r.is_empty() { "(no reason)" } else { r }))
            .collect::<Vec<_>>()
            .join("; ")
    }

    /// A text table.
    pub fn write_text(&self, out: &mut dyn Write) -> io::Result<()> {
        let titles: Vec<String> = self.keys.iter().map(|k| k.title().to_uppercase()).collect();
        let mut widths: Vec<usize> = titles.iter().map(String::len).collect();
        for key in self.groups.keys() {
            for (w, v) in widths.iter_mut().zip(key) {
                *w = (*w).max(v.chars().count());
            }
        }
        for (t, w) in titles.iter().zip(&widths) {
            write!(out, "{t:<w$}  ")?;
        }
        writeln!(
            out,
            "{:>9}  {:>8}  {:>7}  {:>6}  {:>6}  {:>10}  TOP FAILURES",
            "PROCESSES", "UNLOCKED", "APPLIED", "FAILED", "STOCK", "NO OUTCOME"
        )?;
        for (key, c) in self.sorted() {
            for (v, w) in key.iter().zip(&widths) {
                write!(out, "{v:<w$}  ")?;
            }
            writeln!(
                out,
                "{:>9}  {:>8}  {:>7}  {:>6}  {:>6}  {:>10}  {}",
                c.processes,
                c.unlocked,
                c.applied,
                c.failed,
                c.stock,
                c.no_outcome,
                Self::reasons_text(c)
            )?;
        }
        Ok(())
    }

    /// One JSON object: `by` (the keys) and `groups`, most processes first.
    pub fn write_json(&self, out: &mut dyn Write) -> io::Result<()> {
        let groups: Vec<_> = self
            .sorted()
            .into_iter()
            .map(|(key, c)| {
                let named: serde_json::Map<String, serde_json::Value> = self
                    .keys
                    .iter()
                    .zip(key)
                    .map(|(k, v)| (k.title(), json!(v)))
                    .collect();
                let reasons: Vec<_> = c
                    .top_reasons()
                    .into_iter()
                    .map(|(reason, count)| json!({"reason": reason, "count": count}))
                    .collect();
                json!({"key": named, "counts": c, "top_failures": reasons})
            })
            .collect();
        let by: Vec<String> = self.keys.iter().map(Key::title).collect();
        serde_json::to_writer(&mut *out, &json!({"by": by, "groups": groups}))?;
        writeln!(out)
    }

    /// A Markdown table.
    pub fn write_markdown(&self, out: &mut dyn Write) -> io::Result<()> {
        let titles: Vec<String> = self.keys.iter().map(Key::title).collect();
        writeln!(
            out,
            "| {} | Processes | Unlocked | Applied | Failed | Stock | No outcome | Top failures |",
            titles.join(" | ")
        )?;
        writeln!(out, "{}|", "| --- ".repeat(titles.len() + 7))?;
        for (key, c) in self.sorted() {
            let cells: Vec<String> = key.iter().map(|v| super::markdown::cell(v)).collect();
            writeln!(
                out,
                "| {} | {} | {} | {} | {} | {} | {} | {} |",
                cells.join(" | "),
                c.processes,
                c.unlocked,
                c.applied,
                c.failed,
                c.stock,
                c.no_outcome,
                super::markdown::cell(&Self::reasons_text(c))
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_documented_key_parses_and_others_are_refused_with_the_list() {
        for word in KEYS.split(", ") {
            let word = word.replace("NAME", "image");
            assert!(parse_key(&word).is_ok(), "{word}");
        }
        assert!(parse_key("label:").unwrap_err().contains("label:NAME"));
        assert!(parse_key("colour").is_err());
    }
}
