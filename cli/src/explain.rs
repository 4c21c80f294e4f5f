//! `metalift explain`: shows which rule decides for an executable or a running
//! process, every rule considered and why, and the profile values the shim would apply.
//!
//! The subject is built the way metaliftd builds it: the executable's resolved path,
//! its sha256 only when some rule needs it, the uid, the user name, and the parent's
//! executable. The code-signature fields can only be supplied by hand here
//! (`--team-id` and friends), to ask "what if"; the daemon reads them from the kernel.
//!
//! Which policy: the file on disk (`--policy`, default), the daemon's live policy
//! (`--live`: its hash from `metalift status`, its text from the policy archive beside
//! the audit log), or the one that decided a past decision (`--decision ID`: the
//! record from the audit log, rotated files included, and the policy archived under
//! the hash it names). The archive is [`metalift_daemon::live_policy::archive`]; a policy no longer
//! in it is reported as such, never silently replaced by the file on disk.
//!
//! Paths: rules match the resolved executable (the kernel reports it resolved), so
//! `--path` is resolved first and the resolution is shown.
//!
//! Exit codes: 0 explained, 1 the policy is invalid, 2 the policy, the executable,
//! the daemon, the decision or its archived policy could not be read.

use std::fs::File;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::judgement::{Judgement, Level};

use anyhow::Context;
use metalift_policy::{
    load_with, Action, Capabilities, CompileOptions, HostFamily, LoadError, LoadOptions, Loaded,
    Policy, Subject, Verdict,
};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use metalift_daemon::live_policy::verification;
use metalift_daemon::service::config::DEFAULT_POLICY;

mod past;
use past::{archived_policy, compare_text, decision_text, find_decision, live_policy, subject_of};

/// Exit status: the policy to explain with is invalid.
pub const INVALID_POLICY: u8 = 1;

/// Arguments of `metalift explain`.
#[derive(Debug, clap::Args)]
#[command(group(clap::ArgGroup::new("who").required(true).args(["path", "pid", "decision"])))]
pub struct Args {
    /// The main policy file (`policy.d/` beside it is read too). Not read with
    /// --live, which explains with the daemon's own policy.
    #[arg(long, default_value = DEFAULT_POLICY, env = "METALIFT_POLICY")]
    pub policy: PathBuf,
    /// Explain for this executable.
    #[arg(long)]
    pub path: Option<PathBuf>,
    /// Explain for this running process (Linux: read from /proc).
    #[arg(long)]
    pub pid: Option<u32>,
    /// Re-explain this past decision (its id from the audit log) with the policy that
    /// was live then.
    #[arg(long, value_name = "ID", conflicts_with_all = ["live", "uid", "parent", "team_id", "signing_id", "cdhash", "anchor"])]
    pub decision: Option<u64>,
    /// Explain with the running daemon's live policy instead of the file on disk.
    // No clap conflict with --policy: a METALIFT_POLICY set for every command
    // would make every --live a usage error.
    #[arg(long)]
    pub live: bool,
    // The daemon, for --live.
    #[command(flatten)]
    pub daemon: crate::daemon_args::DaemonArgs,
    /// The audit log (its rotated files are read too); the policy archive is the
    /// `policies/` directory beside it. For --live and --decision. Or an export
    /// bundle's directory (`metalift audit export`): its records and the policies
    /// its decisions name.
    #[arg(long, visible_alias = "audit-log", value_name = "PATH", default_value = metalift_daemon::audit::DEFAULT_LOG_PATH, env = "METALIFT_AUDIT_LOG")]
    pub log: PathBuf,
    /// What if the host chip were this brand (for `apple_family_max = "host"`, and the
    /// family no profile is applied above) [default: this machine's
    /// `machdep.cpu.brand_string` on macOS].
    #[arg(long, value_name = "BRAND")]
    pub host_chip_brand: Option<String>,
    /// The uid to decide for (default: the process's, or yours with --path).
    #[arg(long)]
    pub uid: Option<u32>,
    /// What if the parent process's executable were this.
    #[arg(long)]
    pub parent: Option<PathBuf>,
    /// What if the executable's valid signature had this team id.
    #[arg(long)]
    pub team_id: Option<String>,
    /// What if the executable's valid signature had this signing id.
    #[arg(long)]
    pub signing_id: Option<String>,
    /// What if the executable's valid signature had this cdhash (40 hex digits).
    #[arg(long)]
    pub cdhash: Option<String>,
    /// What if the signature were anchored at this: apple (Apple's own code, for
    /// `platform = true` rules), developer-id, app-store, apple-development,
    /// ad-hoc, untrusted, invalid, unsigned, unreadable. The daemon keeps a
    /// signature's team id and signing id only for the first four, and so does
    /// explain [default: none; --team-id/--signing-id are then taken as trusted].
    #[arg(long, value_name = "ANCHOR")]
    pub anchor: Option<metalift_policy::Anchor>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    pub json: bool,
    /// Accept policy files not owned by root or writable by group/other (development only).
    #[arg(long)]
    pub allow_insecure_owner: bool,
}

/// How the sha256 field of the subject came to be what it is.
#[derive(Debug)]
enum HashNote {
    NotNeeded,
    Computed,
    Unreadable(String),
}

/// The policy being explained and where it came from.
struct Chosen {
    policy: Policy,
    /// Its files' names, load order.
    files: Vec<String>,
    /// Where it came from, for the header: a path, or "live in metaliftd ...".
    origin: String,
    /// Said before the explanation (e.g. "no such policy file").
    note: Option<String>,
    /// `--live`: the daemon's policy path and host chip, where and for what the
    /// verifications that gate `require_verified` profiles are judged.
    daemon: Option<(PathBuf, Option<String>)>,
    /// The compiled policy's warnings and notes, each weighed as every tool
    /// weighs it ([`crate::host_severity`]: `"host"` on an unknown chip is a note).
    diagnostics: Vec<metalift_policy::Diagnostic>,
}

/// Runs `metalift explain`.
pub fn run(mut args: Args) -> anyhow::Result<ExitCode> {
    // An export bundle is read as its audit.jsonl, whose `policies/` beside it is
    // the bundle's copy of the archive (audit export writes it in that layout).
    if crate::audit::inputs::is_bundle(&args.log) {
        args.log = args.log.join("audit.jsonl");
    }
    let mut decision = None;
    let mut judged = None;
    let chosen = if let Some(id) = args.decision {
        let record = match find_decision(&args.log, id) {
            Ok(Some(r)) => r,
            Ok(None) => {
                eprintln!(
                    "metalift: error: no decision {id} in {} (or its rotated files)",
                    args.log.display()
                );
                return Ok(ExitCode::from(2));
            }
            Err(e) => {
                eprintln!("metalift: error: reading {}: {e:#}", args.log.display());
                return Ok(ExitCode::from(2));
            }
        };
        if !args.json {
            print!("{}", decision_text(&record));
        }
        // The chip the daemon decided on, as it recorded it.
        let recorded_chip = record
            .raw
            .get("host_chip")
            .and_then(Value::as_str)
            .map(str::to_owned);
        let archived = archived_policy(
            &args,
            &record.policy_sha256,
            &host_for(&args, recorded_chip),
            "that was live then",
        );
        decision = Some(record);
        archived
    } else if args.live {
        let (j, chosen) = live_policy(&args);
        judged = j;
        chosen
    } else {
        file_policy(&args, &host_for(&args, None))
    };
    let chosen = match chosen {
        Ok(c) => c,
        Err(_) if judged.as_ref().is_some_and(|j| j.level > Level::Healthy) => {
            return Ok(ExitCode::from(live_ladder(judged.as_ref(), 0)));
        }
        Err(code) => return Ok(code),
    };

    let built = match &decision {
        Some(record) => Ok(subject_of(record, &chosen.policy)),
        None => build_subject(&args, &chosen.policy),
    };
    let (subject, hash_note, given) = match built {
        Ok(s) => s,
        Err(e) => {
            eprintln!("metalift: error: {e:#}");
            return Ok(ExitCode::from(2));
        }
    };
    // A decision is explained at the time it was decided (a rule's window may have
    // closed since); anything else at this moment, as metaliftd would decide now.
    let at = decision
        .as_ref()
        .and_then(|r| r.raw.get("time"))
        .and_then(Value::as_str)
        .and_then(|t| metalift_policy::window::parse_rfc3339(t).ok())
        .unwrap_or_else(std::time::SystemTime::now);
    let mut verdict = chosen.policy.explain(&subject, at);
    if let Some(record) = &decision {
        // Verified unlock as it was judged then (against the verifications of
        // that moment, which today's file no longer shows).
        if let Some(reason) = record.raw.get("unverified").and_then(Value::as_str) {
            verdict = verification::unverified(verdict, reason.to_owned());
        }
    } else {
        // Verified unlock as metaliftd answers now, given verifications.jsonl
        // beside its policy (--live) or beside the file explained.
        let (policy_path, chip) = chosen
            .daemon
            .clone()
            .unwrap_or_else(|| (args.policy.clone(), host_for(&args, None).host.brand));
        verdict = crate::verify::store_here(&policy_path, chip, args.allow_insecure_owner)
            .gate(verdict, &chosen.policy);
    }
    if args.json {
        let mut doc = explain_json(&chosen, &subject, &hash_note, &verdict);
        if let Some(obj) = doc.as_object_mut() {
            obj.insert("unverified".into(), json!(verdict.unverified));
            obj.insert(
                "given_path".into(),
                json!(given.as_ref().map(|g| g.display().to_string())),
            );
            obj.insert(
                "decision".into(),
                decision.as_ref().map_or(Value::Null, |r| r.raw.clone()),
            );
        }
        println!("{}", serde_json::to_string_pretty(&doc)?);
    } else {
        if let Some(note) = &chosen.note {
            println!("{note}");
        }
        for d in &chosen.diagnostics {
            println!("{d}");
        }
        print!(
            "{}",
            explain_text(&chosen, &subject, given.as_deref(), &hash_note, &verdict)
        );
        if let Some(record) = &decision {
            print!("{}", compare_text(record, &verdict));
        }
        if args.path.is_some() && matches!(verdict.action, metalift_policy::Action::Unlock { .. }) {
            print!("{}", shim_fit_text(&subject.path));
        }
    }
    Ok(ExitCode::from(live_ladder(judged.as_ref(), 0)))
}

/// `--live`'s exit status: the judgement's ladder when the daemon is not healthy
/// (its cause said on stderr, as `metalift status` says it first), else `code`.
fn live_ladder(judged: Option<&Judgement>, code: u8) -> u8 {
    let Some(judged) = judged.filter(|j| j.level > Level::Healthy) else {
        return code;
    };
    if let Some(cause) = judged.cause_line() {
        eprintln!("metalift: --live: {}: {cause}", judged.level.word());
    }
    judged.exit_code()
}

/// The policy file on disk (`--policy`), as metaliftd would load it.
/// The host chip to explain on (`apple_family_max = "host"`, and the family no
/// unlock exceeds): `--host-chip-brand` when given (a what-if); else `daemons`,
/// the brand the daemon reported (`--live`, from its status) or recorded in the
/// decision (`--decision`), so the explanation is the daemon's, whatever machine
/// reads it; else this machine's (a file explained here, or an older daemon that
/// reported none).
fn host_for(args: &Args, daemons: Option<String>) -> CompileOptions {
    CompileOptions {
        host: HostFamily {
            brand: args
                .host_chip_brand
                .clone()
                .or(daemons)
                .or_else(metalift_daemon::live_policy::host_chip::machine_brand),
        },
        now: Some(std::time::SystemTime::now()),
    }
}

fn file_policy(args: &Args, compile: &CompileOptions) -> Result<Chosen, ExitCode> {
    let opts = LoadOptions {
        allow_insecure_owner: args.allow_insecure_owner,
    };
    let origin = args.policy.display().to_string();
    match load_with(&args.policy, &opts, compile) {
        Ok(Loaded {
            policy,
            sources,
            warnings,
        }) => Ok(Chosen {
            policy,
            files: sources.into_iter().map(|s| s.name).collect(),
            origin,
            note: None,
            daemon: None,
            diagnostics: crate::host_severity::judged(warnings),
        }),
        Err(LoadError::NotFound { path }) => Ok(Chosen {
            policy: Policy::empty(),
            files: Vec::new(),
            origin,
            note: Some(format!(
                "{}: no such policy file: a metaliftd started without it has no rules, everything stock (a running one keeps its last good policy)",
                path.display()
            )),
            daemon: None,
            diagnostics: Vec::new(),
        }),
        Err(LoadError::Invalid {
            diagnostics,
            sources,
        }) => {
            for d in &diagnostics {
                eprintln!("{}\n", d.render(&sources));
            }
            eprintln!(
                "metalift: error: {}: the policy is invalid; metaliftd would keep its last good policy",
                args.policy.display()
            );
            Err(ExitCode::from(INVALID_POLICY))
        }
        Err(e) => {
            eprintln!("metalift: error: {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// The subject as metaliftd would see it, plus the what-if signature fields, and the
/// path as given when it resolved to another.
fn build_subject(
    args: &Args,
    policy: &Policy,
) -> anyhow::Result<(Subject, HashNote, Option<PathBuf>)> {
    let mut s = Subject::default();
    let mut given = None;
    match (&args.path, args.pid) {
        (Some(path), _) => {
            // The kernel reports the resolved path; a path that does not exist is
            // explained as written, for "what if" questions.
            s.path = metalift_daemon::live_policy::host::resolve_executable(path);
            if s.path != *path {
                given = Some(path.clone());
            }
            s.uid = args
                .uid
                .unwrap_or_else(|| rustix::process::getuid().as_raw());
        }
        (None, Some(pid)) => {
            let process = process_identity(pid)?;
            s.path = process.exe;
            s.uid = args.uid.unwrap_or(process.uid);
            s.parent_path = process.parent_exe;
        }
        (None, None) => anyhow::bail!("give --path EXE, --pid PID or --decision ID"),
    }
    if let Some(parent) = &args.parent {
        s.parent_path = Some(parent.clone());
    }
    // The daemon's own lookup (NSS), so explain names the user the daemon would.
    s.user = metalift_daemon::checkin::peer::user_name(s.uid);
    s.team_id.clone_from(&args.team_id);
    s.signing_id.clone_from(&args.signing_id);
    if let Some(anchor) = args.anchor {
        // The daemon's own rule for what reaches a subject.
        (s.team_id, s.signing_id) = metalift_daemon::checkin::peer::signature::trusted_ids(
            anchor,
            s.team_id.as_deref(),
            s.signing_id.as_deref(),
        );
        s.anchor = Some(anchor);
    }
    if let Some(cdhash) = &args.cdhash {
        s.cdhash = Some(hex::decode(cdhash).context("--cdhash must be hex digits")?);
    }
    let note = if policy.needs().sha256 {
        match sha256_file(&s.path) {
            Ok(digest) => {
                s.sha256 = Some(digest);
                HashNote::Computed
            }
            Err(e) => HashNote::Unreadable(format!("{}: {e}", s.path.display())),
        }
    } else {
        HashNote::NotNeeded
    };
    Ok((s, note, given))
}

fn sha256_file(path: &Path) -> std::io::Result<[u8; 32]> {
    let mut file = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = file.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(buf.get(..n).unwrap_or_default());
    }
    Ok(hasher.finalize().into())
}

/// A running process's executable, real uid and parent executable.
struct ProcessIdentity {
    exe: PathBuf,
    uid: u32,
    parent_exe: Option<PathBuf>,
}

/// Reads a process's identity from /proc (the daemon reads the same files through a
/// pidfd; this CLI is only explaining, so a plain pid is enough).
#[cfg(target_os = "linux")]
fn process_identity(pid: u32) -> anyhow::Result<ProcessIdentity> {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe"))
        .with_context(|| format!("reading /proc/{pid}/exe"))?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let uid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|real| real.parse().ok())
        .with_context(|| format!("no real uid in /proc/{pid}/status"))?;
    let parent_exe = parent_pid(pid)
        .filter(|ppid| *ppid != 0)
        .and_then(|ppid| std::fs::read_link(format!("/proc/{ppid}/exe")).ok());
    Ok(ProcessIdentity {
        exe,
        uid,
        parent_exe,
    })
}

/// The ppid from /proc/PID/stat: the field after the `(comm)`, whose name may itself
/// contain spaces and parentheses, so split after the last `)`.
#[cfg(target_os = "linux")]
fn parent_pid(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = stat.get(stat.rfind(')')? + 1..)?;
    after_comm.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(not(target_os = "linux"))]
fn process_identity(pid: u32) -> anyhow::Result<ProcessIdentity> {
    anyhow::bail!("--pid {pid}: reading another process's identity needs /proc; use --path")
}

fn opt_display(v: Option<&str>) -> String {
    v.map_or_else(|| "-".to_owned(), str::to_owned)
}

fn size_text(bytes: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    if bytes % GIB == 0 {
        format!("{} GiB ({bytes} bytes)", bytes / GIB)
    } else if bytes % MIB == 0 {
        format!("{} MiB ({bytes} bytes)", bytes / MIB)
    } else {
        format!("{bytes} bytes")
    }
}

fn profile_lines(policy: &Policy, profile: &str, caps: &Capabilities) -> String {
    let host = policy.profile_host(profile);
    // Never above the host: the value shown is the applied one; say what was asked.
    let capped = policy.profile_cap(profile).map_or_else(String::new, |cap| {
        format!(
            "                           {} (never above the host)\n",
            cap.describe(profile)
        )
    });
    let verified = if policy.requires_verification(profile) {
        format!("  require_verified         yes: unlocks only while a passing `metalift verify --profile {profile}` covers the host chip and macOS build\n")
    } else {
        String::new()
    };
    format!(
        "  apple_family_max         {}{} (supportsFamily: YES for Apple1..Apple{}; Metal3/Common/Mac unchanged)\n{capped}  max_threadgroup_memory   {} (floor)\n  recommended_working_set  {}\n{verified}",
        caps.apple_family_max,
        host.map(|h| format!(" (\"host\": {})", h.describe()))
            .unwrap_or_default(),
        caps.apple_family_max,
        caps.max_threadgroup_memory,
        caps.recommended_working_set
            .map_or_else(|| "unchanged".to_owned(), |b| format!("{} (floor)", size_text(b))),
    )
}

fn explain_text(
    chosen: &Chosen,
    s: &Subject,
    given: Option<&Path>,
    hash: &HashNote,
    v: &Verdict,
) -> String {
    let (policy, files) = (&chosen.policy, &chosen.files);
    let mut out = String::new();
    out.push_str(&format!(
        "policy   {} ({} file{}), mode {}, {} rule{}, sha256 {}\n",
        chosen.origin,
        files.len(),
        if files.len() == 1 { "" } else { "s" },
        policy.mode().as_str(),
        policy.rule_count(),
        if policy.rule_count() == 1 { "" } else { "s" },
        policy.sha256_hex()
    ));
    out.push_str("\nidentity used\n");
    out.push_str(&format!("  path        {}\n", s.path.display()));
    if let Some(given) = given {
        out.push_str(&format!(
            "  given as    {} → {} (resolved: rules match the resolved executable, as the kernel reports it)\n",
            given.display(),
            s.path.display()
        ));
    }
    out.push_str(&format!(
        "  uid         {}{}\n",
        s.uid,
        s.user
            .as_deref()
            .map(|u| format!(" ({u})"))
            .unwrap_or_default()
    ));
    out.push_str(&format!(
        "  parent      {}\n",
        opt_display(s.parent_path.as_deref().map(|p| p.to_str().unwrap_or("?")))
    ));
    out.push_str(&format!(
        "  sha256      {}\n",
        match (hash, &s.sha256) {
            (HashNote::Computed, Some(d)) => hex::encode(d),
            (HashNote::Unreadable(why), _) => format!("unreadable: {why}"),
            _ => "not computed (no rule needs it)".to_owned(),
        }
    ));
    out.push_str(&format!(
        "  team_id     {}\n",
        opt_display(s.team_id.as_deref())
    ));
    out.push_str(&format!(
        "  signing_id  {}\n",
        opt_display(s.signing_id.as_deref())
    ));
    out.push_str(&format!(
        "  cdhash      {}\n",
        opt_display(s.cdhash.as_deref().map(hex::encode).as_deref())
    ));
    if let Some(anchor) = s.anchor {
        out.push_str(&format!("  anchor      {anchor}\n"));
    }
    if let Some(why) = &s.unreadable {
        out.push_str(&format!("  identity    unreadable: {why}\n"));
    }

    out.push_str(&format!("\nrules considered ({})\n", v.trace.len()));
    if v.trace.is_empty() {
        out.push_str("  (none: the policy has no rules)\n");
    }
    for c in &v.trace {
        let mark = if Some(&c.rule) == v.rule.as_ref() {
            "WINS "
        } else if c.matched {
            "match"
        } else {
            "  -  "
        };
        out.push_str(&format!(
            "  {mark} {} ({}): {}\n",
            c.rule, c.location, c.why
        ));
    }

    out.push_str("\nverdict\n");
    if let (Some(why), Some(rule)) = (&v.unverified, &v.rule) {
        out.push_str(&format!(
            "  stock: rule `{rule}` unlocks, but its profile requires verification: {why}\n"
        ));
        return out;
    }
    match (&v.action, &v.rule) {
        (
            Action::Unlock {
                profile,
                capabilities,
            },
            rule,
        ) => {
            out.push_str(&format!(
                "  unlock with profile `{profile}` (rule `{}`, mode {})\n",
                rule.as_deref().unwrap_or("-"),
                v.mode.as_str()
            ));
            out.push_str(&profile_lines(policy, profile, capabilities));
        }
        (Action::Stock, None) => out.push_str(&format!(
            "  stock: no rule matches (mode {})\n",
            v.mode.as_str()
        )),
        (Action::Stock, Some(rule)) => match &v.would_unlock {
            Some(profile) => {
                out.push_str(&format!(
                    "  stock (monitor mode): rule `{rule}` would unlock profile `{profile}`\n"
                ));
                if let Some(caps) = policy.profile(profile) {
                    out.push_str(&profile_lines(policy, profile, caps));
                }
            }
            None => out.push_str(&format!(
                "  stock: rule `{rule}` says stock (mode {})\n",
                v.mode.as_str()
            )),
        },
    }
    out
}

fn caps_json(policy: &Policy, profile: &str, caps: &Capabilities) -> Value {
    let cap = policy.profile_cap(profile);
    json!({
        "apple_family_max": caps.apple_family_max,
        "apple_family_max_from": policy.profile_host(profile).map(HostFamily::describe),
        "apple_family_requested": cap.map_or(caps.apple_family_max, |c| c.requested),
        "apple_family_capped": cap.map(|c| c.describe(profile)),
        "max_threadgroup_memory": caps.max_threadgroup_memory,
        "recommended_working_set": caps.recommended_working_set,
    })
}

fn explain_json(chosen: &Chosen, s: &Subject, hash: &HashNote, v: &Verdict) -> Value {
    let (policy, files) = (&chosen.policy, &chosen.files);
    let profile = match (&v.action, &v.would_unlock) {
        (Action::Unlock { profile, .. }, _) => Some(profile.clone()),
        (Action::Stock, Some(p)) => Some(p.clone()),
        (Action::Stock, None) => None,
    };
    let capabilities = profile
        .as_deref()
        .and_then(|p| policy.profile(p).map(|c| caps_json(policy, p, c)));
    json!({
        "policy": {
            "path": chosen.origin,
            "files": files,
            "sha256": policy.sha256_hex(),
            "mode": policy.mode().as_str(),
            "rules": policy.rule_count(),
            "diagnostics": chosen.diagnostics.iter().map(|d| json!({
                "severity": d.severity.as_str(),
                "file": d.file,
                "line": d.line,
                "col": d.col,
                "message": d.message,
            })).collect::<Vec<_>>(),
        },
        "subject": {
            "path": s.path.display().to_string(),
            "uid": s.uid,
            "user": s.user,
            "parent": s.parent_path.as_ref().map(|p| p.display().to_string()),
            "sha256": s.sha256.map(hex::encode),
            "sha256_note": match hash {
                HashNote::NotNeeded => "not needed".to_owned(),
                HashNote::Computed => "computed".to_owned(),
                HashNote::Unreadable(why) => format!("unreadable: {why}"),
            },
            "team_id": s.team_id,
            "signing_id": s.signing_id,
            "cdhash": s.cdhash.as_deref().map(hex::encode),
            "anchor": s.anchor.map(|a| a.as_str()),
            "identity_error": s.unreadable.as_ref().map(|why| format!("identity unreadable: {why}")),
        },
        "trace": v.trace.iter().map(|c| json!({
            "rule": c.rule,
            "location": c.location,
            "matched": c.matched,
            "winner": Some(&c.rule) == v.rule.as_ref(),
            "why": c.why,
        })).collect::<Vec<_>>(),
        "verdict": {
            "action": v.action.as_str(),
            "rule": v.rule,
            "mode": v.mode.as_str(),
            "would_unlock": v.would_unlock,
            "profile": profile,
            "capabilities": capabilities,
        },
    })
}

/// For an unlock of `--path`: why the executable would not take the shim anyway.
fn shim_fit_text(path: &Path) -> String {
    crate::macho::shim_fit::check(path)
        .into_iter()
        .map(|u| format!("warning: {}: it will run stock; {}\n", u.message, u.fix))
        .collect()
}
