//! One line of the audit log, read back: deserialised into the writer's own
//! [`Record`] (one definition of the format). Fields a newer daemon added are
//! ignored; a record kind this version does not know is returned as an [`Entry`]
//! without a record (readers skip it and count it), never as an error. A line that
//! is not a record at all is [`Item::Corrupt`] with its `file:line`, never fatal.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use serde::Deserialize;

use super::record::{rfc3339, Record};
use super::stamp::Stamp;

/// One line of the log that is a record (of a kind known or not).
#[derive(Debug, Clone, PartialEq)]
pub struct Entry {
    /// The line exactly as written, without its newline.
    pub raw: String,
    /// `"kind"`.
    pub kind: String,
    /// `"time"`, parsed.
    pub time: SystemTime,
    /// The record, typed by the writer's definition; `None` for a kind written by a
    /// newer daemon that this version does not know.
    pub record: Option<Record>,
    /// `"schema"`, `"id"` and `"host"` (defaults for records older daemons wrote).
    pub stamp: Stamp,
}

/// What reading one line produced.
#[derive(Debug, Clone, PartialEq)]
// Items are passed one at a time, never stored in bulk: boxing the common case
// would only add an allocation per line.
#[allow(clippy::large_enum_variant)]
pub enum Item {
    /// A record.
    Entry(Entry),
    /// A line that is not a record; skipped by readers, reported to the admin.
    Corrupt {
        /// The file it is in.
        file: PathBuf,
        /// Its 1-based line number in that file.
        line: usize,
        /// What is wrong with it.
        error: String,
    },
}

/// The two fields every record has, read when the whole record does not parse, to
/// tell a newer kind (skipped) from a damaged line (corrupt).
#[derive(Deserialize)]
struct Head {
    kind: String,
    #[serde(with = "rfc3339")]
    time: SystemTime,
}

/// Parses one line (without its newline): a record, bare or behind the syslog
/// header a collector kept ([`super::collected`]). `file` and `line` locate a
/// corrupt one.
#[must_use]
pub fn parse_line(text: &str, file: &Path, line: usize) -> Item {
    match super::collected::record_text(text) {
        Ok(json) => parse_record(json, None, None, file, line),
        Err(what) => Item::Corrupt {
            file: file.to_owned(),
            line,
            error: what.to_owned(),
        },
    }
}

/// Parses one record's JSON. `stamp`: its common fields when the caller has read
/// them already (`metalift audit` reads them with a scan and keeps each guest's
/// `host` parsed once), else they are parsed here. `kind`: its top-level `"kind"`
/// when the caller has read it: a decision or outcome is then parsed as its own
/// struct, not through the tagged enum (which buffers every field first: most of
/// the time `metalift audit --summary` spent on a fleet's file).
#[must_use]
pub fn parse_record(
    text: &str,
    stamp: Option<Stamp>,
    kind: Option<&str>,
    file: &Path,
    line: usize,
) -> Item {
    let corrupt = |error: String| Item::Corrupt {
        file: file.to_owned(),
        line,
        error,
    };
    let stamp_of = |stamp: Option<Stamp>| {
        stamp.unwrap_or_else(|| serde_json::from_str(text).unwrap_or_default())
    };
    let parsed = match kind {
        Some("decision") => serde_json::from_str(text).map(Record::Decision),
        Some("outcome") => serde_json::from_str(text).map(Record::Outcome),
        _ => serde_json::from_str::<Record>(text),
    };
    let error = match parsed {
        Ok(record) => {
            return Item::Entry(Entry {
                raw: text.to_owned(),
                kind: record.kind().to_owned(),
                time: record.time(),
                record: Some(record),
                stamp: stamp_of(stamp),
            })
        }
        Err(e) => e,
    };
    match serde_json::from_str::<Head>(text) {
        Ok(head) if !Record::KINDS.contains(&head.kind.as_str()) => Item::Entry(Entry {
            raw: text.to_owned(),
            kind: head.kind,
            time: head.time,
            record: None,
            stamp: stamp_of(stamp),
        }),
        Ok(head) => corrupt(format!("bad {:?} record: {error}", head.kind)),
        Err(e) if error.is_syntax() || error.is_eof() => corrupt(format!("not JSON: {e}")),
        Err(e) => corrupt(format!("not a record: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_without_kind_or_with_a_bad_time_is_corrupt_with_its_location() {
        let f = Path::new("a.jsonl");
        assert!(matches!(
            parse_line("{\"time\":\"2026-01-01T00:00:00Z\"}", f, 3),
            Item::Corrupt { line: 3, .. }
        ));
        assert!(matches!(
            parse_line("{\"kind\":\"daemon_stop\",\"time\":\"yesterday\"}", f, 4),
            Item::Corrupt { line: 4, .. }
        ));
        assert!(matches!(
            parse_line("{not json", f, 5),
            Item::Corrupt { .. }
        ));
        // A known kind missing a field the writer always writes is damaged.
        assert!(matches!(
            parse_line(
                "{\"kind\":\"decision\",\"time\":\"2026-01-01T00:00:00Z\"}",
                f,
                6
            ),
            Item::Corrupt { line: 6, .. }
        ));
    }

    #[test]
    fn a_newer_kind_is_an_entry_without_a_record_and_unknown_fields_are_ignored() {
        let f = Path::new("a.jsonl");
        let Item::Entry(newer) = parse_line(
            "{\"kind\":\"quota_exceeded\",\"time\":\"2026-01-01T00:00:00.5Z\",\"n\":3}",
            f,
            1,
        ) else {
            panic!("a newer kind is not corrupt")
        };
        assert_eq!(newer.kind, "quota_exceeded");
        assert!(newer.record.is_none());
        let Item::Entry(known) = parse_line(
            "{\"kind\":\"daemon_stop\",\"time\":\"2026-01-01T00:00:00Z\",\"reason\":\"x\",\"checkins\":2,\"unlocks\":0,\"added_in_v9\":[1]}",
            f,
            2,
        ) else {
            panic!("an unknown field refused the record")
        };
        assert!(matches!(
            known.record,
            Some(Record::DaemonStop { checkins: 2, .. })
        ));
    }

    #[test]
    fn a_decision_from_an_older_daemon_without_descriptive_fields_still_reads() {
        let Item::Entry(old) = parse_line(
            "{\"kind\":\"decision\",\"time\":\"2026-01-01T00:00:00Z\",\"decision_id\":1,\
             \"pid\":2,\"uid\":3,\"exe\":\"/x\",\"rule\":null,\"action\":\"stock\",\
             \"mode\":\"enforce\",\"policy_sha256\":\"ab\"}",
            Path::new("a.jsonl"),
            1,
        ) else {
            panic!("an older decision is corrupt")
        };
        let Some(Record::Decision(d)) = old.record else {
            panic!("not a decision")
        };
        assert_eq!((d.pid, d.transport.as_str()), (2, ""));
    }
}
