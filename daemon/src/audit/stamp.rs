//! The fields every audit record carries besides its own: `"schema"` (the
//! record format's version), `"id"` (unique across guests: a collector
//! deduplicates on it) and `"host"` ([`Host`]: which machine, which boot, which
//! image, which writing process).
//!
//! # Why the id is `<run>-<seq>`
//!
//! `run` is 128 random bits drawn when the daemon opens its log (one per daemon
//! process), `seq` counts that process's records from 1. Random per run, so two
//! clones of one image, or one guest's daemon after a restart, never reuse an id
//! (a boot id + sequence would repeat after a daemon restart within one boot);
//! one random draw per run rather than per record keeps the check-in path free
//! of a system call; and the sequence tells a collector the order of one run's
//! records and, by a gap, that some append failed. The id is written into the
//! line itself, so a record forwarded twice (after a restart) carries the same id.

use std::io::Read;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};

use super::host::Host;
use super::record::Record;

/// The version of the record format this daemon writes (`"schema"`). Raised only
/// for a change a reader must know about (a field removed or its meaning
/// changed); fields and kinds are added without raising it.
pub const SCHEMA_VERSION: u32 = 1;

/// One line of the audit log as written: the common fields, then the record's own.
/// The JSON Schema of the log (`schema/metalift-audit-record.schema.json`) is
/// generated from this type.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Stamped<'a> {
    /// The record format's version ([`SCHEMA_VERSION`]).
    pub schema: u32,
    /// Unique across guests and daemon restarts: `<run>-<seq>` (see the module doc).
    pub id: &'a str,
    /// Which machine wrote it.
    pub host: &'a Host,
    /// The record itself, tagged by `"kind"`.
    #[serde(flatten)]
    pub record: &'a Record,
}

/// The common fields of a line, read back (absent from records older daemons wrote).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Stamp {
    /// `"schema"`; 0 for a record written before it existed.
    #[serde(default)]
    pub schema: u32,
    /// `"id"`; empty for a record written before it existed.
    #[serde(default)]
    pub id: String,
    /// `"host"`; `None` for a record written before it existed.
    #[serde(default)]
    pub host: Option<Host>,
}

/// Hands out ids and the current host part.
#[derive(Debug)]
pub struct Stamper {
    /// This daemon run's random part of every id (32 hex digits).
    run: String,
    /// The last sequence number handed out.
    seq: AtomicU64,
    /// The host part: name and boot id fixed, labels replaced on a policy load. A
    /// std `RwLock` around an `Arc`: a writer clones the `Arc` (no allocation) and
    /// serialises outside the lock.
    host: RwLock<Arc<Host>>,
}

impl Stamper {
    /// A stamper for this machine and this process (its pid in every record),
    /// with a fresh run id.
    #[must_use]
    pub fn new() -> Stamper {
        Stamper::with_host(Host::this_writer())
    }

    /// A stamper for `host` (tests), with a fresh run id.
    #[must_use]
    pub fn with_host(host: Host) -> Stamper {
        Stamper {
            run: run_id(),
            seq: AtomicU64::new(0),
            host: RwLock::new(Arc::new(host)),
        }
    }

    /// Replaces the labels every later record carries (the live policy's `[audit.labels]`).
    pub fn set_labels(&self, labels: &std::collections::BTreeMap<String, String>) {
        let mut host = self
            .host
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if host.labels != *labels {
            let mut next = (**host).clone();
            next.labels = labels.clone();
            *host = Arc::new(next);
        }
    }

    /// Replaces the clone's name every later record carries (`host.instance`).
    pub fn set_instance(&self, instance: Option<String>) {
        let mut host = self
            .host
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if host.instance != instance {
            let mut next = (**host).clone();
            next.instance = instance;
            *host = Arc::new(next);
        }
    }

    /// The host part records carry now.
    #[must_use]
    pub fn host(&self) -> Arc<Host> {
        Arc::clone(
            &self
                .host
                .read()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }

    /// `record` as one JSON line with a new id, newline included.
    pub fn line(&self, record: &Record) -> Result<Vec<u8>, serde_json::Error> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) + 1;
        let id = format!("{}-{seq}", self.run);
        let host = self.host();
        let mut line = serde_json::to_vec(&Stamped {
            schema: SCHEMA_VERSION,
            id: &id,
            host: &host,
            record,
        })?;
        line.push(b'\n');
        Ok(line)
    }
}

impl Default for Stamper {
    fn default() -> Self {
        Stamper::new()
    }
}

/// 128 bits from the system's random source as 32 hex digits; if it cannot be
/// read (not expected), the clock's nanoseconds and the pid, which still differ
/// between runs on one machine (the boot id in `host` separates machines).
fn run_id() -> String {
    let mut bytes = [0u8; 16];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut bytes)) {
        Ok(()) => hex::encode(bytes),
        Err(error) => {
            tracing::warn!(%error, "cannot read /dev/urandom: audit record ids fall back to time and pid");
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos());
            format!("{nanos:024x}{:08x}", std::process::id())
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn stop() -> Record {
        Record::DaemonStop {
            time: SystemTime::UNIX_EPOCH,
            reason: "SIGTERM".into(),
            checkins: 0,
            unlocks: 0,
            pid: 1,
        }
    }

    #[test]
    fn every_line_has_the_schema_a_new_id_and_the_labels_live_when_written() {
        let stamper = Stamper::with_host(Host {
            name: "guest".into(),
            boot_id: Some("b00t".into()),
            labels: Default::default(),
            pid: Some(4242),
            os_build: None,
            instance: None,
        });
        let first: serde_json::Value =
            serde_json::from_slice(&stamper.line(&stop()).unwrap()).unwrap();
        stamper.set_labels(&[("image".to_owned(), "macos-26".to_owned())].into());
        let second: serde_json::Value =
            serde_json::from_slice(&stamper.line(&stop()).unwrap()).unwrap();
        assert_eq!(first["schema"], SCHEMA_VERSION);
        assert_eq!(first["kind"], "daemon_stop");
        assert_eq!(first["host"]["boot_id"], "b00t");
        assert_eq!(first["host"]["pid"], 4242);
        assert_eq!(first["host"]["labels"], serde_json::json!({}));
        assert_eq!(second["host"]["labels"]["image"], "macos-26");
        assert_ne!(first["id"], second["id"]);
        let (run, seq) = second["id"].as_str().unwrap().rsplit_once('-').unwrap();
        assert_eq!((run.len(), seq), (32, "2"));
        // A second daemon run on the same machine never reuses the ids.
        let again: serde_json::Value =
            serde_json::from_slice(&Stamper::with_host(Host::default()).line(&stop()).unwrap())
                .unwrap();
        assert_ne!(again["id"], first["id"]);
        // And the record reads back, the common fields with it.
        let line = stamper.line(&stop()).unwrap();
        assert_eq!(serde_json::from_slice::<Record>(&line).unwrap(), stop());
        let stamp: Stamp = serde_json::from_slice(&line).unwrap();
        assert_eq!(stamp.host.unwrap().name, "guest");
    }

    #[test]
    fn a_stamper_for_this_process_writes_its_pid_in_every_record() {
        let stamper = Stamper::new();
        for _ in 0..2 {
            let line: serde_json::Value =
                serde_json::from_slice(&stamper.line(&stop()).unwrap()).unwrap();
            assert_eq!(line["host"]["pid"], std::process::id());
        }
        // A machine described (not a writer) has none, and says nothing about it.
        let machine = serde_json::to_value(Host::this_machine()).unwrap();
        assert!(machine.get("pid").is_none(), "{machine}");
    }
}
