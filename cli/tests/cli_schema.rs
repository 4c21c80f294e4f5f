//! The policy's JSON Schema: `metalift schema` prints the committed copy, every
//! example policy validates against it, and the schema agrees with `metalift
//! validate` on a set of good and bad single-file policies.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn schema() -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .arg("schema")
        .output()
        .unwrap();
    assert!(out.status.success());
    serde_json::from_slice(&out.stdout).unwrap()
}

fn as_json(toml_text: &str) -> Value {
    toml::from_str::<Value>(toml_text).unwrap_or_else(|e| panic!("not TOML ({e}): {toml_text}"))
}

fn schema_accepts(validator: &jsonschema::Validator, text: &str) -> bool {
    validator.is_valid(&as_json(text))
}

fn validate_accepts(text: &str) -> bool {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.toml");
    std::fs::write(&path, text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .args(["validate", "--allow-insecure-owner"])
        .arg(&path)
        .output()
        .unwrap();
    match out.status.code() {
        Some(0) => true,
        Some(1) => false,
        other => panic!(
            "validate exited {other:?}: {}",
            String::from_utf8_lossy(&out.stdout)
        ),
    }
}

#[test]
fn the_committed_schema_is_what_metalift_schema_prints() {
    let committed = std::fs::read_to_string(repo().join("schema/metalift-policy.schema.json"))
        .expect("schema/metalift-policy.schema.json is committed");
    let printed = Command::new(env!("CARGO_BIN_EXE_metalift"))
        .arg("schema")
        .output()
        .unwrap();
    assert_eq!(
        committed,
        String::from_utf8_lossy(&printed.stdout),
        "stale: run `metalift schema > schema/metalift-policy.schema.json`"
    );
}

#[test]
fn every_example_policy_validates_against_the_schema() {
    let validator = jsonschema::draft7::new(&schema()).expect("a valid draft-07 schema");
    let mut seen = 0;
    for entry in std::fs::read_dir(repo().join("examples")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let errors: Vec<String> = validator
            .iter_errors(&as_json(&text))
            .map(|e| format!("{} at {}", e, e.instance_path))
            .collect();
        assert!(errors.is_empty(), "{}: {errors:#?}", path.display());
        seen += 1;
    }
    assert!(seen >= 3, "only {seen} examples found");
}

const P: &str = "version = 1\n[profile.apple7]\napple_family_max = 7\n";

/// (what, policy text, valid?). Single-file policies: what spans files (unique
/// ids across files, profiles named from drop-ins) is validate's alone.
fn cases() -> Vec<(&'static str, String, bool)> {
    let rule = |body: &str| format!("{P}\n[[rule]]\nid = \"r\"\n{body}\n");
    let profile = |body: &str| format!("version = 1\n[profile.p]\n{body}\n");
    vec![
        ("minimal", "version = 1\n".into(), true),
        ("monitor", "version = 1\nmode = \"monitor\"\n".into(), true),
        ("family 5", profile("apple_family_max = 5"), true),
        ("family 10", profile("apple_family_max = 10"), true),
        ("family 4", profile("apple_family_max = 4"), false),
        ("host", profile("apple_family_max = \"host\""), true),
        (
            "host misspelt",
            profile("apple_family_max = \"hots\""),
            false,
        ),
        ("family 11", profile("apple_family_max = 11"), false),
        ("family as text", profile("apple_family_max = \"7\""), false),
        (
            "no family",
            profile("max_threadgroup_memory = 32768"),
            false,
        ),
        (
            "threadgroup 65536",
            profile("apple_family_max = 7\nmax_threadgroup_memory = 65536"),
            true,
        ),
        (
            "threadgroup 0",
            profile("apple_family_max = 7\nmax_threadgroup_memory = 0"),
            false,
        ),
        (
            "threadgroup 70000",
            profile("apple_family_max = 7\nmax_threadgroup_memory = 70000"),
            false,
        ),
        (
            "working set GiB",
            profile("apple_family_max = 7\nrecommended_working_set = \"12 GiB\""),
            true,
        ),
        (
            "working set bytes",
            profile("apple_family_max = 7\nrecommended_working_set = 1073741824"),
            true,
        ),
        (
            "working set ambiguous unit",
            profile("apple_family_max = 7\nrecommended_working_set = \"12 G\""),
            false,
        ),
        (
            "unknown profile key",
            profile("apple_family_max = 7\nfamily = 7"),
            false,
        ),
        (
            "unknown top key",
            "version = 1\nmodes = \"enforce\"\n".into(),
            false,
        ),
        ("bad mode", "version = 1\nmode = \"loud\"\n".into(), false),
        ("version 2", "version = 2\n".into(), false),
        ("version as text", "version = \"1\"\n".into(), false),
        (
            "unlock by path",
            rule("path = \"/opt/x\"\nunlock = \"apple7\""),
            true,
        ),
        (
            "glob path",
            rule("path = \"/opt/**/llama-*\"\nunlock = \"apple7\""),
            true,
        ),
        (
            "stock by name",
            rule("name = \"python3\"\nstock = true"),
            true,
        ),
        (
            "sha256",
            rule(&format!("sha256 = \"{}\"\nstock = true", "ab".repeat(32))),
            true,
        ),
        (
            "sha256 short",
            rule(&format!("sha256 = \"{}\"\nstock = true", "a".repeat(63))),
            false,
        ),
        (
            "cdhash not hex",
            rule(&format!("cdhash = \"{}\"\nstock = true", "g".repeat(40))),
            false,
        ),
        (
            "signed",
            rule("team_id = \"ABCDE12345\"\nsigning_id = \"com.example.x\"\nunlock = \"apple7\""),
            true,
        ),
        (
            "signing id alone",
            rule("signing_id = \"com.example.x\"\nunlock = \"apple7\""),
            false,
        ),
        (
            "apple platform signing id",
            rule("signing_id = \"com.apple.ls\"\nplatform = true\nstock = true"),
            true,
        ),
        (
            "platform false",
            rule("signing_id = \"com.apple.ls\"\nplatform = false\nstock = true"),
            false,
        ),
        (
            "platform alone",
            rule("platform = true\nstock = true"),
            false,
        ),
        (
            "uid qualifier",
            rule("name = \"x\"\nuid = 501\nstock = true"),
            true,
        ),
        (
            "negative uid",
            rule("name = \"x\"\nuid = -1\nstock = true"),
            false,
        ),
        (
            "uid as text",
            rule("name = \"x\"\nuid = \"501\"\nstock = true"),
            false,
        ),
        (
            "unknown rule key",
            rule("name = \"x\"\nteam-id = \"A\"\nstock = true"),
            false,
        ),
        (
            "no identity",
            rule("user = \"ci\"\nunlock = \"apple7\""),
            false,
        ),
        (
            "both verdicts",
            rule("name = \"x\"\nunlock = \"apple7\"\nstock = true"),
            false,
        ),
        ("no verdict", rule("name = \"x\""), false),
        ("stock false", rule("name = \"x\"\nstock = false"), false),
        (
            "stock as text",
            rule("name = \"x\"\nstock = \"yes\""),
            false,
        ),
        (
            "relative path",
            rule("path = \"opt/x\"\nstock = true"),
            false,
        ),
        ("path as number", rule("path = 3\nstock = true"), false),
        (
            "name with slash",
            rule("name = \"bin/x\"\nstock = true"),
            false,
        ),
        ("empty name", rule("name = \"\"\nstock = true"), false),
        (
            "id with a space",
            format!("{P}\n[[rule]]\nid = \"a b\"\nname = \"x\"\nstock = true\n"),
            false,
        ),
        (
            "no id",
            format!("{P}\n[[rule]]\nname = \"x\"\nstock = true\n"),
            false,
        ),
    ]
}

#[test]
fn the_schema_and_validate_agree_on_good_and_bad_policies() {
    let validator = jsonschema::draft7::new(&schema()).unwrap();
    let mut disagreements = Vec::new();
    for (what, text, valid) in cases() {
        let by_schema = schema_accepts(&validator, &text);
        let by_validate = validate_accepts(&text);
        if by_schema != valid || by_validate != valid {
            disagreements.push(format!(
                "{what}: expected {valid}, schema {by_schema}, validate {by_validate}"
            ));
        }
    }
    assert!(disagreements.is_empty(), "{disagreements:#?}");
}

#[test]
fn the_schema_accepts_host_as_apple_family_max() {
    // pol's branch teaches `metalift validate` the same word; once merged, this
    // case belongs in the agreement list above.
    let validator = jsonschema::draft7::new(&schema()).unwrap();
    assert!(schema_accepts(
        &validator,
        "version = 1\n[profile.p]\napple_family_max = \"host\"\n"
    ));
    assert!(!schema_accepts(
        &validator,
        "version = 1\n[profile.p]\napple_family_max = \"guest\"\n"
    ));
}

#[test]
fn audit_labels_the_validator_refuses_the_schema_refuses_too() {
    let validator = jsonschema::draft7::new(&schema()).unwrap();
    assert!(schema_accepts(
        &validator,
        "version = 1\n[audit.labels]\nimage = \"macos-26-xcode-17\"\n"
    ));
    assert!(!schema_accepts(
        &validator,
        "version = 1\n[audit.labels]\n9lives = \"a\"\n"
    ));
    assert!(!schema_accepts(
        &validator,
        "version = 1\n[audit.labels]\nn = 3\n"
    ));
    assert!(!schema_accepts(
        &validator,
        "version = 1\n[audit]\nlables = {}\n"
    ));
}

#[test]
fn the_schema_names_every_key_the_validator_accepts() {
    let schema = schema();
    let keys = |v: &Value| -> Vec<String> {
        v["properties"]
            .as_object()
            .unwrap()
            .keys()
            .cloned()
            .collect()
    };
    let mut top = keys(&schema);
    top.sort();
    assert_eq!(top, ["audit", "mode", "profile", "rule", "version"]);
    assert_eq!(keys(&schema["properties"]["audit"]), ["forward", "labels"]);
    let mut forward = keys(&schema["properties"]["audit"]["properties"]["forward"]);
    forward.sort();
    let mut accepted: Vec<&str> = metalift_policy::forward::FORWARD_KEYS.to_vec();
    accepted.sort_unstable();
    assert_eq!(forward, accepted);
    let mut profile = keys(&schema["definitions"]["profile"]);
    profile.sort();
    assert_eq!(
        profile,
        [
            "apple_family_max",
            "max_threadgroup_memory",
            "recommended_working_set",
            "require_verified"
        ]
    );
    // Each rule key the schema names is one the validator accepts.
    for key in keys(&schema["definitions"]["rule"]) {
        let value = match key.as_str() {
            "stock" | "platform" => "true".to_owned(),
            // A signing id alone must say it names Apple's own code.
            "signing_id" => "\"com.apple.ls\"\nplatform = true".to_owned(),
            "uid" => "501".to_owned(),
            "sha256" => format!("\"{}\"", "ab".repeat(32)),
            "cdhash" => format!("\"{}\"", "ab".repeat(20)),
            "path" | "parent" => "\"/opt/x\"".to_owned(),
            "team_id" => "\"ABCDE12345\"".to_owned(),
            "unlock" => "\"apple7\"".to_owned(),
            // A window edge far enough ahead that `until` draws no expiry warning.
            "from" | "until" => "2999-01-01T00:00:00Z".to_owned(),
            _ => "\"x\"".to_owned(),
        };
        let verdict = if key == "stock" || key == "unlock" {
            ""
        } else {
            "stock = true\n"
        };
        let identity = if key == "name" { "" } else { "name = \"x\"\n" };
        let id = if key == "id" { "" } else { "id = \"r\"\n" };
        let text = format!("{P}\n[[rule]]\n{id}{identity}{key} = {value}\n{verdict}");
        assert!(
            validate_accepts(&text),
            "validate refuses rule key `{key}`:\n{text}"
        );
    }
}
