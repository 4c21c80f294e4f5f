//! `metalift audit`: read the audit log (rotated files included), filtered, as a table or JSON.
//!
//! It reads the file directly rather than asking the daemon, so it takes `--log`
//! (not `--socket`) and works while metaliftd is stopped. Filters on a decision's
//! `rule` and `action` also select the outcomes that answer those decisions (joined
//! by decision id), so `--rule llama-cpp` shows what was decided and what happened.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use globset::{Glob, GlobMatcher};

use crate::audit::reader::{Entry, Item, LogReader};
use crate::audit::DEFAULT_LOG_PATH;

/// Decisions remembered to join outcomes to (bounds memory under `--follow`).
const MAX_REMEMBERED_DECISIONS: usize = 100_000;

/// How often `--follow` looks for new records.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(250);

/// Arguments of `metalift audit`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The audit log; its rotated files (PATH.1, PATH.2, ...) are read first.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_LOG_PATH)]
    pub log: PathBuf,
    /// Only records from the last DURATION, e.g. `10m`, `2h`, `1day`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub since: Option<Duration>,
    /// Only records whose executable matches GLOB (a GLOB without `/` matches the file name).
    #[arg(long, value_name = "GLOB")]
    pub exe: Option<String>,
    /// Only decisions by rule ID, and their outcomes.
    #[arg(long, value_name = "ID")]
    pub rule: Option<String>,
    /// Only decisions with this action, and their outcomes.
    #[arg(long, value_enum)]
    pub action: Option<ActionFilter>,
    /// Only records of this kind.
    #[arg(long, value_enum)]
    pub kind: Option<KindFilter>,
    /// Keep reading as records are appended, across rotations (Ctrl-C to stop).
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Print the matching records as they are in the log, one JSON object per line.
    #[arg(long)]
    pub json: bool,
}

/// `--action`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ActionFilter {
    /// Decisions that unlocked.
    Unlock,
    /// Decisions that stayed stock.
    Stock,
}

/// `--kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KindFilter {
    /// Verdicts decided.
    #[value(name = "decision")]
    Decision,
    /// What the shim did.
    #[value(name = "outcome")]
    Outcome,
    /// A policy became live.
    #[value(name = "policy_loaded")]
    PolicyLoaded,
    /// A policy was refused.
    #[value(name = "policy_rejected")]
    PolicyRejected,
    /// The daemon started.
    #[value(name = "daemon_start")]
    DaemonStart,
    /// The daemon stopped.
    #[value(name = "daemon_stop")]
    DaemonStop,
}

impl KindFilter {
    fn as_str(self) -> &'static str {
        match self {
            KindFilter::Decision => "decision",
            KindFilter::Outcome => "outcome",
            KindFilter::PolicyLoaded => "policy_loaded",
            KindFilter::PolicyRejected => "policy_rejected",
            KindFilter::DaemonStart => "daemon_start",
            KindFilter::DaemonStop => "daemon_stop",
        }
    }
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text).map_err(|e| format!("{e} (try e.g. 10m, 2h, 1day)"))
}

/// Runs `metalift audit`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let stdout = io::stdout();
    let stderr = io::stderr();
    match run_with(&args, &mut stdout.lock(), &mut stderr.lock()) {
        // `metalift audit | head`: the reader left; that is not an error.
        Err(e)
            if e.downcast_ref::<io::Error>()
                .is_some_and(|e| e.kind() == io::ErrorKind::BrokenPipe) =>
        {
            Ok(ExitCode::SUCCESS)
        }
        other => other,
    }
}

/// `metalift audit` writing to `out`, with corrupt-line reports to `err`.
pub fn run_with(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<ExitCode> {
    if !args.follow && !args.log.exists() {
        anyhow::bail!("no audit log at {}", args.log.display());
    }
    let context = || format!("cannot read audit log {}", args.log.display());
    let mut filter = Filter::new(args)?;
    let mut reader = LogReader::open(&args.log).with_context(context)?;

    // The table's columns are fitted to everything read first, so those rows are
    // kept (as strings only) until the end; JSON lines go straight out.
    let mut rows = Vec::new();
    {
        let mut each = |item: Item| -> io::Result<()> {
            let Some(entry) = select(&mut filter, item, err)? else {
                return Ok(());
            };
            if args.json {
                writeln!(out, "{}", entry.raw)
            } else {
                rows.push(filter.row(&entry));
                Ok(())
            }
        };
        if args.follow {
            reader.poll_each(&mut each)
        } else {
            reader.read_to_end_each(&mut each)
        }
        .with_context(context)?;
    }
    let mut table = Table::default();
    if !args.json {
        table.fit(&rows);
        table.header(out)?;
        for row in &rows {
            table.line(out, row)?;
        }
    }
    drop(rows);
    out.flush()?;
    if !args.follow {
        return Ok(ExitCode::SUCCESS);
    }
    loop {
        std::thread::sleep(FOLLOW_INTERVAL);
        reader
            .poll_each(&mut |item| {
                let Some(entry) = select(&mut filter, item, err)? else {
                    return Ok(());
                };
                if args.json {
                    writeln!(out, "{}", entry.raw)
                } else {
                    table.line(out, &filter.row(&entry))
                }
            })
            .with_context(context)?;
        out.flush()?;
    }
}

/// The entry in `item` if it passes `filter`; a corrupt line is reported to `err`.
fn select(filter: &mut Filter, item: Item, err: &mut dyn Write) -> io::Result<Option<Entry>> {
    match item {
        Item::Entry(entry) => Ok(filter.keep(&entry).then_some(entry)),
        Item::Corrupt { file, line, error } => {
            writeln!(
                err,
                "metalift audit: {}:{line}: skipped corrupt line: {error}",
                file.display()
            )?;
            Ok(None)
        }
    }
}

/// The filters, and what they remember about decisions to judge later outcomes.
struct Filter {
    since: Option<SystemTime>,
    exe: Option<ExeGlob>,
    rule: Option<String>,
    action: Option<&'static str>,
    kind: Option<&'static str>,
    /// Rule and action of each decision seen, by decision id, so an outcome is
    /// filtered (and shown) by the decision it answers.
    decisions: HashMap<u64, (Option<String>, String)>,
}

/// `--exe`: against the full path when the glob has a `/`, else the file name.
struct ExeGlob {
    matcher: GlobMatcher,
    full_path: bool,
}

impl Filter {
    fn new(args: &Args) -> anyhow::Result<Filter> {
        let exe = match &args.exe {
            Some(glob) => Some(ExeGlob {
                matcher: Glob::new(glob)
                    .with_context(|| format!("bad --exe glob {glob:?}"))?
                    .compile_matcher(),
                full_path: glob.contains('/'),
            }),
            None => None,
        };
        Ok(Filter {
            since: args.since.map(|d| {
                SystemTime::now()
                    .checked_sub(d)
                    .unwrap_or(SystemTime::UNIX_EPOCH)
            }),
            exe,
            rule: args.rule.clone(),
            action: args.action.map(|a| match a {
                ActionFilter::Unlock => "unlock",
                ActionFilter::Stock => "stock",
            }),
            kind: args.kind.map(KindFilter::as_str),
            decisions: HashMap::new(),
        })
    }

    fn keep(&mut self, e: &Entry) -> bool {
        if e.kind == "decision" {
            if let Some(id) = e
                .value
                .get("decision_id")
                .and_then(serde_json::Value::as_u64)
            {
                let rule = e.str("rule").map(str::to_owned);
                let action = e.str("action").unwrap_or_default().to_owned();
                if self.decisions.len() >= MAX_REMEMBERED_DECISIONS {
                    // Outcomes follow their decisions within seconds; forgetting old
                    // ones only loses the join for outcomes that never came.
                    self.decisions.clear();
                }
                self.decisions.insert(id, (rule, action));
            }
        }
        if self.kind.is_some_and(|k| k != e.kind) {
            return false;
        }
        if self.since.is_some_and(|since| e.time < since) {
            return false;
        }
        if let Some(glob) = &self.exe {
            let Some(exe) = e.str("exe") else {
                return false;
            };
            let subject = if glob.full_path {
                exe
            } else {
                exe.rsplit('/').next().unwrap_or(exe)
            };
            if !glob.matcher.is_match(subject) {
                return false;
            }
        }
        if self.rule.is_some() || self.action.is_some() {
            let Some((rule, action)) = self.decision_of(e) else {
                return false;
            };
            if self
                .rule
                .as_deref()
                .is_some_and(|r| rule.as_deref() != Some(r))
            {
                return false;
            }
            if self.action.is_some_and(|a| a != action) {
                return false;
            }
        }
        true
    }

    /// The rule and action of the decision `e` is (or answers).
    fn decision_of(&self, e: &Entry) -> Option<(Option<String>, String)> {
        match e.kind.as_str() {
            "decision" => Some((
                e.str("rule").map(str::to_owned),
                e.str("action").unwrap_or_default().to_owned(),
            )),
            "outcome" => e
                .value
                .get("decision_id")
                .and_then(serde_json::Value::as_u64)
                .and_then(|id| self.decisions.get(&id).cloned()),
            _ => None,
        }
    }

    fn row(&self, e: &Entry) -> Row {
        let dash = || "-".to_owned();
        let short = |key: &str| {
            e.str(key)
                .map(|s| s.chars().take(12).collect::<String>())
                .unwrap_or_else(dash)
        };
        let id = e
            .value
            .get("decision_id")
            .and_then(serde_json::Value::as_u64)
            .map_or_else(dash, |id| id.to_string());
        let (exe, rule, action, detail) = match e.kind.as_str() {
            "decision" => {
                let mut action = e.str("action").unwrap_or("?").to_owned();
                if e.value
                    .get("would_unlock")
                    .and_then(serde_json::Value::as_bool)
                    == Some(true)
                {
                    action.push_str(" (would unlock)");
                }
                let mut detail = format!("id={id}");
                if let Some(profile) = e.str("profile") {
                    detail.push_str(&format!(" profile={profile}"));
                }
                detail.push_str(&format!(" mode={}", e.str("mode").unwrap_or("?")));
                if let Some(us) = e.int("latency_us") {
                    detail.push_str(&format!(" latency={us}us"));
                }
                (
                    e.str("exe"),
                    e.str("rule").map(str::to_owned),
                    action,
                    detail,
                )
            }
            "outcome" => {
                let rule = self.decision_of(e).and_then(|(rule, _)| rule);
                let mut detail = format!("id={id} device={}", e.str("device_class").unwrap_or("?"));
                if let Some(reason) = e.str("reason").filter(|r| !r.is_empty()) {
                    detail.push_str(&format!(" reason={reason:?}"));
                }
                let result = e.str("result").unwrap_or("?").to_owned();
                (e.str("exe"), rule, result, detail)
            }
            "policy_loaded" => {
                let warnings = e
                    .value
                    .get("warnings")
                    .and_then(serde_json::Value::as_array)
                    .map_or(0, Vec::len);
                let mut detail = format!(
                    "reason={} rules={} mode={} sha256={}",
                    e.str("reason").unwrap_or("?"),
                    e.int("rules").unwrap_or(0),
                    e.str("mode").unwrap_or("?"),
                    short("sha256"),
                );
                if warnings > 0 {
                    detail.push_str(&format!(" warnings={warnings}"));
                }
                (e.str("path"), None, "-".to_owned(), detail)
            }
            "policy_rejected" => {
                let errors: Vec<&str> = e
                    .value
                    .get("errors")
                    .and_then(serde_json::Value::as_array)
                    .map(|a| a.iter().filter_map(serde_json::Value::as_str).collect())
                    .unwrap_or_default();
                let mut detail = format!("kept={}", short("kept_sha256"));
                if let Some(first) = errors.first() {
                    detail.push_str(&format!(" {first}"));
                }
                if errors.len() > 1 {
                    detail.push_str(&format!(" (+{} more)", errors.len() - 1));
                }
                (e.str("path"), None, "-".to_owned(), detail)
            }
            "daemon_start" => (
                e.str("policy"),
                None,
                "-".to_owned(),
                format!(
                    "version={} listen={}",
                    e.str("version").unwrap_or("?"),
                    e.str("listen").unwrap_or("?")
                ),
            ),
            "daemon_stop" => (
                None,
                None,
                "-".to_owned(),
                format!(
                    "reason={} checkins={} unlocks={}",
                    e.str("reason").unwrap_or("?"),
                    e.int("checkins").unwrap_or(0),
                    e.int("unlocks").unwrap_or(0)
                ),
            ),
            _ => (e.str("exe"), None, "-".to_owned(), String::new()),
        };
        let pid = match e.kind.as_str() {
            "decision" | "outcome" | "daemon_start" => e.int("pid").map(|p| p.to_string()),
            _ => None,
        };
        Row([
            humantime::format_rfc3339_seconds(e.time).to_string(),
            e.kind.clone(),
            pid.unwrap_or_else(dash),
            exe.map_or_else(dash, str::to_owned),
            rule.unwrap_or_else(dash),
            action,
            detail,
        ])
    }
}

/// One table row: time, kind, pid, exe, rule, action, detail.
struct Row([String; COLUMNS]);

const COLUMNS: usize = 7;
const HEADERS: [&str; COLUMNS] = ["TIME", "KIND", "PID", "EXE", "RULE", "ACTION", "DETAIL"];

/// Column widths: fitted to the rows read first, kept for rows that follow.
struct Table {
    widths: [usize; COLUMNS],
}

impl Default for Table {
    fn default() -> Self {
        Table {
            widths: HEADERS.map(str::len),
        }
    }
}

impl Table {
    fn fit(&mut self, rows: &[Row]) {
        for row in rows {
            for (w, cell) in self.widths.iter_mut().zip(&row.0) {
                *w = (*w).max(cell.chars().count());
            }
        }
    }

    fn header(&self, out: &mut dyn Write) -> io::Result<()> {
        self.write(out, &HEADERS.map(str::to_owned))
    }

    fn line(&self, out: &mut dyn Write, row: &Row) -> io::Result<()> {
        self.write(out, &row.0)
    }

    fn write(&self, out: &mut dyn Write, cells: &[String; COLUMNS]) -> io::Result<()> {
        let mut line = String::new();
        for (i, (cell, width)) in cells.iter().zip(self.widths).enumerate() {
            if i + 1 == COLUMNS {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                let pad = width.saturating_sub(cell.chars().count()) + 2;
                line.extend(std::iter::repeat_n(' ', pad));
            }
        }
        writeln!(out, "{}", line.trim_end())
    }
}
