//! The JSON Schema of an audit log line (every record kind), generated from the
//! types the writer serialises ([`super::stamp::Stamped`] around
//! [`super::Record`]) with `schemars`, so it cannot drift from what is written.
//! Committed as `schema/metalift-audit-record.schema.json` (`metalift schema
//! --audit-record` prints it; `scripts/test.sh` checks the copy is current), and
//! the test suites validate every record they read against it.
//!
//! The contract it states: `schema`, `id`, `host`, `kind` and `time` on every
//! record; per kind, the fields a record of that kind always has. Objects are
//! open (`additionalProperties` is not false): a newer daemon may add fields and
//! kinds without raising `schema` (see docs/src/reference/json.md).

use serde_json::Value;

use super::stamp::Stamped;

/// Where the .pkg installs the record schema.
pub const INSTALLED_PATH: &str = "/usr/local/share/metalift/metalift-audit-record.schema.json";

/// The schema of one audit log line.
#[must_use]
pub fn record_schema() -> Value {
    let generator = schemars::generate::SchemaSettings::draft07().into_generator();
    let schema = generator.into_root_schema_for::<Stamped<'static>>();
    let mut value = schema.to_value();
    if let Some(object) = value.as_object_mut() {
        object.insert(
            "$id".into(),
            Value::String(
                "https://example.invalid/metalift/metalift-audit-record.schema.json".into(),
            ),
        );
        object.insert(
            "title".into(),
            Value::String("metalift audit record".into()),
        );
        object.insert(
            "description".into(),
            Value::String(
                "One line of metaliftd's audit log (/var/log/metalift/audit.jsonl), every kind. \
                 Fields may be added within a schema version; see the guide's JSON reference."
                    .into(),
            ),
        );
    }
    value
}

/// [`record_schema`] as committed: pretty JSON.
#[must_use]
pub fn render() -> String {
    serde_json::to_string_pretty(&record_schema()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every `"kind": {"const": ...}` in the schema, in order.
    fn kinds_in(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                if let Some(kind) = map.get("kind").and_then(|k| k.get("const")) {
                    out.extend(kind.as_str().map(str::to_owned));
                }
                map.values().for_each(|v| kinds_in(v, out));
            }
            Value::Array(items) => items.iter().for_each(|v| kinds_in(v, out)),
            _ => {}
        }
    }

    #[test]
    fn the_kinds_the_reader_accepts_are_the_kinds_the_types_write() {
        let mut in_schema = Vec::new();
        kinds_in(&record_schema(), &mut in_schema);
        in_schema.sort();
        in_schema.dedup();
        let mut listed: Vec<String> = super::super::Record::KINDS
            .iter()
            .map(|k| (*k).to_owned())
            .collect();
        listed.sort();
        assert_eq!(listed, in_schema);
    }
}
