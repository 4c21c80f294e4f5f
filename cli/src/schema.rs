//! `metalift schema`: the JSON Schema (draft-07) of one policy file, for editors
//! that validate TOML against a schema (taplo, Even Better TOML: put
//! `#:schema /usr/local/share/metalift/metalift-policy.schema.json` on the first
//! line). A copy is committed as `schema/metalift-policy.schema.json`, checked
//! stale by the tests.
//!
//! It describes one file, main or drop-in, so what spans files is left to
//! `metalift validate`: `version` is required only in the main file, `mode` is
//! allowed only there, rule ids must be unique across files, and `unlock` must
//! name a profile defined in some file. Everything within a file — keys, types,
//! ranges, digests, the identity a rule needs, one verdict per rule — is here.

use std::io::Write;
use std::process::ExitCode;

use serde_json::{json, Value};

/// Where the .pkg installs the schema, for `#:schema` lines.
pub const INSTALLED_PATH: &str = "/usr/local/share/metalift/metalift-policy.schema.json";

/// Arguments of `metalift schema`.
#[derive(Debug, clap::Args)]
#[command(after_help = "\
Editors: put this first line in a policy file (taplo / Even Better TOML):
  #:schema /usr/local/share/metalift/metalift-policy.schema.json

--audit-record prints the schema of an audit log line instead (every record
kind), generated from the daemon's record types; committed as
schema/metalift-audit-record.schema.json.

Exit status:
  0  printed")]
pub struct Args {
    /// Print the JSON Schema of one audit log record (every kind) instead.
    #[arg(long)]
    pub audit_record: bool,
}

/// Runs `metalift schema`: prints the schema.
pub fn run(args: Args) -> anyhow::Result<ExitCode> {
    let mut out = std::io::stdout().lock();
    if args.audit_record {
        writeln!(out, "{}", metalift_daemon::audit::schema::render())?;
    } else {
        writeln!(out, "{}", render())?;
    }
    Ok(ExitCode::SUCCESS)
}

/// The schema as committed: pretty JSON.
#[must_use]
pub fn render() -> String {
    serde_json::to_string_pretty(&policy_schema()).unwrap_or_default()
}

fn path_string(what: &str) -> Value {
    json!({
        "type": "string",
        "pattern": "^/",
        "description": format!("{what}: an absolute path, or a glob when it has * ? [ ] {{ }} (`*` stays within a path component, `**` crosses them)"),
    })
}

fn non_empty(description: &str) -> Value {
    json!({"type": "string", "pattern": "\\S", "description": description})
}

/// `[audit.labels]` (metalift_policy::labels): `metalift validate` also refuses a
/// label set in two files and more than the bound over all files.
fn labels_schema() -> Value {
    use metalift_policy::labels::{MAX_KEY_LEN, MAX_LABELS, MAX_VALUE_LEN};
    json!({
        "type": "object",
        "description": "Labels for this machine, copied into the `host` part of every audit record (e.g. image = \"macos-26-xcode-17\"); set once when the image is baked, in a drop-in such as /etc/metalift/policy.d/00-image.toml. No rule reads them.",
        "maxProperties": MAX_LABELS,
        "propertyNames": {"pattern": format!("^[A-Za-z][A-Za-z0-9_.-]{{0,{}}}$", MAX_KEY_LEN - 1)},
        "additionalProperties": {
            "type": "string",
            "maxLength": MAX_VALUE_LEN,
            "pattern": "^[^\\u0000-\\u001f\\u007f-\\u009f]*$"
        }
    })
}

/// `[audit.forward]` (policy/src/model/forward.rs): where audit records are forwarded.
fn forward_schema() -> Value {
    let path = |what: &str| json!({"type": "string", "pattern": "^/", "description": format!("{what}: an absolute path to a PEM file")});
    json!({
        "type": "object",
        "description": "Forward every audit record, after it is written locally, to a syslog collector: RFC 5424 (APP-NAME metaliftd, MSGID the record kind, MSG the JSON record), RFC 6587 octet-counted over TCP, or TLS (RFC 5425), or one RELP syslog command each (rsyslog imrelp). Applied on reload.",
        "additionalProperties": false,
        "required": ["address"],
        "properties": {
            "address": {"type": "string", "pattern": "^(\\[[^\\]]+\\]|[^:\\[\\]]+):[0-9]{1,5}$", "description": "The collector as host:port ([v6]:port)."},
            "transport": {"enum": ["tcp", "tls", "relp", "relp-tls"], "default": "tcp", "description": "tcp (plain), tls (RFC 5425, needs ca), relp (rsyslog's RELP over TCP: every message acknowledged by the collector), or relp-tls (RELP inside TLS, imrelp tls=\"on\"; needs ca)."},
            "ca": path("The CA(s) the collector's certificate must chain to (tls and relp-tls only)"),
            "client_cert": path("The client certificate chain presented for mutual TLS (with client_key)"),
            "client_key": path("The client certificate's private key (with client_cert)"),
            "server_name": {"type": "string", "pattern": "\\S", "description": "The name the collector's certificate must carry (tls and relp-tls only); default: the address's host."},
            "max_delay_seconds": {"type": "integer", "minimum": 1, "maximum": metalift_policy::forward::MAX_MAX_DELAY_SECONDS, "default": metalift_policy::forward::DEFAULT_MAX_DELAY_SECONDS, "description": "How long a record may wait undelivered before metaliftd's health is degraded (cause forward_behind: `metalift status` exits 4)."}
        },
        "dependencies": {"client_cert": ["client_key"], "client_key": ["client_cert"]},
        "if": {"properties": {"transport": {"enum": ["tls", "relp-tls"]}}, "required": ["transport"]},
        "then": {"required": ["ca"]},
        "else": {"not": {"anyOf": [{"required": ["ca"]}, {"required": ["client_cert"]}, {"required": ["client_key"]}, {"required": ["server_name"]}]}}
    })
}

/// The schema of one policy file.
#[must_use]
pub fn policy_schema() -> Value {
    let identities = ["path", "name", "sha256", "cdhash", "team_id", "signing_id"];
    json!({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "$id": "https://example.invalid/metalift/metalift-policy.schema.json",
        "title": "metalift policy",
        "description": "One metalift policy file: /etc/metalift/policy.toml or a drop-in in /etc/metalift/policy.d/. See metalift-policy(5); `metalift validate` checks what spans files.",
        "type": "object",
        "additionalProperties": false,
        "properties": {
            "version": {
                "const": 1,
                "description": "The policy format version; required in the main file."
            },
            "mode": {
                "enum": ["enforce", "monitor"],
                "description": "enforce: apply verdicts; monitor: decide and log \"would unlock\", change nothing. Main file only."
            },
            "profile": {
                "type": "object",
                "description": "Capability profiles by name: what an unlocked process is told.",
                "additionalProperties": {"$ref": "#/definitions/profile"}
            },
            "rule": {
                "type": "array",
                "description": "Rules, written [[rule]]. The most specific identity wins (cdhash > sha256 > signing_id > team_id > exact path > glob path > name); at equal specificity stock beats unlock; then file order.",
                "items": {"$ref": "#/definitions/rule"}
            },
            "audit": {
                "type": "object",
                "description": "The audit trail's settings, one sub-table per concern: [audit.labels] names this machine in every record, [audit.forward] sends every record to a syslog collector.",
                "additionalProperties": false,
                "properties": {
                    "labels": labels_schema(),
                    "forward": forward_schema()
                }
            }
        },
        "definitions": {
            "profile": {
                "type": "object",
                "additionalProperties": false,
                "required": ["apple_family_max"],
                "properties": {
                    "apple_family_max": {
                        "description": "supportsFamily: answers YES for Apple1..AppleN. 5..10, or \"host\" (recommended): the host chip's family. Never applied above the host chip's family where metaliftd knows the chip.",
                        "oneOf": [
                            {"type": "integer", "minimum": 5, "maximum": 10},
                            {"const": "host"}
                        ]
                    },
                    "max_threadgroup_memory": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": 65536,
                        "description": "A floor for maxThreadgroupMemoryLength in bytes (default 32768; above 32768 draws a warning)."
                    },
                    "require_verified": {
                        "type": "boolean",
                        "description": "Unlock only while a passing `metalift verify --profile NAME` is recorded for the host chip and macOS build (verifications.jsonl beside the policy); otherwise stock, with the reason in the decision record. Default false."
                    },
                    "recommended_working_set": {
                        "description": "A floor for recommendedMaxWorkingSetSize: bytes, or a size such as \"12 GiB\" (B, KiB, MiB, GiB, TiB, kB, MB, GB, TB).",
                        "oneOf": [
                            {"type": "integer", "minimum": 1},
                            {
                                "type": "string",
                                "pattern": "^\\s*[0-9][0-9_]*(\\.[0-9]{1,9})?\\s*(B|KiB|MiB|GiB|TiB|kB|KB|MB|GB|TB)?\\s*$"
                            }
                        ]
                    }
                }
            },
            "rule": {
                "type": "object",
                "additionalProperties": false,
                "required": ["id"],
                "properties": {
                    "id": {
                        "type": "string",
                        "pattern": "^[^\\s\\p{Cc}]{1,128}$",
                        "description": "1 to 128 characters without spaces or control characters; unique across files."
                    },
                    "description": {"type": "string", "description": "Free text for the admin."},
                    "path": path_string("The executable"),
                    "name": {
                        "type": "string",
                        "pattern": "^[^/]*[^/\\s][^/]*$",
                        "description": "The executable's file name, exactly (no `/`)."
                    },
                    "sha256": {
                        "type": "string",
                        "pattern": "^[0-9a-fA-F]{64}$",
                        "description": "SHA-256 of the executable file (64 hex digits)."
                    },
                    "cdhash": {
                        "type": "string",
                        "pattern": "^[0-9a-fA-F]{40}$",
                        "description": "Code directory hash of a valid signature (40 hex digits)."
                    },
                    "team_id": non_empty("Team identifier of a signature that chains to Apple (Developer ID, App Store, Apple Development/Distribution), 10 characters A-Z, 0-9."),
                    "signing_id": non_empty("Signing identifier of a signature that chains to Apple; needs team_id, or platform = true for Apple's own code."),
                    "platform": {
                        "const": true,
                        "description": "Only Apple's own code: the signature satisfies `anchor apple` (narrows; not an identity). Lets signing_id stand without team_id (Apple's code has none)."
                    },
                    "uid": {
                        "type": "integer",
                        "minimum": 0,
                        "maximum": 4_294_967_295_u64,
                        "description": "Only for processes of this real uid (narrows; not an identity)."
                    },
                    "user": non_empty("Only for processes of this user (narrows; not an identity)."),
                    "parent": path_string("Only when the parent process's executable matches (narrows; not an identity)"),
                    "unlock": {
                        "type": "string",
                        "description": "The profile to unlock with (defined in any file)."
                    },
                    "stock": {
                        "const": true,
                        "description": "Stay stock explicitly (beats unlock at equal specificity)."
                    },
                    "from": {
                        "type": "string",
                        "format": "date-time",
                        "description": "The first instant the rule matches: an RFC 3339 time with a UTC offset (a TOML date-time or a string). Before it the rule does not match."
                    },
                    "until": {
                        "type": "string",
                        "format": "date-time",
                        "description": "The first instant the rule no longer matches: an RFC 3339 time with a UTC offset (a TOML date-time or a string), after `from`. From then on the rule does not match."
                    }
                },
                "anyOf": identities.iter().map(|k| json!({"required": [k]})).collect::<Vec<_>>(),
                "dependencies": {
                    "signing_id": {"anyOf": [{"required": ["team_id"]}, {"required": ["platform"]}]}
                },
                "oneOf": [{"required": ["unlock"]}, {"required": ["stock"]}]
            }
        }
    })
}
