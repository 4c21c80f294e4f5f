//! The audit log: every decision, outcome, policy load and daemon start/stop, as JSON Lines.
//!
//! - [`record`]: what a line says ([`Record`], tagged by `"kind"`).
//! - [`stamp`]: the fields every line carries besides its record (`schema`, `id`, `host`).
//! - [`schema`]: the JSON Schema of a line, generated from the record types.
//! - [`host`]: the `host` part: host name, boot session id, the admin's labels.
//! - [`rfc3339`]: how every record writes and reads its `"time"`.
//! - [`refused`]: a refused check-in or outcome ([`RefusedRecord`]) and the budget
//!   that bounds how many are written.
//! - [`writer`]: [`AuditLog`], one `write(2)` per record, size rotation under one lock.
//! - [`log_lock`]: one daemon per log (`<log>.lock`, an exclusive `flock`).
//! - [`rotation`]: [`Rotation`] settings and the file-name scheme of rotated files.
//! - [`collected`]: a record as a collector stores it (bare JSON, or behind a syslog header).
//! - [`line`]: one line read back as the writer's typed [`Record`] (or a newer kind, or corrupt).
//! - [`chain`]: the log's files held open oldest first across rotations: the one follower
//!   under both the reader and the forwarder.
//! - [`reader`]: reading the log back (rotated files first), and following it, for `metalift audit`.
//! - [`receipt`]: what a `verification` record proves it ran (hashes, stock and effective answers, the control).
//! - [`verification`]: the `verification` record (`metalift verify`), shared with the verification file.
//! - [`forward`]: forwarding every record to a syslog collector (`[audit.forward]`).
//! - [`tail`]: where the last N lines start, read backwards (`metalift audit -f -n N`).

pub mod chain;
pub mod collected;
pub mod forward;
pub mod host;
pub mod line;
pub mod log_lock;
pub mod reader;
pub mod receipt;
pub mod record;
pub mod refused;
pub mod rfc3339;
pub mod rotation;
pub mod schema;
pub mod stamp;
pub mod tail;
pub mod verification;
pub mod writer;

use std::io;
use std::path::PathBuf;

pub use host::Host;
pub use record::{
    Advisory, AnswersRecord, DecisionRecord, LoadReason, OtherShimRecord, OutcomeRecord, Record,
    WindowRecord,
};
pub use refused::RefusedRecord;
pub use rotation::Rotation;
pub use stamp::{Stamp, Stamper, SCHEMA_VERSION};
pub use writer::AuditLog;

/// Where metaliftd writes the audit log and `metalift audit` reads it, unless told otherwise.
pub const DEFAULT_LOG_PATH: &str = "/var/log/metalift/audit.jsonl";

/// Why a record could not be written. Every variant means the record is not (wholly)
/// in the log, so the daemon must answer stock.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The log's directory could not be created.
    #[error("cannot create audit log directory {}: {source}", path.display())]
    CreateDir {
        /// The directory.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The log file could not be opened or created.
    #[error("cannot open audit log {}: {source}", path.display())]
    Open {
        /// The log file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// `write(2)` failed (disk full, file too large, I/O error).
    #[error("cannot write audit log {}: {source}", path.display())]
    Write {
        /// The log file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// `write(2)` wrote only part of the record.
    #[error("short write to audit log {}: {written} of {expected} bytes", path.display())]
    ShortWrite {
        /// The log file.
        path: PathBuf,
        /// Bytes written.
        written: usize,
        /// Bytes in the record.
        expected: usize,
    },
    /// Renaming the files of a rotation failed.
    #[error("cannot rotate audit log {}: {source}", path.display())]
    Rotate {
        /// The log file.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The record could not be serialized (not expected for well-formed records).
    #[error("cannot serialize audit record: {0}")]
    Serialize(serde_json::Error),
}
