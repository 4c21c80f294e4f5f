//! `metalift doctor`'s `forwarder` check: is the audit forwarder delivering to its
//! collector? Fails when the collector's certificate is untrusted or it refuses ours,
//! and when the daemon's health says records wait too long (`forward_behind`).

use metalift_daemon::service::health::code;
use metalift_daemon::service::status::StatusReport;

use super::check::{Check, Status};
use crate::judgement::Judgement;

/// The forwarder as the daemon reports it.
/// `judged` is the judgement doctor reports (its `forward_behind` finding, unless
/// doctor was told to accept it).
pub fn forwarder(report: Option<&StatusReport>, judged: &Judgement) -> Check {
    let Some(report) = report else {
        return Check::new(
            "forwarder",
            Status::NotApplicable,
            "the daemon did not answer",
        );
    };
    let Some(f) = report.forwarder.as_ref().filter(|f| f.configured) else {
        return Check::new(
            "forwarder",
            Status::NotApplicable,
            "no [audit.forward] in the live policy",
        );
    };
    let address = f.address.as_deref().unwrap_or("?");
    let error = f.last_error.as_deref().unwrap_or("");
    // The daemon's own judgement that records wait too long: the health check
    // fails with it; here it is a failure too, never an `ok` beside it.
    if let Some(behind) = judged
        .findings
        .iter()
        .find(|c| c.code == code::FORWARD_BEHIND)
    {
        return Check::new("forwarder", Status::Fail, behind.message.clone()).fix(
            "start the collector or fix [audit.forward] address; records wait in the local log",
        );
    }
    if f.connected {
        return Check::new(
            "forwarder",
            Status::Ok,
            format!(
                "connected to {address}: {} records behind, last delivery {}",
                f.records_behind,
                f.last_delivery_at.as_deref().unwrap_or("none yet")
            ),
        );
    }
    let tls = error.contains("certificate") || error.contains("TLS");
    if tls {
        return Check::new("forwarder", Status::Fail, format!("{address}: {error}")).fix(
            "check [audit.forward] ca (the CA the collector's certificate chains to), server_name, and the client certificate the collector expects",
        );
    }
    if f.last_error.is_none() {
        // Nothing to send yet: it connects when the first record comes.
        return Check::new(
            "forwarder",
            Status::Ok,
            format!("{address}: idle, nothing to send"),
        );
    }
    Check::new(
        "forwarder",
        Status::Warn,
        format!(
            "not connected to {address} ({} records behind): {error}",
            f.records_behind
        ),
    )
    .fix("start the collector or fix [audit.forward] address; records wait in the local log")
}
