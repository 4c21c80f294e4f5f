//! Why the daemon could not unlock, as it reports it: the `health` of its status
//! (`{"state": "ok"|"degraded", "causes": [{"code", "message"}]}`), for
//! `metalift exec --require-unlock` to name the cause when it fails (a full audit
//! disk, a missing policy) instead of leaving the admin to guess.
//!
//! Daemons older than that field send no `health`: then nothing is said.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

/// How long to wait for the daemon's status: it answers from memory.
const TIMEOUT: Duration = Duration::from_secs(2);

/// The causes of a degraded daemon on `socket`, one line each (`code: message`);
/// empty when it is healthy, reports no health, or does not answer (that is said
/// before the command runs).
pub fn degraded_causes(socket: &Path) -> Vec<String> {
    match metalift_daemon::service::status::request_raw(socket, TIMEOUT) {
        Ok(json) => causes_in(&json),
        Err(_) => Vec::new(),
    }
}

/// The causes in a status document, when its `health.state` is `degraded`.
fn causes_in(status_json: &str) -> Vec<String> {
    let Ok(status) = serde_json::from_str::<Value>(status_json) else {
        return Vec::new();
    };
    let health = &status["health"];
    if health["state"].as_str() != Some("degraded") {
        return Vec::new();
    }
    let causes: Vec<String> = health["causes"]
        .as_array()
        .map(|causes| {
            causes
                .iter()
                .map(|c| {
                    let message = c["message"].as_str().unwrap_or("(no message)");
                    match c["code"].as_str() {
                        Some(code) => format!("{code}: {message}"),
                        None => message.to_owned(),
                    }
                })
                .collect()
        })
        .unwrap_or_default();
    if causes.is_empty() {
        vec!["it reports itself degraded, without a cause".to_owned()]
    } else {
        causes
    }
}

#[cfg(test)]
mod tests {
    use super::causes_in;

    #[test]
    fn a_degraded_daemon_names_each_cause_and_a_healthy_or_older_one_nothing() {
        let degraded = r#"{"version":"0.1.0","health":{"state":"degraded","causes":[
            {"code":"audit_unwritable","message":"the audit log /var/log/metalift/audit.jsonl refused the last record: No space left on device"},
            {"code":"policy_missing","message":"/etc/metalift/policy.toml is missing"}]}}"#;
        assert_eq!(
            causes_in(degraded),
            [
                "audit_unwritable: the audit log /var/log/metalift/audit.jsonl refused the last record: No space left on device",
                "policy_missing: /etc/metalift/policy.toml is missing"
            ]
        );
        assert!(causes_in(r#"{"health":{"state":"ok","causes":[]}}"#).is_empty());
        assert!(causes_in(r#"{"version":"0.1.0"}"#).is_empty());
        assert!(causes_in("not json").is_empty());
        assert_eq!(
            causes_in(r#"{"health":{"state":"degraded"}}"#),
            ["it reports itself degraded, without a cause"]
        );
    }
}
