//! What a fleet image needs beyond "it can unlock now": a rule that unlocks
//! something (`unlocks`; a `FAIL` under `--bake`, since a clone of an image whose
//! policy unlocks nothing is a fleet running stock), the `[audit.labels]` keys the
//! fleet names (`--require-label`), and a forwarder (`--require-forward`, connected
//! unless `--forward-unreachable-ok` says the collector cannot be reached from the
//! build network).

use metalift_daemon::service::status::StatusReport;
use metalift_policy::Loaded;

use super::check::{Check, Status};

/// The drop-in `baking.md` shows, as the fix for a policy that unlocks nothing.
const DROP_IN_FIX: &str = "install a drop-in with a profile and a rule that unlocks, e.g. \
/etc/metalift/policy.d/50-bake.toml: [profile.apple7] apple_family_max = \"host\" \
[[rule]] id = \"llama-server\" path = \"/opt/homebrew/bin/llama-server\" unlock = \"apple7\" \
(the guide's \"Baking an image\"; examples/packer/policy.toml)";

/// Whether some rule of the policy unlocks: a failure under `--bake`, a warning
/// otherwise (a fresh install's default policy unlocks nothing on purpose).
pub fn unlocking_rule(loaded: Option<&Loaded>, bake: bool) -> Check {
    let Some(loaded) = loaded else {
        return Check::new(
            "unlocks",
            Status::NotApplicable,
            "no loadable policy to check",
        );
    };
    let unlocking = loaded.policy.unlocking_rules();
    if unlocking.is_empty() {
        let rules = loaded.policy.rule_count();
        let what = if rules == 0 {
            "the policy has no rules".to_owned()
        } else {
            format!("every one of its {rules} rules is `stock`")
        };
        let status = if bake { Status::Fail } else { Status::Warn };
        return Check::new(
            "unlocks",
            status,
            format!("{what}: nothing this image runs can be unlocked"),
        )
        .fix(DROP_IN_FIX);
    }
    let mode = if loaded.policy.mode() == metalift_policy::Mode::Monitor {
        " (mode = \"monitor\": decided and logged as would_unlock, not applied)"
    } else {
        ""
    };
    Check::new(
        "unlocks",
        Status::Ok,
        format!(
            "{} rule(s) unlock: {}{mode}",
            unlocking.len(),
            unlocking.join(", ")
        ),
    )
}

/// One check per `--require-label KEY`: the policy's `[audit.labels]` has it.
pub fn labels(loaded: Option<&Loaded>, keys: &[String]) -> Vec<Check> {
    keys.iter()
        .map(|key| {
            let Some(loaded) = loaded else {
                return Check::new(
                    "label",
                    Status::Fail,
                    format!("`{key}`: no loadable policy to read [audit.labels] from"),
                )
                .fix("fix the policy first (the policy check says how)");
            };
            match loaded.policy.labels().get(key) {
                Some(value) => Check::new("label", Status::Ok, format!("{key} = {value:?}")),
                None => Check::new(
                    "label",
                    Status::Fail,
                    format!(
                        "`{key}` is required (--require-label) and [audit.labels] has no such key"
                    ),
                )
                .fix(format!(
                    "add `{key} = \"...\"` under [audit.labels] in the bake's drop-in"
                )),
            }
        })
        .collect()
}

/// `--require-forward`: `[audit.forward]` is live, and the forwarder is connected
/// (unless `unreachable_ok`: then configured is enough).
pub fn forward(report: Option<&StatusReport>, unreachable_ok: bool) -> Check {
    let Some(report) = report else {
        return Check::new(
            "forward",
            Status::Fail,
            "required (--require-forward), and the daemon did not answer",
        )
        .fix("start metaliftd (the daemon check says how)");
    };
    let Some(f) = report.forwarder.as_ref().filter(|f| f.configured) else {
        return Check::new(
            "forward",
            Status::Fail,
            "required (--require-forward), and the live policy has no [audit.forward]",
        )
        .fix("add [audit.forward] address = \"host:port\" to the bake's drop-in");
    };
    let address = f.address.as_deref().unwrap_or("?");
    if f.connected {
        return Check::new("forward", Status::Ok, format!("connected to {address}"));
    }
    if unreachable_ok {
        return Check::new(
            "forward",
            Status::Ok,
            format!(
                "configured for {address}; not connected, accepted (--forward-unreachable-ok: \
                 the collector is not reachable from the build network)"
            ),
        );
    }
    Check::new(
        "forward",
        Status::Fail,
        format!(
            "required (--require-forward), and not connected to {address}{}",
            f.last_error
                .as_deref()
                .map_or_else(String::new, |e| format!(": {e}"))
        ),
    )
    .fix(
        "make the collector reachable from the build, or pass --forward-unreachable-ok when \
         it cannot be from the build network",
    )
}
