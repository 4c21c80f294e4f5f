//! The audit log writer: whole lines, rotation that keeps N files and loses nothing,
//! and failures reported as errors (the server turns them into stock verdicts).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use metalift_daemon::audit::reader::{Item, LogReader};
use metalift_daemon::audit::rotation::rotated_path;
use metalift_daemon::audit::{Advisory, AuditError, AuditLog, DecisionRecord, Record, Rotation};

fn decision(id: u64, exe: &str) -> Record {
    Record::Decision(DecisionRecord {
        time: SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000 + id),
        decision_id: id,
        pid: 1000 + id as i32,
        uid: 501,
        exe: exe.to_owned(),
        sha256: None,
        team_id: None,
        signing_id: None,
        cdhash: None,
        anchor: None,
        identity_error: None,
        parent_exe: None,
        ancestors: Vec::new(),
        rule: Some("llama-cpp".into()),
        action: "unlock".into(),
        profile: Some("apple7".into()),
        mode: "enforce".into(),
        apple_family_max: None,
        apple_family_requested: None,
        apple_family_capped: None,
        unverified: None,
        window: None,
        would_unlock: false,
        host_chip: None,
        policy_sha256: "ab".repeat(32),
        latency_us: 42,
        transport: "unix".into(),
        advisory: Advisory::default(),
    })
}

/// Every record of the log at `path`, oldest first; panics on a corrupt line.
fn read_all(path: &Path) -> Vec<Record> {
    let mut reader = LogReader::open(path).expect("log opens");
    reader
        .read_to_end()
        .expect("log reads")
        .into_iter()
        .map(|item| match item {
            Item::Entry(e) => serde_json::from_str(&e.raw).expect("a whole record"),
            Item::Corrupt { file, line, error } => {
                panic!("{}:{line}: corrupt: {error}", file.display())
            }
        })
        .collect()
}

fn ids(records: &[Record]) -> Vec<u64> {
    records
        .iter()
        .map(|r| match r {
            Record::Decision(d) => d.decision_id,
            other => panic!("unexpected {}", other.kind()),
        })
        .collect()
}

#[test]
fn open_creates_the_directory_0750_and_the_file_0640() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("var/log/metalift/audit.jsonl");
    let log = AuditLog::open(&path, Rotation::default()).unwrap();
    log.append(&decision(1, "/bin/x")).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(path.parent().unwrap()), 0o750);
    assert_eq!(mode(&path), 0o640);
    assert_eq!(ids(&read_all(&path)), vec![1]);
}

#[test]
fn rotation_keeps_the_configured_number_of_files_with_the_newest_records() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("audit.jsonl");
    let rotation = Rotation {
        max_bytes: 2_000,
        keep: 3,
    };
    let log = AuditLog::open(&path, rotation).unwrap();
    // A line as the log writes it: the record with its stamp (schema, id, host).
    log.append(&decision(0, "/opt/bin/tool")).unwrap();
    let line_len = std::fs::metadata(&path).unwrap().len();
    let per_file = rotation.max_bytes / line_len;
    // Enough for ten rotations.
    let total = per_file * 11;
    for id in 1..total {
        log.append(&decision(id, "/opt/bin/tool")).unwrap();
    }

    for n in 1..=3 {
        assert!(rotated_path(&path, n).exists(), ".{n} is kept");
    }
    assert!(!rotated_path(&path, 4).exists(), "nothing beyond keep = 3");
    for n in 1..=3 {
        let size = std::fs::metadata(rotated_path(&path, n)).unwrap().len();
        assert!(size <= rotation.max_bytes, ".{n} is {size} bytes");
    }
    // The kept files hold the newest records, contiguous, oldest first, ending with the last.
    let kept = ids(&read_all(&path));
    let first = kept[0];
    assert_eq!(kept, (first..total).collect::<Vec<_>>());
    assert!(kept.len() as u64 >= per_file * 3);
}

#[test]
fn concurrent_appends_across_rotations_lose_no_record_and_never_interleave() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("audit.jsonl");
    // Small files, and enough of them kept that nothing is dropped.
    let log = Arc::new(
        AuditLog::open(
            &path,
            Rotation {
                max_bytes: 64 * 1024,
                keep: 1_000,
            },
        )
        .unwrap(),
    );
    let threads = 8u64;
    let per_thread = 400u64;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                // Long, thread-specific lines make any interleaving visible as bad JSON.
                let exe = format!(
                    "/opt/{}/bin/tool",
                    char::from(b'a' + t as u8).to_string().repeat(3000)
                );
                for i in 0..per_thread {
                    log.append(&decision(t * per_thread + i, &exe)).unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }

    let records = read_all(&path);
    let mut seen = ids(&records);
    assert_eq!(seen.len() as u64, threads * per_thread, "line count");
    seen.sort_unstable();
    assert_eq!(seen, (0..threads * per_thread).collect::<Vec<_>>());
    // Each record kept its own thread's executable: no bytes from another write.
    for r in &records {
        let Record::Decision(d) = r else {
            unreachable!()
        };
        let t = d.decision_id / per_thread;
        assert!(d
            .exe
            .contains(&char::from(b'a' + t as u8).to_string().repeat(3000)));
    }
    assert!(rotated_path(&path, 2).exists(), "the test did rotate");
}

#[test]
fn a_full_disk_is_an_append_error() {
    // /dev/full accepts the open and fails every write with ENOSPC.
    let log = AuditLog::open(Path::new("/dev/full"), Rotation::default()).unwrap();
    let err = log.append(&decision(1, "/bin/x")).unwrap_err();
    assert!(
        matches!(&err, AuditError::Write { source, .. } if source.raw_os_error() == Some(libc::ENOSPC)),
        "{err}"
    );
}

#[test]
fn a_log_whose_directory_cannot_exist_fails_to_open() {
    let tmp = tempfile::tempdir().unwrap();
    let file = tmp.path().join("not-a-dir");
    std::fs::write(&file, "").unwrap();
    let err = AuditLog::open(&file.join("audit.jsonl"), Rotation::default()).unwrap_err();
    assert!(matches!(err, AuditError::CreateDir { .. }), "{err}");
}

#[test]
fn a_failed_rotation_still_records_into_the_current_file() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("audit.jsonl");
    let log = AuditLog::open(
        &path,
        Rotation {
            max_bytes: 1,
            keep: 1,
        },
    )
    .unwrap();
    log.append(&decision(1, "/bin/x")).unwrap();
    // `.1` is a non-empty directory: renaming the live file onto it fails.
    std::fs::create_dir_all(rotated_path(&path, 1).join("blocker")).unwrap();
    log.append(&decision(2, "/bin/x")).unwrap();
    log.append(&decision(3, "/bin/x")).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let in_live: Vec<u64> = text
        .lines()
        .map(|l| match serde_json::from_str::<Record>(l).unwrap() {
            Record::Decision(d) => d.decision_id,
            other => panic!("unexpected {}", other.kind()),
        })
        .collect();
    assert_eq!(in_live, vec![1, 2, 3]);
}

#[test]
fn keep_zero_starts_the_live_file_afresh_and_leaves_no_rotated_file() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("audit.jsonl");
    let line_len = decision(0, "/bin/x").to_line().unwrap().len() as u64;
    let log = AuditLog::open(
        &path,
        Rotation {
            max_bytes: line_len * 2,
            keep: 0,
        },
    )
    .unwrap();
    for id in 0..5 {
        log.append(&decision(id, "/bin/x")).unwrap();
    }
    assert!(!rotated_path(&path, 1).exists());
    assert_eq!(ids(&read_all(&path)), vec![4]);
}
