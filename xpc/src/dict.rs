//! How a check-in protocol [`Message`] rides an XPC dictionary: one key per field.
//!
//! Pure (no XPC, no unsafe): it speaks to a dictionary through [`DictSink`] and
//! [`DictSource`], implemented over libxpc by `xpc_dict.rs` and over a `BTreeMap` by
//! the Linux tests. The same file is compiled into the daemon's XPC transport, the
//! shim's XPC client and `daemon/tests/core_in_memory.rs` (both include it by path),
//! so there is exactly one mapping. Its natural home is `metalift_policy::wire`
//! (as `wire::dict`), next to the frame codec it mirrors.
//!
//! # Keys
//!
//! | key | type | messages | meaning |
//! |---|---|---|---|
//! | `metalift.version` | uint64 | all | [`PROTOCOL_VERSION`]; another value is refused |
//! | `kind` | string | all | `check_in`, `verdict`, `outcome`, `status_request`, `status`, `declined` |
//! | `shim_version`, `arch`, `claimed_executable` | string | check_in | advisory, logged only |
//! | `job` | string | check_in | advisory CI job claims, `NAME=value` lines (`metalift_policy::job`); absent from older shims |
//! | `decision_id` | uint64 | verdict, outcome | the audit record's decision id |
//! | `action` | string | verdict | `unlock` or `stock` |
//! | `apple_family_max` | uint64 | verdict | present iff unlock (fits a `u8`) |
//! | `max_threadgroup_memory` | uint64 | verdict | present iff unlock |
//! | `recommended_working_set` | uint64 | verdict | optional |
//! | `profile`, `rule` | string | verdict | optional |
//! | `mode` | string | verdict | `enforce` or `monitor` |
//! | `would_unlock` | bool | verdict | monitor mode: a rule would have unlocked |
//! | `result` | string | outcome | `applied`, `stock`, `failed` |
//! | `reason`, `device_class` | string | outcome | free text |
//! | `stock_families`, `effective_families` | uint64 | outcome | bit set over `KNOWN_FAMILIES` (fits a `u32`) |
//! | `stock_threadgroup_memory`, `effective_threadgroup_memory` | uint64 | outcome | |
//! | `stock_working_set`, `effective_working_set` | uint64 | outcome | |
//! | `other_shim_image` | string | outcome | optional: the image holding another shim's IMPs; absent: none |
//! | `other_shim_methods` | string | outcome | with the image: its selectors, joined with `,` |
//! | `other_shim_patched` | string | outcome | with the image: `before` or `after` (`OtherShimPatched`) |
//! | `json` | string | status | the status document |
//! | `decline` | string | declined | `use_socket` or `busy` |
//! | `reason` | string | declined | free text |
//!
//! Decoding is as strict as the frame decoder: unknown keys are ignored (newer
//! peers), but a wrong value type, a bad enum word, an unlock without capabilities
//! or more than [`MAX_FRAME`] bytes of strings is an error, mapped onto the same
//! [`WireError`] variants.
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::ffi::CStr;

use metalift_policy::verdict::Mode;
use metalift_policy::wire::{
    split_methods, Answers, CheckIn, DeclineReason, Declined, Message, OtherShim, OtherShimPatched,
    Outcome, OutcomeResult, VerdictMsg, WireAction, WireError, MAX_FRAME, PROTOCOL_VERSION,
};
use metalift_policy::Capabilities;

/// The mach service metaliftd listens on and the shim looks up by default; both
/// launchd plists advertise it in `MachServices`.
pub const DEFAULT_SERVICE: &str = "com.metalift.policy";

/// The dictionary keys, as C strings (libxpc takes `const char *`).
pub mod key {
    use std::ffi::CStr;

    /// uint64: the protocol version.
    pub const VERSION: &CStr = c"metalift.version";
    /// string: the message kind.
    pub const KIND: &CStr = c"kind";
    /// string (check_in).
    pub const SHIM_VERSION: &CStr = c"shim_version";
    /// string (check_in).
    pub const ARCH: &CStr = c"arch";
    /// string (check_in).
    pub const CLAIMED_EXECUTABLE: &CStr = c"claimed_executable";
    pub const JOB: &CStr = c"job";
    /// uint64 (verdict, outcome).
    pub const DECISION_ID: &CStr = c"decision_id";
    /// string (verdict).
    pub const ACTION: &CStr = c"action";
    /// uint64 (verdict).
    pub const APPLE_FAMILY_MAX: &CStr = c"apple_family_max";
    /// uint64 (verdict).
    pub const MAX_THREADGROUP_MEMORY: &CStr = c"max_threadgroup_memory";
    /// uint64 (verdict).
    pub const RECOMMENDED_WORKING_SET: &CStr = c"recommended_working_set";
    /// string (verdict).
    pub const PROFILE: &CStr = c"profile";
    /// string (verdict).
    pub const RULE: &CStr = c"rule";
    /// string (verdict).
    pub const MODE: &CStr = c"mode";
    /// bool (verdict).
    pub const WOULD_UNLOCK: &CStr = c"would_unlock";
    /// string (outcome).
    pub const RESULT: &CStr = c"result";
    /// string (outcome).
    pub const REASON: &CStr = c"reason";
    /// string (outcome).
    pub const DEVICE_CLASS: &CStr = c"device_class";
    /// uint64 (outcome).
    pub const STOCK_FAMILIES: &CStr = c"stock_families";
    /// uint64 (outcome).
    pub const STOCK_THREADGROUP_MEMORY: &CStr = c"stock_threadgroup_memory";
    /// uint64 (outcome).
    pub const STOCK_WORKING_SET: &CStr = c"stock_working_set";
    /// uint64 (outcome).
    pub const EFFECTIVE_FAMILIES: &CStr = c"effective_families";
    /// uint64 (outcome).
    pub const EFFECTIVE_THREADGROUP_MEMORY: &CStr = c"effective_threadgroup_memory";
    /// uint64 (outcome).
    pub const EFFECTIVE_WORKING_SET: &CStr = c"effective_working_set";
    /// string (outcome, optional).
    pub const OTHER_SHIM_IMAGE: &CStr = c"other_shim_image";
    /// string (outcome, with the image).
    pub const OTHER_SHIM_METHODS: &CStr = c"other_shim_methods";
    /// string (outcome, with the image): `before` or `after`.
    pub const OTHER_SHIM_PATCHED: &CStr = c"other_shim_patched";
    /// string (status).
    pub const JSON: &CStr = c"json";
    /// string (declined): `use_socket` or `busy`.
    pub const DECLINE: &CStr = c"decline";

    /// Whether `k` is a key this protocol version defines.
    #[must_use]
    pub fn is_known(k: &CStr) -> bool {
        [
            VERSION,
            KIND,
            SHIM_VERSION,
            ARCH,
            CLAIMED_EXECUTABLE,
            JOB,
            DECISION_ID,
            ACTION,
            APPLE_FAMILY_MAX,
            MAX_THREADGROUP_MEMORY,
            RECOMMENDED_WORKING_SET,
            PROFILE,
            RULE,
            MODE,
            WOULD_UNLOCK,
            RESULT,
            REASON,
            DEVICE_CLASS,
            STOCK_FAMILIES,
            STOCK_THREADGROUP_MEMORY,
            STOCK_WORKING_SET,
            EFFECTIVE_FAMILIES,
            EFFECTIVE_THREADGROUP_MEMORY,
            EFFECTIVE_WORKING_SET,
            OTHER_SHIM_IMAGE,
            OTHER_SHIM_METHODS,
            OTHER_SHIM_PATCHED,
            JSON,
            DECLINE,
        ]
        .contains(&k)
    }
}

/// An XPC dictionary's stand-in: typed values under their keys, in memory. What
/// the tests on every platform (and any carrier other than libxpc) encode into.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct MapDict(pub BTreeMap<&'static CStr, DictValue>);

impl DictSink for MapDict {
    fn set_u64(&mut self, key: &'static CStr, value: u64) {
        self.0.insert(key, DictValue::U64(value));
    }
    fn set_bool(&mut self, key: &'static CStr, value: bool) {
        self.0.insert(key, DictValue::Bool(value));
    }
    fn set_str(&mut self, key: &'static CStr, value: &str) {
        self.0
            .insert(key, DictValue::Str(value.as_bytes().to_vec()));
    }
}

impl DictSource for MapDict {
    fn get(&self, key: &'static CStr) -> Option<DictValue> {
        self.0.get(key).cloned()
    }
}

/// One value read from a dictionary, as its type says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DictValue {
    /// An unsigned 64-bit integer.
    U64(u64),
    /// A boolean.
    Bool(bool),
    /// A string's bytes (not yet checked as UTF-8), at most [`MAX_FRAME`] long.
    Str(Vec<u8>),
    /// A string longer than [`MAX_FRAME`]: its length, unread.
    LongStr(usize),
    /// Any other type (data, int64, array, …).
    Other,
}

/// Writes typed values under keys (an XPC dictionary, or a map in tests).
pub trait DictSink {
    /// Stores an unsigned integer.
    fn set_u64(&mut self, key: &'static CStr, value: u64);
    /// Stores a boolean.
    fn set_bool(&mut self, key: &'static CStr, value: bool);
    /// Stores a string without interior NUL bytes (the encoder guarantees it).
    fn set_str(&mut self, key: &'static CStr, value: &str);
}

/// Reads typed values by key.
pub trait DictSource {
    /// The value under `key`, or `None` when absent.
    fn get(&self, key: &'static CStr) -> Option<DictValue>;
}

/// Writes `msg` into `sink`. Strings are cut at the first NUL (XPC strings are C
/// strings) and the total string payload is cut to [`MAX_FRAME`] bytes at a
/// character boundary, as the frame encoder does: paths and reasons are advisory.
pub fn encode(msg: &Message, sink: &mut impl DictSink) {
    let mut out = Writer {
        sink,
        budget: MAX_FRAME,
    };
    out.sink.set_u64(key::VERSION, u64::from(PROTOCOL_VERSION));
    match msg {
        Message::CheckIn(c) => {
            out.str(key::KIND, "check_in");
            out.str(key::SHIM_VERSION, &c.shim_version);
            out.str(key::ARCH, &c.arch);
            if let Some(exe) = &c.claimed_executable {
                out.str(key::CLAIMED_EXECUTABLE, exe);
            }
            if let Some(job) = &c.job {
                out.str(key::JOB, job);
            }
        }
        Message::Verdict(v) => {
            out.str(key::KIND, "verdict");
            out.sink.set_u64(key::DECISION_ID, v.decision_id);
            out.str(
                key::ACTION,
                match v.action {
                    WireAction::Unlock => "unlock",
                    WireAction::Stock => "stock",
                },
            );
            if let Some(caps) = &v.capabilities {
                out.sink
                    .set_u64(key::APPLE_FAMILY_MAX, u64::from(caps.apple_family_max));
                out.sink
                    .set_u64(key::MAX_THREADGROUP_MEMORY, caps.max_threadgroup_memory);
                if let Some(ws) = caps.recommended_working_set {
                    out.sink.set_u64(key::RECOMMENDED_WORKING_SET, ws);
                }
            }
            if let Some(p) = &v.profile {
                out.str(key::PROFILE, p);
            }
            if let Some(r) = &v.rule {
                out.str(key::RULE, r);
            }
            out.str(key::MODE, v.mode.as_str());
            out.sink.set_bool(key::WOULD_UNLOCK, v.would_unlock);
        }
        Message::Outcome(o) => {
            out.str(key::KIND, "outcome");
            out.sink.set_u64(key::DECISION_ID, o.decision_id);
            out.str(key::RESULT, o.result.as_str());
            out.str(key::REASON, &o.reason);
            out.str(key::DEVICE_CLASS, &o.device_class);
            out.sink
                .set_u64(key::STOCK_FAMILIES, u64::from(o.stock.families));
            out.sink
                .set_u64(key::STOCK_THREADGROUP_MEMORY, o.stock.threadgroup_memory);
            out.sink
                .set_u64(key::STOCK_WORKING_SET, o.stock.working_set);
            out.sink
                .set_u64(key::EFFECTIVE_FAMILIES, u64::from(o.effective.families));
            out.sink.set_u64(
                key::EFFECTIVE_THREADGROUP_MEMORY,
                o.effective.threadgroup_memory,
            );
            out.sink
                .set_u64(key::EFFECTIVE_WORKING_SET, o.effective.working_set);
            if let Some(other) = &o.other_shim {
                out.str(key::OTHER_SHIM_IMAGE, &other.image);
                out.str(key::OTHER_SHIM_METHODS, &other.methods.join(","));
                out.str(key::OTHER_SHIM_PATCHED, other.patched.as_str());
            }
        }
        Message::StatusRequest => out.str(key::KIND, "status_request"),
        Message::Status(json) => {
            out.str(key::KIND, "status");
            out.str(key::JSON, json);
        }
        Message::Declined(d) => {
            out.str(key::KIND, "declined");
            out.str(key::DECLINE, d.reason.as_str());
            out.str(key::REASON, &d.detail);
        }
    }
}

/// Reads a message from `src`, as strictly as `wire::decode_body` reads a frame.
pub fn decode(src: &impl DictSource) -> Result<Message, WireError> {
    let mut r = Reader {
        src,
        budget: MAX_FRAME,
    };
    match r.u64(key::VERSION, "metalift.version")? {
        Some(v) if v == u64::from(PROTOCOL_VERSION) => {}
        Some(v) => return Err(WireError::Version(u8::try_from(v).unwrap_or(u8::MAX))),
        None => return Err(WireError::Missing("metalift.version")),
    }
    let kind = r
        .str(key::KIND, "kind")?
        .ok_or(WireError::Missing("kind"))?;
    match kind.as_str() {
        "check_in" => Ok(Message::CheckIn(CheckIn {
            shim_version: r
                .str(key::SHIM_VERSION, "shim_version")?
                .unwrap_or_default(),
            arch: r.str(key::ARCH, "arch")?.unwrap_or_default(),
            claimed_executable: r.str(key::CLAIMED_EXECUTABLE, "claimed_executable")?,
            job: r.str(key::JOB, "job")?,
        })),
        "verdict" => {
            let action = match r.str(key::ACTION, "action")?.as_deref() {
                Some("unlock") => WireAction::Unlock,
                Some("stock") => WireAction::Stock,
                Some(_) => return Err(WireError::BadField("action")),
                None => return Err(WireError::Missing("action")),
            };
            let capabilities = match r.u64(key::APPLE_FAMILY_MAX, "apple_family_max")? {
                Some(max) => Some(Capabilities {
                    apple_family_max: u8::try_from(max)
                        .map_err(|_| WireError::BadField("apple_family_max"))?,
                    max_threadgroup_memory: r
                        .u64(key::MAX_THREADGROUP_MEMORY, "max_threadgroup_memory")?
                        .ok_or(WireError::Missing("max_threadgroup_memory"))?,
                    recommended_working_set: r
                        .u64(key::RECOMMENDED_WORKING_SET, "recommended_working_set")?,
                }),
                None => None,
            };
            if action == WireAction::Unlock && capabilities.is_none() {
                return Err(WireError::Missing("apple_family_max"));
            }
            Ok(Message::Verdict(VerdictMsg {
                decision_id: r
                    .u64(key::DECISION_ID, "decision_id")?
                    .ok_or(WireError::Missing("decision_id"))?,
                action,
                capabilities,
                profile: r.str(key::PROFILE, "profile")?,
                rule: r.str(key::RULE, "rule")?,
                mode: match r.str(key::MODE, "mode")?.as_deref() {
                    Some("enforce") => Mode::Enforce,
                    Some("monitor") => Mode::Monitor,
                    Some(_) => return Err(WireError::BadField("mode")),
                    None => return Err(WireError::Missing("mode")),
                },
                would_unlock: r.bool(key::WOULD_UNLOCK, "would_unlock")?.unwrap_or(false),
            }))
        }
        "outcome" => Ok(Message::Outcome(Outcome {
            decision_id: r
                .u64(key::DECISION_ID, "decision_id")?
                .ok_or(WireError::Missing("decision_id"))?,
            result: match r.str(key::RESULT, "result")?.as_deref() {
                Some("applied") => OutcomeResult::Applied,
                Some("stock") => OutcomeResult::Stock,
                Some("failed") => OutcomeResult::Failed,
                Some(_) => return Err(WireError::BadField("result")),
                None => return Err(WireError::Missing("result")),
            },
            reason: r.str(key::REASON, "reason")?.unwrap_or_default(),
            device_class: r
                .str(key::DEVICE_CLASS, "device_class")?
                .unwrap_or_default(),
            stock: Answers {
                families: r.families(key::STOCK_FAMILIES, "stock_families")?,
                threadgroup_memory: r
                    .u64(key::STOCK_THREADGROUP_MEMORY, "stock_threadgroup_memory")?
                    .unwrap_or(0),
                working_set: r
                    .u64(key::STOCK_WORKING_SET, "stock_working_set")?
                    .unwrap_or(0),
            },
            effective: Answers {
                families: r.families(key::EFFECTIVE_FAMILIES, "effective_families")?,
                threadgroup_memory: r
                    .u64(
                        key::EFFECTIVE_THREADGROUP_MEMORY,
                        "effective_threadgroup_memory",
                    )?
                    .unwrap_or(0),
                working_set: r
                    .u64(key::EFFECTIVE_WORKING_SET, "effective_working_set")?
                    .unwrap_or(0),
            },
            other_shim: other_shim(&mut r)?,
        })),
        "status_request" => Ok(Message::StatusRequest),
        "status" => Ok(Message::Status(
            r.str(key::JSON, "json")?.unwrap_or_default(),
        )),
        "declined" => Ok(Message::Declined(Declined {
            reason: match r.str(key::DECLINE, "decline")?.as_deref() {
                Some("use_socket") => DeclineReason::UseSocket,
                Some("busy") => DeclineReason::Busy,
                Some(_) => return Err(WireError::BadField("decline")),
                None => return Err(WireError::Missing("decline")),
            },
            detail: r.str(key::REASON, "reason")?.unwrap_or_default(),
        })),
        _ => Err(WireError::BadField("kind")),
    }
}

/// Writes strings within the shared byte budget.
struct Writer<'a, S> {
    sink: &'a mut S,
    /// String bytes still allowed in this message.
    budget: usize,
}

impl<S: DictSink> Writer<'_, S> {
    fn str(&mut self, key: &'static CStr, value: &str) {
        let value = value.split('\0').next().unwrap_or_default();
        let mut end = value.len().min(self.budget);
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        self.budget -= end;
        self.sink.set_str(key, &value[..end]);
    }
}

/// An outcome's `other_shim_*` keys, as strict as the frame decoder's (wire.rs
/// `other_shim`): absent image, none; an image requires `patched`.
fn other_shim<S: DictSource>(r: &mut Reader<'_, S>) -> Result<Option<OtherShim>, WireError> {
    let methods = r.str(key::OTHER_SHIM_METHODS, "other_shim_methods")?;
    let patched = match r
        .str(key::OTHER_SHIM_PATCHED, "other_shim_patched")?
        .as_deref()
    {
        None => None,
        Some("before") => Some(OtherShimPatched::Before),
        Some("after") => Some(OtherShimPatched::After),
        Some(_) => return Err(WireError::BadField("other_shim_patched")),
    };
    let Some(image) = r.str(key::OTHER_SHIM_IMAGE, "other_shim_image")? else {
        return Ok(None);
    };
    Ok(Some(OtherShim {
        image,
        methods: split_methods(methods.as_deref().unwrap_or("")),
        patched: patched.ok_or(WireError::Missing("other_shim_patched"))?,
    }))
}

/// Reads typed values, charging strings to the shared byte budget.
struct Reader<'a, S> {
    src: &'a S,
    /// String bytes still allowed in this message.
    budget: usize,
}

impl<S: DictSource> Reader<'_, S> {
    fn u64(&mut self, key: &'static CStr, name: &'static str) -> Result<Option<u64>, WireError> {
        match self.src.get(key) {
            None => Ok(None),
            Some(DictValue::U64(v)) => Ok(Some(v)),
            Some(_) => Err(WireError::BadField(name)),
        }
    }

    /// A family bit set: absent means none, beyond 32 bits is malformed.
    fn families(&mut self, key: &'static CStr, name: &'static str) -> Result<u32, WireError> {
        u32::try_from(self.u64(key, name)?.unwrap_or(0)).map_err(|_| WireError::BadField(name))
    }

    fn bool(&mut self, key: &'static CStr, name: &'static str) -> Result<Option<bool>, WireError> {
        match self.src.get(key) {
            None => Ok(None),
            Some(DictValue::Bool(v)) => Ok(Some(v)),
            Some(_) => Err(WireError::BadField(name)),
        }
    }

    fn str(&mut self, key: &'static CStr, name: &'static str) -> Result<Option<String>, WireError> {
        match self.src.get(key) {
            None => Ok(None),
            Some(DictValue::Str(bytes)) => {
                if bytes.len() > self.budget {
                    return Err(WireError::Oversize(MAX_FRAME - self.budget + bytes.len()));
                }
                self.budget -= bytes.len();
                String::from_utf8(bytes)
                    .map(Some)
                    .map_err(|_| WireError::BadField(name))
            }
            Some(DictValue::LongStr(len)) => Err(WireError::Oversize(len)),
            Some(_) => Err(WireError::BadField(name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(msg: Message) {
        let mut d = MapDict::default();
        encode(&msg, &mut d);
        assert!(d.0.keys().all(|k| key::is_known(k)));
        assert_eq!(decode(&d), Ok(msg));
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

    #[test]
    fn every_message_kind_survives_a_dictionary_round_trip() {
        round_trip(Message::CheckIn(CheckIn {
            shim_version: "0.1.0".into(),
            arch: "arm64e".into(),
            claimed_executable: Some("/opt/llama.cpp/bin/llama-server".into()),
            job: None,
        }));
        round_trip(Message::CheckIn(CheckIn {
            shim_version: "0.1.0".into(),
            arch: "arm64".into(),
            claimed_executable: None,
            job: Some("{\"GITHUB_RUN_ID\":\"42\"}".into()),
        }));
        round_trip(Message::CheckIn(CheckIn::default()));
        round_trip(Message::Verdict(verdict()));
        round_trip(Message::Verdict(VerdictMsg {
            action: WireAction::Stock,
            capabilities: None,
            profile: None,
            rule: None,
            mode: Mode::Monitor,
            would_unlock: true,
            ..verdict()
        }));
        round_trip(Message::Outcome(Outcome {
            decision_id: 7,
            result: OutcomeResult::Failed,
            reason: "selector initGPUFamilySupport missing".into(),
            device_class: "AppleParavirtDevice".into(),
            stock: Answers {
                families: 0b1_1111,
                threadgroup_memory: 32768,
                working_set: 1,
            },
            effective: Answers {
                families: 0b111_1111,
                threadgroup_memory: 65536,
                working_set: 2,
            },
            other_shim: None,
        }));
        for patched in [OtherShimPatched::Before, OtherShimPatched::After] {
            round_trip(Message::Outcome(Outcome {
                decision_id: 8,
                result: OutcomeResult::Applied,
                reason: String::new(),
                device_class: "AppleParavirtDevice".into(),
                stock: Answers::default(),
                effective: Answers::default(),
                other_shim: Some(OtherShim {
                    image: "/usr/local/lib/libLumeMetalCapabilities.dylib".into(),
                    methods: vec![
                        "maxThreadgroupMemoryLength".into(),
                        "supportsFamily:".into(),
                    ],
                    patched,
                }),
            }));
        }
        round_trip(Message::StatusRequest);
        round_trip(Message::Status("{\"rules\":3}".into()));
        round_trip(Message::Declined(Declined {
            reason: DeclineReason::UseSocket,
            detail: "this daemon serves no XPC identities".into(),
        }));
        round_trip(Message::Declined(Declined {
            reason: DeclineReason::Busy,
            detail: String::new(),
        }));
    }

    #[test]
    fn an_other_shim_image_needs_its_order_and_a_known_word() {
        let mut d = MapDict::default();
        encode(
            &Message::Outcome(Outcome {
                decision_id: 1,
                result: OutcomeResult::Stock,
                reason: String::new(),
                device_class: String::new(),
                stock: Answers::default(),
                effective: Answers::default(),
                other_shim: None,
            }),
            &mut d,
        );
        d.set_str(key::OTHER_SHIM_IMAGE, "/x");
        assert_eq!(decode(&d), Err(WireError::Missing("other_shim_patched")));
        d.set_str(key::OTHER_SHIM_PATCHED, "sideways");
        assert_eq!(decode(&d), Err(WireError::BadField("other_shim_patched")));
    }

    #[test]
    fn an_unlock_without_capabilities_is_malformed() {
        let mut d = MapDict::default();
        encode(
            &Message::Verdict(VerdictMsg {
                capabilities: None,
                ..verdict()
            }),
            &mut d,
        );
        assert_eq!(decode(&d), Err(WireError::Missing("apple_family_max")));
    }

    #[test]
    fn a_value_of_the_wrong_type_is_refused() {
        let mut d = MapDict::default();
        encode(&Message::Verdict(verdict()), &mut d);
        d.0.insert(key::DECISION_ID, DictValue::Str(b"42".to_vec()));
        assert_eq!(decode(&d), Err(WireError::BadField("decision_id")));
        d.0.insert(key::DECISION_ID, DictValue::Other);
        assert_eq!(decode(&d), Err(WireError::BadField("decision_id")));
    }

    #[test]
    fn another_version_or_kind_is_refused_and_unknown_keys_ignored() {
        let mut d = MapDict::default();
        encode(&Message::StatusRequest, &mut d);
        d.0.insert(c"from.the.future", DictValue::Bool(true));
        assert_eq!(decode(&d), Ok(Message::StatusRequest));
        d.0.insert(key::KIND, DictValue::Str(b"reboot".to_vec()));
        assert_eq!(decode(&d), Err(WireError::BadField("kind")));
        d.0.insert(key::VERSION, DictValue::U64(9));
        assert_eq!(decode(&d), Err(WireError::Version(9)));
        d.0.remove(key::VERSION);
        assert_eq!(decode(&d), Err(WireError::Missing("metalift.version")));
    }

    #[test]
    fn strings_beyond_the_frame_budget_are_cut_on_encode_and_refused_on_decode() {
        let msg = Message::CheckIn(CheckIn {
            shim_version: "é".repeat(MAX_FRAME),
            arch: "arm64e".into(),
            claimed_executable: None,
            job: None,
        });
        let mut d = MapDict::default();
        encode(&msg, &mut d);
        let Ok(Message::CheckIn(c)) = decode(&d) else {
            panic!("a cut message still decodes")
        };
        // The budget is shared: "check_in" (the kind) was charged first.
        assert_eq!(c.shim_version.len(), MAX_FRAME - "check_in".len());
        assert!(c.shim_version.chars().all(|ch| ch == 'é'));
        assert_eq!(c.arch, "", "nothing is left of the budget");

        d.0.insert(key::ARCH, DictValue::Str(b"a".to_vec()));
        assert!(matches!(decode(&d), Err(WireError::Oversize(_))));
        d.0.insert(key::SHIM_VERSION, DictValue::LongStr(MAX_FRAME * 4));
        assert_eq!(decode(&d), Err(WireError::Oversize(MAX_FRAME * 4)));
    }

    #[test]
    fn strings_are_cut_at_a_nul_and_must_be_utf8() {
        let mut d = MapDict::default();
        encode(
            &Message::CheckIn(CheckIn {
                shim_version: "0.1.0".into(),
                arch: "arm64\0e".into(),
                claimed_executable: None,
                job: None,
            }),
            &mut d,
        );
        let Ok(Message::CheckIn(c)) = decode(&d) else {
            panic!("decodes")
        };
        assert_eq!(c.arch, "arm64");
        d.0.insert(key::ARCH, DictValue::Str(vec![0xff, 0xfe]));
        assert_eq!(decode(&d), Err(WireError::BadField("arch")));
    }
}
