//! Test helper shared by the test suites that read audit logs (the daemon's, the
//! CLI's and the probe's include this file with `#[path]`): every record they read
//! must validate against the committed `schema/metalift-audit-record.schema.json`,
//! the schema generated from the writer's types (checked current by
//! `scripts/test.sh`). A record the daemon writes that its own schema refuses
//! fails the test that read it. Not a test binary of its own: `autotests`
//! would build it as one, so it holds a test too (the schema refuses a record
//! without its common fields).
#![allow(dead_code)]

use std::sync::OnceLock;

use serde_json::Value;

fn validator() -> &'static jsonschema::Validator {
    static VALIDATOR: OnceLock<jsonschema::Validator> = OnceLock::new();
    VALIDATOR.get_or_init(|| {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../schema/metalift-audit-record.schema.json"
        );
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let schema: Value = serde_json::from_str(&text).expect("the record schema is JSON");
        jsonschema::draft7::new(&schema).expect("the record schema is a valid draft-07 schema")
    })
}

/// Panics, naming every violation, unless `record` is valid by the record schema.
pub fn assert_valid_record(record: &Value) {
    let errors: Vec<String> = validator()
        .iter_errors(record)
        .map(|e| format!("{} at {}", e, e.instance_path))
        .collect();
    assert!(
        errors.is_empty(),
        "an audit record the schema refuses: {record}\n  {}",
        errors.join("\n  ")
    );
}

/// Every record in the audit log `log` so far, read by the one records reader
/// (`metalift_daemon::scratch::records_in`: whole lines only, none when the file
/// does not exist yet), each checked against the schema.
pub fn valid_records(log: &std::path::Path) -> Vec<Value> {
    let records = metalift_daemon::scratch::records_in(log).unwrap_or_else(|e| panic!("{e}"));
    records.iter().for_each(assert_valid_record);
    records
}

/// Parses one audit line and checks it against the schema.
pub fn valid_record(line: &str) -> Value {
    let record: Value = serde_json::from_str(line).expect("an audit line is JSON");
    assert_valid_record(&record);
    record
}

#[test]
fn the_schema_refuses_a_record_without_its_common_fields_or_with_a_wrong_type() {
    let good = serde_json::json!({
        "schema": 1, "id": "ab-1",
        "host": {"name": "guest", "boot_id": null, "labels": {}},
        "kind": "daemon_stop", "time": "2026-01-01T00:00:00Z",
        "reason": "SIGTERM", "checkins": 0, "unlocks": 0
    });
    assert!(validator().is_valid(&good));
    let mut no_host = good.clone();
    no_host.as_object_mut().unwrap().remove("host");
    assert!(!validator().is_valid(&no_host));
    let mut bad = good.clone();
    bad["checkins"] = Value::from("many");
    assert!(!validator().is_valid(&bad));
    let mut unknown_kind = good;
    unknown_kind["kind"] = Value::from("nonsense");
    assert!(!validator().is_valid(&unknown_kind));
}
