//! `metalift audit`: answers from the audit log in one command.
//!
//! The default view joins each decision with the outcome the shim reported for it
//! (by decision id): one line per process with its time, pid, rule, action, result
//! (applied / stock / failed / no outcome), policy hash and executable. `--records`
//! shows the raw records instead; `--summary` counts. It reads the file directly
//! rather than asking the daemon, so it takes `--log` (not `--socket`) and works
//! while metaliftd is stopped. Everything streams: memory stays bounded however
//! large the log (see [`join`] for what the join keeps).

pub mod dedup;
pub mod export;
pub mod filter;
pub mod flush;
pub mod group;
pub mod inputs;
pub mod join;
mod local_day;
pub mod markdown;
pub mod matrix;
pub mod records;
pub mod skim;
pub mod view;
pub mod when;

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use self::dedup::Dedup;
use self::filter::{ActionFilter, ExeFilter, Filters, LabelFilter, ResultFilter};
use self::inputs::Line;
use self::join::{Join, Process};
use self::view::{Columns, Summary};
use self::when::When;
use metalift_daemon::audit::collected;
use metalift_daemon::audit::line::parse_record;
use metalift_daemon::audit::reader::{parse_line, Entry, Item, LogReader};
use metalift_daemon::audit::{Record, DEFAULT_LOG_PATH};

/// Exit status when the input is not empty but holds no record at all.
pub const NO_RECORDS: u8 = 3;

/// Exit status of `--matrix` with `--require-verified` or `--fail-on-failed` when
/// a row fails the gate.
pub const MATRIX_GATE: u8 = 1;

/// Lines that are not records reported one by one; past it only counted.
const REPORTED_BAD_LINES: u64 = 10;

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

Inputs (--log, any number): a file is a log with its rotated siblings (PATH.1 ...,
and PATH.N.gz/.bz2/.zst); a directory is walked (an export bundle is its
audit.jsonl). Each line is a record as JSON, bare or behind a syslog header
(RFC 5424 as metaliftd sends it and rsyslog's %rawmsg% keeps it, or RFC 3164
`TIME HOST TAG:`). A record a collector received twice (same \"id\") counts once.

Exit status:
  0  records were read (whether or not anything matched)
  1  --matrix with --require-verified or --fail-on-failed: a row fails the gate
     (each named on stderr)
  2  an input cannot be read (missing, permission denied, a damaged compressed
     file: the others are still read), or a usage error
  3  the input is not empty but holds no record (the first offending line is named)")]
pub struct Args {
    /// `flush`, `export`: commands on the audit trail (without one: show it).
    #[command(subcommand)]
    pub command: Option<Command>,
    /// What to read: the audit log (its rotated files, PATH.1, PATH.2, ... and
    /// compressed ones, first), a collector's file or directory, an export bundle;
    /// any number, read in the order given.
    #[arg(long, visible_alias = "audit-log", value_name = "PATH", num_args = 1.., default_value = DEFAULT_LOG_PATH, env = "METALIFT_AUDIT_LOG")]
    pub log: Vec<PathBuf>,
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
    #[arg(long, value_name = "KIND", value_parser = clap::builder::PossibleValuesParser::new(Record::KINDS))]
    pub kind: Option<String>,
    /// Only records of guests with this host name, or this clone name (`host.instance`, the instance file the orchestrator writes).
    #[arg(long, value_name = "NAME")]
    pub host: Option<String>,
    /// Only records of the guest boot whose boot id starts with this (8 characters
    /// are shown in the GUEST column).
    #[arg(long = "boot-id", value_name = "ID")]
    pub boot_id: Option<String>,
    /// Only records whose host carries this label (`[audit.labels]`); repeatable,
    /// all must match.
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = filter::parse_label)]
    pub labels: Vec<LabelFilter>,
    /// Also show the value of this host label in the per-process view (a column in
    /// text and Markdown; JSON has every label); repeatable.
    #[arg(long = "show-label", value_name = "KEY")]
    pub show_labels: Vec<String>,
    /// Print counts by result, rule and executable instead of lines.
    #[arg(long, conflicts_with_all = ["records", "kind", "follow"])]
    pub summary: bool,
    /// With --summary: one row per group of these keys (comma-separated): host,
    /// boot, label:NAME, job, rule, exe, chip, os (macOS build), result; counts of
    /// processes, unlocked, applied, failed (top reasons), stock, no outcome.
    #[arg(long, value_name = "KEY[,KEY]", value_delimiter = ',', value_parser = group::parse_key, requires = "summary")]
    pub by: Vec<group::Key>,
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
    /// Only processes of this job: any value of the job claims the shim read from
    /// the process's environment (METALIFT_JOB_ID, GITHUB_RUN_ID, CI_JOB_ID,
    /// BUILDKITE_JOB_ID, BUILD_TAG, ...). Advisory: a process can claim any job. With --records: the
    /// decisions carrying it.
    #[arg(long, value_name = "ID")]
    pub job: Option<String>,
    /// A Markdown table of the unlocks (process, rule, result), e.g. for
    /// $GITHUB_STEP_SUMMARY: `metalift audit --job "$GITHUB_RUN_ID" --markdown`.
    /// With --summary: the groups as a Markdown table.
    #[arg(long, conflicts_with_all = ["records", "kind", "follow", "json"])]
    pub markdown: bool,
    /// The validated matrix: one row per host chip × macOS build × image ×
    /// executable, with processes applied / failed / stock, the last verification
    /// of that chip, build and image, and the workload speed-ups measured there
    /// (text; --markdown, --json, or --html for one self-contained page).
    #[arg(long, conflicts_with_all = ["records", "kind", "follow", "summary"])]
    pub matrix: bool,
    /// With --matrix: one self-contained HTML page (no script, nothing fetched).
    #[arg(long, requires = "matrix", conflicts_with_all = ["json", "markdown"])]
    pub html: bool,
    /// With --matrix: the host label that names the image (`[audit.labels]`).
    #[arg(long, value_name = "KEY", default_value = "image", requires = "matrix")]
    pub image_label: String,
    /// With --matrix: exit 1 when a row's chip, macOS build and image has no
    /// passing last verification.
    #[arg(long, requires = "matrix")]
    pub require_verified: bool,
    /// With --matrix: exit 1 when a row has a failed process.
    #[arg(long, requires = "matrix")]
    pub fail_on_failed: bool,
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
            "permission denied: cannot read {} (the audit log is readable by root \
             and the admin group only; run with sudo)",
            path.display()
        ),
        io::ErrorKind::NotFound => anyhow::anyhow!(
            "no audit log at {} (is metaliftd running, and with this --audit-log?)",
            path.display()
        ),
        _ => anyhow::Error::new(e).context(format!("cannot read {}", path.display())),
    }
}

/// What was read, for the closing report and the exit status.
#[derive(Debug, Default)]
struct Tally {
    /// Records read (known kinds or not; copies not counted).
    records: u64,
    /// Lines that are not records.
    bad_lines: u64,
    /// The first of them: where, what it is, and its text's start.
    first_bad: Option<String>,
    /// Records of kinds this version does not know (a newer daemon wrote them).
    unknown_kinds: u64,
}

/// Where matching lines go, and what is counted on the way.
struct Printer<'a> {
    out: &'a mut dyn Write,
    err: &'a mut dyn Write,
    json: bool,
    /// `--matrix --html`.
    html: bool,
    records_view: bool,
    summary: Option<Summary>,
    /// `--summary --by` (or `--summary --markdown`): counts by group.
    grouped: Option<group::Grouped>,
    /// `--matrix`.
    matrix: Option<matrix::Matrix>,
    /// `--markdown`: the unlocks, written at the end.
    markdown: Option<markdown::Table>,
    columns: Columns,
    filters: Filters,
    join: Join,
    decided: records::Decided,
    dedup: Dedup,
    tally: Tally,
    prefilter: skim::Prefilter,
    hosts: skim::Hosts,
}

impl Printer<'_> {
    /// Takes one line read: skims it, skips it when it cannot change the answer,
    /// parses it otherwise.
    fn line(&mut self, line: Line<'_>) -> io::Result<()> {
        let (text, file, number) = match line {
            Line::Corrupt(item) => return self.item(*item, false),
            Line::Text { text, file, number } => (text, file, number),
        };
        let Some((json, skimmed)) = collected::record_text(text)
            .ok()
            .and_then(|json| Some((json, skim::skim(json)?)))
        else {
            return self.item(parse_line(text, file, number), false);
        };
        if self.prefilter.skips(&skimmed, json, &self.join) {
            self.tally.records += 1;
            return Ok(());
        }
        if !self.dedup.first_time(skimmed.id) {
            return Ok(());
        }
        let stamp = self.hosts.stamp(&skimmed);
        let item = parse_record(json, Some(stamp), Some(skimmed.kind), file, number);
        self.item(item, true)
    }

    /// Takes one item read from the log (`deduplicated`: its id was counted already).
    fn item(&mut self, item: Item, deduplicated: bool) -> io::Result<()> {
        let entry = match item {
            Item::Entry(entry) => entry,
            Item::Corrupt { file, line, error } => {
                self.tally.bad_lines += 1;
                let at = format!("{}:{line}: {error}", file.display());
                if self.tally.bad_lines <= REPORTED_BAD_LINES {
                    writeln!(self.err, "metalift audit: {at}: skipped corrupt line")?;
                }
                self.tally.first_bad.get_or_insert(at);
                return Ok(());
            }
        };
        let Entry {
            raw, record, stamp, ..
        } = entry;
        if !deduplicated && !self.dedup.first_time(&stamp.id) {
            return Ok(());
        }
        self.tally.records += 1;
        let Some(record) = record else {
            self.tally.unknown_kinds += 1;
            return Ok(());
        };
        if !self.records_view {
            if !self.filters.keeps_guest(stamp.host.as_ref()) {
                return Ok(());
            }
            if let (Some(matrix), Record::Verification(v)) = (&mut self.matrix, &record) {
                if self.filters.keeps_record(&record, None) {
                    matrix.verification(v, stamp.host.as_ref());
                }
                return Ok(());
            }
            let mut join = std::mem::take(&mut self.join);
            let result = join.push(record, &stamp, &mut |p| self.process(p));
            self.join = join;
            return result;
        }
        let seen = self.decided.see(&record, &stamp);
        let decided = seen.as_ref().map(|(r, a)| (r.as_deref(), a.as_str()));
        if !self.filters.keeps_guest(stamp.host.as_ref())
            || !self.filters.keeps_record(&record, decided)
        {
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
        if let Some(grouped) = &mut self.grouped {
            grouped.add(&p);
            return Ok(());
        }
        if let Some(matrix) = &mut self.matrix {
            matrix.add(&p);
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
            (None, false) => view::line(self.out, &p, &self.columns),
        }
    }

    /// The end of what is read: the joined lines still waiting, the Markdown table
    /// or the summary, and the closing words on stderr.
    fn close(&mut self, json: bool) -> io::Result<()> {
        self.flush_join(None)?;
        if let Some(m) = &self.matrix {
            let rows = m.rows();
            if json {
                matrix::write_json(self.out, &rows)?;
            } else if self.markdown.is_some() {
                matrix::write_markdown(self.out, &rows)?;
            } else if self.html {
                matrix::write_html(self.out, &rows, SystemTime::now())?;
            } else {
                matrix::write_text(self.out, &rows)?;
            }
            self.out.flush()?;
            return self.report();
        }
        if let Some(grouped) = &self.grouped {
            if json {
                grouped.write_json(self.out)?;
            } else if self.markdown.is_some() {
                grouped.write_markdown(self.out)?;
            } else {
                grouped.write_text(self.out)?;
            }
            self.out.flush()?;
            return self.report();
        }
        if let Some(table) = &self.markdown {
            table.write(self.out)?;
        }
        if let Some(summary) = &self.summary {
            if json {
                summary.write_json(self.out)?;
            } else {
                summary.write_text(self.out)?;
            }
        }
        self.out.flush()?;
        self.report()
    }

    /// The closing words on stderr: lines skipped, copies, kinds not known.
    fn report(&mut self) -> io::Result<()> {
        let t = &self.tally;
        if t.bad_lines > REPORTED_BAD_LINES {
            writeln!(
                self.err,
                "metalift audit: skipped {} lines that are not records ({} not shown)",
                t.bad_lines,
                t.bad_lines - REPORTED_BAD_LINES
            )?;
        }
        if t.unknown_kinds > 0 {
            writeln!(
                self.err,
                "metalift audit: skipped {} records of kinds this version does not \
                 know (written by a newer metaliftd?)",
                t.unknown_kinds
            )?;
        }
        if self.dedup.forgotten > 0 {
            writeln!(
                self.err,
                "metalift audit: more than {} holes in the record ids: a copy of a record \
                 older than that may be counted twice",
                dedup::MAX_RANGES
            )?;
        }
        Ok(())
    }
}

/// `metalift audit` writing to `out`, with corrupt-line reports to `err`.
pub fn run_with(args: &Args, out: &mut dyn Write, err: &mut dyn Write) -> anyhow::Result<ExitCode> {
    let records_view = args.records || args.kind.is_some();
    let tail = args.follow || args.lines.is_some();
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
        kind: args.kind.clone(),
        job: args.job.clone(),
        host: args.host.clone(),
        boot_id: args.boot_id.clone(),
        labels: args.labels.clone(),
    };
    let mut printer = Printer {
        out,
        err,
        json: args.json,
        html: args.html,
        matrix: args.matrix.then(|| matrix::Matrix::new(&args.image_label)),
        records_view,
        summary: args.summary.then(Summary::default),
        grouped: (args.summary && (!args.by.is_empty() || args.markdown)).then(|| {
            let keys = if args.by.is_empty() {
                vec![group::Key::Result]
            } else {
                args.by.clone()
            };
            group::Grouped::new(keys)
        }),
        markdown: args
            .markdown
            .then(|| markdown::Table::new(&args.show_labels)),
        columns: Columns::new(&args.show_labels),
        filters,
        join: Join::default(),
        decided: records::Decided::default(),
        dedup: Dedup::default(),
        tally: Tally::default(),
        prefilter: skim::Prefilter::new(
            records_view,
            args.kind.as_deref(),
            args.rule.is_some() || args.action.is_some(),
            args.job.as_deref(),
            args.matrix,
        ),
        hosts: skim::Hosts::default(),
    };
    if tail {
        return follow(args, &mut printer);
    }
    let inputs = inputs::expand(&args.log).map_err(|e| read_error(first_missing(&args.log), e))?;
    if !args.json && !args.summary && !args.markdown && !args.matrix {
        if records_view {
            records::header(printer.out)?;
        } else {
            view::header(printer.out, &printer.columns)?;
        }
    }
    // A damaged input is reported and the others are still read; the run then
    // exits 2.
    let mut failed = None;
    for input in &inputs {
        if let Err(e) = inputs::read(input, &mut |line| printer.line(line)) {
            if e.kind() == io::ErrorKind::BrokenPipe {
                return Err(e.into());
            }
            let e = read_error(input.path(), e);
            writeln!(printer.err, "metalift audit: error: {e:#}")?;
            failed.get_or_insert(e);
        }
    }
    printer.close(args.json)?;
    if failed.is_some() {
        return Ok(ExitCode::from(crate::report::ERROR));
    }
    if let Some(m) = &printer.matrix {
        let why = m.gate_fails(args.require_verified, args.fail_on_failed);
        for reason in &why {
            writeln!(printer.err, "metalift audit: matrix: {reason}")?;
        }
        if !why.is_empty() {
            return Ok(ExitCode::from(MATRIX_GATE));
        }
    }
    if printer.tally.records == 0 {
        if let Some(first) = &printer.tally.first_bad {
            writeln!(
                printer.err,
                "metalift audit: error: no metalift record in {} lines read: expected one \
                 audit record per line, as JSON, bare or behind a syslog header (RFC 5424 \
                 `<PRI>1 TIME HOST APP PROCID MSGID SD {{...}}`, or RFC 3164 \
                 `TIME HOST TAG: {{...}}`); the first line that is not: {first}",
                printer.tally.bad_lines
            )?;
            return Ok(ExitCode::from(NO_RECORDS));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// The first of `paths` that does not exist (for an error that names it), or the first.
fn first_missing(paths: &[PathBuf]) -> &Path {
    paths
        .iter()
        .find(|p| std::fs::symlink_metadata(p).is_err())
        .or(paths.first())
        .map_or(Path::new(DEFAULT_LOG_PATH), PathBuf::as_path)
}

/// `--follow` and `-n`: the one live log, from its end.
fn follow(args: &Args, printer: &mut Printer<'_>) -> anyhow::Result<ExitCode> {
    let [log] = args.log.as_slice() else {
        anyhow::bail!("--follow and -n read one live log; give one --log PATH");
    };
    if std::fs::metadata(log).is_ok_and(|m| m.is_dir()) {
        anyhow::bail!(
            "--follow and -n read one live log file; {} is a directory",
            log.display()
        );
    }
    let records_view = printer.records_view;
    let mut wanted = |item: &Item| match item {
        Item::Entry(e) => records_view || e.kind == "decision",
        Item::Corrupt { .. } => false,
    };
    let mut reader = LogReader::open_tail(log, args.lines.unwrap_or(0), &mut wanted)
        .map_err(|e| read_error(log, e))?;
    if !args.json && !args.summary && !args.markdown {
        if records_view {
            records::header(printer.out)?;
        } else {
            view::header(printer.out, &printer.columns)?;
        }
    }
    reader
        .poll_each(&mut |item| printer.item(item, false))
        .map_err(|e| read_error(log, e))?;
    if !args.follow {
        printer.close(args.json)?;
        return Ok(ExitCode::SUCCESS);
    }
    printer.out.flush()?;
    loop {
        std::thread::sleep(FOLLOW_INTERVAL);
        reader
            .poll_each(&mut |item| printer.item(item, false))
            .map_err(|e| read_error(log, e))?;
        // An idle log: decisions whose outcome did not come within the window.
        printer.flush_join(Some(SystemTime::now()))?;
        printer.out.flush()?;
    }
}
