//! `metalift audit --matrix`: the validated matrix. One row per host chip × macOS
//! build × image × executable, from the records a fleet already writes: its
//! processes applied / failed / stock (the joined view), the last verification of
//! that chip, build and image (`metalift verify`'s `verification` records: pass or
//! fail, when, which metalift) and the workload speed-ups `verify --workload`
//! measured there (prompt processing and generation: min and median). In text,
//! Markdown, JSON, or one self-contained HTML page (no script, no network) to
//! publish from CI; `--require-verified` and `--fail-on-failed` make it a gate.
//!
//! Memory grows with the rows and the verifications' speed-ups kept (at most
//! [`MAX_SPEEDUPS`] per chip, build and image), not with the records read.

use std::collections::BTreeMap;
use std::io::{self, Write};
use std::time::SystemTime;

use serde::Serialize;

use super::join::{Process, NO_OUTCOME};
use metalift_daemon::audit::verification::VerificationRecord;
use metalift_daemon::audit::Host;

/// Speed-ups kept per chip, build and image (the most recent).
pub const MAX_SPEEDUPS: usize = 1000;

/// Chip, macOS build, image: where a verification holds.
type Machine = (String, String, String);

/// One row's counts.
#[derive(Debug, Default, Clone, Serialize)]
struct Counts {
    processes: u64,
    applied: u64,
    failed: u64,
    stock: u64,
    no_outcome: u64,
}

/// What the verifications of one chip, build and image say.
#[derive(Debug, Default, Clone)]
struct Verified {
    /// The latest: when, passed, the metalift version.
    last: Option<(SystemTime, bool, String)>,
    pp: Vec<f64>,
    tg: Vec<f64>,
}

/// The matrix being built.
#[derive(Debug)]
pub struct Matrix {
    /// The host label naming the image (`--image-label`).
    image_label: String,
    rows: BTreeMap<(Machine, String), Counts>,
    verified: BTreeMap<Machine, Verified>,
}

/// One row as printed and as JSON.
#[derive(Debug, Serialize)]
pub struct Row {
    /// The host chip the daemon decided on.
    pub chip: String,
    /// The guest's macOS build.
    pub os_build: String,
    /// The image label's value.
    pub image: String,
    /// The executable.
    pub exe: String,
    /// Processes counted, by result.
    #[serde(flatten)]
    counts: Counts,
    /// `pass`, `fail`, or `none` (no verification of this chip, build and image).
    pub verification: String,
    /// When the last verification ran (RFC 3339).
    pub verified_at: Option<String>,
    /// The metalift version that ran it.
    pub verified_by: Option<String>,
    /// Prompt-processing speed-ups measured: min and median.
    pub pp_speedup: Option<[f64; 2]>,
    /// Generation speed-ups measured: min and median.
    pub tg_speedup: Option<[f64; 2]>,
    /// A failed process or a failed last verification.
    pub marked: bool,
}

fn or_dash(value: Option<&str>) -> String {
    value.filter(|v| !v.is_empty()).unwrap_or("-").to_owned()
}

fn min_median(values: &[f64]) -> Option<[f64; 2]> {
    if values.is_empty() {
        return None;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    Some([sorted[0], sorted[sorted.len() / 2]])
}

impl Matrix {
    /// A matrix whose image column is the host label `image_label`.
    #[must_use]
    pub fn new(image_label: &str) -> Matrix {
        Matrix {
            image_label: image_label.to_owned(),
            rows: BTreeMap::new(),
            verified: BTreeMap::new(),
        }
    }

    fn image_of(&self, host: Option<&Host>) -> String {
        or_dash(
            host.and_then(|h| h.labels.get(&self.image_label))
                .map(String::as_str),
        )
    }

    /// Counts one process in its row.
    pub fn add(&mut self, p: &Process) {
        let machine = (
            or_dash(p.host_chip.as_deref()),
            or_dash(p.host.as_ref().and_then(|h| h.os_build.as_deref())),
            self.image_of(p.host.as_ref()),
        );
        let c = self.rows.entry((machine, p.exe.clone())).or_default();
        c.processes += 1;
        match p.result.as_str() {
            "applied" => c.applied += 1,
            "failed" => c.failed += 1,
            "stock" => c.stock += 1,
            NO_OUTCOME => c.no_outcome += 1,
            _ => {}
        }
    }

    /// Takes a `verification` record written on the guest `host`.
    pub fn verification(&mut self, v: &VerificationRecord, host: Option<&Host>) {
        let machine = (
            or_dash(v.host_chip.as_deref()),
            or_dash(v.os_build.as_deref()),
            self.image_of(host),
        );
        let entry = self.verified.entry(machine).or_default();
        if entry.last.as_ref().is_none_or(|(t, ..)| *t <= v.time) {
            entry.last = Some((v.time, v.passed, v.metalift_version.clone()));
        }
        if let Some(w) = v.receipt.as_ref().and_then(|r| r.workload.as_ref()) {
            for (kept, measure) in [
                (&mut entry.pp, &w.pp_speedup),
                (&mut entry.tg, &w.tg_speedup),
            ] {
                if let Some(m) = measure {
                    if kept.len() >= MAX_SPEEDUPS {
                        kept.remove(0);
                    }
                    kept.push(m.0);
                }
            }
        }
    }

    /// The rows, by chip, build, image and executable.
    #[must_use]
    pub fn rows(&self) -> Vec<Row> {
        self.rows
            .iter()
            .map(|((machine, exe), counts)| {
                let v = self.verified.get(machine);
                let last = v.and_then(|v| v.last.as_ref());
                let verification = match last {
                    None => "none",
                    Some((_, true, _)) => "pass",
                    Some((_, false, _)) => "fail",
                };
                Row {
                    chip: machine.0.clone(),
                    os_build: machine.1.clone(),
                    image: machine.2.clone(),
                    exe: exe.clone(),
                    counts: counts.clone(),
                    verification: verification.to_owned(),
                    verified_at: last
                        .map(|(t, ..)| humantime::format_rfc3339_seconds(*t).to_string()),
                    verified_by: last.map(|(.., version)| version.clone()),
                    pp_speedup: v.and_then(|v| min_median(&v.pp)),
                    tg_speedup: v.and_then(|v| min_median(&v.tg)),
                    marked: counts.failed > 0 || verification == "fail",
                }
            })
            .collect()
    }

    /// Whether a gate fails: a row with a failed process (`fail_on_failed`), or
    /// whose chip, build and image has no passing last verification (`require_verified`).
    #[must_use]
    pub fn gate_fails(&self, require_verified: bool, fail_on_failed: bool) -> Vec<String> {
        let mut why = Vec::new();
        for r in self.rows() {
            let at = format!("{} / {} / {} / {}", r.chip, r.os_build, r.image, r.exe);
            if fail_on_failed && r.counts.failed > 0 {
                why.push(format!("{at}: {} failed", r.counts.failed));
            }
            if require_verified && r.verification != "pass" {
                why.push(format!("{at}: verification {}", r.verification));
            }
        }
        why
    }
}

fn speedup(s: Option<[f64; 2]>) -> String {
    s.map_or_else(
        || "-".to_owned(),
        |[min, med]| format!("{min:.1}× / {med:.1}×"),
    )
}

fn verification_text(r: &Row) -> String {
    match (&r.verified_at, &r.verified_by) {
        (Some(at), Some(by)) => format!("{} {at} (metalift {by})", r.verification),
        _ => r.verification.clone(),
    }
}

const TITLES: [&str; 11] = [
    "chip",
    "macOS",
    "image",
    "executable",
    "processes",
    "applied",
    "failed",
    "stock",
    "verification",
    "pp speed-up (min / median)",
    "tg speed-up (min / median)",
];

fn cells(r: &Row) -> [String; 11] {
    [
        r.chip.clone(),
        r.os_build.clone(),
        r.image.clone(),
        r.exe.clone(),
        r.counts.processes.to_string(),
        r.counts.applied.to_string(),
        r.counts.failed.to_string(),
        r.counts.stock.to_string(),
        verification_text(r),
        speedup(r.pp_speedup),
        speedup(r.tg_speedup),
    ]
}

/// The matrix as text: one line per row, tab-aligned columns, `!` on marked rows.
pub fn write_text(out: &mut dyn Write, rows: &[Row]) -> io::Result<()> {
    let mut widths: Vec<usize> = TITLES.iter().map(|t| t.len()).collect();
    let all: Vec<[String; 11]> = rows.iter().map(cells).collect();
    for row in &all {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    write!(out, "  ")?;
    for (t, w) in TITLES.iter().zip(&widths) {
        write!(out, "{:<w$}  ", t.to_uppercase())?;
    }
    writeln!(out)?;
    for (r, row) in rows.iter().zip(&all) {
        write!(out, "{} ", if r.marked { "!" } else { " " })?;
        for (c, w) in row.iter().zip(&widths) {
            write!(out, "{c:<w$}  ")?;
        }
        writeln!(out)?;
    }
    Ok(())
}

/// The matrix as a Markdown table; a marked row's chip is prefixed with ⚠️.
pub fn write_markdown(out: &mut dyn Write, rows: &[Row]) -> io::Result<()> {
    writeln!(out, "### metalift: validated matrix\n")?;
    writeln!(out, "| {} |", TITLES.join(" | "))?;
    writeln!(out, "{}|", "| --- ".repeat(TITLES.len()))?;
    for r in rows {
        let mut c = cells(r).map(|c| super::markdown::cell(&c));
        if r.marked {
            c[0] = format!("⚠️ {}", c[0]);
        }
        writeln!(out, "| {} |", c.join(" | "))?;
    }
    Ok(())
}

/// The matrix as JSON: `{"rows": [...]}`.
pub fn write_json(out: &mut dyn Write, rows: &[Row]) -> io::Result<()> {
    serde_json::to_writer(&mut *out, &serde_json::json!({ "rows": rows }))?;
    writeln!(out)
}

fn html_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The matrix as one self-contained HTML page: inline style, no script, nothing
/// fetched; marked rows are shaded and say why in their last cell.
pub fn write_html(out: &mut dyn Write, rows: &[Row], generated: SystemTime) -> io::Result<()> {
    writeln!(
        out,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>metalift: validated matrix</title>\n<style>\n\
         body {{ font: 14px system-ui, sans-serif; margin: 2em; }}\n\
         table {{ border-collapse: collapse; }}\n\
         th, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; }}\n\
         th {{ background: #f3f3f3; }}\n\
         tr.marked td {{ background: #fde8e8; }}\n\
         </style>\n</head>\n<body>\n<h1>metalift: validated matrix</h1>\n\
         <p>Generated {} from the audit records read. A shaded row had a failed \
         process or a failed last verification.</p>\n<table>\n<thead><tr>",
        humantime::format_rfc3339_seconds(generated)
    )?;
    for t in TITLES {
        write!(out, "<th>{}</th>", html_escape(t))?;
    }
    writeln!(out, "<th>marked</th></tr></thead>\n<tbody>")?;
    for r in rows {
        let class = if r.marked { " class=\"marked\"" } else { "" };
        write!(out, "<tr{class}>")?;
        for c in cells(r) {
            write!(out, "<td>{}</td>", html_escape(&c))?;
        }
        let why = match (r.counts.failed > 0, r.verification == "fail") {
            (true, true) => "failed processes; failed verification",
            (true, false) => "failed processes",
            (false, true) => "failed verification",
            (false, false) => "",
        };
        writeln!(out, "<td>{why}</td></tr>")?;
    }
    if rows.is_empty() {
        writeln!(
            out,
            "<tr><td colspan=\"{}\">No process in the records read.</td></tr>",
            TITLES.len() + 1
        )?;
    }
    writeln!(out, "</tbody>\n</table>\n</body>\n</html>")
}
