//! `metalift audit --records`: the raw records, one table row each (or, with
//! `--json`, each line exactly as written), streamed with fixed column widths.

use std::collections::{BTreeMap, HashMap};
use std::io::{self, Write};

use metalift_daemon::audit::{Record, Stamp};

/// Decisions remembered so `--rule`/`--action` also select the outcomes answering them.
const REMEMBERED_DECISIONS: usize = 10_000;

/// Fixed widths of the columns before DETAIL (EXE grows when a path is longer).
const WIDTHS: [usize; 6] = [20, 15, 7, 40, 16, 12];
const HEADERS: [&str; 7] = ["TIME", "KIND", "PID", "EXE", "RULE", "ACTION", "DETAIL"];

/// The rule and action of recent decisions, by daemon run and decision id
/// (bounded: the oldest go first; see `join` for why the run).
#[derive(Debug, Default)]
pub struct Decided {
    by_id: HashMap<(u128, u64), (u64, Option<String>, String)>,
    order: BTreeMap<u64, (u128, u64)>,
    read: u64,
}

impl Decided {
    /// Remembers a decision; returns the (rule, action) `record` has or answers.
    pub fn see(&mut self, record: &Record, stamp: &Stamp) -> Option<(Option<String>, String)> {
        let run = super::dedup::split_id(&stamp.id).map_or(0, |(run, _)| run);
        match record {
            Record::Decision(d) => {
                if self.order.len() >= REMEMBERED_DECISIONS {
                    if let Some((_, key)) = self.order.pop_first() {
                        self.by_id.remove(&key);
                    }
                }
                self.read += 1;
                let key = (run, d.decision_id);
                let seen = (self.read, d.rule.clone(), action_of(d).to_owned());
                if let Some((earlier, ..)) = self.by_id.insert(key, seen) {
                    self.order.remove(&earlier);
                }
                self.order.insert(self.read, key);
                Some((d.rule.clone(), action_of(d).to_owned()))
            }
            Record::Outcome(o) => self
                .by_id
                .get(&(run, o.decision_id))
                .map(|(_, rule, action)| (rule.clone(), action.clone())),
            _ => None,
        }
    }
}

fn action_of(d: &metalift_daemon::audit::DecisionRecord) -> &str {
    if d.would_unlock && d.action == "stock" {
        "would-unlock"
    } else {
        &d.action
    }
}

/// Writes the header line.
pub fn header(out: &mut dyn Write) -> io::Result<()> {
    write_cells(out, &HEADERS.map(str::to_owned))
}

/// Writes one record as a row; `rule` is the rule of the decision it is or answers.
pub fn row(out: &mut dyn Write, r: &Record, rule: Option<&str>) -> io::Result<()> {
    let dash = || "-".to_owned();
    let short = |s: &str| s.chars().take(12).collect::<String>();
    let (pid, exe, action, detail): (Option<i32>, Option<&str>, String, String) = match r {
        Record::Decision(d) => {
            let mut detail = format!("id={}", d.decision_id);
            if let Some(profile) = &d.profile {
                detail.push_str(&format!(" profile={profile}"));
            }
            detail.push_str(&format!(" mode={} latency={}us", d.mode, d.latency_us));
            if d.unverified.is_some() {
                // verified unlock: the profile required a verification this host lacks.
                detail.push_str(" unverified");
            }
            let mut action = d.action.clone();
            if d.would_unlock {
                action.push_str(" (would unlock)");
            }
            (Some(d.pid), Some(&d.exe), action, detail)
        }
        Record::Outcome(o) => {
            let mut detail = format!("id={} device={}", o.decision_id, o.device_class);
            if !o.reason.is_empty() {
                detail.push_str(&format!(" reason={:?}", o.reason));
            }
            if let Some(other) = &o.other_shim {
                // Whose answers `stock` holds (OutcomeRecord::stock_label).
                detail.push_str(&format!(
                    " other_shim={:?} patched={} methods={} answers_before={}",
                    other.image,
                    other.patched,
                    other.methods.join(","),
                    o.stock_label()
                ));
            }
            (Some(o.pid), Some(&o.exe), o.result.clone(), detail)
        }
        Record::Refused(r) => {
            let mut detail = format!("{} refused: {}", r.message.replace('_', "-"), r.reason);
            if let Some(id) = r.decision_id {
                detail.push_str(&format!(" id={id}"));
            }
            if r.suppressed > 0 {
                detail.push_str(&format!(" (+{} not recorded)", r.suppressed));
            }
            detail.push_str(&format!(" via={} {:?}", r.transport, r.detail));
            (r.pid, r.exe.as_deref(), dash(), detail)
        }
        Record::PolicyLoaded {
            path,
            sha256,
            rules,
            mode,
            warnings,
            reason,
            ..
        } => {
            let mut detail = format!(
                "reason={} rules={rules} mode={mode} sha256={}",
                reason.as_str(),
                short(sha256)
            );
            if !warnings.is_empty() {
                detail.push_str(&format!(" warnings={}", warnings.len()));
            }
            (None, Some(path), dash(), detail)
        }
        Record::PolicyRejected {
            path,
            errors,
            kept_sha256,
            ..
        } => {
            let mut detail = format!("kept={}", short(kept_sha256));
            if let Some(first) = errors.first() {
                detail.push_str(&format!(" {first}"));
            }
            if errors.len() > 1 {
                detail.push_str(&format!(" (+{} more)", errors.len() - 1));
            }
            (None, Some(path), dash(), detail)
        }
        Record::DaemonStart {
            version,
            pid,
            policy,
            listen,
            ..
        } => (
            i32::try_from(*pid).ok(),
            Some(policy),
            dash(),
            format!("version={version} listen={listen}"),
        ),
        Record::Verification(v) => (
            None,
            None,
            if v.passed { "verified" } else { "unverified" }.to_owned(),
            format!(
                "profile={} build={} chip={} {}",
                v.profile,
                v.os_build.as_deref().unwrap_or("-"),
                v.host_chip.as_deref().unwrap_or("-"),
                if v.passed {
                    "passed".to_owned()
                } else {
                    format!("failed: {}", v.failures().join(", "))
                }
            ),
        ),
        Record::DaemonStop {
            reason,
            checkins,
            unlocks,
            pid,
            ..
        } => (
            i32::try_from(*pid).ok().filter(|p| *p != 0),
            None,
            dash(),
            format!("reason={reason} checkins={checkins} unlocks={unlocks}"),
        ),
        Record::RecordsLost {
            count,
            first_at,
            last_at,
            first_decision_id,
            last_decision_id,
            error,
            pid,
            ..
        } => (
            i32::try_from(*pid).ok(),
            None,
            dash(),
            format!(
                "lost={count} from={} to={} decisions={} error={error}",
                humantime::format_rfc3339_seconds(*first_at),
                humantime::format_rfc3339_seconds(*last_at),
                match (first_decision_id, last_decision_id) {
                    (Some(a), Some(b)) => format!("{a}-{b}"),
                    _ => "-".to_owned(),
                }
            ),
        ),
        Record::ForwardGap {
            file,
            records,
            total,
            ..
        } => (
            None,
            None,
            dash(),
            format!(
                "not forwarded: {} records of {file}{}",
                records.map_or_else(|| "uncounted".to_owned(), |n| n.to_string()),
                total.map_or_else(String::new, |t| format!(" ({t} since the log began)"))
            ),
        ),
    };
    write_cells(
        out,
        &[
            humantime::format_rfc3339_seconds(r.time()).to_string(),
            r.kind().to_owned(),
            pid.map_or_else(dash, |p| p.to_string()),
            exe.map_or_else(dash, str::to_owned),
            rule.map_or_else(dash, str::to_owned),
            action,
            detail,
        ],
    )
}

fn write_cells(out: &mut dyn Write, cells: &[String; 7]) -> io::Result<()> {
    let mut line = String::new();
    for (i, cell) in cells.iter().enumerate() {
        line.push_str(cell);
        if let Some(width) = WIDTHS.get(i) {
            let pad = width.saturating_sub(cell.chars().count()) + 2;
            line.extend(std::iter::repeat_n(' ', pad));
        }
    }
    writeln!(out, "{}", line.trim_end())
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use metalift_daemon::audit::OutcomeRecord;
    use metalift_policy::wire::{OtherShim, OtherShimPatched, Outcome, OutcomeResult};

    use super::*;

    fn row_of(other_shim: Option<OtherShim>) -> String {
        let record = Record::Outcome(OutcomeRecord::new(
            SystemTime::UNIX_EPOCH,
            42,
            "/x".into(),
            &Outcome {
                decision_id: 7,
                result: OutcomeResult::Applied,
                device_class: "AppleParavirtDevice".into(),
                other_shim,
                ..Default::default()
            },
        ));
        let mut out = Vec::new();
        row(&mut out, &record, None).unwrap();
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn an_outcome_row_names_another_shim_and_whether_its_answers_were_found() {
        let line = row_of(Some(OtherShim {
            image: "/opt/lume/libLumeMetalCapabilities.dylib".into(),
            methods: vec![
                "supportsFamily:".into(),
                "maxThreadgroupMemoryLength".into(),
            ],
            patched: OtherShimPatched::Before,
        }));
        assert!(
            line.contains(
                "other_shim=\"/opt/lume/libLumeMetalCapabilities.dylib\" patched=before \
                 methods=supportsFamily:,maxThreadgroupMemoryLength answers_before=found"
            ),
            "{line}"
        );
        assert!(!row_of(None).contains("other_shim"));
    }
}
