//! `metalift audit`: answers from the audit log in one command.
//!
//! The default view joins each decision with the outcome the shim reported for it
//! (by decision id): one line per process with its time, pid, rule, action, result
//! (applied / stock / failed / no outcome), policy hash and executable. `--records`
//! shows the raw records instead; `--summary` counts. It reads the file directly
//! rather than asking the daemon, so it takes `--log` (not `--socket`) and works
//! while metaliftd is stopped. Everything streams: memory stays bounded however
//! large the log (see [`join`] for what the join keeps).

pub mod export;
pub mod filter;
pub mod flush;
pub mod join;
mod local_day;
pub mod markdown;
pub mod records;
pub mod view;
pub mod when;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use self::filter::{ActionFilter, ExeFilter, Filters, KindFilter, ResultFilter};
use self::join::{Join, Process};
use self::view::Summary;
use self::when::When;
use metalift_daemon::audit::reader::{Entry, Item, LogReader};
use metalift_daemon::audit::DEFAULT_LOG_PATH;

/// How often `--follow` looks for new records.
const FOLLOW_INTERVAL: Duration = Duration::from_millis(250);

/// Arguments of `metalift audit`.
#[derive(Debug, clap::Args)]
#[command(args_conflicts_with_subcommands = true)]
#[command(after_help = "\
Views:
  default     one line per process: its decision joined with the shim's outcome
  --records   the raw records (decision, outcome, policy_loaded, ...)
  --summary   counts by result, rule and executable

Exit status:
  0  the log was read (whether or not anything matched)
  2  the log cannot be read (missing, permission denied), or a usage error")]
pub struct Args {
    /// `flush`, `export`: commands on the audit trail (without one: show it).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// The audit log; its rotated files (PATH.1, PATH.2, ...) are read first.
    #[arg(long, visible_alias = "audit-log", value_name = "PATH", default_value = DEFAULT_LOG_PATH, env = "METALIFT_AUDIT_LOG")]
    pub log: PathBuf,
    /// Only from WHEN on: an RFC 3339 time (2026-11-30T11:00:00Z, or with +01:00),
    /// a date (UTC), `today`, `yesterday` (local midnight), or a duration ago (10m, 2h, 1day).
    #[arg(long, value_name = "WHEN", value_parser = when::parse)]
    pub since: Option<When>,
    /// Only before WHEN (same forms as --since).
    #[arg(long, value_name = "WHEN", value_parser = when::parse)]
    pub until: Option<When>,
    /// Only this executable: a path (a symlink matches what it resolves to), a glob
    /// with `/` against the whole path, or a glob without `/` against the file name.
    #[arg(long, value_name = "PATH|GLOB")]
    pub exe: Option<String>,
    /// Only decisions by rule ID (and their outcomes).
    #[arg(long, value_name = "ID")]
    pub rule: Option<String>,
    /// Only decisions with this action (and their outcomes).
    #[arg(long, value_enum)]
    pub action: Option<ActionFilter>,
    /// Only processes whose outcome was this.
    #[arg(long, value_enum)]
    pub result: Option<ResultFilter>,
    /// Only this process id.
    #[arg(long, value_name = "PID")]
    pub pid: Option<i32>,
    /// Only this decision id.
    #[arg(long = "decision", value_name = "ID")]
    pub decision: Option<u64>,
    /// Show the raw records instead of one line per process.
    #[arg(long)]
    pub records: bool,
    /// Only records of this kind (implies --records).
    #[arg(long, value_enum)]
    pub kind: Option<KindFilter>,
    /// Print counts by result, rule and executable instead of lines.
    #[arg(long, conflicts_with_all = ["records", "kind", "follow"])]
    pub summary: bool,
    /// Follow the log from its end as records are appended, across rotations (Ctrl-C to stop).
    #[arg(long, short = 'f')]
    pub follow: bool,
    /// Only the last N processes (records, with --records) of the live file, like
    /// `tail -n`; with --follow, these first, then what is appended.
    #[arg(short = 'n', long = "lines", value_name = "N")]
    pub lines: Option<usize>,
    /// JSON Lines: one object per process (with --records: each record as written).
    #[arg(long)]
    pub json: bool,
    /// Only processes of this CI job: any value of the job claims the shim read from
    /// the process's environment (GITHUB_RUN_ID, CI_JOB_ID, BUILDKITE_JOB_ID,
    /// BUILD_TAG, ...). Advisory: a process can claim any job. With --records: the
    /// decisions carrying it.
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,
    /// A Markdown table of the unlocks (process, rule, result), e.g. for
    /// $GITHUB_STEP_SUMMARY: `metalift audit --job "$GITHUB_RUN_ID" --markdown`.
    #[arg(long, conflicts_with_all = ["records", "kind", "follow", "summary", "json"])]
    pub markdown: bool,
}

/// `metalift audit SUBCOMMAND`: what `metalift audit` does besides reading the log.
#[derive(Debug, clap::Subcommand)]
pub enum Command {
    /// Wait until every record written so far was delivered to the syslog collector.
    Flush(flush::Args),
    /// Write a self-contained bundle (this boot's records, the daemon's status, the
    /// live policy, SHA256SUMS) into a directory, e.g. a CI artifact.
    Export(export::Args),
}

/// Runs `metalift audit`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    if let Some(Command::Export(export)) = args.command {
        return export::run(export);
    }
    let stdout = io::stdout();
    let stderr = io::stderr();
    if let Some(Command::Flush(flush)) = &args.command {
        return flush::run(flush, &mut stdout.lock());
    }
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

/// Says what is wrong with reading `path` in the admin's words.
fn read_error(path: &Path, e: io::Error) -> anyhow::Error {
    match e.kind() {
        io::ErrorKind::PermissionDenied => anyhow::anyhow!(
            "permission denied: cannot read the audit log {} (it is readable by root \
             and the admin group only; run with sudo)",
            path.display()
        ),
        io::ErrorKind::NotFound => anyhow::anyhow!(
            "no audit log at {} (is metaliftd running, and with this --audit-log?)",
            path.display()
        ),
        _ => anyhow::Error::new(e).context(format!("cannot read audit log {}", path.display())),
    }
}

/// Where matching lines go, and what is counted on the way.
struct Printer<'a> {
    out: &'a mut dyn Write,
    err: &'a mut dyn Write,
    json: bool,
    records_view: bool,
    summary: Option<Summary>,
    /// `--markdown`: the unlocks, written at the end.
    markdown: Option<markdown::Table>,
    filters: Filters,
    join: Join,
    decided: records::Decided,
    /// Records of kinds this version does not know (a newer daemon wrote them).
    unknown_kinds: u64,
}

impl Printer<'_> {
    /// Takes one item read from the log.
    fn item(&mut self, item: Item) -> io::Result<()> {
        let entry = match item {
            Item::Entry(entry) => entry,
            Item::Corrupt { file, line, error } => {
                return writeln!(
                    self.err,
                    "metalift audit: {}:{line}: skipped corrupt line: {error}",
                    file.display()
                );
            }
        };
        let Entry { raw, record, .. } = entry;
        let Some(record) = record else {
            self.unknown_kinds += 1;
            return Ok(());
        };
        if !self.records_view {
            let mut join = std::mem::take(&mut self.join);
            let result = join.push(record, &mut |p| self.process(p));
            self.join = join;
            return result;
        }
        let seen = self.decided.see(&record);
        let decided = seen.as_ref().map(|(r, a)| (r.as_deref(), a.as_str()));
        if !self.filters.keeps_record(&record, decided) {
            return Ok(());
        }
        if self.json {
            writeln!(self.out, "{raw}")
        } else {
            records::row(self.out, &record, decided.and_then(|(rule, _)| rule))
        }
    }

    /// Reports joined lines that are complete: those whose decision waited past
    /// the window before `now` (`None`: at the end, every one still waiting).
    fn flush_join(&mut self, now: Option<SystemTime>) -> io::Result<()> {
        let mut join = std::mem::take(&mut self.join);
        let result = match now {
            Some(now) => join.expire(now, &mut |p| self.process(p)),
            None => join.finish(&mut |p| self.process(p)),
        };
        self.join = join;
        result
    }

    fn process(&mut self, p: Process) -> io::Result<()> {
        if !self.filters.keeps_process(&p) {
            return Ok(());
        }
        if let Some(table) = &mut self.markdown {
            table.add(p);
            return Ok(());
        }
        match (&mut self.summary, self.json) {
            (Some(summary), _) => {
                summary.add(&p);
                Ok(())
            }
            (None, true) => view::json_line(self.out, &p),
            (None, false) => view::line(self.out, &p),
        }
    }
}

/// `metalift audit` writing to `out`, with corrupt-line reports to `err`.
pub fn run_with(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<ExitCode> {
    let records_view = args.records || args.kind.is_some();
    if !args.follow {
        std::fs::metadata(&args.log).map_err(|e| read_error(&args.log, e))?;
    }
    let now = SystemTime::now();
    let filters = Filters {
        since: args.since.map(|w| w.resolve(now)),
        until: args.until.map(|w| w.resolve(now)),
        exe: args.exe.as_deref().map(ExeFilter::new).transpose()?,
        rule: args.rule.clone(),
        action: args.action,
        result: args.result,
        pid: args.pid,
        decision: args.decision,
        kind: args.kind,
        job: args.job.clone(),
    };
    let tail = args.follow || args.lines.is_some();
    let mut reader = if tail {
        let mut wanted = |item: &Item| match item {
            Item::Entry(e) => records_view || e.kind == "decision",
            Item::Corrupt { .. } => false,
        };
        LogReader::open_tail(&args.log, args.lines.unwrap_or(0), &mut wanted)
    } else {
        LogReader::open(&args.log)
    }
    .map_err(|e| read_error(&args.log, e))?;

    let mut printer = Printer {
        out,
        err,
        json: args.json,
        records_view,
        summary: args.summary.then(Summary::default),
        markdown: args.markdown.then(markdown::Table::default),
        filters,
        join: Join::default(),
        decided: records::Decided::default(),
        unknown_kinds: 0,
    };
    if !args.json && !args.summary && !args.markdown {
        if records_view {
            records::header(printer.out)?;
        } else {
            view::header(printer.out)?;
        }
    }
    if tail {
        reader.poll_each(&mut |item| printer.item(item))
    } else {
        reader.read_to_end_each(&mut |item| printer.item(item))
    }
    .map_err(|e| read_error(&args.log, e))?;
    if !args.follow {
        printer.flush_join(None)?;
        if let Some(table) = &printer.markdown {
            table.write(printer.out)?;
        }
        if let Some(summary) = &printer.summary {
            if args.json {
                summary.write_json(printer.out)?;
            } else {
                summary.write_text(printer.out)?;
            }
        }
        printer.out.flush()?;
        if printer.unknown_kinds > 0 {
            writeln!(
                printer.err,
                "metalift audit: skipped {} records of kinds this version does not \
                 know (written by a newer metaliftd?)",
                printer.unknown_kinds
            )?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    printer.out.flush()?;
    loop {
        std::thread::sleep(FOLLOW_INTERVAL);
        reader
            .poll_each(&mut |item| printer.item(item))
            .map_err(|e| read_error(&args.log, e))?;
        // An idle log: decisions whose outcome did not come within the window.
        printer.flush_join(Some(SystemTime::now()))?;
        printer.out.flush()?;
    }
}
