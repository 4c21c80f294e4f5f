//! Verified unlock: a profile with `require_verified = true` unlocks only while a
//! passing verification covers this machine's host chip and macOS build.
//!
//! An unlock claims the GPU runs simdgroup reductions, simdgroup matrices and
//! bfloat; a macOS or host update can make that false, and then llama.cpp computes
//! garbage instead of running slowly. `metalift verify --profile NAME` runs
//! `metalift-probe --verify` under the shim with that profile (the kernels, compared
//! with the CPU) and appends one [`VerificationRecord`] to the verification file,
//! `verifications.jsonl` beside `policy.toml`. The daemon reads that file, and a
//! profile requiring verification unlocks only when the LAST record for the
//! profile's capabilities on this host chip and macOS build passed.
//!
//! Who may record a verification: whoever may write the file, and the daemon
//! accepts it only as it accepts a policy file: owned by root and not writable by
//! group or other (`--allow-insecure-owner` relaxes both, as for the policy). The
//! record's `recorded_by_uid` is advisory; the file's owner is what is trusted. An
//! unprivileged user therefore cannot unlock anything by claiming a verification.
//!
//! The daemon reads the file when a check-in's winning profile requires verification
//! (a `stat` per such check-in; the records are re-read only when the file changed)
//! and for `metalift status`. The host chip is `crate::live_policy::host_chip`'s,
//! the build `crate::live_policy::host_os`'s, both read once per daemon: an OS update
//! means a restart, so the new build is seen, and the profile answers stock until
//! `metalift verify` records a pass for it.

use std::fs;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use metalift_policy::{Action, Capabilities, Policy, Verdict};

use crate::audit::rfc3339;
pub use crate::audit::verification::{KernelLine, VerificationRecord};

/// The verification file's name, beside `policy.toml`.
pub const FILE_NAME: &str = "verifications.jsonl";

/// Larger files are refused: a few hundred bytes per verification, one per image bake.
const MAX_FILE_BYTES: u64 = 4 << 20;

/// Where the verifications for the policy at `policy` are kept.
#[must_use]
pub fn path_beside(policy: &Path) -> PathBuf {
    policy
        .parent()
        .unwrap_or_else(|| Path::new("."))
        .join(FILE_NAME)
}

/// The facts a verification must match: this machine's host chip and macOS build.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostBuild {
    /// The host chip's brand string.
    pub chip: Option<String>,
    /// The macOS build.
    pub os_build: Option<String>,
}

impl HostBuild {
    /// What metaliftd compares with (its own environment's overrides, else sysctl).
    #[must_use]
    pub fn daemon() -> HostBuild {
        HostBuild {
            chip: crate::live_policy::host_chip::daemon_host().brand.clone(),
            os_build: crate::live_policy::host_os::daemon_os_build().map(str::to_owned),
        }
    }

    /// `chip "…", macOS build …`, as reasons print it.
    #[must_use]
    pub fn describe(&self) -> String {
        format!(
            "host chip {}, macOS build {}",
            self.chip
                .as_deref()
                .map_or("(unknown)".to_owned(), |c| format!("\"{c}\"")),
            self.os_build.as_deref().unwrap_or("(unknown)")
        )
    }
}

/// What the verification file holds, as the daemon judged it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recorded {
    /// No file: nothing verified.
    Missing,
    /// The file is not trusted or not readable: nothing verified.
    Refused(String),
    /// The records, in file order (later lines are newer).
    Records(Vec<VerificationRecord>),
}

/// Whether a profile may unlock here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Coverage {
    /// The last verification for this profile, host chip and build passed.
    Verified(Box<VerificationRecord>),
    /// It did not, or there is none: why, in a sentence.
    Unverified(String),
}

/// The last record covering `profile` with `capabilities` on `host`, judged.
#[must_use]
pub fn coverage(
    recorded: &Recorded,
    profile: &str,
    capabilities: &Capabilities,
    host: &HostBuild,
) -> Coverage {
    let hint = format!("run `metalift verify --profile {profile}` on this machine");
    let records = match recorded {
        Recorded::Missing => {
            return Coverage::Unverified(format!(
                "profile `{profile}` requires a passing verification for {}: none recorded ({hint})",
                host.describe()
            ))
        }
        Recorded::Refused(why) => {
            return Coverage::Unverified(format!(
                "profile `{profile}` requires a passing verification: the verification file is refused ({why})"
            ))
        }
        Recorded::Records(records) => records,
    };
    let last = records.iter().rev().find(|r| {
        r.profile == profile
            && r.capabilities() == *capabilities
            && r.host_chip == host.chip
            && r.os_build == host.os_build
    });
    match last {
        Some(r) if r.passed => Coverage::Verified(Box::new(r.clone())),
        Some(r) => Coverage::Unverified(format!(
            "profile `{profile}`: the last verification for {} failed at {} ({})",
            host.describe(),
            rfc3339::format(r.time),
            r.failures().join(", ")
        )),
        None => Coverage::Unverified(format!(
            "profile `{profile}` requires a passing verification for {}: none recorded for it{} ({hint})",
            host.describe(),
            nearest(records, profile, capabilities, host)
                .map(|differs| format!(" (the nearest verification of it differs: {differs})"))
                .unwrap_or_default()
        )),
    }
}

/// What differs between `host` (and `capabilities`) and the nearest record of
/// `profile`: the one matching most of chip, build and capabilities (the newest
/// among equals), each difference with both values. `None` without a record of it.
fn nearest(
    records: &[VerificationRecord],
    profile: &str,
    capabilities: &Capabilities,
    host: &HostBuild,
) -> Option<String> {
    let score = |r: &VerificationRecord| {
        u8::from(r.host_chip == host.chip)
            + u8::from(r.os_build == host.os_build)
            + u8::from(r.capabilities() == *capabilities)
    };
    let near = records
        .iter()
        .enumerate()
        .filter(|(_, r)| r.profile == profile)
        .max_by_key(|(i, r)| (score(r), *i))
        .map(|(_, r)| r)?;
    let shown = |v: &Option<String>| {
        v.as_deref()
            .map_or("(unknown)".to_owned(), |c| format!("\"{c}\""))
    };
    let mut out = Vec::new();
    if near.host_chip != host.chip {
        out.push(format!(
            "host chip {} here, {} recorded",
            shown(&host.chip),
            shown(&near.host_chip)
        ));
    }
    if near.os_build != host.os_build {
        out.push(format!(
            "macOS build {} here, {} recorded",
            shown(&host.os_build),
            shown(&near.os_build)
        ));
    }
    if near.capabilities() != *capabilities {
        out.push(format!(
            "capabilities {capabilities:?} in the policy, {:?} recorded",
            near.capabilities()
        ));
    }
    Some(out.join("; "))
}

/// `verdict`, answered stock with the reason when its (would-be) unlocked profile
/// requires verification and `recorded` has no passing one for `host`.
pub fn gate(verdict: Verdict, policy: &Policy, recorded: &Recorded, host: &HostBuild) -> Verdict {
    let profile = match (&verdict.action, &verdict.would_unlock) {
        (Action::Unlock { profile, .. }, _) | (Action::Stock, Some(profile)) => profile.clone(),
        (Action::Stock, None) => return verdict,
    };
    if !policy.requires_verification(&profile) {
        return verdict;
    }
    let Some(capabilities) = policy.profile(&profile) else {
        return verdict;
    };
    match coverage(recorded, &profile, capabilities, host) {
        Coverage::Verified(_) => verdict,
        Coverage::Unverified(reason) => unverified(verdict, reason),
    }
}

/// `verdict` answered stock because its profile is not verified, for `reason`:
/// what [`gate`] answers, and what `metalift explain --decision` shows for a
/// decision recorded with `unverified`.
pub fn unverified(verdict: Verdict, reason: String) -> Verdict {
    Verdict {
        action: Action::Stock,
        would_unlock: None,
        unverified: Some(reason),
        ..verdict
    }
}

/// The verification file as the daemon sees it, re-read when it changes.
#[derive(Debug)]
pub struct VerificationStore {
    /// `verifications.jsonl` beside the policy.
    path: PathBuf,
    /// `--allow-insecure-owner`: accept a file not owned by root (development).
    allow_insecure_owner: bool,
    /// This machine's host chip and build.
    host: HostBuild,
    /// The last read, by the file's identity and change time. A std `Mutex`: held
    /// for a `stat` and, when the file changed, one small read; never across an await.
    cache: Mutex<Option<(Stamp, Arc<Recorded>)>>,
}

/// What identifies one version of the file.
type Stamp = Option<(u64, u64, u64, i64, i64, i64, i64)>;

impl VerificationStore {
    /// A store for the policy at `policy_path`, judging for `host`.
    #[must_use]
    pub fn beside(policy_path: &Path, allow_insecure_owner: bool, host: HostBuild) -> Self {
        VerificationStore {
            path: path_beside(policy_path),
            allow_insecure_owner,
            host,
            cache: Mutex::new(None),
        }
    }

    /// The file it reads.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The host chip and build it judges for.
    #[must_use]
    pub fn host(&self) -> &HostBuild {
        &self.host
    }

    /// [`gate`] against the file as it is now.
    pub fn gate(&self, verdict: Verdict, policy: &Policy) -> Verdict {
        let needs = match (&verdict.action, &verdict.would_unlock) {
            (Action::Unlock { profile, .. }, _) | (Action::Stock, Some(profile)) => {
                policy.requires_verification(profile)
            }
            (Action::Stock, None) => false,
        };
        if !needs {
            return verdict;
        }
        gate(verdict, policy, &self.recorded(), &self.host)
    }

    /// One line per profile of `policy` with `require_verified = true`: whether it
    /// unlocks on this host now, and why not (`metalift status`).
    pub fn status_lines(&self, policy: &Policy) -> Vec<String> {
        let wanted: Vec<(&String, &Capabilities)> = policy
            .profiles()
            .iter()
            .filter(|(name, _)| policy.requires_verification(name))
            .collect();
        if wanted.is_empty() {
            return Vec::new();
        }
        let recorded = self.recorded();
        wanted
            .into_iter()
            .map(
                |(name, caps)| match coverage(&recorded, name, caps, &self.host) {
                    Coverage::Verified(r) => format!(
                        "{name}: verified for {} at {}",
                        self.host.describe(),
                        rfc3339::format(r.time)
                    ),
                    Coverage::Unverified(why) => format!("{name}: stock: {why}"),
                },
            )
            .collect()
    }

    /// The health causes verified unlock adds (`crate::service::health`): the
    /// file refused (which file and why), else one per `require_verified`
    /// profile of `policy` that answers stock on this host. None when no
    /// profile requires verification.
    pub fn health_causes(&self, policy: &Policy) -> Vec<crate::service::health::Cause> {
        use crate::service::health::{code, Cause};
        let wanted: Vec<(&String, &Capabilities)> = policy
            .profiles()
            .iter()
            .filter(|(name, _)| policy.requires_verification(name))
            .collect();
        if wanted.is_empty() {
            return Vec::new();
        }
        let recorded = self.recorded();
        if let Recorded::Refused(why) = recorded.as_ref() {
            let names: Vec<String> = wanted.iter().map(|(n, _)| format!("`{n}`")).collect();
            return vec![Cause::new(
                code::VERIFICATION_REFUSED,
                format!(
                    "the verification file is refused ({why}): profile{} {} (require_verified) \
                     answer{} stock",
                    if names.len() == 1 { "" } else { "s" },
                    names.join(", "),
                    if names.len() == 1 { "s" } else { "" }
                ),
            )];
        }
        wanted
            .into_iter()
            .filter_map(
                |(name, caps)| match coverage(&recorded, name, caps, &self.host) {
                    Coverage::Verified(_) => None,
                    Coverage::Unverified(why) => Some(Cause::new(
                        code::UNVERIFIED,
                        format!("{why}; it answers stock"),
                    )),
                },
            )
            .collect()
    }

    /// The file's records (re-read when it changed since the last call).
    pub fn recorded(&self) -> Arc<Recorded> {
        let meta = fs::metadata(&self.path);
        let stamp: Stamp = meta.as_ref().ok().map(|m| {
            (
                m.dev(),
                m.ino(),
                m.size(),
                m.mtime(),
                m.mtime_nsec(),
                m.ctime(),
                m.ctime_nsec(),
            )
        });
        let mut cache = self.cache.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((seen, recorded)) = cache.as_ref() {
            if *seen == stamp {
                return Arc::clone(recorded);
            }
        }
        let recorded = Arc::new(match meta {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Recorded::Missing,
            Err(e) => Recorded::Refused(format!("{}: {e}", self.path.display())),
            Ok(m) => self.read(&m),
        });
        if let Recorded::Refused(why) = recorded.as_ref() {
            tracing::warn!(%why, "verification file refused: profiles requiring verification answer stock");
        }
        *cache = Some((stamp, Arc::clone(&recorded)));
        recorded
    }

    fn read(&self, meta: &fs::Metadata) -> Recorded {
        let path = self.path.display();
        if !self.allow_insecure_owner {
            if meta.uid() != 0 {
                return Recorded::Refused(format!(
                    "{path}: owned by uid {}, not root: only root may record a verification",
                    meta.uid()
                ));
            }
            if meta.mode() & 0o022 != 0 {
                return Recorded::Refused(format!(
                    "{path}: writable by group or other (mode {:04o})",
                    meta.mode() & 0o7777
                ));
            }
        }
        if meta.len() > MAX_FILE_BYTES {
            return Recorded::Refused(format!("{path}: larger than {MAX_FILE_BYTES} bytes"));
        }
        let mut text = String::new();
        let read = fs::File::open(&self.path)
            .and_then(|f| f.take(MAX_FILE_BYTES).read_to_string(&mut text));
        if let Err(e) = read {
            return Recorded::Refused(format!("{path}: {e}"));
        }
        Recorded::Records(parse_lines(&text, &path.to_string()))
    }
}

/// The records of a verification file; a line that is not one is skipped and
/// logged (a torn last line from a crash mid-append must not hide the others).
#[must_use]
pub fn parse_lines(text: &str, path: &str) -> Vec<VerificationRecord> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| !line.trim().is_empty())
        .filter_map(
            |(n, line)| match serde_json::from_str::<VerificationRecord>(line) {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!(path, line = n + 1, %e, "not a verification record: skipped");
                    None
                }
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn policy() -> Policy {
        let text = "version = 1\n[profile.apple7]\napple_family_max = 7\nrequire_verified = true\n\
                    [profile.free]\napple_family_max = 7\n\
                    [[rule]]\nid = \"v\"\nname = \"verified\"\nunlock = \"apple7\"\n\
                    [[rule]]\nid = \"f\"\nname = \"free\"\nunlock = \"free\"\n";
        metalift_policy::compile_sources(vec![metalift_policy::Source::new("policy.toml", text)])
            .unwrap_or_else(|e| panic!("{e}"))
            .policy
    }

    fn record(passed: bool, build: &str) -> VerificationRecord {
        VerificationRecord {
            time: SystemTime::UNIX_EPOCH,
            profile: "apple7".into(),
            apple_family_max: 7,
            max_threadgroup_memory: 32768,
            recommended_working_set: None,
            host_chip: Some("Apple M2 (Virtual)".into()),
            os_build: Some(build.into()),
            metalift_version: "0".into(),
            passed,
            kernels: vec![KernelLine {
                kernel: "metalift_simd_sum".into(),
                result: if passed { "pass" } else { "differs" }.into(),
                detail: None,
                ms: None,
            }],
            error: None,
            recorded_by_uid: 0,
            receipt: None,
        }
    }

    fn host(build: &str) -> HostBuild {
        HostBuild {
            chip: Some("Apple M2 (Virtual)".into()),
            os_build: Some(build.into()),
        }
    }

    fn verdict_for(name: &str, recorded: &Recorded, build: &str) -> Verdict {
        let policy = policy();
        let subject = metalift_policy::Subject {
            path: format!("/bin/{name}").into(),
            ..Default::default()
        };
        gate(
            policy.evaluate(&subject, std::time::SystemTime::now()),
            &policy,
            recorded,
            &host(build),
        )
    }

    #[test]
    fn only_the_last_record_for_this_build_counts() {
        let pass = Recorded::Records(vec![record(true, "24A335")]);
        assert!(matches!(
            verdict_for("verified", &pass, "24A335").action,
            Action::Unlock { .. }
        ));
        let new_build = verdict_for("verified", &pass, "24B83");
        assert_eq!(new_build.action, Action::Stock);
        assert!(new_build
            .unverified
            .as_deref()
            .unwrap_or("")
            .contains("24B83"));
        let failed_later = Recorded::Records(vec![record(true, "24A335"), record(false, "24A335")]);
        let v = verdict_for("verified", &failed_later, "24A335");
        assert_eq!(v.action, Action::Stock);
        assert!(v
            .unverified
            .as_deref()
            .unwrap_or("")
            .contains("metalift_simd_sum: differs"));
    }

    #[test]
    fn a_profile_without_require_verified_is_never_gated() {
        let v = verdict_for("free", &Recorded::Missing, "24A335");
        assert!(matches!(v.action, Action::Unlock { .. }));
        assert_eq!(v.unverified, None);
    }

    #[test]
    fn only_roots_unwritable_file_is_trusted_unless_the_development_flag_says_so() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("tempdir");
        let policy_path = dir.path().join("policy.toml");
        let file = path_beside(&policy_path);
        let line = serde_json::to_string(&record(true, "24A335")).unwrap_or_default();
        fs::write(&file, format!("{line}\n")).expect("write");
        let strict = VerificationStore::beside(&policy_path, false, host("24A335"));
        let lenient = VerificationStore::beside(&policy_path, true, host("24A335"));
        // Not root's (when the test runs as root, hand the file to uid 1).
        if rustix::process::getuid().is_root() {
            std::os::unix::fs::chown(&file, Some(1), None).expect("chown");
        }
        assert!(
            matches!(strict.recorded().as_ref(), Recorded::Refused(why) if why.contains("not root")),
            "{:?}",
            strict.recorded()
        );
        assert!(matches!(lenient.recorded().as_ref(), Recorded::Records(r) if r.len() == 1));
        // Root's but writable by others (only checkable as root).
        if rustix::process::getuid().is_root() {
            std::os::unix::fs::chown(&file, Some(0), None).expect("chown");
            fs::set_permissions(&file, fs::Permissions::from_mode(0o666)).expect("chmod");
            assert!(
                matches!(strict.recorded().as_ref(), Recorded::Refused(why) if why.contains("writable")),
                "{:?}",
                strict.recorded()
            );
            fs::set_permissions(&file, fs::Permissions::from_mode(0o644)).expect("chmod");
            assert!(matches!(strict.recorded().as_ref(), Recorded::Records(_)));
        }
    }

    #[test]
    fn a_torn_line_is_skipped_and_the_others_kept() {
        let line = serde_json::to_string(&record(true, "1")).unwrap_or_default();
        let text = format!("{line}\n{{\"time\":\n{line}\n");
        assert_eq!(parse_lines(&text, "t").len(), 2);
    }
}
