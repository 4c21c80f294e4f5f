//! The policy that decided: the daemon's live one (`explain --live`) or the one live
//! at a past decision (`explain --decision ID`), both read from the policy archive
//! ([`metalift_daemon::live_policy::archive`]) by hash; and the decision record itself, found in the
//! audit log (rotated files included) through the audit reader's public functions.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use metalift_policy::{compile_sources_with, CompileOptions, Policy, Source, Subject, Verdict};

use metalift_daemon::service::status::StatusReport;

use super::{Args, Chosen, HashNote};
use crate::judgement::Judgement;

/// The daemon's live policy: its hash from the daemon, its text from the archive.
pub(super) fn live_policy(args: &Args) -> (Option<Judgement>, Result<Chosen, ExitCode>) {
    let socket = match args.daemon.socket() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("metalift: error: {e}");
            return (None, Err(ExitCode::from(2)));
        }
    };
    // The judgement every tool renders: what is live, and whether it unlocks.
    let judged = crate::judgement::ask(&args.daemon, &socket);
    let Some(report) = judged.report.clone() else {
        return (Some(judged), Err(ExitCode::from(2)));
    };
    (Some(judged), live_from(args, &report))
}

fn live_from(args: &Args, report: &StatusReport) -> Result<Chosen, ExitCode> {
    if report.policy_archived == Some(false) {
        // The daemon knows its archive write failed (it retries at every reload and
        // status request): say that, not "no longer archived".
        eprintln!(
            "metalift: error: --live: the live policy {} was never archived: metaliftd could not write it to {} (it retries at every reload and status request; is that file system full?)",
            report.policy_sha256,
            metalift_daemon::live_policy::archive::dir_for(Path::new(
                report.audit_log.as_deref().unwrap_or_else(|| args.log.to_str().unwrap_or_default())
            ))
            .display()
        );
        return Err(ExitCode::from(2));
    }
    // Explained on the chip the daemon compiles with, not this reader's.
    let compile = super::host_for(args, report.host_chip_brand.clone());
    let mut chosen = archived_policy(args, &report.policy_sha256, &compile, "live in metaliftd")?;
    chosen.origin = format!(
        "live in metaliftd (pid {}, {}, loaded {})",
        report.pid, report.policy_path, report.policy_loaded_at
    );
    chosen.daemon = Some((
        PathBuf::from(&report.policy_path),
        report.host_chip_brand.clone(),
    ));
    // "Is my file the live one?": compare by the contents-only hash.
    if let Ok(read) = metalift_policy::read_policy(Path::new(&report.policy_path)) {
        let on_disk = metalift_policy::sources_sha256(&read.sources);
        if on_disk != report.policy_sha256 {
            chosen.note = Some(format!(
                "note: the policy on disk ({}) has sha256 {on_disk}, not the live {}: it was edited since, or refused",
                report.policy_path, report.policy_sha256
            ));
        }
    }
    Ok(chosen)
}

/// The policy archived under `sha256` beside the audit log.
pub(super) fn archived_policy(
    args: &Args,
    sha256: &str,
    compile: &CompileOptions,
    what: &str,
) -> Result<Chosen, ExitCode> {
    let dir = metalift_daemon::live_policy::archive::dir_for(&args.log);
    let origin = format!("archived {}", dir.display());
    let archived = match metalift_daemon::live_policy::archive::load(&dir, sha256) {
        Ok(a) => a,
        Err(e) => {
            eprintln!(
                "metalift: error: the policy {sha256} {what}: reading the archive {}: {e}",
                dir.display()
            );
            return Err(ExitCode::from(2));
        }
    };
    let Some(archived) = archived else {
        if sha256 == Policy::empty().sha256_hex() {
            return Ok(Chosen {
                policy: Policy::empty(),
                files: Vec::new(),
                origin,
                note: Some(format!(
                    "the policy {what} is the empty policy (no policy file): everything stock"
                )),
                daemon: None,
                diagnostics: Vec::new(),
            });
        }
        eprintln!(
            "metalift: error: the policy {sha256} {what} is not in the archive {}: pruned (metaliftd keeps the newest {} policies it loaded), never archived (a write that failed, e.g. on a full disk, is retried only while the daemon runs), or written by an older daemon that kept none",
            dir.display(),
            metalift_daemon::live_policy::archive::KEEP
        );
        return Err(ExitCode::from(2));
    };
    let sources: Vec<Source> = archived
        .into_iter()
        .map(|(n, t)| Source::new(n, t))
        .collect();
    match compile_sources_with(sources, compile) {
        Ok(loaded) if loaded.policy.sha256_hex() == sha256 => Ok(Chosen {
            files: loaded.sources.into_iter().map(|s| s.name).collect(),
            policy: loaded.policy,
            origin,
            note: None,
            daemon: None,
            diagnostics: crate::host_severity::judged(loaded.warnings),
        }),
        Ok(loaded) => {
            eprintln!(
                "metalift: error: the archive's entry for {sha256} hashes to {}: it was altered",
                loaded.policy.sha256_hex()
            );
            Err(ExitCode::from(2))
        }
        Err(e) => {
            eprintln!("metalift: error: the archived policy {sha256} no longer compiles: {e}");
            Err(ExitCode::from(2))
        }
    }
}

/// A decision record, as much of it as explaining needs.
pub(super) struct DecisionSeen {
    /// The whole record, as the writer's type serialises it.
    pub(super) raw: serde_json::Value,
    /// The Apple family ceiling the verdict carried (unlock verdicts of daemons that record it).
    apple_family_max: Option<u8>,
    /// Why the host chip lowered it below what the profile asked, when it did.
    apple_family_capped: Option<String>,
    id: u64,
    time: String,
    pid: i64,
    uid: u32,
    exe: String,
    parent_exe: Option<String>,
    sha256: Option<String>,
    team_id: Option<String>,
    signing_id: Option<String>,
    cdhash: Option<String>,
    /// The signature's anchor word, as recorded (`None` from older daemons and Linux).
    anchor: Option<String>,
    /// `identity unreadable: ...`, as recorded.
    identity_error: Option<String>,
    rule: Option<String>,
    action: String,
    profile: Option<String>,
    mode: String,
    pub(super) policy_sha256: String,
}

/// Finds decision `id` in the audit log at `log`, rotated files included.
pub(super) fn find_decision(log: &Path, id: u64) -> anyhow::Result<Option<DecisionSeen>> {
    use metalift_daemon::audit::line::{Entry, Item};
    use metalift_daemon::audit::reader::LogReader;
    use metalift_daemon::audit::record::Record;
    let mut reader = LogReader::open(log)?;
    let mut found = None;
    reader.read_to_end_each(&mut |item| {
        if let Item::Entry(Entry {
            record: Some(Record::Decision(d)),
            ..
        }) = item
        {
            if d.decision_id == id {
                found = Some(d);
            }
        }
        Ok(())
    })?;
    let Some(d) = found else { return Ok(None) };
    Ok(Some(DecisionSeen {
        raw: serde_json::to_value(&d).context("re-serialising the decision record")?,
        apple_family_max: d.apple_family_max,
        apple_family_capped: d.apple_family_capped,
        id,
        time: metalift_daemon::audit::record::rfc3339::format(d.time),
        pid: i64::from(d.pid),
        uid: d.uid,
        exe: d.exe,
        parent_exe: d.parent_exe,
        sha256: d.sha256,
        team_id: d.team_id,
        signing_id: d.signing_id,
        cdhash: d.cdhash,
        anchor: d.anchor,
        identity_error: d.identity_error,
        rule: d.rule,
        action: d.action,
        profile: d.profile,
        mode: d.mode,
        policy_sha256: d.policy_sha256,
    }))
}

pub(super) fn decision_text(r: &DecisionSeen) -> String {
    let family = r
        .apple_family_max
        .map(|f| format!(", apple_family_max {f}"))
        .unwrap_or_default();
    let capped = r
        .apple_family_capped
        .as_deref()
        .map(|why| format!("  never above the host: {why}\n"))
        .unwrap_or_default();
    format!(
        "decision {} at {}\n  pid {} (uid {}) ran {}\n  decided: {} (rule {}, profile {}{family}, mode {})\n{capped}  policy sha256 {}\n\nre-explained with the policy that was live then:\n",
        r.id,
        r.time,
        r.pid,
        r.uid,
        r.exe,
        r.action,
        r.rule.as_deref().map_or_else(|| "none".to_owned(), |x| format!("`{x}`")),
        r.profile.as_deref().map_or_else(|| "none".to_owned(), |x| format!("`{x}`")),
        r.mode,
        r.policy_sha256,
    )
}

/// Whether re-explaining reached the recorded decision.
pub(super) fn compare_text(r: &DecisionSeen, v: &Verdict) -> String {
    if v.rule == r.rule && v.action.as_str() == r.action {
        "\nsame decision as recorded\n".to_owned()
    } else {
        format!(
            "\nNOT the recorded decision ({} by rule {}): the user database, the host chip or the signature facts differ from then\n",
            r.action,
            r.rule.as_deref().unwrap_or("none")
        )
    }
}

/// The subject of a recorded decision: what the daemon saw then.
pub(super) fn subject_of(
    r: &DecisionSeen,
    policy: &Policy,
) -> (Subject, HashNote, Option<PathBuf>) {
    let decode = |h: &Option<String>| h.as_deref().and_then(|h| hex::decode(h).ok());
    let sha256 = decode(&r.sha256).and_then(|b| <[u8; 32]>::try_from(b).ok());
    let subject = Subject {
        path: PathBuf::from(&r.exe),
        uid: r.uid,
        // Not recorded: looked up now, as the daemon did then.
        user: metalift_daemon::checkin::peer::user_name(r.uid),
        parent_path: r.parent_exe.as_ref().map(PathBuf::from),
        sha256,
        cdhash: decode(&r.cdhash),
        team_id: r.team_id.clone(),
        signing_id: r.signing_id.clone(),
        anchor: r.anchor.as_deref().and_then(|a| a.parse().ok()),
        unreadable: r.identity_error.as_deref().map(|e| {
            e.strip_prefix("identity unreadable: ")
                .unwrap_or(e)
                .to_owned()
        }),
    };
    let note = match (sha256, policy.needs().sha256) {
        (Some(_), _) => HashNote::Computed,
        (None, true) => HashNote::Unreadable("not recorded in the decision".to_owned()),
        (None, false) => HashNote::NotNeeded,
    };
    (subject, note, None)
}
