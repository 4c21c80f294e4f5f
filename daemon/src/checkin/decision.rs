//! What a decision becomes: its audit record and the verdict sent on the wire.
//! Pure functions of the peer, the subject and the verdict, so the server core
//! ([`super::server`]) only orders the steps (decide, record, answer).

use std::time::SystemTime;

use metalift_policy::wire::{CheckIn, VerdictMsg, WireAction};
use metalift_policy::{Action, Subject, Verdict};

use crate::audit::{Advisory, DecisionRecord, WindowRecord};
use crate::checkin::peer::PeerFacts;

/// A pid as the audit records write it.
pub(super) fn pid_i32(pid: u32) -> i32 {
    i32::try_from(pid).unwrap_or(i32::MAX)
}

#[allow(clippy::too_many_arguments)] // one call site; each argument is one record field's source
pub(super) fn decision_record(
    decided_at: SystemTime,
    decision_id: u64,
    peer: &PeerFacts,
    subject: &Subject,
    verdict: &Verdict,
    policy_sha256: &str,
    latency_us: u64,
    transport: &'static str,
    req: CheckIn,
) -> DecisionRecord {
    let profile = match &verdict.action {
        Action::Unlock { profile, .. } => Some(profile.clone()),
        Action::Stock => verdict.would_unlock.clone(),
    };
    // Never above the host: what the profile asked beside what was applied, and why.
    let (apple_family_requested, apple_family_capped) = match &verdict.action {
        Action::Unlock { profile, .. } => (
            verdict.requested_family(),
            verdict.family_cap.as_ref().map(|cap| cap.describe(profile)),
        ),
        Action::Stock => (None, None),
    };
    DecisionRecord {
        time: decided_at,
        decision_id,
        pid: pid_i32(peer.pid),
        uid: peer.uid,
        exe: peer.exe.display().to_string(),
        sha256: subject.sha256.map(hex::encode),
        team_id: subject.team_id.clone(),
        signing_id: subject.signing_id.clone(),
        cdhash: subject.cdhash.as_deref().map(hex::encode),
        anchor: subject.anchor.map(|a| a.as_str().to_owned()),
        identity_error: subject
            .unreadable
            .as_ref()
            .map(|why| format!("identity unreadable: {why}"))
            .or_else(|| {
                peer.hashes_withheld
                    .as_ref()
                    .map(|why| format!("file hashes not used: {why}"))
            }),
        parent_exe: peer.parent_exe.as_ref().map(|p| p.display().to_string()),
        ancestors: peer.ancestors.clone(),
        rule: verdict.rule.clone(),
        action: verdict.action.as_str().to_owned(),
        profile,
        mode: verdict.mode.as_str().to_owned(),
        apple_family_max: match &verdict.action {
            Action::Unlock { capabilities, .. } => Some(capabilities.apple_family_max),
            Action::Stock => None,
        },
        apple_family_requested,
        apple_family_capped,
        unverified: verdict.unverified.clone(),
        window: verdict.window.as_ref().map(WindowRecord::from),
        would_unlock: verdict.would_unlock.is_some(),
        host_chip: crate::live_policy::host_chip::daemon_host().brand.clone(),
        policy_sha256: policy_sha256.to_owned(),
        latency_us,
        transport: transport.to_owned(),
        advisory: Advisory {
            shim_version: req.shim_version,
            arch: req.arch,
            claimed_executable: req.claimed_executable,
            job: req
                .job
                .as_deref()
                .map(metalift_policy::job::parse)
                .unwrap_or_default(),
        },
    }
}

/// The wire form of a verdict. In monitor mode the action is stock and `profile`
/// names what would have been unlocked.
pub(super) fn verdict_msg(decision_id: u64, verdict: Verdict) -> VerdictMsg {
    let (action, capabilities, profile) = match verdict.action {
        Action::Unlock {
            profile,
            capabilities,
        } => (WireAction::Unlock, Some(capabilities), Some(profile)),
        Action::Stock => (WireAction::Stock, None, verdict.would_unlock.clone()),
    };
    VerdictMsg {
        decision_id,
        action,
        capabilities,
        profile,
        rule: verdict.rule,
        mode: verdict.mode,
        would_unlock: verdict.would_unlock.is_some(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_monitor_verdict_goes_out_stock_naming_the_profile_it_would_unlock() {
        let verdict = Verdict {
            action: Action::Stock,
            rule: Some("llama".into()),
            mode: metalift_policy::Mode::Monitor,
            would_unlock: Some("apple7".into()),
            family_cap: None,
            unverified: None,
            window: None,
            trace: Vec::new(),
        };
        let msg = verdict_msg(9, verdict);
        assert_eq!(msg.action, WireAction::Stock);
        assert!(msg.capabilities.is_none());
        assert_eq!(msg.profile.as_deref(), Some("apple7"));
        assert!(msg.would_unlock);
        assert_eq!(msg.decision_id, 9);
    }
}
