//! `metalift edit`: visudo for the policy. Takes the edit lock, copies the policy
//! (or one drop-in) to a temporary file beside it, runs `$VISUAL`/`$EDITOR`,
//! validates the result together with the installed drop-ins exactly as metaliftd
//! will (the policy crate's loader and compiler, as `metalift validate` uses),
//! and only then installs it atomically with the owner and mode metaliftd
//! requires. A broken edit is shown (`file:line:col`) and can be edited again or
//! discarded; the installed file is never half-written, never insecure, and never
//! invalid. Nor does it overwrite a change it did not see: if the file changed
//! while the editor was open (a configuration tool replaced it, wrote it, removed
//! or created it), nothing is installed and the admin's copy is kept beside it.
//! Then it prints the new policy hash and, when metaliftd answers, waits
//! until that hash is live (or reports why the daemon refused it).

mod changed;
mod editor;
pub mod install;
mod live;
pub mod lock;
mod replace;
mod seen;

use std::fs::{self, OpenOptions};
use std::io::{self, BufRead, IsTerminal, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context as _};
use metalift_policy::{
    compile_sources_with, load_within, CompileOptions, Diagnostic, HostFamily, LoadError,
    LoadOptions, Loaded, Source,
};
use serde_json::json;

use self::live::Live;
use self::lock::EditLock;
use self::seen::{Change, Seen};
use crate::judgement::{Judgement, Limits};
use metalift_daemon::service::config::DEFAULT_POLICY;

/// Exit status: installed (or nothing to install).
pub const DONE: u8 = 0;
/// Exit status: not installed, the file changed during the edit.
pub use changed::NOT_INSTALLED;
/// Exit status: the edit was invalid and discarded.
pub const DISCARDED: u8 = 1;
/// Exit status: installed, but the daemon refused it or did not make it live in time.
pub const NOT_LIVE: u8 = 3;

/// What a new main policy file starts as.
const NEW_POLICY: &str = "version = 1\nmode = \"enforce\"\n";

/// What a new drop-in starts as (no `version` or `mode`: those belong to the main file).
const NEW_DROPIN: &str = "# A policy.d/ drop-in: [profile.NAME] and [[rule]] tables, merged after\n# the main policy in file-name order (no `version` or `mode` here).\n";

/// Arguments of `metalift edit`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The editor is $VISUAL, else $EDITOR, else vi (split like a shell: VISUAL='code --wait').
Only one edit runs at a time (a lock file .policy.toml.lock beside the policy).

Exit status:
  0  installed (and live when a daemon answers), or no changes
  1  the edit was invalid and discarded (non-interactive stdin discards at once)
  2  error: lock busy, editor failed, cannot read or install
  3  installed, but metaliftd refused it, did not make it live in time, or did
     not answer (hung)
  5  not installed: the file changed during the edit (someone else replaced,
     wrote, removed or created it); the edited copy is kept beside it")]
pub struct Args {
    /// The main policy file; its policy.d/ drop-ins are validated with it.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_POLICY, env = "METALIFT_POLICY")]
    pub policy: PathBuf,
    /// Edit the drop-in policy.d/NAME (NAME.toml) instead of the main file.
    #[arg(long, value_name = "NAME")]
    pub dropin: Option<String>,
    // The daemon to wait for.
    #[command(flatten)]
    pub daemon: crate::daemon_args::DaemonArgs,
    /// How long to wait for the daemon to make the new policy live.
    #[arg(long, value_name = "SECONDS", default_value_t = 5)]
    pub wait: u64,
    /// Accept and install files not owned by root (development only, as metaliftd's flag).
    #[arg(long)]
    pub allow_insecure_owner: bool,
    /// Print the result as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// The temporary copy the editor works on; removed however the edit ends.
struct Scratch(PathBuf);

impl Scratch {
    fn create(target: &Path, contents: &[u8]) -> anyhow::Result<Scratch> {
        let dir = target.parent().unwrap_or_else(|| Path::new("."));
        let name = target
            .file_name()
            .map_or_else(|| "policy".into(), |n| n.to_string_lossy());
        let stem = name.strip_suffix(".toml").unwrap_or(&name);
        // A leading dot: metaliftd's loader and watcher skip it in policy.d/.
        let path = dir.join(format!(".{stem}.edit-{}.toml", std::process::id()));
        let _ = fs::remove_file(&path);
        let mut file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("cannot create {}", path.display()))?;
        let scratch = Scratch(path);
        file.write_all(contents)
            .and_then(|()| file.sync_all())
            .with_context(|| format!("cannot write {}", scratch.0.display()))?;
        Ok(scratch)
    }

    /// Starts the copy over with `contents`.
    fn rewrite(&self, contents: &[u8]) -> anyhow::Result<()> {
        let mut file = OpenOptions::new()
            .write(true)
            .truncate(true)
            .open(&self.0)
            .with_context(|| format!("cannot write {}", self.0.display()))?;
        file.write_all(contents)
            .and_then(|()| file.sync_all())
            .with_context(|| format!("cannot write {}", self.0.display()))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.0);
    }
}

/// The file being edited: the policy, or `policy.d/NAME.toml` beside it.
fn target_path(args: &Args) -> anyhow::Result<PathBuf> {
    let Some(name) = &args.dropin else {
        return Ok(args.policy.clone());
    };
    if name.is_empty() || name.contains('/') || name.starts_with('.') {
        bail!(
            "--dropin {name:?}: a file name in policy.d/, not a path (and not starting with '.')"
        );
    }
    let name = if name.ends_with(".toml") {
        name.clone()
    } else {
        format!("{name}.toml")
    };
    Ok(args
        .policy
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join("policy.d")
        .join(name))
}

/// The daemon's judgement now, when a socket is known.
fn judged(args: &Args) -> Option<Judgement> {
    args.daemon
        .known_socket()
        .map(|s| crate::judgement::ask(&args.daemon, &s))
}

/// Runs `metalift edit`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let target = target_path(&args)?;
    // The limits the edit is validated with: the daemon's (its status), as
    // `doctor` takes them, not this CLI's compiled defaults.
    let limits = Limits::of(judged(&args).as_ref());
    let interactive = io::stdin().is_terminal();
    let _lock = EditLock::take(&args.policy, interactive)?;
    if args.dropin.is_some() {
        if !args.policy.exists() {
            bail!(
                "{} does not exist: metaliftd reads policy.d/ only beside it; edit it first",
                args.policy.display()
            );
        }
        if let Some(dir) = target.parent().filter(|d| !d.exists()) {
            use std::os::unix::fs::DirBuilderExt;
            fs::DirBuilder::new()
                .mode(0o755)
                .create(dir)
                .with_context(|| format!("cannot create {}", dir.display()))?;
        }
    }
    let mut base = Base::read(&args, &target)?;
    let scratch = Scratch::create(&target, &base.original)?;
    let editor = editor::command_line()?;
    loop {
        let status = editor::edit(&editor, &scratch.0)?;
        if !status.success() {
            bail!(
                "the editor ({}) ended with {status}: nothing installed, {} unchanged",
                editor.join(" "),
                target.display()
            );
        }
        let edited = fs::read(&scratch.0)
            .with_context(|| format!("cannot read the edited copy {}", scratch.0.display()))?;
        if edited == base.original {
            return finish(&args, &target, None, None);
        }
        // Seen now, the change is reported before validating (whose answer would
        // be about a file that is no longer there); `install` looks again last.
        let now = base
            .seen
            .check(&target)
            .with_context(|| format!("cannot read {} to see if it changed", target.display()))?;
        let change = match now {
            Some(change) => change,
            None => match install_valid(
                &args,
                &limits,
                &target,
                &scratch,
                &edited,
                &base,
                interactive,
            )? {
                Attempt::Over(code) => return Ok(code),
                Attempt::EditAgain => continue,
                Attempt::Changed(change) => change,
            },
        };
        let kept = changed::keep(&target, &edited)?;
        changed::report(&args, &target, &kept, change);
        if interactive && !args.json && changed::ask_edit_new_file()? {
            base = Base::read(&args, &target)?;
            scratch.rewrite(&base.original)?;
            continue;
        }
        return Ok(ExitCode::from(changed::NOT_INSTALLED));
    }
}

/// How [`install_valid`] ended.
enum Attempt {
    /// The edit is over with this exit status (installed, or invalid and discarded).
    Over(ExitCode),
    /// The edit was invalid and the admin chose to edit it again.
    EditAgain,
    /// The file changed after the last look, before the rename.
    Changed(Change),
}

/// Validates `edited` and installs it if it is valid and the file is still what
/// `base` saw.
fn install_valid(
    args: &Args,
    limits: &Limits,
    target: &Path,
    scratch: &Scratch,
    edited: &[u8],
    base: &Base,
    interactive: bool,
) -> anyhow::Result<Attempt> {
    match check(args, limits, target, &scratch.0, edited)? {
        Ok(loaded) => {
            // `"host"` on a chip unknown here is a note, as in every tool.
            for warning in crate::host_severity::judged(loaded.warnings.clone()) {
                eprintln!("{}\n", warning.render(&loaded.sources));
            }
            let before = live::snapshot(&args.daemon);
            let change = install::install(
                target,
                edited,
                base.placement,
                args.allow_insecure_owner,
                &base.seen,
            )?;
            if let Some(change) = change {
                return Ok(Attempt::Changed(change));
            }
            let hash = loaded.policy.sha256_hex().to_owned();
            let live = live::wait(before, &args.policy, &hash, Duration::from_secs(args.wait));
            Ok(Attempt::Over(finish(args, target, Some(hash), Some(live))?))
        }
        Err(problems) => {
            eprint!("{}", problems.text);
            if interactive && ask_edit_again()? {
                return Ok(Attempt::EditAgain);
            }
            let message = format!(
                "invalid edit discarded: {} unchanged ({})",
                target.display(),
                problems.summary
            );
            if args.json {
                println!(
                    "{}",
                    json!({"ok": false, "error": message, "code": DISCARDED,
                           "diagnostics": problems.lines})
                );
            } else {
                eprintln!("metalift: {message}");
            }
            Ok(Attempt::Over(ExitCode::from(DISCARDED)))
        }
    }
}

/// What an edit starts from (again, when it restarts on a file that changed).
struct Base {
    /// The file as it was copied: the install happens only if it is still this
    /// (same kind, same link, same bytes).
    seen: Seen,
    /// What the editor is given: the file's bytes, or a template for a new file.
    original: Vec<u8>,
    /// The new file's owner and mode, decided before the editor starts: an edit
    /// that could not be installed is not offered.
    placement: install::Placement,
}

impl Base {
    fn read(args: &Args, target: &Path) -> anyhow::Result<Base> {
        let existing = match fs::metadata(target) {
            Ok(meta) if meta.is_file() => Some(meta),
            Ok(_) => bail!("{} is not a regular file", target.display()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(e).with_context(|| format!("cannot read {}", target.display())),
        };
        let placement = install::placement(
            existing.as_ref(),
            args.allow_insecure_owner,
            rustix::process::geteuid().as_raw(),
            rustix::process::getegid().as_raw(),
        )?;
        let (seen, copied) =
            Seen::read(target).with_context(|| format!("cannot read {}", target.display()))?;
        let original = match &existing {
            Some(_) => copied,
            None if args.dropin.is_some() => NEW_DROPIN.as_bytes().to_vec(),
            None => NEW_POLICY.as_bytes().to_vec(),
        };
        Ok(Base {
            seen,
            original,
            placement,
        })
    }
}

/// What was wrong with an edit, rendered.
struct Problems {
    /// Every diagnostic with its source line and underline.
    text: String,
    /// `file:line:col: severity: message`, one per diagnostic.
    lines: Vec<String>,
    /// "2 errors".
    summary: String,
}

/// Validates `edited` as the new contents of `target`, with the drop-ins installed
/// now, named as metaliftd names them (so the hash is the one it will report),
/// within the daemon's `limits` (size and host chip).
fn check(
    args: &Args,
    limits: &Limits,
    target: &Path,
    scratch: &Path,
    edited: &[u8],
) -> anyhow::Result<Result<Loaded, Problems>> {
    let name = target.display().to_string();
    let Ok(text) = std::str::from_utf8(edited) else {
        let at = std::str::from_utf8(edited)
            .err()
            .map_or(0, |e| e.valid_up_to());
        let line = format!("{name}: error: not valid UTF-8 (byte {at})");
        return Ok(Err(Problems {
            text: format!("{line}\n"),
            lines: vec![line],
            summary: "1 error".into(),
        }));
    };
    let opts = LoadOptions {
        allow_insecure_owner: args.allow_insecure_owner,
    };
    // `apple_family_max = "host"` resolves for the daemon's chip (else this
    // machine's), as `metalift validate --socket` and `doctor` do.
    let options = CompileOptions {
        host: HostFamily {
            brand: limits.host_chip_brand.clone(),
        },
        now: Some(std::time::SystemTime::now()),
    };
    let max = limits.max_policy_bytes;
    let read = |path: &Path| match load_within(path, &opts, &options, max) {
        Ok(loaded) => Ok(loaded.sources),
        Err(LoadError::Invalid { sources, .. }) => Ok(sources),
        Err(e) => {
            Err(anyhow::Error::new(e).context("cannot read the installed policy to validate with"))
        }
    };
    let mut sources: Vec<Source> = if args.dropin.is_none() {
        // The copy sits beside the policy, so the loader reads the same policy.d/.
        let mut sources = read(scratch)?;
        if let Some(main) = sources.first_mut() {
            *main = Source::new(name.clone(), text);
        }
        sources
    } else {
        read(&args.policy)?
    };
    if args.dropin.is_some() {
        match sources.iter_mut().find(|s| s.name == name) {
            Some(source) => source.text = text.to_owned(),
            None => {
                let file = |s: &Source| Path::new(&s.name).file_name().map(|n| n.to_owned());
                let new_name = target.file_name().map(|n| n.to_owned());
                let at = sources
                    .iter()
                    .skip(1)
                    .position(|s| file(s) > new_name)
                    .map_or(sources.len(), |i| i + 1);
                sources.insert(at, Source::new(name.clone(), text));
            }
        }
    }
    let bytes = sources
        .iter()
        .map(|s| s.text.len() as u64)
        .fold(0, u64::saturating_add);
    if bytes > max {
        let line = format!(
            "{name}: error: the policy would be {bytes} bytes (with policy.d/), over the \
             daemon's {max}-byte limit (metaliftd --max-policy-bytes): it would refuse it unread"
        );
        return Ok(Err(Problems {
            text: format!("{line}\n"),
            lines: vec![line],
            summary: "1 error".into(),
        }));
    }
    match compile_sources_with(sources, &options) {
        Ok(loaded) => Ok(Ok(loaded)),
        Err(LoadError::Invalid {
            diagnostics,
            sources,
        }) => Ok(Err(problems(&diagnostics, &sources))),
        Err(e) => Err(e.into()),
    }
}

fn problems(diagnostics: &[Diagnostic], sources: &[Source]) -> Problems {
    let errors = diagnostics.iter().filter(|d| d.is_error()).count();
    Problems {
        text: diagnostics
            .iter()
            .map(|d| format!("{}\n\n", d.render(sources)))
            .collect(),
        lines: diagnostics.iter().map(ToString::to_string).collect(),
        summary: format!("{errors} error{}", if errors == 1 { "" } else { "s" }),
    }
}

/// Asks what to do with an invalid edit; `true`: edit again.
fn ask_edit_again() -> anyhow::Result<bool> {
    ask_edit_or("What now? [e]dit again, [d]iscard: ", "d", "discard")
}

/// Asks `prompt` on the terminal until the answer is `e`/`edit` (`true`) or
/// `no`/`no_word` (`false`, also at end of input); case-insensitive letters.
pub(crate) fn ask_edit_or(prompt: &str, no: &str, no_word: &str) -> anyhow::Result<bool> {
    let stdin = io::stdin();
    loop {
        eprint!("{prompt}");
        io::stderr().flush()?;
        let mut answer = String::new();
        if stdin.lock().read_line(&mut answer)? == 0 {
            return Ok(false);
        }
        let answer = answer.trim();
        if answer.eq_ignore_ascii_case("e") || answer == "edit" {
            return Ok(true);
        }
        if answer.eq_ignore_ascii_case(no) || answer == no_word {
            return Ok(false);
        }
    }
}

/// Reports the result; `hash`/`live` are `None` when nothing changed.
fn finish(
    args: &Args,
    target: &Path,
    hash: Option<String>,
    live: Option<Live>,
) -> anyhow::Result<ExitCode> {
    let code = match &live {
        None | Some(Live::Serving { .. } | Live::NoDaemon(_)) => DONE,
        Some(Live::Refused(_) | Live::Timeout { .. } | Live::NoAnswer(_)) => NOT_LIVE,
    };
    // The daemon's state after the edit, as every tool judges it.
    let judged = judged(args);
    if args.json {
        let daemon = live.as_ref().map(Live::to_json);
        println!(
            "{}",
            json!({
                "ok": code == DONE,
                "path": target.display().to_string(),
                "changed": hash.is_some(),
                "sha256": hash,
                "daemon": daemon,
                "judgement": judged.as_ref().map(Judgement::to_json),
                "code": code,
            })
        );
        return Ok(ExitCode::from(code));
    }
    match (&hash, &live) {
        (Some(hash), Some(live)) => {
            println!("installed {} (policy sha256 {hash})", target.display());
            println!("{}", live.describe());
        }
        _ if target.exists() => println!("no changes: {} unchanged", target.display()),
        _ => println!("no changes: {} not created", target.display()),
    }
    // When it answered: that no daemon answers is said once, by the line above.
    if let Some(judged) = judged.as_ref().filter(|j| j.report.is_some()) {
        println!("{}", judged.line());
    }
    Ok(ExitCode::from(code))
}
