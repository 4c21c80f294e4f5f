//! What `metalift audit` learns from a record's first keys before parsing it whole
//! (`metalift_daemon::audit::forward::head::top_level`, the forwarder's scanner):
//! `schema`, `id`, `host`, `kind`, `decision_id`. With it, a record that cannot
//! change the answer is skipped unparsed ([`Prefilter`]), and each guest's `host`
//! part is parsed once ([`Hosts`]), not once per record.
//!
//! A line the scan is not sure of (escapes, another shape) is parsed whole, as
//! before: the scan only ever saves work, it never decides what a record says.

use std::collections::HashMap;
use std::ops::ControlFlow;

use memchr::memmem;
use metalift_daemon::audit::forward::head::{plain_str, top_level};
use metalift_daemon::audit::{Host, Record, Stamp};

use super::dedup::split_id;
use super::join::Join;

/// The first keys of a record, raw.
#[derive(Debug, Default)]
pub struct Skimmed<'a> {
    /// `"schema"`, 0 when absent.
    pub schema: u32,
    /// `"id"`, empty when absent.
    pub id: &'a str,
    /// `"host"`'s raw JSON.
    pub host: Option<&'a [u8]>,
    /// `"kind"`.
    pub kind: &'a str,
    /// `"decision_id"` of a decision or outcome.
    pub decision_id: Option<u64>,
}

/// Skims `json`; `None` when the scan is not sure (then parse it whole).
#[must_use]
pub fn skim(json: &str) -> Option<Skimmed<'_>> {
    let mut s = Skimmed::default();
    let mut kind_seen = false;
    let mut unsure = false;
    let walked = top_level(json.as_bytes(), &mut |key, value| {
        match key {
            b"schema" => {
                s.schema = std::str::from_utf8(value)
                    .ok()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0)
            }
            b"id" => match plain_str(value) {
                Some(id) => s.id = id,
                None => unsure = true,
            },
            b"host" => s.host = Some(value),
            b"kind" => match plain_str(value) {
                Some(kind) => {
                    s.kind = kind;
                    kind_seen = true;
                }
                None => unsure = true,
            },
            b"decision_id" => {
                s.decision_id = std::str::from_utf8(value).ok().and_then(|v| v.parse().ok());
                return ControlFlow::Break(());
            }
            _ => {}
        }
        let done = unsure || (kind_seen && !matches!(s.kind, "decision" | "outcome"));
        if done {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    (walked.is_some() && kind_seen && !unsure).then_some(s)
}

/// Each guest's `host` part parsed once, by its raw JSON (a daemon writes the same
/// bytes in every record until its labels change). Bounded: cleared when full.
#[derive(Debug, Default)]
pub struct Hosts(HashMap<Box<[u8]>, Option<Host>>);

/// Distinct `host` parts kept, at most.
const MAX_HOSTS: usize = 4096;

impl Hosts {
    /// The stamp of a skimmed record.
    pub fn stamp(&mut self, s: &Skimmed<'_>) -> Stamp {
        let host = s.host.and_then(|raw| {
            if let Some(host) = self.0.get(raw) {
                return host.clone();
            }
            if self.0.len() >= MAX_HOSTS {
                self.0.clear();
            }
            let host: Option<Host> = serde_json::from_slice(raw).ok();
            self.0.insert(raw.into(), host.clone());
            host
        });
        Stamp {
            schema: s.schema,
            id: s.id.to_owned(),
            host,
        }
    }
}

/// Which records cannot change the answer of the command given, decided from the
/// skim alone.
#[derive(Debug)]
pub struct Prefilter {
    /// The per-process view (not `--records`): only decisions, outcomes and
    /// daemon starts take part in the join.
    joined_view: bool,
    /// `--kind` in the records view (when nothing needs the decisions besides).
    only_kind: Option<String>,
    /// `--job`: a decision whose line does not hold the value (as a JSON string)
    /// is not of the job, and an outcome whose decision is not waiting is not either.
    job: Option<memmem::Finder<'static>>,
    /// `--matrix`: verifications are read too.
    verifications: bool,
}

impl Prefilter {
    /// The prefilter for these options.
    #[must_use]
    pub fn new(
        records_view: bool,
        kind: Option<&str>,
        needs_decisions: bool,
        job: Option<&str>,
        verifications: bool,
    ) -> Prefilter {
        // A value JSON writes with an escape cannot be searched for as written.
        let job = job
            .filter(|j| !j.chars().any(|c| c == '"' || c == '\\' || c.is_control()))
            .map(|j| memmem::Finder::new(format!("\"{j}\"").as_bytes()).into_owned());
        Prefilter {
            joined_view: !records_view,
            only_kind: kind
                .filter(|_| records_view && !needs_decisions)
                .map(str::to_owned),
            job: job.filter(|_| !records_view),
            verifications,
        }
    }

    /// Whether the record skimmed as `s` (its whole JSON `json`) can be skipped.
    #[must_use]
    pub fn skips(&self, s: &Skimmed<'_>, json: &str, join: &Join) -> bool {
        if !Record::KINDS.contains(&s.kind) {
            // A newer kind: parsed, so it is counted and reported.
            return false;
        }
        if let Some(kind) = &self.only_kind {
            return s.kind != kind;
        }
        if !self.joined_view {
            return false;
        }
        match s.kind {
            "daemon_start" => false,
            "verification" => !self.verifications,
            "decision" => self
                .job
                .as_ref()
                .is_some_and(|job| job.find(json.as_bytes()).is_none()),
            "outcome" => {
                self.job.is_some() && {
                    let run = split_id(s.id).map_or(0, |(run, _)| run);
                    s.decision_id.is_some_and(|id| !join.is_waiting(run, id))
                }
            }
            _ => true,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_as_the_writer_writes_it_is_skimmed_to_its_decision_id() {
        let line = r#"{"schema":1,"id":"0000000000000000000000000000000a-3","host":{"name":"g","boot_id":null,"labels":{"kind":"x"}},"kind":"outcome","time":"t","decision_id":42,"pid":1}"#;
        let s = skim(line).unwrap();
        assert_eq!(
            (s.schema, s.id, s.kind, s.decision_id),
            (1, "0000000000000000000000000000000a-3", "outcome", Some(42))
        );
        let mut hosts = Hosts::default();
        assert_eq!(hosts.stamp(&s).host.unwrap().name, "g");
        assert!(
            skim(r#"{"kind":"deci\u0073ion"}"#).is_none(),
            "escapes: parse it whole"
        );
        assert!(skim("[1]").is_none());
    }
}
