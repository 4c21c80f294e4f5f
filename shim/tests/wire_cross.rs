//! The C wire code (`shim/c/wire.c`, the shim's one codec: the socket and XPC
//! carry the same bodies) held to the Rust reference (`metalift_policy::wire`):
//! for every message the shim speaks, Rust encode → C decode and C encode →
//! Rust decode, with random messages and with malformed, oversize and truncated
//! input. The C decoder accepts only what `decode_body` accepts (a verdict, a
//! `Declined`), with the same values, and refuses everything else — for its own
//! reasons: it reads only the kinds the shim receives, so its errors are not
//! compared with Rust's (`c::accepts_as_rust_does`).
#![cfg(shim_c)]

use metalift_policy::profile::Capabilities;
use metalift_policy::verdict::Mode;
use metalift_policy::wire::{
    self, Answers, CheckIn, DeclineReason, Declined, Message, OtherShim, OtherShimPatched, Outcome,
    OutcomeResult, VerdictMsg, WireAction, WireError, KNOWN_FAMILIES, LENGTH_PREFIX, MAX_FRAME,
};
use metalift_shim::c::{self, CWireError};
use proptest::prelude::*;
use support::{answers_strategy, outcome_strategy};

mod support;

/// The outcomes these properties draw: reasons and device classes of these shapes.
const REASON: &str = "[^\u{0}]{0,200}";
const CLASS: &str = "[^\u{0}]{0,60}";

/// The C accepts `body` only as `decode_body` does, with the same values.
fn assert_accepts_as_rust_does(body: &[u8]) {
    let (rust, c) = (wire::decode_body(body), c::decode_verdict(body));
    assert!(
        c::accepts_as_rust_does(&rust, &c),
        "body {body:02x?}: Rust {rust:?}, C {c:?}"
    );
}

fn verdict_strategy() -> impl Strategy<Value = VerdictMsg> {
    (
        any::<u64>(),
        any::<bool>(),
        (
            any::<u8>(),
            any::<u64>(),
            proptest::option::of(any::<u64>()),
        ),
        proptest::option::of(".{0,40}"),
        proptest::option::of(".{0,40}"),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(id, unlock, (max, tg, ws), profile, rule, monitor, would)| VerdictMsg {
                decision_id: id,
                action: if unlock {
                    WireAction::Unlock
                } else {
                    WireAction::Stock
                },
                capabilities: unlock.then_some(Capabilities {
                    apple_family_max: max,
                    max_threadgroup_memory: tg,
                    recommended_working_set: ws,
                }),
                profile,
                rule,
                mode: if monitor {
                    Mode::Monitor
                } else {
                    Mode::Enforce
                },
                would_unlock: would,
            },
        )
}

proptest! {
    #[test]
    fn every_rust_encoded_verdict_decodes_identically_in_c(v in verdict_strategy()) {
        let frame = wire::encode_frame(&Message::Verdict(v.clone()));
        let prefix: [u8; 4] = frame[..LENGTH_PREFIX].try_into().unwrap();
        prop_assert_eq!(c::frame_length(prefix), Ok(frame.len() - LENGTH_PREFIX));
        prop_assert_eq!(c::decode_verdict(&frame[LENGTH_PREFIX..]), Ok(v));
    }

    #[test]
    fn every_c_encoded_outcome_is_byte_identical_to_rust(o in outcome_strategy(REASON, CLASS)) {
        let rust = wire::encode_frame(&Message::Outcome(o.clone()));
        let c_frame = c::encode_outcome(&o, MAX_FRAME + LENGTH_PREFIX);
        prop_assert_eq!(&c_frame, &rust);
        let decoded = wire::decode_frame(&c_frame).unwrap().unwrap().0;
        prop_assert_eq!(decoded, Message::Outcome(o));
    }

    #[test]
    fn every_c_encoded_check_in_is_byte_identical_to_rust(
        version in "[^\u{0}]{0,30}",
        arch in "[^\u{0}]{0,10}",
        claimed in proptest::option::of("[^\u{0}]{0,100}"),
    ) {
        let msg = CheckIn { shim_version: version.clone(), arch: arch.clone(), claimed_executable: claimed.clone(), job: None };
        let rust = wire::encode_frame(&Message::CheckIn(msg));
        prop_assert_eq!(c::encode_check_in(&version, &arch, claimed.as_deref(), MAX_FRAME + LENGTH_PREFIX), rust);
    }

    #[test]
    fn random_bodies_are_accepted_only_as_rust_does(body in proptest::collection::vec(any::<u8>(), 0..64)) {
        assert_accepts_as_rust_does(&body);
    }

    #[test]
    fn mutated_verdicts_and_declines_are_accepted_only_as_rust_does(
        v in verdict_strategy(),
        declined in any::<bool>(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let msg = if declined {
            Message::Declined(Declined { reason: DeclineReason::Busy, detail: v.rule.clone().unwrap_or_default() })
        } else {
            Message::Verdict(v)
        };
        let frame = wire::encode_frame(&msg);
        let mut body = frame[LENGTH_PREFIX..].to_vec();
        let i = at.index(body.len());
        body[i] = byte;
        assert_accepts_as_rust_does(&body);
        let cut = cut.index(body.len() + 1);
        assert_accepts_as_rust_does(&body[..cut]);
    }

    #[test]
    fn the_expected_answers_match_the_profile_rules(
        stock in answers_strategy(),
        max in 0u8..=12,
        tg in any::<u64>(),
        ws in proptest::option::of(any::<u64>()),
    ) {
        let caps = Capabilities { apple_family_max: max, max_threadgroup_memory: tg, recommended_working_set: ws };
        let mut families = 0u32;
        for (bit, (_, family)) in KNOWN_FAMILIES.iter().enumerate() {
            if caps.supports_family(*family, stock.families & (1 << bit) != 0) {
                families |= 1 << bit;
            }
        }
        let rust = Answers {
            families,
            threadgroup_memory: caps.threadgroup_memory(stock.threadgroup_memory),
            working_set: caps.working_set(stock.working_set),
        };
        prop_assert_eq!(c::expected_answers(&caps, stock), rust);
    }
}

#[test]
fn the_c_family_table_is_known_families() {
    for (i, (_, value)) in KNOWN_FAMILIES.iter().enumerate() {
        assert_eq!(c::known_family(i as u32), *value);
    }
    assert_eq!(c::known_family(KNOWN_FAMILIES.len() as u32), 0);
}

/// The shim receives verdicts and declines only: every other kind, valid or
/// not in Rust's eyes, and whatever its fields, is refused as "not a verdict"
/// (the C no longer judges messages it never receives).
#[test]
fn every_other_kind_is_refused_as_not_a_verdict_whatever_its_fields() {
    let outcome = Message::Outcome(Outcome {
        decision_id: 1,
        result: OutcomeResult::Stock,
        reason: String::new(),
        device_class: String::new(),
        stock: Answers::default(),
        effective: Answers::default(),
        ..Default::default()
    });
    for msg in [
        Message::CheckIn(CheckIn::default()),
        Message::StatusRequest,
        Message::Status("{}".into()),
        outcome,
    ] {
        let body = wire::encode_frame(&msg)[LENGTH_PREFIX..].to_vec();
        assert!(wire::decode_body(&body).is_ok());
        assert_eq!(
            c::decode_verdict(&body),
            Err(CWireError::NotVerdict(body[1]))
        );
        // A field Rust refuses (an outcome's other-shim image without its
        // order, a repeated tag): Rust errs, the C still says "not a verdict".
        let mut broken = body.clone();
        broken.extend_from_slice(&[29, 2, 0, b'/', b'x']);
        broken.extend_from_slice(&[29, 2, 0, b'/', b'x']);
        assert!(wire::decode_body(&broken).is_err());
        assert_eq!(
            c::decode_verdict(&broken),
            Err(CWireError::NotVerdict(body[1]))
        );
    }
    for kind in [0u8, 7, 99, 255] {
        let body = [1u8, kind];
        assert!(wire::decode_body(&body).is_err());
        assert_eq!(c::decode_verdict(&body), Err(CWireError::NotVerdict(kind)));
    }
}

/// hook.c's bounds (a reason under 384 bytes, a 128-byte class name, a 256-byte
/// image, 96 bytes of methods) keep the largest outcome within session.c's
/// 1024-byte frame: every field arrives whole.
#[test]
fn the_largest_outcome_hook_c_builds_fits_the_shims_1024_byte_frame() {
    let o = Outcome {
        decision_id: u64::MAX,
        result: OutcomeResult::Failed,
        reason: "r".repeat(383),
        device_class: "C".repeat(127),
        stock: Answers {
            families: u32::MAX,
            threadgroup_memory: u64::MAX,
            working_set: u64::MAX,
        },
        effective: Answers {
            families: u32::MAX,
            threadgroup_memory: u64::MAX,
            working_set: u64::MAX,
        },
        other_shim: Some(OtherShim {
            image: "/".repeat(255),
            methods: vec!["m".repeat(95)],
            patched: OtherShimPatched::After,
        }),
    };
    let frame = c::encode_outcome(&o, 1024);
    assert!(frame.len() <= 1024);
    assert_eq!(
        wire::decode_frame(&frame).unwrap().unwrap().0,
        Message::Outcome(o)
    );
}

#[test]
fn a_declined_check_in_is_understood_with_its_reason_and_a_bad_reason_refused() {
    for (reason, code) in [(DeclineReason::UseSocket, 1u8), (DeclineReason::Busy, 2)] {
        let frame = wire::encode_frame(&Message::Declined(Declined {
            reason,
            detail: "no XPC identities here".into(),
        }));
        let body = &frame[LENGTH_PREFIX..];
        assert_eq!(c::decode_verdict(body), Err(CWireError::Declined(code)));
        assert_accepts_as_rust_does(body);
        // Any other reason byte, or a detail that is not UTF-8, is refused by
        // both decoders alike.
        let at = body
            .iter()
            .position(|&b| b == 40)
            .expect("decline_reason tag");
        let mut bad = body.to_vec();
        bad[at + 3] = 9;
        let mut bad_text = body.to_vec();
        bad_text.extend_from_slice(&[21, 1, 0, 0xff]);
        bad_text.drain(at + 4..at + 4 + 3 + "no XPC identities here".len());
        for bad in [bad, bad_text] {
            assert!(wire::decode_body(&bad).is_err(), "{bad:02x?}");
            assert!(c::decode_verdict(&bad).is_err(), "{bad:02x?}");
            assert_accepts_as_rust_does(&bad);
        }
    }
}

#[test]
fn oversize_and_tiny_frame_lengths_are_refused_like_rust() {
    for len in [
        0u32,
        1,
        2,
        100,
        MAX_FRAME as u32,
        MAX_FRAME as u32 + 1,
        u32::MAX,
    ] {
        let prefix = len.to_le_bytes();
        let rust = wire::frame_length(prefix).map_err(|e| match e {
            WireError::Oversize(n) => CWireError::Oversize(n as u64),
            WireError::Truncated => CWireError::Truncated,
            other => panic!("{other:?}"),
        });
        assert_eq!(c::frame_length(prefix), rust, "{len}");
    }
    let body = vec![1u8; MAX_FRAME + 1];
    assert_accepts_as_rust_does(&body);
}

/// A verdict body from `(tag, value)` fields, in order.
fn body(fields: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut b = vec![1u8, 2];
    for (tag, value) in fields {
        b.push(*tag);
        b.extend_from_slice(&(value.len() as u16).to_le_bytes());
        b.extend_from_slice(value);
    }
    b
}

/// Every field of a full unlock verdict, valid.
fn full_verdict() -> Vec<(u8, Vec<u8>)> {
    vec![
        (10, 7u64.to_le_bytes().to_vec()),
        (11, vec![1]),
        (12, 7u64.to_le_bytes().to_vec()),
        (13, 32768u64.to_le_bytes().to_vec()),
        (14, (12u64 << 30).to_le_bytes().to_vec()),
        (15, b"apple7".to_vec()),
        (16, b"llama".to_vec()),
        (17, vec![0]),
        (18, vec![1]),
    ]
}

#[test]
fn each_malformed_or_missing_field_is_refused_by_both() {
    assert!(c::decode_verdict(&body(&full_verdict())).is_ok());
    let bad_values: Vec<(u8, Vec<u8>)> = vec![
        (10, vec![1, 2, 3]),
        (11, vec![2]),
        (11, vec![1, 0]),
        (11, vec![]),
        (12, 300u64.to_le_bytes().to_vec()),
        (12, vec![7]),
        (13, vec![0; 4]),
        (14, vec![0; 9]),
        (15, vec![0xff, 0xfe]),
        (15, vec![0xc0, 0x80]),
        (15, vec![0xf4, 0x90, 0x80, 0x80]),
        (16, vec![0xed, 0xa0, 0x80]),
        (16, vec![0xe0, 0x80, 0x80]),
        (16, vec![0xf0, 0x80, 0x80, 0x80]),
        (16, vec![0xe2, 0x82]),
        (17, vec![2]),
        (17, vec![]),
        (18, vec![2]),
        (18, vec![0, 0]),
    ];
    for (tag, value) in bad_values {
        let mut fields = full_verdict();
        for field in fields.iter_mut().filter(|(t, _)| *t == tag) {
            field.1 = value.clone();
        }
        let b = body(&fields);
        assert_accepts_as_rust_does(&b);
        assert!(c::decode_verdict(&b).is_err(), "tag {tag} = {value:02x?}");
    }
    // Valid multi-byte UTF-8 is accepted by both.
    let mut fields = full_verdict();
    fields[6].1 = "é€😀".as_bytes().to_vec();
    assert_accepts_as_rust_does(&body(&fields));
    assert!(c::decode_verdict(&body(&fields)).is_ok());
    // Each field removed in turn, and a stock verdict without capabilities.
    for skip in 0..full_verdict().len() {
        let mut fields = full_verdict();
        fields.remove(skip);
        assert_accepts_as_rust_does(&body(&fields));
        let mut stock = fields.clone();
        for field in stock.iter_mut().filter(|(t, _)| *t == 11) {
            field.1 = vec![0];
        }
        assert_accepts_as_rust_does(&body(&stock));
    }
    // A repeated tag, and truncated headers and values.
    let mut fields = full_verdict();
    fields.push((18, vec![1]));
    assert_accepts_as_rust_does(&body(&fields));
    let full = body(&full_verdict());
    for cut in 0..full.len() {
        assert_accepts_as_rust_does(&full[..cut]);
    }
}

#[test]
fn strings_too_long_for_a_frame_are_cut_at_the_same_character_boundary() {
    let long = "é".repeat(MAX_FRAME);
    let rust = wire::encode_frame(&Message::CheckIn(CheckIn {
        shim_version: long.clone(),
        arch: "x".into(),
        claimed_executable: Some(long.clone()),
        job: None,
    }));
    assert_eq!(
        c::encode_check_in(&long, "x", Some(&long), MAX_FRAME + LENGTH_PREFIX),
        rust
    );
}

#[test]
fn the_timeout_parses_like_the_rust_shim_did() {
    assert_eq!(c::parse_timeout(None), Some(2000));
    assert_eq!(c::parse_timeout(Some("50")), Some(50));
    assert_eq!(c::parse_timeout(Some(" 0 ")), Some(0));
    assert_eq!(c::parse_timeout(Some("+5")), Some(5));
    assert_eq!(c::parse_timeout(Some("999999999")), Some(10_000));
    assert_eq!(c::parse_timeout(Some("18446744073709551615")), Some(10_000));
    assert_eq!(c::parse_timeout(Some("18446744073709551616")), None);
    assert_eq!(c::parse_timeout(Some("soon")), None);
    assert_eq!(c::parse_timeout(Some("")), None);
    assert_eq!(c::parse_timeout(Some("-1")), None);
}

#[test]
fn the_socket_path_is_the_one_socket_path_rs_gives() {
    use metalift_policy::socket_path::{client_socket, SYSTEM_SOCKET};
    use std::ffi::OsStr;
    assert_eq!(
        c::socket_path(Some("/tmp/x.sock"), true, None).as_deref(),
        Some("/tmp/x.sock")
    );
    for (system, dir) in [
        (true, Some("/run/user/501")),
        (false, Some("/run/user/501")),
        (false, Some("/run/user/501/")),
        // macOS: confstr(_CS_DARWIN_USER_TEMP_DIR) ends in a slash.
        (
            false,
            Some("/var/folders/zz/zyxvpxvq6csfxvn_n0000000000000/T/"),
        ),
        (false, None),
        (false, Some("")),
    ] {
        let rust = client_socket(system, dir.map(OsStr::new));
        assert_eq!(
            c::socket_path(None, system, dir).as_deref(),
            Some(rust.to_str().unwrap()),
            "{system} {dir:?}"
        );
    }
    assert_eq!(
        c::socket_path(Some(""), true, None).as_deref(),
        Some(SYSTEM_SOCKET)
    );
    assert_eq!(c::socket_path(Some(&"x".repeat(200)), false, None), None);
}

#[test]
fn the_agent_directory_is_trusted_exactly_as_socket_path_rs_says() {
    use metalift_policy::socket_path::agent_dir_is_trustworthy;
    for dir_uid in [0, 501, 502] {
        for mode in [0o700, 0o755, 0o770, 0o777, 0o1777, 0o720, 0o702, 0o40700] {
            for caller in [0, 501] {
                assert_eq!(
                    c::agent_dir_trustworthy(dir_uid, mode, caller),
                    agent_dir_is_trustworthy(dir_uid, mode, caller),
                    "dir uid {dir_uid}, mode {mode:o}, caller {caller}"
                );
            }
        }
    }
    // A squatter's directory (another user's, or writable by others) is refused.
    assert!(!c::agent_dir_trustworthy(502, 0o700, 501));
    assert!(!c::agent_dir_trustworthy(501, 0o777, 501));
    assert!(c::agent_dir_trustworthy(501, 0o700, 501));
}

/// The job claims the C shim sends are what `metalift_policy::job::parse` keeps:
/// allow-listed names only, bounded values, and a C-encoded check-in carrying them
/// decodes in Rust with the same text.
mod job_claims {
    use metalift_policy::job::{self, JOB_VARIABLES, MAX_VALUE_LEN};
    use metalift_policy::wire::{self, CheckIn, Message, LENGTH_PREFIX, MAX_FRAME};
    use metalift_shim::c;
    use proptest::prelude::*;

    const JOB_CAP: usize = 1024;

    #[test]
    fn the_c_sends_allow_listed_variables_only_and_rust_keeps_every_one() {
        let long = vec![b'9'; MAX_VALUE_LEN + 1];
        let env: [(&str, &[u8]); 7] = [
            ("METALIFT_JOB_ID", b"tart-17"),
            ("GITHUB_RUN_ID", b"1234567"),
            ("GITHUB_JOB", b"build"),
            ("PATH", b"/usr/bin"),
            ("CI_JOB_ID", &long),
            ("RUNNER_NAME", b"bad\nline"),
            ("BUILD_TAG", b"jenkins-x-7"),
        ];
        let text = String::from_utf8(c::job_format(&env, JOB_CAP)).unwrap();
        assert_eq!(
            text,
            "METALIFT_JOB_ID=tart-17\nGITHUB_RUN_ID=1234567\nGITHUB_JOB=build\nBUILD_TAG=jenkins-x-7"
        );
        let claims = job::parse(&text);
        assert_eq!(claims.len(), 4);
        let frame =
            c::encode_check_in_job("0.1.0", "x86_64", Some(&text), MAX_FRAME + LENGTH_PREFIX);
        let decoded = wire::decode_frame(&frame).unwrap().unwrap().0;
        assert_eq!(
            decoded,
            Message::CheckIn(CheckIn {
                shim_version: "0.1.0".into(),
                arch: "x86_64".into(),
                claimed_executable: None,
                job: Some(text),
            })
        );
    }

    #[test]
    fn no_claims_means_no_field_and_the_frame_an_old_shim_sends() {
        assert!(c::job_format(&[("HOME", b"/root")], JOB_CAP).is_empty());
        assert_eq!(
            c::encode_check_in_job("v", "a", Some(""), 256),
            c::encode_check_in("v", "a", None, 256)
        );
    }

    proptest! {
        #[test]
        fn whatever_the_environment_the_c_text_is_bounded_and_rust_keeps_all_of_it(
            values in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..200), JOB_VARIABLES.len()),
        ) {
            let env: Vec<(&str, &[u8])> = JOB_VARIABLES.iter().copied().zip(values.iter().map(Vec::as_slice)).collect();
            let bytes = c::job_format(&env, JOB_CAP);
            prop_assert!(bytes.len() < JOB_CAP);
            let text = String::from_utf8(bytes).expect("the C sends UTF-8 only");
            let lines = if text.is_empty() { 0 } else { text.split('\n').count() };
            prop_assert_eq!(job::parse(&text).len(), lines, "{:?}", text);
        }
    }
}
