//! What the stock device answers, against what the profiles claim (`metalift
//! gpu`'s comparison, [`crate::gpu`]): a warning the day the stock device already
//! answers a profile's claims (Apple's paravirtual device answering Apple7 by
//! itself), since the unlock is then unneeded there and its rules can retire.

use metalift_policy::Loaded;

use super::check::{Check, Status};
use crate::gpu;

const NAME: &str = "stock gpu";

/// The check: n/a without the probe beside this executable; a warning when the
/// stock device already meets a profile of `loaded`.
#[must_use]
pub fn stock(loaded: Option<&Loaded>) -> Check {
    let Ok(probe) = crate::tools::beside("metalift-probe") else {
        return Check::new(
            NAME,
            Status::NotApplicable,
            "metalift-probe is not installed beside metalift",
        );
    };
    let stock = match gpu::stock(&probe, gpu::PROBE_TIMEOUT) {
        Ok(s) => s,
        Err(e) => {
            return Check::new(
                NAME,
                Status::Warn,
                format!("cannot ask the stock device: {e:#}"),
            )
            .fix("metalift gpu shows what the probe says")
        }
    };
    let a = &stock.answers;
    let answers = format!(
        "{} answers {}, {} bytes of threadgroup memory",
        stock.name,
        a.apple_family
            .map_or_else(|| "no Apple family".to_owned(), |f| format!("Apple{f}")),
        a.max_threadgroup_memory
    );
    let notes = loaded.map_or_else(Vec::new, |l| {
        gpu::profile_notes(&stock.answers, l.policy.profiles())
    });
    let met: Vec<&str> = notes
        .iter()
        .filter(|n| !n.unlock_needed)
        .map(|n| n.profile.as_str())
        .collect();
    if !met.is_empty() {
        return Check::new(
            NAME,
            Status::Warn,
            format!(
                "the stock device already answers what profile {} claims ({answers}): \
                 the unlock is unneeded here",
                met.join(", ")
            ),
        )
        .fix("retire the rules that unlock with it on this image (metalift gpu shows the stock answers)");
    }
    let needing: Vec<&str> = notes.iter().map(|n| n.profile.as_str()).collect();
    Check::new(
        NAME,
        Status::Ok,
        if needing.is_empty() {
            format!("{answers} (no profile to compare)")
        } else {
            format!("{answers}: profile {} needs the unlock", needing.join(", "))
        },
    )
}
