//! Property-test strategies the cross test draws outcomes from (the C frame
//! codec in wire_cross.rs).

// Each test binary uses the part it needs.
#![allow(dead_code)]

use metalift_policy::wire::{Answers, OtherShim, OtherShimPatched, Outcome, OutcomeResult};
use proptest::prelude::*;

/// Any answers.
pub fn answers_strategy() -> impl Strategy<Value = Answers> {
    (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(f, t, w)| Answers {
        families: f,
        threadgroup_memory: t,
        working_set: w,
    })
}

/// Another shim: absent, or an image with selectors (no `,`, none empty: they
/// are joined with `,`) and an order.
pub fn other_shim_strategy() -> impl Strategy<Value = Option<OtherShim>> {
    proptest::option::of(
        (
            "[^\0]{0,60}",
            proptest::collection::vec("[A-Za-z][A-Za-z0-9:]{0,30}", 0..4),
            any::<bool>(),
        )
            .prop_map(|(image, methods, after)| OtherShim {
                image,
                methods,
                patched: if after {
                    OtherShimPatched::After
                } else {
                    OtherShimPatched::Before
                },
            }),
    )
}

/// Any outcome, with or without another shim, whose reason and device class are
/// drawn from the regular expressions `reason` and `class`.
pub fn outcome_strategy(
    reason: &'static str,
    class: &'static str,
) -> impl Strategy<Value = Outcome> {
    (
        any::<u64>(),
        0u8..3,
        reason,
        class,
        answers_strategy(),
        answers_strategy(),
        other_shim_strategy(),
    )
        .prop_map(
            |(id, r, reason, class, stock, effective, other_shim)| Outcome {
                decision_id: id,
                result: [
                    OutcomeResult::Applied,
                    OutcomeResult::Stock,
                    OutcomeResult::Failed,
                ][usize::from(r)],
                reason,
                device_class: class,
                stock,
                effective,
                other_shim,
            },
        )
}
