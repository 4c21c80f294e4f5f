//! A write(2) that stores only part of a record is an error, and the partial line is
//! taken back out. Its own test binary: it lowers this process's file size limit.

use std::time::{Duration, SystemTime};

use metalift_daemon::audit::{AuditError, AuditLog, Record, Rotation};

#[test]
fn a_short_write_is_an_error_leaves_only_whole_lines_and_the_next_record_says_it_was_lost() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("audit.jsonl");
    let log = AuditLog::open(&path, Rotation::default()).unwrap();
    let record = Record::DaemonStop {
        time: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000),
        reason: "x".repeat(300),
        checkins: 1,
        unlocks: 0,
        pid: 1,
    };
    // The length of a line as the writer writes it (stamped with the host part, the
    // schema version and an id, all of one length for every record of this test).
    let scratch = tmp.path().join("scratch.jsonl");
    AuditLog::open(&scratch, Rotation::default())
        .unwrap()
        .append(&record)
        .unwrap();
    let line_len = std::fs::metadata(&scratch).unwrap().len();
    let limit = line_len * 3 + line_len / 2;

    // SAFETY: SIG_IGN is a valid disposition for SIGXFSZ; ignoring it makes writes
    // past RLIMIT_FSIZE fail (or come up short) instead of killing the process.
    let previous = unsafe { libc::signal(libc::SIGXFSZ, libc::SIG_IGN) };
    assert_ne!(previous, libc::SIG_ERR);
    let rlimit = libc::rlimit {
        rlim_cur: limit,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: `rlimit` is a valid, initialized struct that outlives the call.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &rlimit) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());

    let appended: Vec<_> = (0..4).map(|_| log.append(&record)).collect();

    // Lift the limit before anything else writes: the test harness's own output may
    // go to a file (CI redirects it), and a write past the limit there fails too.
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: `unlimited` is a valid, initialized struct that outlives the call.
    let rc = unsafe { libc::setrlimit(libc::RLIMIT_FSIZE, &unlimited) };
    assert_eq!(rc, 0, "setrlimit: {}", std::io::Error::last_os_error());

    let mut appended = appended.into_iter();
    for _ in 0..3 {
        appended.next().unwrap().unwrap();
    }
    let err = appended.next().unwrap().unwrap_err();
    assert!(
        matches!(err, AuditError::ShortWrite { written, expected, .. }
            if written as u64 == limit - 3 * line_len && expected as u64 == line_len),
        "{err}"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    assert_eq!(
        text.len() as u64,
        3 * line_len,
        "the partial line was removed"
    );
    assert!(text
        .lines()
        .all(|l| serde_json::from_str::<Record>(l).is_ok()));

    // The log takes records again: the first line says one was lost, then the record.
    assert_eq!(log.lost(), 1);
    log.append(&record).unwrap();
    assert_eq!(log.lost(), 0);
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert_eq!(lines[3]["kind"], "records_lost", "{text}");
    assert_eq!(lines[3]["count"], 1);
    assert_eq!(lines[3]["pid"], std::process::id());
    assert!(lines[3]["error"]
        .as_str()
        .is_some_and(|e| e.contains("short write")));
    assert_eq!(lines[4]["kind"], "daemon_stop");
}
