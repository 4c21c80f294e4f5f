//! The check-in wire protocol between libmetalift, metaliftd and the admin CLI.
//!
//! On a Unix socket every message is one frame:
//!
//! ```text
//! frame  := length:u32-le  body            (2 <= length <= MAX_FRAME)
//! body   := version:u8  kind:u8  field*
//! field  := tag:u8  len:u16-le  value[len]
//! ```
//!
//! Integers are little-endian `u64` (8 bytes), strings are UTF-8, flags one byte
//! (0 or 1). Unknown tags are skipped (newer peers may add fields); a repeated tag, a
//! missing required field, a truncated field or a wrong-sized integer is an error.
//! On macOS the same [`Message`] rides an XPC dictionary instead (see the daemon's
//! XPC transport); only this module knows the byte layout.
//!
//! Nothing a client says here is trusted: the daemon learns who is asking from
//! the kernel, and logs the client's own claims only as advisory.

use crate::profile::Capabilities;
use crate::verdict::Mode;

mod client;
pub use client::{Client, ClientError};

/// The protocol version this build speaks. A peer with another version is refused.
pub const PROTOCOL_VERSION: u8 = 1;
/// The largest frame body accepted, in bytes. Paths are bounded by `PATH_MAX` (4096).
pub const MAX_FRAME: usize = 16 * 1024;
/// Bytes in the length prefix.
pub const LENGTH_PREFIX: usize = 4;

/// The Metal GPU families the shim reads and reports, in bit order for [`Answers::families`].
pub const KNOWN_FAMILIES: [(&str, i64); 16] = [
    ("Apple1", 1001),
    ("Apple2", 1002),
    ("Apple3", 1003),
    ("Apple4", 1004),
    ("Apple5", 1005),
    ("Apple6", 1006),
    ("Apple7", 1007),
    ("Apple8", 1008),
    ("Apple9", 1009),
    ("Apple10", 1010),
    ("Mac2", 2002),
    ("Common1", 3001),
    ("Common2", 3002),
    ("Common3", 3003),
    ("Metal3", 5001),
    ("Metal4", 5002),
];

/// A decoding failure. Every variant means "close this connection".
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WireError {
    /// The length prefix announces more than [`MAX_FRAME`] bytes.
    Oversize(usize),
    /// The body is shorter than its header.
    Truncated,
    /// The peer speaks another protocol version.
    Version(u8),
    /// The kind byte names no message.
    UnknownKind(u8),
    /// A field is malformed (repeated, wrong size, bad UTF-8, bad enum value).
    BadField(&'static str),
    /// A required field is absent.
    Missing(&'static str),
}

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WireError::Oversize(n) => {
                write!(f, "frame of {n} bytes exceeds the {MAX_FRAME}-byte limit")
            }
            WireError::Truncated => write!(f, "truncated frame"),
            WireError::Version(v) => write!(
                f,
                "protocol version {v} (this build speaks {PROTOCOL_VERSION})"
            ),
            WireError::UnknownKind(k) => write!(f, "unknown message kind {k}"),
            WireError::BadField(name) => write!(f, "malformed field `{name}`"),
            WireError::Missing(name) => write!(f, "missing field `{name}`"),
        }
    }
}

impl std::error::Error for WireError {}

/// Shim → daemon, sent once from the shim's constructor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CheckIn {
    /// The shim's version string (advisory, logged).
    pub shim_version: String,
    /// The shim's architecture, e.g. `arm64e` (advisory, logged).
    pub arch: String,
    /// What the client claims its executable is (advisory, logged, never matched).
    pub claimed_executable: Option<String>,
    /// The CI job the client claims to run in: `NAME=value` lines from its own
    /// environment (advisory, logged, never matched: [`crate::job`]). Absent from
    /// older shims.
    pub job: Option<String>,
}

/// What the daemon tells the shim to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WireAction {
    /// Install the hooks with the verdict's capabilities.
    Unlock,
    /// Stay stock.
    Stock,
}

/// Daemon → shim: the decision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerdictMsg {
    /// Identifies this decision in the audit log; echoed by the outcome.
    pub decision_id: u64,
    /// Unlock or stock. Unlock always carries `capabilities`.
    pub action: WireAction,
    /// The profile's values (present iff `action` is unlock).
    pub capabilities: Option<Capabilities>,
    /// The profile's name.
    pub profile: Option<String>,
    /// The winning rule's id, if any.
    pub rule: Option<String>,
    /// The policy's mode.
    pub mode: Mode,
    /// In monitor mode: the rule would have unlocked.
    pub would_unlock: bool,
}

/// How the shim's work ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum OutcomeResult {
    /// The hooks are installed and answering with the profile.
    Applied,
    /// The process stays stock (verdict said so, or no verdict in time): where
    /// every process starts, so the default.
    #[default]
    Stock,
    /// Installing the hooks failed; everything was rolled back, the process is stock.
    Failed,
}

impl OutcomeResult {
    /// The word used in the audit log.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            OutcomeResult::Applied => "applied",
            OutcomeResult::Stock => "stock",
            OutcomeResult::Failed => "failed",
        }
    }
}

/// A device's answers, as read by the shim.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Answers {
    /// Bit `i` set ⇔ `supportsFamily:` said YES for [`KNOWN_FAMILIES`]`[i]`.
    pub families: u32,
    /// `maxThreadgroupMemoryLength`.
    pub threadgroup_memory: u64,
    /// `recommendedMaxWorkingSetSize`.
    pub working_set: u64,
}

impl Answers {
    /// Names of the families answered YES, in [`KNOWN_FAMILIES`] order.
    pub fn family_names(&self) -> impl Iterator<Item = &'static str> + '_ {
        KNOWN_FAMILIES
            .iter()
            .enumerate()
            .filter(|(i, _)| self.families & (1 << i) != 0)
            .map(|(_, (name, _))| *name)
    }
}

/// Shim → daemon: what the shim actually did.
///
/// `Default` is a stock outcome with nothing said: callers outside the codec
/// build one with `..Default::default()`, so a new optional field touches only
/// the codecs, the record and the schema.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Outcome {
    /// The decision this reports on (0 when no verdict arrived).
    pub decision_id: u64,
    /// Applied, stock or failed.
    pub result: OutcomeResult,
    /// Why stock or failed (empty when applied).
    pub reason: String,
    /// The live device's concrete class, e.g. `AppleParavirtDevice`.
    pub device_class: String,
    /// The answers through the IMPs the shim found when it looked, before the
    /// original `-initGPUFamilySupport` ran: Metal's own (stock), unless
    /// `other_shim` says another shim's were already there
    /// ([`OtherShimPatched::Before`]): then they are the answers as found.
    pub stock: Answers,
    /// The answers the process now sees.
    pub effective: Answers,
    /// Another shim's IMPs on the capability methods, found by the image that
    /// holds them (neither Metal's own nor metalift's). Absent: none (and from
    /// older shims, which did not look).
    pub other_shim: Option<OtherShim>,
}

/// Another shim found on the capability methods (e.g. Cua's
/// `LumeMetalCapabilities`), which metalift never rolls back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtherShim {
    /// The path of the image holding its IMPs (`dladdr`'s `dli_fname`).
    pub image: String,
    /// The selectors whose IMP was its, e.g. `["supportsFamily:"]`. On the wire
    /// they are joined with `,` (a selector holds none).
    pub methods: Vec<String>,
    /// Whether it patched before metalift looked or over metalift's patch.
    pub patched: OtherShimPatched,
}

/// When another shim patched, relative to metalift.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtherShimPatched {
    /// Its IMPs were there when metalift looked: the outcome's `stock` answers
    /// are the answers as found (through it), not Metal's own.
    Before,
    /// It patched over metalift's (or over Metal's, while the original ran):
    /// the effective answers are its; metalift left its IMPs in place.
    After,
}

impl OtherShimPatched {
    /// The word in the audit log and on XPC.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            OtherShimPatched::Before => "before",
            OtherShimPatched::After => "after",
        }
    }
}

/// Every message of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Shim → daemon at load time.
    CheckIn(CheckIn),
    /// Daemon → shim.
    Verdict(VerdictMsg),
    /// Shim → daemon after the first device init.
    Outcome(Outcome),
    /// Admin CLI → daemon: counts only.
    StatusRequest,
    /// Daemon → admin CLI: a JSON document of counters and policy facts.
    Status(String),
    /// Daemon → shim, instead of a verdict: the daemon will not decide on this
    /// connection, and says at once why, so the shim never waits out its deadline
    /// for an answer that cannot come.
    Declined(Declined),
}

/// Why the daemon declined a check-in (see [`Declined`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeclineReason {
    /// The daemon cannot identify callers on this transport (XPC off, or this macOS
    /// lacks the per-message audit token): check in again on the Unix socket, within
    /// the same deadline.
    UseSocket,
    /// Every place for a waiting check-in is taken: stay stock now, without waiting.
    Busy,
}

impl DeclineReason {
    /// The word on the wire (XPC) and in logs.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            DeclineReason::UseSocket => "use_socket",
            DeclineReason::Busy => "busy",
        }
    }
}

/// Daemon → shim: a refusal the shim understands (never a silent close).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Declined {
    /// What the shim is to do about it.
    pub reason: DeclineReason,
    /// Free text for the shim's log line (advisory).
    pub detail: String,
}

impl Message {
    /// The message's kind in words, for logs and refusals ("check-in", "status request").
    #[must_use]
    pub fn kind_name(&self) -> &'static str {
        match self {
            Message::CheckIn(_) => "check-in",
            Message::Verdict(_) => "verdict",
            Message::Outcome(_) => "outcome",
            Message::StatusRequest => "status request",
            Message::Status(_) => "status",
            Message::Declined(_) => "declined",
        }
    }
}

mod kind {
    pub const CHECK_IN: u8 = 1;
    pub const VERDICT: u8 = 2;
    pub const OUTCOME: u8 = 3;
    pub const STATUS_REQUEST: u8 = 4;
    pub const STATUS: u8 = 5;
    pub const DECLINED: u8 = 6;
}

mod tag {
    pub const SHIM_VERSION: u8 = 1;
    pub const ARCH: u8 = 2;
    pub const CLAIMED_EXE: u8 = 3;
    pub const JOB: u8 = 9;
    pub const DECISION_ID: u8 = 10;
    pub const ACTION: u8 = 11;
    pub const FAMILY_MAX: u8 = 12;
    pub const TG_MEMORY: u8 = 13;
    pub const WORKING_SET: u8 = 14;
    pub const PROFILE: u8 = 15;
    pub const RULE: u8 = 16;
    pub const MODE: u8 = 17;
    pub const WOULD_UNLOCK: u8 = 18;
    pub const RESULT: u8 = 20;
    pub const REASON: u8 = 21;
    pub const DEVICE_CLASS: u8 = 22;
    pub const STOCK_FAMILIES: u8 = 23;
    pub const STOCK_TG: u8 = 24;
    pub const STOCK_WS: u8 = 25;
    pub const EFF_FAMILIES: u8 = 26;
    pub const EFF_TG: u8 = 27;
    pub const EFF_WS: u8 = 28;
    pub const OTHER_SHIM_IMAGE: u8 = 29;
    pub const OTHER_SHIM_METHODS: u8 = 31;
    pub const OTHER_SHIM_PATCHED: u8 = 32;
    pub const JSON: u8 = 30;
    pub const DECLINE_REASON: u8 = 40;
}

/// Encodes `msg` as one length-prefixed frame. Strings longer than a field can hold
/// are cut at a character boundary (paths and reasons are advisory text).
#[must_use]
pub fn encode_frame(msg: &Message) -> Vec<u8> {
    let mut body = Body::new(msg);
    match msg {
        Message::CheckIn(c) => {
            body.str(tag::SHIM_VERSION, &c.shim_version);
            body.str(tag::ARCH, &c.arch);
            if let Some(exe) = &c.claimed_executable {
                body.str(tag::CLAIMED_EXE, exe);
            }
            if let Some(job) = &c.job {
                body.str(tag::JOB, job);
            }
        }
        Message::Verdict(v) => {
            body.u64(tag::DECISION_ID, v.decision_id);
            body.u8(tag::ACTION, matches!(v.action, WireAction::Unlock) as u8);
            if let Some(caps) = &v.capabilities {
                body.u64(tag::FAMILY_MAX, u64::from(caps.apple_family_max));
                body.u64(tag::TG_MEMORY, caps.max_threadgroup_memory);
                if let Some(ws) = caps.recommended_working_set {
                    body.u64(tag::WORKING_SET, ws);
                }
            }
            if let Some(p) = &v.profile {
                body.str(tag::PROFILE, p);
            }
            if let Some(r) = &v.rule {
                body.str(tag::RULE, r);
            }
            body.u8(tag::MODE, matches!(v.mode, Mode::Monitor) as u8);
            body.u8(tag::WOULD_UNLOCK, v.would_unlock as u8);
        }
        Message::Outcome(o) => {
            body.u64(tag::DECISION_ID, o.decision_id);
            body.u8(
                tag::RESULT,
                match o.result {
                    OutcomeResult::Applied => 0,
                    OutcomeResult::Stock => 1,
                    OutcomeResult::Failed => 2,
                },
            );
            body.str(tag::REASON, &o.reason);
            body.str(tag::DEVICE_CLASS, &o.device_class);
            body.u64(tag::STOCK_FAMILIES, u64::from(o.stock.families));
            body.u64(tag::STOCK_TG, o.stock.threadgroup_memory);
            body.u64(tag::STOCK_WS, o.stock.working_set);
            body.u64(tag::EFF_FAMILIES, u64::from(o.effective.families));
            body.u64(tag::EFF_TG, o.effective.threadgroup_memory);
            body.u64(tag::EFF_WS, o.effective.working_set);
            if let Some(other) = &o.other_shim {
                body.str(tag::OTHER_SHIM_IMAGE, &other.image);
                body.str(tag::OTHER_SHIM_METHODS, &other.methods.join(","));
                body.u8(
                    tag::OTHER_SHIM_PATCHED,
                    match other.patched {
                        OtherShimPatched::Before => 0,
                        OtherShimPatched::After => 1,
                    },
                );
            }
        }
        Message::StatusRequest => {}
        Message::Status(json) => body.str(tag::JSON, json),
        Message::Declined(d) => {
            body.u8(
                tag::DECLINE_REASON,
                match d.reason {
                    DeclineReason::UseSocket => 1,
                    DeclineReason::Busy => 2,
                },
            );
            body.str(tag::REASON, &d.detail);
        }
    }
    body.finish()
}

/// Reads the body length from a frame's 4-byte prefix, refusing oversize frames
/// before anything else is read.
pub fn frame_length(prefix: [u8; LENGTH_PREFIX]) -> Result<usize, WireError> {
    let len = u32::from_le_bytes(prefix) as usize;
    if len > MAX_FRAME {
        return Err(WireError::Oversize(len));
    }
    if len < 2 {
        return Err(WireError::Truncated);
    }
    Ok(len)
}

/// Decodes one complete frame from the front of `buf`.
///
/// Returns `Ok(None)` when more bytes are needed, `Ok(Some((msg, used)))` with the
/// number of bytes consumed, or an error that means the stream is unusable.
pub fn decode_frame(buf: &[u8]) -> Result<Option<(Message, usize)>, WireError> {
    let Some(prefix) = buf.get(..LENGTH_PREFIX) else {
        return Ok(None);
    };
    let mut p = [0u8; LENGTH_PREFIX];
    p.copy_from_slice(prefix);
    let len = frame_length(p)?;
    let Some(body) = buf.get(LENGTH_PREFIX..LENGTH_PREFIX + len) else {
        return Ok(None);
    };
    Ok(Some((decode_body(body)?, LENGTH_PREFIX + len)))
}

/// Decodes a frame body (without its length prefix).
pub fn decode_body(body: &[u8]) -> Result<Message, WireError> {
    if body.len() > MAX_FRAME {
        return Err(WireError::Oversize(body.len()));
    }
    let (&version, rest) = body.split_first().ok_or(WireError::Truncated)?;
    if version != PROTOCOL_VERSION {
        return Err(WireError::Version(version));
    }
    let (&kind, rest) = rest.split_first().ok_or(WireError::Truncated)?;
    let f = Fields::parse(rest)?;
    match kind {
        kind::CHECK_IN => Ok(Message::CheckIn(CheckIn {
            shim_version: f
                .str(tag::SHIM_VERSION, "shim_version")?
                .unwrap_or_default(),
            arch: f.str(tag::ARCH, "arch")?.unwrap_or_default(),
            claimed_executable: f.str(tag::CLAIMED_EXE, "claimed_executable")?,
            job: f.str(tag::JOB, "job")?,
        })),
        kind::VERDICT => {
            let action = match f.required_u8(tag::ACTION, "action")? {
                0 => WireAction::Stock,
                1 => WireAction::Unlock,
                _ => return Err(WireError::BadField("action")),
            };
            let capabilities = match f.u64(tag::FAMILY_MAX, "apple_family_max")? {
                Some(max) => Some(Capabilities {
                    apple_family_max: u8::try_from(max)
                        .map_err(|_| WireError::BadField("apple_family_max"))?,
                    max_threadgroup_memory: f
                        .u64(tag::TG_MEMORY, "max_threadgroup_memory")?
                        .ok_or(WireError::Missing("max_threadgroup_memory"))?,
                    recommended_working_set: f.u64(tag::WORKING_SET, "recommended_working_set")?,
                }),
                None => None,
            };
            if action == WireAction::Unlock && capabilities.is_none() {
                return Err(WireError::Missing("apple_family_max"));
            }
            Ok(Message::Verdict(VerdictMsg {
                decision_id: f.required_u64(tag::DECISION_ID, "decision_id")?,
                action,
                capabilities,
                profile: f.str(tag::PROFILE, "profile")?,
                rule: f.str(tag::RULE, "rule")?,
                mode: match f.required_u8(tag::MODE, "mode")? {
                    0 => Mode::Enforce,
                    1 => Mode::Monitor,
                    _ => return Err(WireError::BadField("mode")),
                },
                would_unlock: f.flag(tag::WOULD_UNLOCK, "would_unlock")?,
            }))
        }
        kind::OUTCOME => {
            let families = |t, name| -> Result<u32, WireError> {
                u32::try_from(f.u64(t, name)?.unwrap_or(0)).map_err(|_| WireError::BadField(name))
            };
            Ok(Message::Outcome(Outcome {
                decision_id: f.required_u64(tag::DECISION_ID, "decision_id")?,
                result: match f.required_u8(tag::RESULT, "result")? {
                    0 => OutcomeResult::Applied,
                    1 => OutcomeResult::Stock,
                    2 => OutcomeResult::Failed,
                    _ => return Err(WireError::BadField("result")),
                },
                reason: f.str(tag::REASON, "reason")?.unwrap_or_default(),
                device_class: f
                    .str(tag::DEVICE_CLASS, "device_class")?
                    .unwrap_or_default(),
                stock: Answers {
                    families: families(tag::STOCK_FAMILIES, "stock_families")?,
                    threadgroup_memory: f
                        .u64(tag::STOCK_TG, "stock_threadgroup_memory")?
                        .unwrap_or(0),
                    working_set: f.u64(tag::STOCK_WS, "stock_working_set")?.unwrap_or(0),
                },
                effective: Answers {
                    families: families(tag::EFF_FAMILIES, "effective_families")?,
                    threadgroup_memory: f
                        .u64(tag::EFF_TG, "effective_threadgroup_memory")?
                        .unwrap_or(0),
                    working_set: f.u64(tag::EFF_WS, "effective_working_set")?.unwrap_or(0),
                },
                other_shim: other_shim(&f)?,
            }))
        }
        kind::STATUS_REQUEST => Ok(Message::StatusRequest),
        kind::STATUS => Ok(Message::Status(
            f.str(tag::JSON, "json")?.unwrap_or_default(),
        )),
        kind::DECLINED => Ok(Message::Declined(Declined {
            reason: match f.required_u8(tag::DECLINE_REASON, "decline_reason")? {
                1 => DeclineReason::UseSocket,
                2 => DeclineReason::Busy,
                _ => return Err(WireError::BadField("decline_reason")),
            },
            detail: f.str(tag::REASON, "reason")?.unwrap_or_default(),
        })),
        other => Err(WireError::UnknownKind(other)),
    }
}

/// An outcome's `other_shim` fields: absent image, none; an image requires
/// `patched`; an empty methods list is allowed (an older encoder's cut).
fn other_shim(f: &Fields<'_>) -> Result<Option<OtherShim>, WireError> {
    let methods = f.str(tag::OTHER_SHIM_METHODS, "other_shim_methods")?;
    let patched = match f.raw(tag::OTHER_SHIM_PATCHED) {
        None => None,
        Some([0]) => Some(OtherShimPatched::Before),
        Some([1]) => Some(OtherShimPatched::After),
        Some(_) => return Err(WireError::BadField("other_shim_patched")),
    };
    let Some(image) = f.str(tag::OTHER_SHIM_IMAGE, "other_shim_image")? else {
        return Ok(None);
    };
    Ok(Some(OtherShim {
        image,
        methods: split_methods(methods.as_deref().unwrap_or("")),
        patched: patched.ok_or(WireError::Missing("other_shim_patched"))?,
    }))
}

/// The selectors of a `,`-joined list (empty entries dropped).
#[must_use]
pub fn split_methods(joined: &str) -> Vec<String> {
    joined
        .split(',')
        .filter(|m| !m.is_empty())
        .map(str::to_owned)
        .collect()
}

/// Builds a frame body field by field, then prefixes its length.
struct Body {
    buf: Vec<u8>,
}

impl Body {
    fn new(msg: &Message) -> Self {
        let kind = match msg {
            Message::CheckIn(_) => kind::CHECK_IN,
            Message::Verdict(_) => kind::VERDICT,
            Message::Outcome(_) => kind::OUTCOME,
            Message::StatusRequest => kind::STATUS_REQUEST,
            Message::Status(_) => kind::STATUS,
            Message::Declined(_) => kind::DECLINED,
        };
        let mut buf = Vec::with_capacity(128);
        buf.extend_from_slice(&[0; LENGTH_PREFIX]);
        buf.push(PROTOCOL_VERSION);
        buf.push(kind);
        Body { buf }
    }

    fn field(&mut self, tag: u8, value: &[u8]) {
        // Keep the whole frame within MAX_FRAME: a field that would not fit is cut.
        let room = (MAX_FRAME + LENGTH_PREFIX).saturating_sub(self.buf.len() + 3);
        let len = value.len().min(room).min(usize::from(u16::MAX));
        if room == 0 {
            return;
        }
        self.buf.push(tag);
        self.buf.extend_from_slice(&(len as u16).to_le_bytes());
        self.buf.extend_from_slice(&value[..len]);
    }

    fn str(&mut self, tag: u8, value: &str) {
        let room = (MAX_FRAME + LENGTH_PREFIX).saturating_sub(self.buf.len() + 3);
        let mut end = value.len().min(room).min(usize::from(u16::MAX));
        while !value.is_char_boundary(end) {
            end -= 1;
        }
        self.field(tag, &value.as_bytes()[..end]);
    }

    fn u64(&mut self, tag: u8, value: u64) {
        self.field(tag, &value.to_le_bytes());
    }

    fn u8(&mut self, tag: u8, value: u8) {
        self.field(tag, &[value]);
    }

    fn finish(mut self) -> Vec<u8> {
        let len = (self.buf.len() - LENGTH_PREFIX) as u32;
        self.buf[..LENGTH_PREFIX].copy_from_slice(&len.to_le_bytes());
        self.buf
    }
}

/// The fields of one body, indexed by tag (at most one value per tag).
struct Fields<'a> {
    by_tag: [Option<&'a [u8]>; 256],
}

impl<'a> Fields<'a> {
    fn parse(mut rest: &'a [u8]) -> Result<Self, WireError> {
        let mut by_tag = [None; 256];
        while !rest.is_empty() {
            if rest.len() < 3 {
                return Err(WireError::Truncated);
            }
            let tag = rest[0];
            let len = usize::from(u16::from_le_bytes([rest[1], rest[2]]));
            let value = rest.get(3..3 + len).ok_or(WireError::Truncated)?;
            let slot = &mut by_tag[usize::from(tag)];
            if slot.is_some() {
                return Err(WireError::BadField("repeated tag"));
            }
            *slot = Some(value);
            rest = &rest[3 + len..];
        }
        Ok(Fields { by_tag })
    }

    fn raw(&self, tag: u8) -> Option<&'a [u8]> {
        self.by_tag[usize::from(tag)]
    }

    fn str(&self, tag: u8, name: &'static str) -> Result<Option<String>, WireError> {
        self.raw(tag)
            .map(|v| {
                std::str::from_utf8(v)
                    .map(str::to_owned)
                    .map_err(|_| WireError::BadField(name))
            })
            .transpose()
    }

    fn u64(&self, tag: u8, name: &'static str) -> Result<Option<u64>, WireError> {
        self.raw(tag)
            .map(|v| {
                <[u8; 8]>::try_from(v)
                    .map(u64::from_le_bytes)
                    .map_err(|_| WireError::BadField(name))
            })
            .transpose()
    }

    fn required_u64(&self, tag: u8, name: &'static str) -> Result<u64, WireError> {
        self.u64(tag, name)?.ok_or(WireError::Missing(name))
    }

    fn required_u8(&self, tag: u8, name: &'static str) -> Result<u8, WireError> {
        match self.raw(tag) {
            Some([b]) => Ok(*b),
            Some(_) => Err(WireError::BadField(name)),
            None => Err(WireError::Missing(name)),
        }
    }

    fn flag(&self, tag: u8, name: &'static str) -> Result<bool, WireError> {
        match self.raw(tag) {
            None | Some([0]) => Ok(false),
            Some([1]) => Ok(true),
            Some(_) => Err(WireError::BadField(name)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round_trip(msg: Message) {
        let frame = encode_frame(&msg);
        let (decoded, used) = decode_frame(&frame).expect("decodes").expect("complete");
        assert_eq!(used, frame.len());
        assert_eq!(decoded, msg);
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
    fn every_message_kind_survives_a_round_trip() {
        round_trip(Message::CheckIn(CheckIn {
            shim_version: "0.1.0".into(),
            arch: "arm64e".into(),
            claimed_executable: Some("/usr/bin/llama".into()),
            job: None,
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
            ..Default::default()
        }));
        for patched in [OtherShimPatched::Before, OtherShimPatched::After] {
            round_trip(Message::Outcome(Outcome {
                other_shim: Some(OtherShim {
                    image: "/usr/local/lib/libLumeMetalCapabilities.dylib".into(),
                    methods: vec![
                        "supportsFamily:".into(),
                        "maxThreadgroupMemoryLength".into(),
                    ],
                    patched,
                }),
                ..outcome()
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

    fn outcome() -> Outcome {
        Outcome {
            decision_id: 7,
            result: OutcomeResult::Applied,
            reason: String::new(),
            device_class: "AppleParavirtDevice".into(),
            stock: Answers::default(),
            effective: Answers::default(),
            ..Default::default()
        }
    }

    /// Re-frames `body` (after the version and kind bytes) with extra raw fields.
    fn with_fields(msg: &Message, extra: &[u8]) -> Vec<u8> {
        let mut frame = encode_frame(msg);
        frame.extend_from_slice(extra);
        let len = (frame.len() - LENGTH_PREFIX) as u32;
        frame[..4].copy_from_slice(&len.to_le_bytes());
        frame
    }

    #[test]
    fn an_outcome_without_other_shim_fields_reads_as_none_the_way_an_older_shim_sends_it() {
        // An older shim sends exactly the fields up to tag 28.
        let frame = encode_frame(&Message::Outcome(outcome()));
        let with_one = encode_frame(&Message::Outcome(Outcome {
            other_shim: Some(OtherShim {
                image: "/x".into(),
                methods: vec!["supportsFamily:".into()],
                patched: OtherShimPatched::Before,
            }),
            ..outcome()
        }));
        // The new fields only follow the old ones: an older daemon skips them.
        assert!(with_one[LENGTH_PREFIX..].starts_with(&frame[LENGTH_PREFIX..]));
        let Message::Outcome(o) = decode_frame(&frame).unwrap().unwrap().0 else {
            panic!()
        };
        assert_eq!(o.other_shim, None);
    }

    #[test]
    fn an_other_shim_image_without_its_order_or_with_a_bad_one_is_malformed() {
        let image = [&[tag::OTHER_SHIM_IMAGE, 1, 0][..], b"x"].concat();
        let msg = Message::Outcome(outcome());
        assert_eq!(
            decode_frame(&with_fields(&msg, &image)),
            Err(WireError::Missing("other_shim_patched"))
        );
        let bad = [&image[..], &[tag::OTHER_SHIM_PATCHED, 1, 0, 2]].concat();
        assert_eq!(
            decode_frame(&with_fields(&msg, &bad)),
            Err(WireError::BadField("other_shim_patched"))
        );
        let good = [&image[..], &[tag::OTHER_SHIM_PATCHED, 1, 0, 1]].concat();
        let Message::Outcome(o) = decode_frame(&with_fields(&msg, &good)).unwrap().unwrap().0
        else {
            panic!()
        };
        assert_eq!(
            o.other_shim,
            Some(OtherShim {
                image: "x".into(),
                methods: vec![],
                patched: OtherShimPatched::After
            })
        );
    }

    #[test]
    fn a_partial_frame_asks_for_more_bytes() {
        let frame = encode_frame(&Message::Verdict(verdict()));
        for cut in 0..frame.len() {
            assert_eq!(decode_frame(&frame[..cut]), Ok(None), "cut at {cut}");
        }
    }

    #[test]
    fn an_oversize_length_is_refused_before_reading_the_body() {
        let prefix = ((MAX_FRAME + 1) as u32).to_le_bytes();
        assert_eq!(
            decode_frame(&prefix),
            Err(WireError::Oversize(MAX_FRAME + 1))
        );
    }

    #[test]
    fn another_protocol_version_is_refused() {
        let mut frame = encode_frame(&Message::StatusRequest);
        frame[LENGTH_PREFIX] = PROTOCOL_VERSION + 1;
        assert_eq!(
            decode_frame(&frame),
            Err(WireError::Version(PROTOCOL_VERSION + 1))
        );
    }

    #[test]
    fn an_unlock_without_capabilities_is_malformed() {
        let msg = Message::Verdict(VerdictMsg {
            capabilities: None,
            ..verdict()
        });
        let frame = encode_frame(&msg);
        assert_eq!(
            decode_frame(&frame),
            Err(WireError::Missing("apple_family_max"))
        );
    }

    #[test]
    fn unknown_tags_are_skipped_and_repeated_tags_refused() {
        let mut frame = encode_frame(&Message::StatusRequest);
        frame.extend_from_slice(&[200, 2, 0, b'h', b'i']);
        let len = (frame.len() - LENGTH_PREFIX) as u32;
        frame[..4].copy_from_slice(&len.to_le_bytes());
        assert_eq!(
            decode_frame(&frame).unwrap().unwrap().0,
            Message::StatusRequest
        );

        frame.extend_from_slice(&[200, 0, 0]);
        let len = (frame.len() - LENGTH_PREFIX) as u32;
        frame[..4].copy_from_slice(&len.to_le_bytes());
        assert_eq!(
            decode_frame(&frame),
            Err(WireError::BadField("repeated tag"))
        );
    }

    #[test]
    fn overlong_strings_are_cut_to_fit_a_frame() {
        let msg = Message::CheckIn(CheckIn {
            shim_version: "é".repeat(MAX_FRAME),
            arch: "x".into(),
            claimed_executable: None,
            job: None,
        });
        let frame = encode_frame(&msg);
        assert!(frame.len() <= MAX_FRAME + LENGTH_PREFIX);
        let Message::CheckIn(c) = decode_frame(&frame).unwrap().unwrap().0 else {
            panic!()
        };
        assert!(c.shim_version.chars().all(|ch| ch == 'é'));
    }
}
