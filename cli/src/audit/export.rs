//! `metalift audit export --to DIR`: a self-contained bundle of the audit trail,
//! for a CI artifact or a host-shared directory, written before the guest is
//! destroyed. The bundle is one directory `DIR/metalift-<instance or host>-<time>/`
//! (the clone's name its records carry, else the host name):
//!
//! - `audit.jsonl`: this boot's records (their `host.boot_id` is this machine's),
//!   or with `--since` every record from then on, exactly as written, oldest first;
//! - `status.json`: what `metalift status --json` prints (also when the daemon is
//!   down: then `"state": "unreachable"` and the error);
//! - `policy/`: the live policy's files (from the daemon's policy archive) and
//!   `policy/sha256` (its hash);
//! - `policies/`: every policy the exported decisions (and `policy_loaded`
//!   records) name that the daemon's policy archive still holds, in the archive's
//!   own layout (`<sha256>.json`), so `metalift explain --decision ID --log
//!   BUNDLE` explains each decision with the policy that made it, on any machine;
//! - `manifest.json`: the machine (with the labels its last record carries), what
//!   was selected, how many records, the daemon's state, the policy hash and where
//!   its text came from, the policies included and those the archive no longer had;
//! - `SHA256SUMS`: every other file's SHA-256, in the format `sha256sum -c` reads.
//!
//! Never half-written: everything goes into a hidden temporary directory inside
//! `DIR`, which is renamed into place last. It runs as any user who can read the
//! audit log (root and the log's group), and says which file and what to do when
//! it cannot.

use std::fs;
use std::io::{self, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::Context as _;
use serde_json::json;
use sha2::{Digest, Sha256};

use super::when::{self, When};
use metalift_daemon::audit::host::Host;
use metalift_daemon::audit::reader::{Item, LogReader};
use metalift_daemon::audit::{Record, DEFAULT_LOG_PATH, SCHEMA_VERSION};
use metalift_daemon::live_policy::archive;

/// Exit status when the bundle was written.
const EXIT_WRITTEN: u8 = 0;
/// Exit status when the log or the target directory cannot be used.
const EXIT_CANNOT: u8 = 2;

/// Arguments of `metalift audit export`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
The bundle: DIR/metalift-<instance or host>-<time>/ with audit.jsonl (this boot's records,
or --since), status.json (as `metalift status --json`; says so when the daemon
is down), policy/ (the live policy's files and its sha256), policies/ (every
policy the exported decisions name, for `metalift explain --decision ID --log
BUNDLE`), manifest.json and
SHA256SUMS (check with: cd BUNDLE && sha256sum -c SHA256SUMS). Written into a
temporary directory and renamed, so DIR never holds half a bundle.

Exit status:
  0  the bundle was written (its path is printed)
  2  the audit log cannot be read (e.g. the user is not in its group), or DIR
     cannot be written")]
pub struct Args {
    /// The directory the bundle goes into (created if missing).
    #[arg(long, value_name = "DIR")]
    pub to: PathBuf,
    /// Every record from WHEN on instead of this boot's (same forms as
    /// `metalift audit --since`).
    #[arg(long, value_name = "WHEN", value_parser = when::parse)]
    pub since: Option<When>,
    /// The audit log; its rotated files are read first.
    #[arg(long, visible_alias = "audit-log", value_name = "PATH", default_value = DEFAULT_LOG_PATH, env = "METALIFT_AUDIT_LOG")]
    pub log: PathBuf,
    /// Where the daemon is, for its status (as for `metalift status`).
    #[command(flatten)]
    pub daemon: crate::daemon_args::DaemonArgs,
}

/// Runs `metalift audit export`.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    match export(&args) {
        Ok(bundle) => {
            println!("{}", bundle.display());
            Ok(ExitCode::from(EXIT_WRITTEN))
        }
        Err(e) => {
            eprintln!("metalift audit export: {e:#}");
            Ok(ExitCode::from(EXIT_CANNOT))
        }
    }
}

/// Which records go in.
enum Selection {
    /// Those whose `host.boot_id` is this one.
    Boot(String),
    /// Those at or after this time.
    Since(SystemTime),
}

/// Writes the bundle and returns its path.
pub fn export(args: &Args) -> anyhow::Result<PathBuf> {
    let host = Host::this_machine();
    let selection = match (args.since, &host.boot_id) {
        (Some(w), _) => Selection::Since(w.resolve(SystemTime::now())),
        (None, Some(boot)) => Selection::Boot(boot.clone()),
        (None, None) => anyhow::bail!(
            "this machine's boot session id cannot be read, so \"this boot's records\" \
             cannot be told apart: pass --since"
        ),
    };
    // Read the log first: a permission problem is the likely one, and it should
    // not leave a temporary directory behind.
    let (records, last_policy) = read_records(&args.log, &selection)?;

    fs::create_dir_all(&args.to).with_context(|| format!("cannot create {}", args.to.display()))?;
    let stamp = humantime::format_rfc3339_micros(SystemTime::now())
        .to_string()
        .replace(':', "");
    // The clone's name its records carry (the instance file), else the host name.
    let name = format!(
        "metalift-{}-{stamp}",
        file_safe(records.instance.as_deref().unwrap_or(&host.name))
    );
    let tmp = TempDir::create(
        args.to
            .join(format!(".{name}.partial-{}", std::process::id())),
    )?;
    let dir = tmp.0.as_path();

    write(dir, "audit.jsonl", records.text.as_bytes())?;
    let socket = args.daemon.socket()?;
    let (_, status) = crate::status::examine_with(&args.daemon, &socket);
    let status_json = serde_json::to_vec_pretty(&status)?;
    write(dir, "status.json", &status_json)?;
    let daemon = match &status.error {
        None => "answered".to_owned(),
        Some(e) => format!("down: {e} (status.json says so; the records are the log's)"),
    };
    // The live policy: the daemon's word when it answered, else the last
    // `policy_loaded` record exported.
    let sha256 = status
        .daemon
        .as_ref()
        .map(|d| d.policy_sha256.clone())
        .or(last_policy);
    let policy_source = match &sha256 {
        Some(sha) => write_policy(dir, &args.log, sha)?,
        None => "unknown: the daemon is down and no policy_loaded record was exported".to_owned(),
    };
    let mut named = records.policies.clone();
    named.extend(sha256.iter().cloned());
    let (policies, policies_missing) = copy_policies(dir, &args.log, &named)?;
    // The machine as this process sees it, with the labels its records carry.
    let host = Host {
        labels: records.labels.clone().unwrap_or_default(),
        instance: records.instance.clone(),
        ..host
    };
    let manifest = json!({
        "schema": SCHEMA_VERSION,
        "created": humantime::format_rfc3339_micros(SystemTime::now()).to_string(),
        "host": host,
        "selection": match &selection {
            Selection::Boot(b) => format!("boot_id {b}"),
            Selection::Since(t) => format!("since {}", humantime::format_rfc3339_seconds(*t)),
        },
        "audit_log": args.log.display().to_string(),
        "records": records.count,
        "skipped_other_boots": records.other_boots,
        "corrupt_lines": records.corrupt,
        "daemon": daemon,
        "policy_sha256": sha256,
        "policy_source": policy_source,
        "policies": policies,
        "policies_missing": policies_missing,
    });
    write(dir, "manifest.json", &serde_json::to_vec_pretty(&manifest)?)?;
    write_sums(dir)?;

    let bundle = args.to.join(&name);
    fs::rename(dir, &bundle)
        .with_context(|| format!("cannot rename the bundle into {}", bundle.display()))?;
    std::mem::forget(tmp);
    Ok(bundle)
}

/// The bundle being written: removed (with what it holds) unless renamed into place.
struct TempDir(PathBuf);

impl TempDir {
    fn create(path: PathBuf) -> anyhow::Result<TempDir> {
        fs::create_dir(&path).with_context(|| format!("cannot write into {}", path.display()))?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// The records selected, as written.
#[derive(Default)]
struct Selected {
    text: String,
    count: u64,
    other_boots: u64,
    corrupt: u64,
    /// Every policy hash a kept decision or `policy_loaded` record names.
    policies: std::collections::BTreeSet<String>,
    /// The `[audit.labels]` on the last record kept: the labels of the policy
    /// live when the daemon last wrote (the manifest's `host.labels`; this
    /// process reads no policy of its own).
    labels: Option<std::collections::BTreeMap<String, String>>,
    /// The clone's name on the last record kept (`host.instance`).
    instance: Option<String>,
}

/// Reads the log (rotated files first) and keeps the selected records; also
/// returns the policy hash of the last `policy_loaded` record kept.
fn read_records(log: &Path, selection: &Selection) -> anyhow::Result<(Selected, Option<String>)> {
    let mut reader = LogReader::open(log).map_err(|e| unreadable(log, e))?;
    let mut out = Selected::default();
    let mut last_policy = None;
    reader
        .read_to_end_each(&mut |item| {
            let entry = match item {
                Item::Entry(entry) => entry,
                Item::Corrupt { .. } => {
                    out.corrupt += 1;
                    return Ok(());
                }
            };
            let keep = match selection {
                Selection::Boot(boot) => {
                    entry.stamp.host.as_ref().and_then(|h| h.boot_id.as_ref()) == Some(boot)
                }
                Selection::Since(t) => entry.time >= *t,
            };
            if !keep {
                out.other_boots += u64::from(matches!(selection, Selection::Boot(_)));
                return Ok(());
            }
            match &entry.record {
                Some(Record::PolicyLoaded { sha256, .. }) => {
                    last_policy = Some(sha256.clone());
                    out.policies.insert(sha256.clone());
                }
                Some(Record::Decision(d)) => {
                    out.policies.insert(d.policy_sha256.clone());
                }
                _ => {}
            }
            if let Some(host) = &entry.stamp.host {
                out.labels = Some(host.labels.clone());
                out.instance.clone_from(&host.instance);
            }
            out.text.push_str(&entry.raw);
            out.text.push('\n');
            out.count += 1;
            Ok(())
        })
        .map_err(|e| unreadable(log, e))?;
    Ok((out, last_policy))
}

/// A read error in the admin's words: which file, and the fix.
fn unreadable(log: &Path, e: io::Error) -> anyhow::Error {
    if e.kind() == io::ErrorKind::PermissionDenied {
        let group = log.parent().and_then(|d| fs::metadata(d).ok()).map_or_else(
            || "the log's group".to_owned(),
            |m| format!("group id {}", m.gid()),
        );
        return anyhow::anyhow!(
            "permission denied reading the audit log {} (or its directory): it is readable \
             by root and its group ({group}). Add the CI user to that group when the image \
             is baked (macOS: sudo dseditgroup -o edit -a USER -t user GROUP; Linux: sudo \
             usermod -aG GROUP USER), or run the export with sudo",
            log.display()
        );
    }
    if e.kind() == io::ErrorKind::NotFound {
        return anyhow::anyhow!(
            "no audit log at {} (is metaliftd running, and with this --audit-log?)",
            log.display()
        );
    }
    anyhow::Error::new(e).context(format!("cannot read the audit log {}", log.display()))
}

/// Copies the archived policy `sha256` into `policy/`; says where it came from.
fn write_policy(dir: &Path, log: &Path, sha256: &str) -> anyhow::Result<String> {
    let pdir = dir.join("policy");
    fs::create_dir(&pdir).with_context(|| format!("cannot create {}", pdir.display()))?;
    write(&pdir, "sha256", format!("{sha256}\n").as_bytes())?;
    let archive_dir = archive::dir_for(log);
    match archive::load(&archive_dir, sha256) {
        Ok(Some(sources)) => {
            for (i, (name, contents)) in sources.iter().enumerate() {
                // Main file first, then the drop-ins in load order, as archived.
                let file = format!("{i:02}-{}", file_safe(name));
                write(&pdir, &file, contents.as_bytes())?;
            }
            Ok(format!(
                "the daemon's policy archive ({})",
                archive_dir.display()
            ))
        }
        Ok(None) => Ok(format!(
            "not in the policy archive {}: only the hash is exported",
            archive_dir.display()
        )),
        Err(e) => Ok(format!(
            "the policy archive {} cannot be read ({e}): only the hash is exported",
            archive_dir.display()
        )),
    }
}

/// Copies each policy in `named` from the daemon's archive into the bundle's
/// `policies/`; returns the hashes copied and those the archive no longer has
/// (pruned, never archived, or a damaged line's hash that is none), both
/// sorted. A failure to read the archive or to write the bundle is an error:
/// the bundle is then not written at all.
fn copy_policies(
    dir: &Path,
    log: &Path,
    named: &std::collections::BTreeSet<String>,
) -> anyhow::Result<(Vec<String>, Vec<String>)> {
    let from = archive::dir_for(log);
    let to = dir.join("policies");
    let (mut copied, mut missing) = (Vec::new(), Vec::new());
    for sha in named {
        match archive::copy_entry(&from, &to, sha) {
            Ok(true) => copied.push(sha.clone()),
            Ok(false) => missing.push(sha.clone()),
            Err(e) if e.kind() == io::ErrorKind::InvalidInput => missing.push(sha.clone()),
            Err(e) => {
                return Err(e).with_context(|| {
                    format!(
                        "cannot copy the policy {sha} from the archive {} into the bundle",
                        from.display()
                    )
                })
            }
        }
    }
    Ok((copied, missing))
}

/// Writes `SHA256SUMS`: every file of the bundle but itself, `<hex>  <path>`.
fn write_sums(dir: &Path) -> anyhow::Result<()> {
    let mut files = Vec::new();
    collect(dir, dir, &mut files)?;
    files.sort();
    let mut sums = String::new();
    for rel in files {
        let bytes = fs::read(dir.join(&rel)).with_context(|| format!("cannot read back {rel}"))?;
        sums.push_str(&format!("{}  {rel}\n", hex::encode(Sha256::digest(&bytes))));
    }
    write(dir, "SHA256SUMS", sums.as_bytes())
}

fn collect(root: &Path, dir: &Path, out: &mut Vec<String>) -> anyhow::Result<()> {
    for entry in fs::read_dir(dir).with_context(|| format!("cannot list {}", dir.display()))? {
        let path = entry?.path();
        if path.is_dir() {
            collect(root, &path, out)?;
        } else if let Ok(rel) = path.strip_prefix(root) {
            out.push(rel.display().to_string());
        }
    }
    Ok(())
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> anyhow::Result<()> {
    let path = dir.join(name);
    let mut file =
        fs::File::create(&path).with_context(|| format!("cannot create {}", path.display()))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .with_context(|| format!("cannot write {}", path.display()))
}

/// `name` with only characters safe in a file name (and in `sha256sum`'s format).
fn file_safe(name: &str) -> String {
    let safe: String = name
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if safe.is_empty() {
        "host".to_owned()
    } else {
        safe
    }
}
