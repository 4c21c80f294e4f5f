//! `metalift status`: the daemon's counters and policy facts, and the client that asks for them.
//!
//! The report holds counts only: nothing about which process got which verdict,
//! so any local user may ask (the socket is world-connectable).

use std::path::{Path, PathBuf};
use std::time::Duration;

use metalift_policy::wire::{self, ClientError};
use serde::{Deserialize, Serialize};

use crate::service::health::Health;

/// What the daemon reports about itself. Sent as JSON inside a `Status` frame.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatusReport {
    /// The daemon's version.
    pub version: String,
    /// The daemon's pid.
    pub pid: u32,
    /// When the daemon started (RFC 3339).
    pub started_at: String,
    /// The policy file.
    pub policy_path: String,
    /// SHA-256 of the live policy.
    pub policy_sha256: String,
    /// When the live policy became live (RFC 3339).
    pub policy_loaded_at: String,
    /// Rules in the live policy.
    pub rule_count: usize,
    /// `enforce` or `monitor`.
    pub mode: String,
    /// Why the last reload was refused, until a reload succeeds: every problem's
    /// locating line, joined by newlines (kept for older readers; see
    /// `last_reload_errors`).
    pub last_reload_error: Option<String>,
    /// Every problem of the last refused load, one `file:line:col: error: ...`
    /// line each, in the policy crate's order; empty when the last load succeeded.
    #[serde(default)]
    pub last_reload_errors: Vec<String>,
    /// SHA-256 of the refused input, when its text could be read.
    #[serde(default)]
    pub refused_sha256: Option<String>,
    /// Check-ins decided since start.
    pub check_ins: u64,
    /// Unlock verdicts given since start.
    pub unlocks: u64,
    /// Monitor-mode verdicts that would have unlocked.
    pub would_unlock: u64,
    /// Outcome reports received.
    pub outcomes: u64,
    /// Decisions answered stock because the audit log refused the record.
    pub audit_failures: u64,
    /// Check-ins closed unanswered because the kernel could not identify the peer.
    #[serde(default)]
    pub unidentified: u64,
    /// Of those, peers that exited before they could be identified (short-lived
    /// processes; counted here instead of logged one line each).
    #[serde(default)]
    pub peers_gone: u64,
    /// Connections being read or answered now.
    #[serde(default)]
    pub connections_active: u64,
    /// Answered connections waiting for the shim's outcome report now.
    #[serde(default)]
    pub connections_waiting: u64,
    /// Executable hashes held by the identity cache.
    pub cache_entries: usize,
    /// Whether the daemon can read what Full Disk Access guards (macOS, checked
    /// at start: `crate::service::full_disk_access`); `None` off macOS, when the probe
    /// told nothing, or from an older daemon.
    #[serde(default)]
    pub full_disk_access: Option<bool>,
    /// Verified unlock: one line per live profile with `require_verified = true`,
    /// whether it unlocks on this host chip and macOS build now, and why not.
    #[serde(default)]
    pub verified_unlock: Vec<String>,
    /// Whether the daemon can unlock as its policy says, cause first
    /// (`crate::service::health`); [`Health::unknown`] from an older daemon that
    /// sends none (never `ok`).
    #[serde(default = "Health::unknown")]
    pub health: Health,
    /// The audit log the daemon writes (`None` from an older daemon).
    #[serde(default)]
    pub audit_log: Option<String>,
    /// Free bytes on the audit log's file system, as the daemon measures them.
    #[serde(default)]
    pub audit_free_bytes: Option<u64>,
    /// The daemon's policy size limit (`--max-policy-bytes`; `None` from an older daemon).
    #[serde(default)]
    pub max_policy_bytes: Option<u64>,
    /// Whether the live policy's text is in the policy archive (`explain --live`
    /// and `--decision` read it there); `false` while a failed archive write waits
    /// for its retry. `None` from an older daemon.
    #[serde(default)]
    pub policy_archived: Option<bool>,
    /// The host chip's brand string the daemon compiles policies with
    /// (`crate::live_policy::host_chip::daemon_host`), so `metalift explain --live`
    /// explains on the daemon's chip; `None` when unreadable, or an older daemon.
    #[serde(default)]
    pub host_chip_brand: Option<String>,
    /// The macOS build the daemon compares verifications with
    /// (`crate::live_policy::host_os::daemon_os_build`), so `metalift verify`
    /// records the build as the daemon reads it; `None` when unknown, or an older daemon.
    #[serde(default)]
    pub host_os_build: Option<String>,
    /// The audit forwarder (`[audit.forward]`); `None` from an older daemon.
    #[serde(default)]
    pub forwarder: Option<crate::audit::forward::ForwarderStatus>,
    /// The nearest rule window edge still to come (`from`/`until` in the live
    /// policy): when the decisions change by themselves, without a reload. `None`
    /// when no window edge lies ahead (or an older daemon).
    #[serde(default)]
    pub next_change: Option<NextChange>,
}

/// When a rule of the live policy next starts or stops matching.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NextChange {
    /// When (RFC 3339, UTC, to the second).
    pub at: String,
    /// The rule.
    pub rule: String,
    /// `opens` (its `from`) or `closes` (its `until`).
    pub edge: String,
}

impl From<&metalift_policy::NextChange> for NextChange {
    fn from(c: &metalift_policy::NextChange) -> Self {
        NextChange {
            at: metalift_policy::window::format_rfc3339(c.at),
            rule: c.rule.clone(),
            edge: c.edge.as_str().to_owned(),
        }
    }
}

impl StatusReport {
    /// The report as an admin reads it.
    #[must_use]
    pub fn to_text(&self) -> String {
        let errors: Vec<&str> = if self.last_reload_errors.is_empty() {
            self.last_reload_error
                .as_deref()
                .map(|e| e.lines().collect())
                .unwrap_or_default()
        } else {
            self.last_reload_errors.iter().map(String::as_str).collect()
        };
        let error = match errors.split_first() {
            None => "none".to_owned(),
            Some((first, rest)) => rest.iter().fold((*first).to_owned(), |acc, l| {
                format!("{acc}\n                  {l}")
            }),
        };
        // The codes only: `metalift status` prints each cause's message once, in
        // its problems list (and the first one as its first line).
        let health = if self.health.causes.is_empty() {
            "ok".to_owned()
        } else if self.health.state == crate::service::health::State::Unknown {
            "UNKNOWN (the daemon reports no health)".to_owned()
        } else {
            let codes: Vec<&str> = self.health.causes.iter().map(|c| c.code.as_str()).collect();
            format!("DEGRADED: {}", codes.join(", "))
        };
        let text = format!(
            "metaliftd {version} (pid {pid}), running since {started}\n\
             health            {health}\n\
             policy            {path}\n\
             \x20 sha256          {sha}\n\
             \x20 loaded at       {loaded}\n\
             \x20 rules           {rules}\n\
             {next}\
             \x20 mode            {mode}\n\
             \x20 last error      {error}\n\
             check-ins         {check_ins}\n\
             \x20 unlocks         {unlocks}\n\
             \x20 would unlock    {would}\n\
             outcomes          {outcomes}\n\
             audit failures    {failures}\n\
             unidentified      {unidentified} ({gone} exited before they could be identified)\n\
             connections       {active} active, {waiting} waiting for an outcome\n\
             cache entries     {cache}\n",
            version = self.version,
            pid = self.pid,
            started = self.started_at,
            path = self.policy_path,
            sha = self.policy_sha256,
            loaded = self.policy_loaded_at,
            rules = self.rule_count,
            next = match &self.next_change {
                Some(c) => format!("  next change     {} rule `{}` {}\n", c.at, c.rule, c.edge),
                None => String::new(),
            },
            mode = self.mode,
            check_ins = self.check_ins,
            unlocks = self.unlocks,
            would = self.would_unlock,
            outcomes = self.outcomes,
            failures = self.audit_failures,
            unidentified = self.unidentified,
            gone = self.peers_gone,
            active = self.connections_active,
            waiting = self.connections_waiting,
            cache = self.cache_entries,
        );
        let text = match &self.forwarder {
            Some(f) if f.configured => format!("{text}{}", f.to_text()),
            _ => text,
        };
        // verified unlock: only when some live profile requires it.
        match self.verified_unlock.split_first() {
            None => text,
            Some((first, rest)) => rest
                .iter()
                .fold(format!("{text}verified unlock   {first}\n"), |acc, l| {
                    format!("{acc}                  {l}\n")
                }),
        }
    }
}

/// Why the status could not be fetched: the one client's error (no daemon, no
/// answer, a closed or broken connection, a malformed or unexpected frame), or
/// a status frame whose JSON does not parse.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The exchange failed ([`wire::Client`]'s own error, its message as is).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// The JSON inside the status frame does not parse.
    #[error("metaliftd on {} sent an unreadable status: {error}", socket.display())]
    Json {
        /// The socket.
        socket: PathBuf,
        /// The parse error.
        error: serde_json::Error,
    },
}

/// Asks the daemon on `socket` for its status. Blocking, bounded by `timeout`.
pub fn request(socket: &Path, timeout: Duration) -> Result<StatusReport, StatusError> {
    let json = request_raw(socket, timeout)?;
    serde_json::from_str(&json).map_err(|error| StatusError::Json {
        socket: socket.to_owned(),
        error,
    })
}

/// Asks for the status and returns the daemon's JSON as sent (through the one
/// client, [`wire::Client`]).
pub fn request_raw(socket: &Path, timeout: Duration) -> Result<String, StatusError> {
    Ok(wire::Client::status(socket, timeout)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report() -> StatusReport {
        StatusReport {
            version: "0.1.0".into(),
            pid: 42,
            started_at: "2026-11-30T06:00:00.000000Z".into(),
            policy_path: "/etc/metalift/policy.toml".into(),
            policy_sha256: "ab".repeat(32),
            policy_loaded_at: "2026-11-30T06:00:00.000100Z".into(),
            rule_count: 3,
            mode: "enforce".into(),
            last_reload_error: Some("p.toml:3:1: error: unknown key\n  | x = 1".into()),
            check_ins: 10,
            unlocks: 4,
            would_unlock: 0,
            outcomes: 9,
            audit_failures: 0,
            unidentified: 0,
            peers_gone: 0,
            last_reload_errors: vec!["p.toml:3:1: error: unknown key".into()],
            refused_sha256: None,
            connections_active: 1,
            connections_waiting: 7,
            cache_entries: 2,
            full_disk_access: None,
            verified_unlock: Vec::new(),
            health: Health::default(),
            audit_log: None,
            audit_free_bytes: None,
            max_policy_bytes: None,
            policy_archived: None,
            host_chip_brand: None,
            host_os_build: None,
            forwarder: None,
            next_change: None,
        }
    }

    #[test]
    fn the_text_report_names_every_figure() {
        let text = report().to_text();
        for needle in [
            "pid 42",
            "/etc/metalift/policy.toml",
            &"ab".repeat(32),
            "rules           3",
            "mode            enforce",
            "last error      p.toml:3:1: error: unknown key",
            "check-ins         10",
            "unlocks         4",
            "cache entries     2",
            "connections       1 active, 7 waiting for an outcome",
        ] {
            assert!(text.contains(needle), "{needle:?} missing from\n{text}");
        }
    }

    #[test]
    fn an_older_daemons_report_without_health_reads_as_unknown_never_ok() {
        let mut json = serde_json::to_value(report()).unwrap();
        let fields = json.as_object_mut().unwrap();
        for new in [
            "health",
            "audit_log",
            "audit_free_bytes",
            "max_policy_bytes",
            "policy_archived",
        ] {
            assert!(fields.remove(new).is_some(), "{new}");
        }
        let read: StatusReport = serde_json::from_value(json).unwrap();
        assert_eq!(read.health.state, crate::service::health::State::Unknown);
        assert_eq!(read.health.causes[0].code, "health_unknown");
        assert_eq!(read.policy_archived, None);
    }

    #[test]
    fn the_text_report_says_degraded_and_the_cause_codes() {
        let mut r = report();
        r.health = Health::from_causes(vec![crate::service::health::Cause::new(
            "audit_write_failed",
            "the last audit write failed".into(),
        )]);
        let text = r.to_text();
        assert!(
            text.contains("health            DEGRADED: audit_write_failed\n"),
            "{text}"
        );
        assert!(report().to_text().contains("health            ok"));
    }

    #[test]
    fn no_daemon_is_a_clear_error_naming_the_socket() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("none.sock");
        let err = request(&socket, Duration::from_secs(1)).unwrap_err();
        let text = err.to_string();
        assert!(matches!(
            err,
            StatusError::Client(ClientError::Connect { .. })
        ));
        assert!(text.contains("is metaliftd running?"), "{text}");
        assert!(text.contains("none.sock"), "{text}");
    }
}
