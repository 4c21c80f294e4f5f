//! The shim's XPC dictionary code (`shim/c/xpc_dict.c`) held to the Rust
//! reference (`metalift_xpc::dict`), on Linux: the C is compiled with
//! `ML_XPC_FAKE` and its libxpc calls are answered by the in-memory stand-in
//! below (the functions it calls, over a map of typed values, as libxpc's
//! dictionaries are). For every verdict the daemon can send, and for malformed
//! dictionaries, C decode must agree with `dict::decode`; what C encodes
//! (check-in, outcome) must decode in Rust to the message meant.
//!
//! The stand-in models only what the C relies on: a dictionary maps C-string
//! keys to typed values; `xpc_get_type` names a value's type by the address of
//! a type object; a string has a length and a NUL-terminated pointer. On macOS
//! the same C runs against libxpc itself (the workflow's XPC round trip).
#![cfg(shim_c)]
#![allow(non_upper_case_globals, unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::{c_char, c_void, CStr, CString};

use metalift_policy::profile::Capabilities;
use metalift_policy::verdict::Mode;
use metalift_policy::wire::{
    Answers, CheckIn, DeclineReason, Declined, Message, Outcome, OutcomeResult, VerdictMsg,
    WireAction, MAX_FRAME,
};
use metalift_shim::c::{self, CWireError, RawError, RawOutcome, RawVerdict};
use metalift_xpc::dict::{self, key, DictSink, DictValue, MapDict};
use proptest::prelude::*;
use support::outcome_strategy;

mod support;

/// The outcomes these properties draw: reasons and device classes of these shapes.
const REASON: &str = "[^\0]{0,80}";
const CLASS: &str = "[^\0]{0,40}";

// ---------------------------------------------------------------- the stand-in

/// One value of the stand-in libxpc.
enum Obj {
    Dict(BTreeMap<CString, Box<Obj>>),
    U64(u64),
    Bool(bool),
    Str(CString),
    /// Any other type (int64, data, …).
    Other,
}

// The type objects: only their addresses matter.
#[no_mangle]
static _xpc_type_uint64: [u8; 1] = [1];
#[no_mangle]
static _xpc_type_bool: [u8; 1] = [2];
#[no_mangle]
static _xpc_type_string: [u8; 1] = [3];
#[no_mangle]
static _xpc_type_error: [u8; 1] = [4];
static TYPE_DICTIONARY: [u8; 1] = [5];
static TYPE_INT64: [u8; 1] = [6];

fn obj<'a>(o: *mut c_void) -> &'a mut Obj {
    // SAFETY: every xpc_object_t the C holds came from this stand-in (a live,
    // leaked Box<Obj>), and the tests run the C on one thread at a time per object.
    unsafe { &mut *o.cast::<Obj>() }
}

fn key_of(k: *const c_char) -> CString {
    // SAFETY: libxpc's keys are NUL-terminated C strings; the C passes literals.
    unsafe { CStr::from_ptr(k) }.to_owned()
}

fn set(d: *mut c_void, k: *const c_char, v: Obj) {
    match obj(d) {
        Obj::Dict(map) => {
            map.insert(key_of(k), Box::new(v));
        }
        _ => panic!("set on a non-dictionary"),
    }
}

#[no_mangle]
extern "C" fn xpc_dictionary_create(
    _keys: *const *const c_char,
    _values: *const *mut c_void,
    count: usize,
) -> *mut c_void {
    assert_eq!(count, 0, "the shim creates empty dictionaries");
    Box::into_raw(Box::new(Obj::Dict(BTreeMap::new()))).cast()
}

#[no_mangle]
extern "C" fn xpc_dictionary_set_uint64(d: *mut c_void, k: *const c_char, v: u64) {
    set(d, k, Obj::U64(v));
}

#[no_mangle]
extern "C" fn xpc_dictionary_set_bool(d: *mut c_void, k: *const c_char, v: bool) {
    set(d, k, Obj::Bool(v));
}

#[no_mangle]
extern "C" fn xpc_dictionary_set_string(d: *mut c_void, k: *const c_char, v: *const c_char) {
    // SAFETY: the C passes a NUL-terminated string.
    set(d, k, Obj::Str(unsafe { CStr::from_ptr(v) }.to_owned()));
}

#[no_mangle]
extern "C" fn xpc_dictionary_get_value(d: *mut c_void, k: *const c_char) -> *mut c_void {
    match obj(d) {
        Obj::Dict(map) => map
            .get_mut(&key_of(k))
            .map_or(std::ptr::null_mut(), |v| (&mut **v as *mut Obj).cast()),
        _ => panic!("get on a non-dictionary"),
    }
}

#[no_mangle]
extern "C" fn xpc_get_type(o: *mut c_void) -> *const u8 {
    match obj(o) {
        Obj::Dict(_) => TYPE_DICTIONARY.as_ptr(),
        Obj::U64(_) => _xpc_type_uint64.as_ptr(),
        Obj::Bool(_) => _xpc_type_bool.as_ptr(),
        Obj::Str(_) => _xpc_type_string.as_ptr(),
        Obj::Other => TYPE_INT64.as_ptr(),
    }
}

#[no_mangle]
extern "C" fn xpc_uint64_get_value(o: *mut c_void) -> u64 {
    match obj(o) {
        Obj::U64(v) => *v,
        _ => 0,
    }
}

#[no_mangle]
extern "C" fn xpc_bool_get_value(o: *mut c_void) -> bool {
    matches!(obj(o), Obj::Bool(true))
}

#[no_mangle]
extern "C" fn xpc_string_get_length(o: *mut c_void) -> usize {
    match obj(o) {
        Obj::Str(s) => s.as_bytes().len(),
        _ => 0,
    }
}

#[no_mangle]
extern "C" fn xpc_string_get_string_ptr(o: *mut c_void) -> *const c_char {
    match obj(o) {
        Obj::Str(s) => s.as_ptr(),
        _ => std::ptr::null(),
    }
}

#[no_mangle]
extern "C" fn xpc_retain(o: *mut c_void) -> *mut c_void {
    o
}

#[no_mangle]
extern "C" fn xpc_release(_o: *mut c_void) {
    // The tests' dictionaries are leaked: a few per case.
}

extern "C" {
    fn ml_xpc_encode_check_in(dict: *mut c_void, version: *const c_char, arch: *const c_char);
    fn ml_xpc_encode_job(dict: *mut c_void, job: *const c_char);
    fn ml_xpc_encode_outcome(dict: *mut c_void, outcome: *const RawOutcome);
    fn ml_xpc_decode_verdict(dict: *mut c_void, out: *mut RawVerdict) -> RawError;
}

// ------------------------------------------------------------- translations

/// The stand-in dictionary holding what `map` holds.
fn to_xpc(map: &MapDict) -> *mut c_void {
    let d = xpc_dictionary_create(std::ptr::null(), std::ptr::null(), 0);
    for (k, v) in &map.0 {
        let value = match v {
            DictValue::U64(n) => Obj::U64(*n),
            DictValue::Bool(b) => Obj::Bool(*b),
            DictValue::Str(bytes) => Obj::Str(CString::new(bytes.clone()).expect("no NUL")),
            DictValue::LongStr(len) => Obj::Str(CString::new(vec![b'a'; *len]).expect("no NUL")),
            DictValue::Other => Obj::Other,
        };
        set(d, k.as_ptr(), value);
    }
    d
}

/// What the C wrote into a stand-in dictionary, as dict.rs's map (every key
/// must be one the protocol defines).
fn from_xpc(d: *mut c_void) -> MapDict {
    let Obj::Dict(entries) = obj(d) else {
        panic!("not a dictionary")
    };
    let known = [
        key::VERSION,
        key::KIND,
        key::SHIM_VERSION,
        key::ARCH,
        key::CLAIMED_EXECUTABLE,
        key::JOB,
        key::DECISION_ID,
        key::RESULT,
        key::REASON,
        key::DEVICE_CLASS,
        key::STOCK_FAMILIES,
        key::STOCK_THREADGROUP_MEMORY,
        key::STOCK_WORKING_SET,
        key::EFFECTIVE_FAMILIES,
        key::EFFECTIVE_THREADGROUP_MEMORY,
        key::EFFECTIVE_WORKING_SET,
        key::OTHER_SHIM_IMAGE,
        key::OTHER_SHIM_METHODS,
        key::OTHER_SHIM_PATCHED,
    ];
    let mut map = MapDict::default();
    for (k, v) in entries.iter() {
        let key = *known
            .iter()
            .find(|known| **known == k.as_c_str())
            .unwrap_or_else(|| panic!("the C wrote an unknown key {k:?}"));
        let value = match &**v {
            Obj::U64(n) => DictValue::U64(*n),
            Obj::Bool(b) => DictValue::Bool(*b),
            Obj::Str(s) => DictValue::Str(s.as_bytes().to_vec()),
            _ => DictValue::Other,
        };
        map.0.insert(key, value);
    }
    map
}

/// What the C decoder must say of `map`, from what `dict::decode` says.
fn expected(map: &MapDict) -> Result<VerdictMsg, CWireError> {
    c::expected_verdict(dict::decode(map))
}

fn c_decode(map: &MapDict) -> Result<VerdictMsg, CWireError> {
    let d = to_xpc(map);
    // SAFETY: `d` is a live stand-in dictionary; `out` is decode_with's valid
    // out-pointer; the strings the C points at live in the leaked dictionary.
    c::decode_with(|out| unsafe { ml_xpc_decode_verdict(d, out) })
}

fn assert_same(map: &MapDict) {
    assert_eq!(c_decode(map), expected(map), "{map:?}");
}

fn encoded(msg: &Message) -> MapDict {
    let mut map = MapDict::default();
    dict::encode(msg, &mut map);
    map
}

fn verdict() -> VerdictMsg {
    VerdictMsg {
        decision_id: 42,
        action: WireAction::Unlock,
        capabilities: Some(Capabilities {
            apple_family_max: 7,
            max_threadgroup_memory: 32768,
            recommended_working_set: Some(12 << 30),
        }),
        profile: Some("apple7".into()),
        rule: Some("llama-cpp".into()),
        mode: Mode::Enforce,
        would_unlock: false,
    }
}

// ------------------------------------------------------------------ the tests

#[test]
fn every_verdict_the_daemon_sends_decodes_in_c_as_in_rust() {
    for v in [
        verdict(),
        VerdictMsg {
            action: WireAction::Stock,
            capabilities: None,
            profile: None,
            rule: None,
            mode: Mode::Monitor,
            would_unlock: true,
            ..verdict()
        },
        VerdictMsg {
            capabilities: Some(Capabilities {
                recommended_working_set: None,
                ..verdict().capabilities.unwrap()
            }),
            ..verdict()
        },
    ] {
        let map = encoded(&Message::Verdict(v.clone()));
        assert_eq!(c_decode(&map), Ok(v));
    }
}

#[test]
fn an_outcomes_other_shim_keys_are_judged_by_c_as_by_rust() {
    let outcome = Message::Outcome(Outcome {
        decision_id: 1,
        result: OutcomeResult::Applied,
        reason: String::new(),
        device_class: String::new(),
        stock: Answers::default(),
        effective: Answers::default(),
        other_shim: None,
    });
    for (image, methods, patched) in [
        (Some("/x"), Some("supportsFamily:"), Some("before")),
        (Some("/x"), None, Some("after")),
        (Some("/x"), Some("supportsFamily:"), None),
        (Some("/x"), None, Some("sideways")),
        (None, Some("supportsFamily:"), Some("after")),
        (None, None, Some("sideways")),
    ] {
        let mut map = encoded(&outcome);
        for (k, v) in [
            (key::OTHER_SHIM_IMAGE, image),
            (key::OTHER_SHIM_METHODS, methods),
            (key::OTHER_SHIM_PATCHED, patched),
        ] {
            if let Some(v) = v {
                map.set_str(k, v);
            }
        }
        assert_same(&map);
    }
}

#[test]
fn other_messages_are_not_verdicts() {
    for (msg, kind) in [
        (Message::CheckIn(CheckIn::default()), 1),
        (Message::StatusRequest, 4),
        (Message::Status("{}".into()), 5),
    ] {
        let map = encoded(&msg);
        assert_eq!(c_decode(&map), Err(CWireError::NotVerdict(kind)));
        assert_same(&map);
    }
}

#[test]
fn a_declined_check_in_is_understood_with_its_reason() {
    for (reason, code) in [(DeclineReason::UseSocket, 1u8), (DeclineReason::Busy, 2)] {
        let map = encoded(&Message::Declined(Declined {
            reason,
            detail: "busy".into(),
        }));
        assert_eq!(c_decode(&map), Err(CWireError::Declined(code)));
        assert_same(&map);
        let mut bad = map.clone();
        bad.0.insert(c"decline", DictValue::Str(b"later".to_vec()));
        assert_eq!(c_decode(&bad), Err(CWireError::BadField("decline".into())));
        assert_same(&bad);
        let mut missing = map.clone();
        missing.0.remove(c"decline");
        assert_same(&missing);
    }
}

#[test]
fn an_xpc_check_in_falls_back_to_the_socket_on_use_the_socket_and_errors_and_sends_again_once_when_interrupted(
) {
    use metalift_shim::c::{xpc_next_step, XpcNext, XpcRead};
    let declined = |reason| {
        XpcRead::Reply(c_decode(&encoded(&Message::Declined(Declined {
            reason,
            detail: String::new(),
        }))))
    };
    // The answer a daemon that cannot serve XPC identities gives at once.
    assert_eq!(
        xpc_next_step(&declined(DeclineReason::UseSocket)),
        XpcNext::UseSocket
    );
    // XPC_ERROR_CONNECTION_INVALID (no such service) and any other XPC error
    // before a reply (interrupted): the socket, within the same deadline.
    assert_eq!(
        xpc_next_step(&XpcRead::Error(-libc::ECONNREFUSED)),
        XpcNext::UseSocket
    );
    assert_eq!(
        xpc_next_step(&XpcRead::Error(-libc::ECONNRESET)),
        XpcNext::UseSocket
    );
    // XPC_ERROR_CONNECTION_INTERRUPTED: libxpc's contract is "send again".
    assert_eq!(
        xpc_next_step(&XpcRead::Error(-libc::EAGAIN)),
        XpcNext::SendAgain
    );
    assert_eq!(
        xpc_next_step(&declined(DeclineReason::Busy)),
        XpcNext::StockBusy
    );
    assert_eq!(xpc_next_step(&XpcRead::Timeout), XpcNext::StockUnresponsive);
    assert_eq!(
        xpc_next_step(&XpcRead::Reply(c_decode(&encoded(&Message::Verdict(
            verdict()
        ))))),
        XpcNext::UseVerdict
    );
    assert_eq!(
        xpc_next_step(&XpcRead::Reply(c_decode(&encoded(&Message::StatusRequest)))),
        XpcNext::StockMalformed
    );
}

#[test]
fn every_key_missing_or_of_another_type_is_refused_as_rust_refuses_it() {
    let base = encoded(&Message::Verdict(verdict()));
    let keys: Vec<_> = base.0.keys().copied().collect();
    for k in keys {
        let mut missing = base.clone();
        missing.0.remove(k);
        assert_same(&missing);
        for other in [
            DictValue::U64(3),
            DictValue::U64(300),
            DictValue::Bool(true),
            DictValue::Str(b"unlock".to_vec()),
            DictValue::Str(b"monitor".to_vec()),
            DictValue::Str(vec![0xff, 0xfe]),
            DictValue::LongStr(MAX_FRAME + 1),
            DictValue::Other,
        ] {
            let mut changed = base.clone();
            changed.0.insert(k, other);
            assert_same(&changed);
        }
    }
}

#[test]
fn versions_kinds_and_words_are_checked_as_in_rust() {
    let base = encoded(&Message::Verdict(verdict()));
    for (k, v) in [
        (key::VERSION, DictValue::U64(2)),
        (key::VERSION, DictValue::U64(1 << 40)),
        (key::KIND, DictValue::Str(b"reboot".to_vec())),
        (key::KIND, DictValue::Str(b"outcome".to_vec())),
        (key::ACTION, DictValue::Str(b"Unlock".to_vec())),
        (key::MODE, DictValue::Str(b"".to_vec())),
        (key::APPLE_FAMILY_MAX, DictValue::U64(256)),
    ] {
        let mut changed = base.clone();
        changed.0.insert(k, v);
        assert_same(&changed);
        assert!(c_decode(&changed).is_err(), "{changed:?}");
    }
    // A stock verdict without capabilities is fine; an unlock without is not.
    let mut stock = base.clone();
    stock
        .0
        .insert(key::ACTION, DictValue::Str(b"stock".to_vec()));
    stock.0.remove(key::APPLE_FAMILY_MAX);
    assert_same(&stock);
    assert!(c_decode(&stock).is_ok());
    // Unknown keys are ignored (a newer daemon).
    let mut newer = base;
    newer.0.insert(c"from.the.future", DictValue::Bool(true));
    assert_same(&newer);
    assert!(c_decode(&newer).is_ok());
}

#[test]
fn strings_share_one_budget_as_in_rust() {
    let mut map = encoded(&Message::Verdict(verdict()));
    map.0
        .insert(key::PROFILE, DictValue::Str(vec![b'p'; MAX_FRAME - 20]));
    assert_same(&map);
    map.0.insert(key::RULE, DictValue::Str(vec![b'r'; 30]));
    assert_same(&map);
    assert!(matches!(c_decode(&map), Err(CWireError::Oversize(_))));
}

#[test]
fn the_check_in_the_c_encodes_is_the_one_rust_reads() {
    let d = xpc_dictionary_create(std::ptr::null(), std::ptr::null(), 0);
    // SAFETY: `d` is a live stand-in dictionary; the strings are NUL-terminated.
    unsafe { ml_xpc_encode_check_in(d, c"0.3.0-c".as_ptr(), c"arm64e".as_ptr()) };
    assert_eq!(
        dict::decode(&from_xpc(d)),
        Ok(Message::CheckIn(CheckIn {
            shim_version: "0.3.0-c".into(),
            arch: "arm64e".into(),
            claimed_executable: None,
            job: None,
        }))
    );
}

#[test]
fn the_job_claims_the_c_adds_to_a_check_in_are_the_ones_rust_reads() {
    let d = xpc_dictionary_create(std::ptr::null(), std::ptr::null(), 0);
    // SAFETY: `d` is a live stand-in dictionary; the strings are NUL-terminated.
    unsafe {
        ml_xpc_encode_check_in(d, c"0.3.0-c".as_ptr(), c"arm64e".as_ptr());
        ml_xpc_encode_job(d, c"GITHUB_RUN_ID=42\nGITHUB_JOB=build".as_ptr());
    }
    assert_eq!(
        dict::decode(&from_xpc(d)),
        Ok(Message::CheckIn(CheckIn {
            shim_version: "0.3.0-c".into(),
            arch: "arm64e".into(),
            claimed_executable: None,
            job: Some("GITHUB_RUN_ID=42\nGITHUB_JOB=build".into()),
        }))
    );
    let empty = xpc_dictionary_create(std::ptr::null(), std::ptr::null(), 0);
    // SAFETY: as above; "" adds nothing, as an old shim's check-in.
    unsafe {
        ml_xpc_encode_check_in(empty, c"v".as_ptr(), c"a".as_ptr());
        ml_xpc_encode_job(empty, c"".as_ptr());
    }
    assert!(matches!(
        dict::decode(&from_xpc(empty)),
        Ok(Message::CheckIn(CheckIn { job: None, .. }))
    ));
}

proptest! {
    #[test]
    fn every_outcome_the_c_encodes_is_the_one_rust_reads(o in outcome_strategy(REASON, CLASS)) {
        let d = xpc_dictionary_create(std::ptr::null(), std::ptr::null(), 0);
        // SAFETY: `d` is a live stand-in dictionary; `raw` lives across the call.
        c::with_raw_outcome(&o, |raw| unsafe { ml_xpc_encode_outcome(d, raw) });
        prop_assert_eq!(dict::decode(&from_xpc(d)), Ok(Message::Outcome(o)));
    }

    #[test]
    fn random_verdicts_decode_in_c_as_in_rust(
        id in any::<u64>(),
        unlock in any::<bool>(),
        max in any::<u8>(),
        tg in any::<u64>(),
        ws in proptest::option::of(any::<u64>()),
        profile in proptest::option::of("[^\0]{0,40}"),
        rule in proptest::option::of("[^\0]{0,40}"),
        monitor in any::<bool>(),
        would in any::<bool>(),
    ) {
        let v = VerdictMsg {
            decision_id: id,
            action: if unlock { WireAction::Unlock } else { WireAction::Stock },
            capabilities: unlock.then_some(Capabilities {
                apple_family_max: max,
                max_threadgroup_memory: tg,
                recommended_working_set: ws,
            }),
            profile,
            rule,
            mode: if monitor { Mode::Monitor } else { Mode::Enforce },
            would_unlock: would,
        };
        let map = encoded(&Message::Verdict(v.clone()));
        prop_assert_eq!(c_decode(&map), Ok(v));
    }
}
