//! The forwarder as `metalift status` reports it (the `forwarder` object).

use serde::{Deserialize, Serialize};

use super::cursor::Cursor;
use metalift_policy::forward::Forward;

/// What the forwarder is doing now.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForwarderStatus {
    /// Whether the live policy has `[audit.forward]`.
    pub configured: bool,
    /// The collector's `host:port`.
    pub address: Option<String>,
    /// `tcp`, `tls`, `relp` or `relp-tls`.
    pub transport: Option<String>,
    /// Whether a connection is open now.
    pub connected: bool,
    /// Whole records written locally and not yet sent.
    pub records_behind: u64,
    /// Bytes of the local log not yet sent (claimed for sending: a batch being
    /// written counts as sent), read from the files when `status` asks.
    pub bytes_behind: u64,
    /// Records rotated away before they were sent, since the log began (durable
    /// across restarts): the latest `forward_gap` record's `total`.
    #[serde(default)]
    pub gap_records: u64,
    /// Bytes of the local log not yet known delivered: `bytes_behind` and what
    /// was sent and is in flight (not acknowledged, or over TCP and TLS
    /// acknowledged less than [`super::window::TCP_SETTLE`] ago).
    #[serde(default)]
    pub undelivered_bytes: u64,
    /// Bytes sent that the collector's TCP stack has not acknowledged yet
    /// (the kernel's send queue), over RELP the messages the collector has not
    /// answered yet; `None` when not connected.
    pub unacknowledged_bytes: Option<u64>,
    /// Records sent since the daemon started.
    pub delivered_records: u64,
    /// Framed bytes sent since the daemon started.
    pub delivered_bytes: u64,
    /// The last error (connect, TLS, write), kept after a later success.
    pub last_error: Option<String>,
    /// When it happened (RFC 3339).
    pub last_error_at: Option<String>,
    /// When records were last sent (RFC 3339).
    pub last_delivery_at: Option<String>,
    /// The cursor: the file (device, inode) and offset sent up to.
    pub position: Option<Cursor>,
    /// The file and offset known delivered (acknowledged, over TCP and TLS then
    /// [`super::window::TCP_SETTLE`] without the connection ending; over RELP
    /// answered): what a lost connection sends again from, and what
    /// `forward.cursor` holds at its next save. Behind `position` by what is in flight.
    #[serde(default)]
    pub delivered_position: Option<Cursor>,
    /// When the oldest record not yet delivered was first seen waiting (RFC 3339;
    /// to within a round of the forwarder, [`super::lag`]); `None` when none waits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behind_since: Option<String>,
    /// The same time, for the daemon's own health (not sent: `behind_since` is).
    #[serde(skip)]
    pub behind_since_at: Option<std::time::SystemTime>,
    /// `[audit.forward] max_delay_seconds`: waiting longer is the health cause
    /// `forward_behind`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_delay_seconds: Option<u64>,
}

impl ForwarderStatus {
    /// A fresh status for `config` (not connected yet).
    #[must_use]
    pub fn configured(config: Option<&Forward>) -> ForwarderStatus {
        ForwarderStatus {
            configured: config.is_some(),
            address: config.map(|c| c.address.clone()),
            max_delay_seconds: config.map(|c| c.max_delay_seconds),
            transport: config.map(|c| c.transport.as_str().to_owned()),
            ..ForwarderStatus::default()
        }
    }

    /// Notes that `behind` bytes wait to be sent and `undelivered` to be known
    /// delivered, the oldest first seen at `since` (`None`: none waits).
    pub fn set_behind(
        &mut self,
        behind: u64,
        undelivered: u64,
        since: Option<std::time::SystemTime>,
    ) {
        self.bytes_behind = behind;
        self.undelivered_bytes = undelivered;
        self.behind_since_at = since;
        self.behind_since = since.map(crate::audit::rfc3339::format);
    }

    /// One line per fact, as `metalift status` prints them.
    #[must_use]
    pub fn to_text(&self) -> String {
        if !self.configured {
            return "forwarder:        not configured\n".to_owned();
        }
        let mut s = format!(
            "forwarder:        {} to {} ({})\n",
            if self.connected {
                "connected"
            } else {
                "not connected"
            },
            self.address.as_deref().unwrap_or("?"),
            self.transport.as_deref().unwrap_or("?"),
        );
        s += &format!(
            "  behind:         {} records, {} bytes (unacknowledged: {})\n",
            self.records_behind,
            self.bytes_behind,
            self.unacknowledged_bytes
                .map_or_else(|| "-".to_owned(), |n| format!("{n} bytes")),
        );
        if self.gap_records > 0 {
            s += &format!(
                "  rotated away:   {} records never sent (forward_gap)\n",
                self.gap_records
            );
        }
        if let Some(since) = &self.behind_since {
            s += &format!("  waiting since:  {since}\n");
        }
        s += &format!(
            "  last delivery:  {}\n",
            self.last_delivery_at.as_deref().unwrap_or("never")
        );
        if let Some(e) = &self.last_error {
            s += &format!(
                "  last error:     {e} ({})\n",
                self.last_error_at.as_deref().unwrap_or("?")
            );
        }
        s
    }
}
