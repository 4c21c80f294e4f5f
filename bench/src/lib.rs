//! metalift's evidence: benchmarks that run the real metaliftd, libmetalift and
//! metalift-probe on this machine and print Markdown tables for BENCHMARKS.md.
//!
//! # Layout
//!
//! - [`report`]: BENCHMARKS.md as one generated document (commit, machine, summary).
//! - [`stats`]: samples and their order statistics (median, p10–p90, tails).
//! - [`harness`] (Linux): the built artifacts, a metaliftd on a temporary socket,
//!   a raw-protocol client, `/proc` readings (RSS, CPU time), machine facts.
//! - [`baseline`] (Linux): a transport-only server (framing, no identity, policy
//!   or audit), the in-run baseline for round trips and throughput.
//! - [`probe_cost`], [`throughput`], [`reload`], [`big_exe`] (Linux): items 2–5 of
//!   issue 7, each returning a [`Section`] with its table and its targets.
//! - [`startup`] (Linux): item 1 (issue 10), the shim's start-up cost next to an
//!   empty preloaded C library.
//! - [`identity_hop`] (Linux): issue 24 item 6, a check-in with the peer identified
//!   inline and on the blocking pool, in one run.
//! - [`versus`] (Linux): issue 31, 23.4 and 24.6 for an older build and this
//!   tree in one run (`metalift-bench versus <old-build-dir>`).
//! - [`forwarding`] (Linux): issues 30 and 42, check-ins with audit forwarding to a
//!   real rsyslogd on vs off, over TCP and over RELP, and RSS with the collector down.
//! - [`fleet_read`] (Linux): issue 41, `metalift audit` on a collector's file of a
//!   fleet's records against jq answering the same questions.
//!
//! Every figure is compared with a baseline measured in the same run, and the
//! harness asserts nothing about time: a missed target is printed as missed.
#![forbid(unsafe_code)]

pub mod report;
pub mod stats;

#[cfg(target_os = "linux")]
pub mod baseline;
#[cfg(target_os = "linux")]
pub mod big_exe;
#[cfg(target_os = "linux")]
pub mod fleet_read;
#[cfg(target_os = "linux")]
pub mod forwarding;
#[cfg(target_os = "linux")]
pub mod harness;
#[cfg(target_os = "linux")]
pub mod identity_hop;
#[cfg(target_os = "linux")]
pub mod probe_cost;
#[cfg(target_os = "linux")]
pub mod reload;
#[cfg(target_os = "linux")]
pub mod stalls;
#[cfg(target_os = "linux")]
pub mod startup;
#[cfg(target_os = "linux")]
pub mod throughput;
#[cfg(target_os = "linux")]
pub mod versus;

/// One target of issue 7 and what this run measured against it.
#[derive(Debug, Clone)]
pub struct Target {
    /// The item, e.g. `"3. daemon throughput"`.
    pub item: String,
    /// The target as the issue states it.
    pub target: String,
    /// The measured figure, with its spread.
    pub measured: String,
    /// Whether the measured median meets the target.
    pub met: bool,
}

/// One benchmark's output: a Markdown section and the targets it measured.
#[derive(Debug, Clone, Default)]
pub struct Section {
    /// The `##` heading.
    pub title: String,
    /// Markdown: what was run, then the table(s).
    pub body: String,
    /// The targets this section measured.
    pub targets: Vec<Target>,
}

impl Section {
    /// The section as Markdown.
    #[must_use]
    pub fn to_markdown(&self) -> String {
        format!("## {}\n\n{}\n", self.title, self.body.trim_end())
    }
}

/// The summary table of every measured target.
#[must_use]
pub fn summary_table(targets: &[Target]) -> String {
    let mut out = String::from("| item | target | measured | |\n|---|---|---|---|\n");
    for t in targets {
        out.push_str(&format!(
            "| {} | {} | {} | {} |\n",
            t.item,
            t.target,
            t.measured,
            if t.met { "met" } else { "**missed**" }
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_summary_marks_missed_targets_in_bold() {
        let table = summary_table(&[
            Target {
                item: "4. reload".into(),
                target: "p99 ≤ 100 ms".into(),
                measured: "62 ms".into(),
                met: true,
            },
            Target {
                item: "3. throughput".into(),
                target: "≥ 20 000/s".into(),
                measured: "9 000/s".into(),
                met: false,
            },
        ]);
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines.len(), 4);
        assert!(lines[2].ends_with("| met |"));
        assert!(lines[3].ends_with("| **missed** |"));
    }

    #[test]
    fn a_section_renders_under_its_heading() {
        let s = Section {
            title: "Reload".into(),
            body: "text\n\n".into(),
            targets: Vec::new(),
        };
        assert_eq!(s.to_markdown(), "## Reload\n\ntext\n");
    }
}
