//! The filters of `metalift audit`, applied to joined lines (the default view) and
//! to raw records (`--records`).

use std::path::Path;
use std::time::SystemTime;

use anyhow::Context as _;
use globset::{Glob, GlobMatcher};

use super::join::{Process, NO_OUTCOME};
use metalift_daemon::audit::{Host, Record};

/// `--action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ActionFilter {
    /// Decisions that unlocked.
    Unlock,
    /// Decisions that stayed stock.
    Stock,
    /// Monitor mode: stayed stock, would have unlocked.
    WouldUnlock,
}

/// `--result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResultFilter {
    /// The shim installed the profile.
    Applied,
    /// The shim stayed stock (told to, or could not ask).
    Stock,
    /// The shim tried and rolled back.
    Failed,
    /// No outcome was reported (the process never created a Metal device, or died).
    NoOutcome,
}

impl ResultFilter {
    fn as_str(self) -> &'static str {
        match self {
            ResultFilter::Applied => "applied",
            ResultFilter::Stock => "stock",
            ResultFilter::Failed => "failed",
            ResultFilter::NoOutcome => NO_OUTCOME,
        }
    }
}

/// `--label KEY=VALUE`: the host's `[audit.labels]` must have KEY with VALUE.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabelFilter {
    /// The label's name.
    pub key: String,
    /// Its value.
    pub value: String,
}

/// Parses `--label KEY=VALUE`.
pub fn parse_label(arg: &str) -> Result<LabelFilter, String> {
    match arg.split_once('=') {
        Some((key, value)) if !key.is_empty() => Ok(LabelFilter {
            key: key.to_owned(),
            value: value.to_owned(),
        }),
        _ => Err(format!("{arg:?} is not KEY=VALUE (e.g. image=ci-15.4)")),
    }
}

/// `--exe`: a path (a symlink matches the file it resolves to, as the kernel
/// reports it), a glob against the whole path (with `/`), or against the file name.
#[derive(Debug)]
pub enum ExeFilter {
    /// Any of these exact paths (as given, and resolved).
    Exact(Vec<String>),
    /// A glob.
    Glob {
        /// The compiled glob.
        matcher: GlobMatcher,
        /// Matched against the whole path (the glob has a `/`), else the file name.
        full_path: bool,
    },
}

impl ExeFilter {
    /// Builds the filter for `--exe ARG`.
    pub fn new(arg: &str) -> anyhow::Result<ExeFilter> {
        let is_glob = arg.contains(['*', '?', '[', ']', '{', '}']);
        if arg.contains('/') && !is_glob {
            let mut paths = vec![arg.to_owned()];
            if let Ok(resolved) = Path::new(arg).canonicalize() {
                paths.push(resolved.display().to_string());
            }
            return Ok(ExeFilter::Exact(paths));
        }
        Ok(ExeFilter::Glob {
            matcher: Glob::new(arg)
                .with_context(|| format!("bad --exe glob {arg:?}"))?
                .compile_matcher(),
            full_path: arg.contains('/'),
        })
    }

    /// Whether `exe` is selected.
    #[must_use]
    pub fn matches(&self, exe: &str) -> bool {
        match self {
            ExeFilter::Exact(paths) => paths.iter().any(|p| p == exe),
            ExeFilter::Glob { matcher, full_path } => {
                let subject = if *full_path {
                    exe
                } else {
                    exe.rsplit('/').next().unwrap_or(exe)
                };
                matcher.is_match(subject)
            }
        }
    }
}

/// Every filter given on the command line; each one absent selects everything.
#[derive(Debug, Default)]
pub struct Filters {
    /// `--since`, resolved.
    pub since: Option<SystemTime>,
    /// `--until`, resolved.
    pub until: Option<SystemTime>,
    /// `--exe`.
    pub exe: Option<ExeFilter>,
    /// `--rule`.
    pub rule: Option<String>,
    /// `--action`.
    pub action: Option<ActionFilter>,
    /// `--result`.
    pub result: Option<ResultFilter>,
    /// `--pid`.
    pub pid: Option<i32>,
    /// `--decision`.
    pub decision: Option<u64>,
    /// `--kind` (raw records only): one of `Record::KINDS`.
    pub kind: Option<String>,
    /// `--job`: any value of the decision's CI job claims.
    pub job: Option<String>,
    /// `--host`: the guest's host name, or its clone's name (`host.instance`).
    pub host: Option<String>,
    /// `--boot-id`: a prefix of the guest's boot id.
    pub boot_id: Option<String>,
    /// `--label`: every one must match.
    pub labels: Vec<LabelFilter>,
}

impl Filters {
    fn in_time(&self, time: SystemTime) -> bool {
        self.since.is_none_or(|s| time >= s) && self.until.is_none_or(|u| time < u)
    }

    /// Whether a record of the guest `host` is selected by `--host`, `--boot-id`
    /// and `--label` (a record without a host part is not, when any is given).
    #[must_use]
    pub fn keeps_guest(&self, host: Option<&Host>) -> bool {
        if self.host.is_none() && self.boot_id.is_none() && self.labels.is_empty() {
            return true;
        }
        let Some(host) = host else {
            return false;
        };
        self.host
            .as_deref()
            .is_none_or(|h| h == host.name || host.instance.as_deref() == Some(h))
            && self
                .boot_id
                .as_deref()
                .is_none_or(|b| host.boot_id.as_deref().is_some_and(|id| id.starts_with(b)))
            && self
                .labels
                .iter()
                .all(|l| host.labels.get(&l.key) == Some(&l.value))
    }

    /// Whether a joined line is selected.
    #[must_use]
    pub fn keeps_process(&self, p: &Process) -> bool {
        self.in_time(p.time)
            && self.keeps_guest(p.host.as_ref())
            && self.exe.as_ref().is_none_or(|f| f.matches(&p.exe))
            && self
                .rule
                .as_deref()
                .is_none_or(|r| p.rule.as_deref() == Some(r))
            && self.action.is_none_or(|a| action_word(a) == p.action)
            && self.result.is_none_or(|r| r.as_str() == p.result)
            && self.pid.is_none_or(|pid| pid == p.pid)
            && self.decision.is_none_or(|id| id == p.decision_id)
            && self
                .job
                .as_deref()
                .is_none_or(|j| p.job.values().any(|v| v == j))
    }

    /// Whether a raw record is selected. `decided` is the (rule, action) of the
    /// decision an outcome answers, when it was read, so `--rule`/`--action`
    /// select outcomes too.
    #[must_use]
    pub fn keeps_record(&self, r: &Record, decided: Option<(Option<&str>, &str)>) -> bool {
        if self.kind.as_deref().is_some_and(|k| k != r.kind()) || !self.in_time(r.time()) {
            return false;
        }
        let (exe, pid, id, result) = match r {
            Record::Decision(d) => (Some(d.exe.as_str()), Some(d.pid), Some(d.decision_id), None),
            Record::Outcome(o) => (
                Some(o.exe.as_str()),
                Some(o.pid),
                Some(o.decision_id),
                Some(o.result.as_str()),
            ),
            Record::Refused(r) => (r.exe.as_deref(), r.pid, r.decision_id, None),
            _ => (None, None, None, None),
        };
        if let Some(f) = &self.exe {
            if !exe.is_some_and(|e| f.matches(e)) {
                return false;
            }
        }
        if self.pid.is_some() && pid != self.pid {
            return false;
        }
        if self.decision.is_some() && id != self.decision {
            return false;
        }
        if let Some(job) = &self.job {
            // Only decisions carry the claims (see `--job`).
            if !matches!(r, Record::Decision(d) if d.advisory.job.values().any(|v| v == job)) {
                return false;
            }
        }
        if let Some(want) = self.result {
            if result != Some(want.as_str()) {
                return false;
            }
        }
        if self.rule.is_some() || self.action.is_some() {
            let Some((rule, action)) = decided else {
                return false;
            };
            if self.rule.as_deref().is_some_and(|want| rule != Some(want)) {
                return false;
            }
            if self.action.is_some_and(|a| action_word(a) != action) {
                return false;
            }
        }
        true
    }
}

/// The action word of the joined view (`would-unlock` for monitor mode).
fn action_word(a: ActionFilter) -> &'static str {
    match a {
        ActionFilter::Unlock => "unlock",
        ActionFilter::Stock => "stock",
        ActionFilter::WouldUnlock => "would-unlock",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exe_path_matches_itself_and_what_its_symlink_resolves_to() {
        let tmp = tempfile::tempdir().unwrap();
        let real = tmp.path().join("llama-server");
        std::fs::write(&real, "").unwrap();
        let link = tmp.path().join("llama");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let f = ExeFilter::new(link.to_str().unwrap()).unwrap();
        let resolved = real.canonicalize().unwrap();
        assert!(f.matches(resolved.to_str().unwrap()));
        assert!(f.matches(link.to_str().unwrap()));
        assert!(!f.matches("/usr/bin/llama"));
    }

    #[test]
    fn a_glob_without_a_slash_matches_the_file_name() {
        let f = ExeFilter::new("llama-*").unwrap();
        assert!(f.matches("/opt/llama.cpp/bin/llama-server"));
        assert!(!f.matches("/opt/llama-dir/bin/whisper"));
    }
}
