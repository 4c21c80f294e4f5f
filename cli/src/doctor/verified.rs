//! Verified unlock as metaliftd judges it here: a profile with
//! `require_verified = true` and no passing verification for this host chip and
//! macOS build answers stock (by design, until `metalift verify` passes). A
//! failure, as the daemon's own `unverified` health cause: the processes it
//! covers run stock (for example after a macOS update), so `doctor --bake` fails.

use std::path::Path;

use metalift_daemon::live_policy::verification::Coverage;
use metalift_daemon::service::status::StatusReport;
use metalift_policy::Loaded;

use super::check::{Check, Status};

/// One check per profile that requires verification (none when no profile does).
pub fn profiles(
    loaded: Option<&Loaded>,
    policy_path: &Path,
    report: Option<&StatusReport>,
    allow_insecure_owner: bool,
) -> Vec<Check> {
    let Some(loaded) = loaded else {
        return Vec::new();
    };
    // The chip the daemon decides for, else this machine's.
    let chip = report
        .and_then(|r| r.host_chip_brand.clone())
        .or_else(metalift_daemon::live_policy::host_chip::machine_brand);
    let store = crate::verify::store_here(policy_path, chip, allow_insecure_owner);
    crate::verify::coverage_here(&loaded.policy, &store)
        .into_iter()
        .map(|(name, coverage)| match coverage {
            Coverage::Verified(record) => Check::new(
                "verified unlock",
                Status::Ok,
                format!(
                    "profile `{name}`: verified for this host chip and macOS build{}",
                    not_needed(&record)
                ),
            ),
            Coverage::Unverified(why) => Check::new(
                "verified unlock",
                Status::Fail,
                format!("profile `{name}` answers stock: {why}"),
            )
            .fix(format!("sudo metalift verify --profile {name}")),
        })
        .collect()
}

/// What the verification's receipt says when the stock device (shim disabled)
/// already answered everything the profile claims.
fn not_needed(record: &metalift_daemon::audit::verification::VerificationRecord) -> &'static str {
    match record.receipt.as_ref().and_then(|r| r.unlock_needed) {
        Some(false) => {
            "; the stock device already answers what it claims: the unlock is not needed here"
        }
        _ => "",
    }
}
