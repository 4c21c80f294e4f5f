//! Safe wrappers over the shim's pure C helpers (`shim/c/wire.c`,
//! `shim/c/config.c`, `shim/c/macho.c`, ...), for the cross-implementation tests and the fuzz target.
//! The one module with `unsafe` in this crate; every call is a plain function
//! over buffers this module owns.

use std::ffi::{c_char, CStr, CString};

use metalift_policy::profile::Capabilities;
use metalift_policy::verdict::Mode;
use metalift_policy::wire::{
    Answers, DeclineReason, Message, OtherShimPatched, Outcome, OutcomeResult, VerdictMsg,
    WireAction, WireError,
};

/// The C helpers' declarations, generated from `c/metalift_shim.h` by bindgen
/// (build.rs `generate_bindings`): `struct ml_outcome` and the others have no
/// hand-kept copy here, so a field added in C is a field here.
#[allow(
    non_camel_case_types,
    non_upper_case_globals,
    dead_code,
    unreachable_pub,
    clippy::all,
    clippy::pedantic,
    // bindgen's `Default` impls zero the structs in unsafe blocks it does not
    // comment: all-zero is a valid value of every one (integers, NULL pointers).
    clippy::undocumented_unsafe_blocks
)]
mod ffi {
    include!(concat!(env!("OUT_DIR"), "/c_bindings.rs"));
}

use ffi::{
    ml_answers, ml_config_agent_dir_trustworthy, ml_config_parse_timeout, ml_config_socket_path,
    ml_expected_answers, ml_job_format, ml_known_family, ml_macho_holds, ml_macho_is_metal,
    ml_other_shim, ml_outcome, ml_verdict, ml_wire_decode_verdict, ml_wire_encode_check_in,
    ml_wire_encode_check_in_job, ml_wire_encode_outcome, ml_wire_error, ml_wire_frame_length,
    ml_xpc_next_step,
};

/// The header's bytes the C may read (32 + sizeofcmds), if `image` holds them.
fn macho_readable(image: &[u8]) -> bool {
    let Some(size) = image.get(20..24) else {
        return false;
    };
    let sizeofcmds = u32::from_le_bytes([size[0], size[1], size[2], size[3]]) as usize;
    image.len() >= 32 + sizeofcmds
}

/// `ml_macho_is_metal` on a 64-bit Mach-O header laid out at the start of
/// `image` (false if `image` is shorter than its load commands).
pub fn macho_is_metal(image: &[u8]) -> bool {
    // SAFETY: the C reads at most 32 + sizeofcmds bytes from `image`, checked here.
    macho_readable(image) && unsafe { ml_macho_is_metal(image.as_ptr().cast()) }
}

/// `ml_macho_holds`: whether the address `offset` bytes from the header at the
/// start of `image` lies in one of that image's segments, the image taken as
/// mapped where `image` is (the address is compared, never read).
pub fn macho_holds(image: &[u8], offset: isize) -> bool {
    let addr = image.as_ptr().wrapping_offset(offset);
    // SAFETY: the C reads at most 32 + sizeofcmds bytes from `image`, checked
    // here; `addr` is only compared.
    macho_readable(image) && unsafe { ml_macho_holds(image.as_ptr().cast(), addr.cast()) }
}

/// Why the C decoder refused a frame: `enum ml_wire_status` with its detail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CWireError {
    /// `ML_WIRE_OVERSIZE` (the announced or actual length).
    Oversize(u64),
    /// `ML_WIRE_TRUNCATED`.
    Truncated,
    /// `ML_WIRE_VERSION` (the version byte).
    Version(u8),
    /// `ML_WIRE_BAD_FIELD` (the field name wire.rs would give).
    BadField(String),
    /// `ML_WIRE_MISSING` (the field name).
    Missing(String),
    /// `ML_WIRE_NOT_VERDICT`: a message of this kind, which the shim never
    /// receives (its fields unread).
    NotVerdict(u8),
    /// `ML_WIRE_DECLINED`: a well-formed `Declined` (1 use the socket, 2 busy).
    Declined(u8),
}

/// Whether the C verdict decoder's answer `c` keeps to what the Rust
/// reference (`wire::decode_body`) says of the same body, `rust`: the C
/// accepts only what Rust accepts, with the same values (a verdict; a
/// `Declined`, as its reason code), and accepts every such message; anything
/// else it refuses, for whatever reason (it judges only the kinds the shim
/// receives, so its errors need not be Rust's).
pub fn accepts_as_rust_does(
    rust: &Result<Message, WireError>,
    c: &Result<VerdictMsg, CWireError>,
) -> bool {
    match (rust, c) {
        (Ok(Message::Verdict(r)), Ok(c)) => r == c,
        (Ok(Message::Declined(d)), Err(CWireError::Declined(code))) => {
            *code == declined_code(d.reason)
        }
        (Ok(Message::Verdict(_) | Message::Declined(_)), _) => false,
        (_, Ok(_) | Err(CWireError::Declined(_))) => false,
        (_, Err(_)) => true,
    }
}

/// `ML_DECLINED_USE_SOCKET` / `ML_DECLINED_BUSY`.
#[must_use]
pub fn declined_code(reason: DeclineReason) -> u8 {
    match reason {
        DeclineReason::UseSocket => ffi::ML_DECLINED_USE_SOCKET as u8,
        DeclineReason::Busy => ffi::ML_DECLINED_BUSY as u8,
    }
}

fn error(raw: ml_wire_error) -> Option<CWireError> {
    let field = || {
        if raw.field.is_null() {
            String::new()
        } else {
            // SAFETY: the C decoder's field names are static NUL-terminated strings.
            unsafe { CStr::from_ptr(raw.field) }
                .to_string_lossy()
                .into_owned()
        }
    };
    Some(match raw.status {
        ffi::ML_WIRE_OK => return None,
        ffi::ML_WIRE_OVERSIZE => CWireError::Oversize(raw.value),
        ffi::ML_WIRE_TRUNCATED => CWireError::Truncated,
        ffi::ML_WIRE_VERSION => CWireError::Version(raw.value as u8),
        ffi::ML_WIRE_BAD_FIELD => CWireError::BadField(field()),
        ffi::ML_WIRE_MISSING => CWireError::Missing(field()),
        ffi::ML_WIRE_DECLINED => CWireError::Declined(raw.value as u8),
        _ => CWireError::NotVerdict(raw.value as u8),
    })
}

/// `ml_known_family(index)`.
pub fn known_family(index: u32) -> i64 {
    // SAFETY: a pure lookup; out-of-range indexes return 0.
    unsafe { ml_known_family(index) }
}

/// `ml_wire_frame_length`: the body length a prefix announces.
pub fn frame_length(prefix: [u8; 4]) -> Result<usize, CWireError> {
    let mut len = 0usize;
    // SAFETY: `prefix` is 4 readable bytes; `len` is a valid out-pointer.
    let raw = unsafe { ml_wire_frame_length(prefix.as_ptr(), &mut len) };
    match error(raw) {
        None => Ok(len),
        Some(e) => Err(e),
    }
}

/// `ml_wire_decode_verdict` on a frame body, as the Rust type.
pub fn decode_verdict(body: &[u8]) -> Result<VerdictMsg, CWireError> {
    // SAFETY: `body` is readable for its length; `out` is the valid out-pointer
    // decode_with passes.
    decode_with(|out| unsafe { ml_wire_decode_verdict(body.as_ptr(), body.len(), out) })
}

/// Runs the C verdict decoder (`ml_wire_decode_verdict`), which fills the
/// out-pointer it is given, and reads its answer as the Rust type. The
/// decoder's strings must still be alive when it returns.
fn decode_with(
    decode: impl FnOnce(*mut ml_verdict) -> ml_wire_error,
) -> Result<VerdictMsg, CWireError> {
    let mut raw = std::mem::MaybeUninit::<ml_verdict>::zeroed();
    let status = decode(raw.as_mut_ptr());
    if let Some(e) = error(status) {
        return Err(e);
    }
    // SAFETY: zero-initialised above and written by the decoder.
    let v = unsafe { raw.assume_init() };
    let text = |ptr: *const c_char, len: usize| -> Option<String> {
        if ptr.is_null() {
            return None;
        }
        // SAFETY: the decoder points into its input, `len` bytes it checked as UTF-8.
        let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
        Some(String::from_utf8_lossy(bytes).into_owned())
    };
    Ok(VerdictMsg {
        decision_id: v.decision_id,
        action: if v.unlock == 1 {
            WireAction::Unlock
        } else {
            WireAction::Stock
        },
        capabilities: (v.has_caps == 1).then_some(Capabilities {
            apple_family_max: v.family_max,
            max_threadgroup_memory: v.tg_memory,
            recommended_working_set: (v.has_ws == 1).then_some(v.working_set),
        }),
        profile: text(v.profile, v.profile_len),
        rule: text(v.rule, v.rule_len),
        mode: if v.monitor == 1 {
            Mode::Monitor
        } else {
            Mode::Enforce
        },
        would_unlock: v.would_unlock == 1,
    })
}

fn c_string(s: &str) -> CString {
    CString::new(s.replace('\0', "")).expect("NULs removed")
}

/// `ml_wire_encode_check_in` with a buffer of `cap` bytes.
pub fn encode_check_in(version: &str, arch: &str, claimed: Option<&str>, cap: usize) -> Vec<u8> {
    let (version, arch) = (c_string(version), c_string(arch));
    let claimed = claimed.map(c_string);
    let mut buf = vec![0u8; cap.max(64)];
    // SAFETY: `buf` is writable for its length; the strings are NUL-terminated
    // and outlive the call; NULL means "absent".
    let n = unsafe {
        ml_wire_encode_check_in(
            buf.as_mut_ptr(),
            buf.len(),
            version.as_ptr(),
            arch.as_ptr(),
            claimed.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
        )
    };
    buf.truncate(n);
    buf
}

/// `ml_wire_encode_check_in_job` with a buffer of `cap` bytes.
pub fn encode_check_in_job(version: &str, arch: &str, job: Option<&str>, cap: usize) -> Vec<u8> {
    let (version, arch) = (c_string(version), c_string(arch));
    let job = job.map(c_string);
    let mut buf = vec![0u8; cap.max(64)];
    // SAFETY: `buf` is writable for its length; the strings are NUL-terminated
    // and outlive the call; NULL means "absent".
    let n = unsafe {
        ml_wire_encode_check_in_job(
            buf.as_mut_ptr(),
            buf.len(),
            version.as_ptr(),
            arch.as_ptr(),
            std::ptr::null(),
            job.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
        )
    };
    buf.truncate(n);
    buf
}

thread_local! {
    /// The environment `job_format` hands the C: name → value.
    static JOB_ENV: std::cell::RefCell<Vec<(CString, CString)>> = const { std::cell::RefCell::new(Vec::new()) };
}

extern "C" fn job_lookup(name: *const c_char) -> *const c_char {
    // SAFETY: job.c passes one of its NUL-terminated static names.
    let name = unsafe { CStr::from_ptr(name) };
    JOB_ENV.with(|env| {
        env.borrow()
            .iter()
            .find(|(n, _)| n.as_c_str() == name)
            // The CString lives in the thread-local until the next `job_format`.
            .map_or(std::ptr::null(), |(_, v)| v.as_ptr())
    })
}

/// `ml_job_format` over `env` (name, value) instead of the process environment,
/// with a buffer of `cap` bytes: the job text the shim would send.
pub fn job_format(env: &[(&str, &[u8])], cap: usize) -> Vec<u8> {
    JOB_ENV.with(|e| {
        *e.borrow_mut() = env
            .iter()
            .map(|(n, v)| {
                let v: Vec<u8> = v.iter().copied().filter(|&b| b != 0).collect();
                (c_string(n), CString::new(v).expect("NULs removed"))
            })
            .collect();
    });
    let mut buf = vec![0 as c_char; cap.max(1)];
    // SAFETY: `buf` is writable for its length; `job_lookup` returns NULL or a
    // NUL-terminated string that lives in JOB_ENV for the whole call.
    let n = unsafe { ml_job_format(buf.as_mut_ptr(), buf.len(), Some(job_lookup)) };
    buf.truncate(n);
    buf.into_iter().map(|c| c as u8).collect()
}

fn raw_answers(a: Answers) -> ml_answers {
    ml_answers {
        families: a.families,
        threadgroup_memory: a.threadgroup_memory,
        working_set: a.working_set,
    }
}

/// `ml_wire_encode_outcome` with a buffer of `cap` bytes.
pub fn encode_outcome(outcome: &Outcome, cap: usize) -> Vec<u8> {
    let mut buf = vec![0u8; cap.max(64)];
    let n = with_raw_outcome(outcome, |raw| {
        // SAFETY: `buf` is writable for its length; `raw` and its strings live across the call.
        unsafe { ml_wire_encode_outcome(buf.as_mut_ptr(), buf.len(), raw) }
    });
    buf.truncate(n);
    buf
}

/// Lends `outcome` as a `struct ml_outcome` (its strings alive for the call) to
/// the C encoder (`ml_wire_encode_outcome`).
fn with_raw_outcome<R>(outcome: &Outcome, encode: impl FnOnce(*const ml_outcome) -> R) -> R {
    let reason = c_string(&outcome.reason);
    let class = c_string(&outcome.device_class);
    let other = outcome.other_shim.as_ref();
    let other_image = other.map(|o| c_string(&o.image));
    let other_methods = other.map(|o| c_string(&o.methods.join(",")));
    let raw = ml_outcome {
        decision_id: outcome.decision_id,
        result: match outcome.result {
            OutcomeResult::Applied => ffi::ML_RESULT_APPLIED,
            OutcomeResult::Stock => ffi::ML_RESULT_STOCK,
            OutcomeResult::Failed => ffi::ML_RESULT_FAILED,
        } as u8,
        reason: reason.as_ptr(),
        device_class: class.as_ptr(),
        stock: raw_answers(outcome.stock),
        effective: raw_answers(outcome.effective),
        other: ml_other_shim {
            image: other_image
                .as_ref()
                .map_or(std::ptr::null(), |s| s.as_ptr()),
            methods: other_methods
                .as_ref()
                .map_or(std::ptr::null(), |s| s.as_ptr()),
            patched: match other.map(|o| o.patched) {
                Some(OtherShimPatched::After) => ffi::ML_OTHER_AFTER,
                _ => ffi::ML_OTHER_BEFORE,
            } as u8,
        },
    };
    encode(&raw)
}

/// `ml_expected_answers`: what a device answers with `caps` applied over `stock`.
pub fn expected_answers(caps: &Capabilities, stock: Answers) -> Answers {
    let verdict = ml_verdict {
        decision_id: 0,
        unlock: 1,
        has_caps: 1,
        family_max: caps.apple_family_max,
        has_ws: u8::from(caps.recommended_working_set.is_some()),
        tg_memory: caps.max_threadgroup_memory,
        working_set: caps.recommended_working_set.unwrap_or(0),
        ..ml_verdict::default()
    };
    // SAFETY: `verdict` is a valid struct for the call's duration; pure function.
    let a = unsafe { ml_expected_answers(&verdict, raw_answers(stock)) };
    Answers {
        families: a.families,
        threadgroup_memory: a.threadgroup_memory,
        working_set: a.working_set,
    }
}

/// `ml_config_parse_timeout`: `None` when garbled.
pub fn parse_timeout(raw: Option<&str>) -> Option<u32> {
    let raw = raw.map(c_string);
    // SAFETY: NULL or a NUL-terminated string that outlives the call.
    let ms =
        unsafe { ml_config_parse_timeout(raw.as_ref().map_or(std::ptr::null(), |c| c.as_ptr())) };
    u32::try_from(ms).ok()
}

/// `ml_config_socket_path`: `None` when the path does not fit 104 bytes.
pub fn socket_path(
    metalift_socket: Option<&str>,
    system_exists: bool,
    private_dir: Option<&str>,
) -> Option<String> {
    let socket = metalift_socket.map(c_string);
    let dir = private_dir.map(c_string);
    let mut buf = vec![0 as c_char; 104];
    // SAFETY: `buf` is writable for its length; the strings are NULL or
    // NUL-terminated and outlive the call.
    let fits = unsafe {
        ml_config_socket_path(
            buf.as_mut_ptr(),
            buf.len(),
            socket.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
            system_exists,
            dir.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
        )
    };
    if !fits {
        return None;
    }
    // SAFETY: on success the C wrote a NUL-terminated path into `buf`.
    Some(
        unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned(),
    )
}

/// `ml_config_agent_dir_trustworthy`: may a per-user agent's socket directory be trusted?
pub fn agent_dir_trustworthy(dir_uid: u32, dir_mode: u32, caller_uid: u32) -> bool {
    // SAFETY: a pure function of three integers.
    unsafe { ml_config_agent_dir_trustworthy(dir_uid, dir_mode, caller_uid) }
}

/// `enum ml_xpc_next`: what the shim does after an XPC check-in (xpc_reply.c).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XpcNext {
    /// `ML_XPC_USE_VERDICT`.
    UseVerdict,
    /// `ML_XPC_USE_SOCKET`: check in on the Unix socket within the same deadline.
    UseSocket,
    /// `ML_XPC_STOCK_BUSY`.
    StockBusy,
    /// `ML_XPC_STOCK_UNRESPONSIVE`: note the daemon, stay stock.
    StockUnresponsive,
    /// `ML_XPC_STOCK_MALFORMED`.
    StockMalformed,
    /// `ML_XPC_SEND_AGAIN`: XPC_ERROR_CONNECTION_INTERRUPTED, send again over XPC once.
    SendAgain,
}

/// How `ml_xpc_read_verdict` ended, as `ml_xpc_next_step` is told.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XpcRead {
    /// A reply came and the C decoder said this of it (0 or -EPROTO).
    Reply(Result<VerdictMsg, CWireError>),
    /// No reply by the deadline (-ETIMEDOUT).
    Timeout,
    /// An XPC error before a reply, as a negative errno (-ECONNREFUSED for
    /// XPC_ERROR_CONNECTION_INVALID, -EAGAIN for _INTERRUPTED, -ECONNRESET for
    /// another).
    Error(i32),
}

/// `ml_xpc_next_step` for `read`.
pub fn xpc_next_step(read: &XpcRead) -> XpcNext {
    let raw = |status: ffi::ml_wire_status, value: u64| ml_wire_error {
        status,
        field: std::ptr::null(),
        value,
    };
    let (result, error) = match read {
        XpcRead::Reply(Ok(_)) => (0, raw(ffi::ML_WIRE_OK, 0)),
        XpcRead::Reply(Err(e)) => (
            -libc::EPROTO,
            match e {
                CWireError::Oversize(n) => raw(ffi::ML_WIRE_OVERSIZE, *n),
                CWireError::Truncated => raw(ffi::ML_WIRE_TRUNCATED, 0),
                CWireError::Version(v) => raw(ffi::ML_WIRE_VERSION, u64::from(*v)),
                CWireError::BadField(_) => raw(ffi::ML_WIRE_BAD_FIELD, 0),
                CWireError::Missing(_) => raw(ffi::ML_WIRE_MISSING, 0),
                CWireError::NotVerdict(k) => raw(ffi::ML_WIRE_NOT_VERDICT, u64::from(*k)),
                CWireError::Declined(r) => raw(ffi::ML_WIRE_DECLINED, u64::from(*r)),
            },
        ),
        XpcRead::Timeout => (-libc::ETIMEDOUT, raw(ffi::ML_WIRE_OK, 0)),
        XpcRead::Error(errno) => (*errno, raw(ffi::ML_WIRE_OK, 0)),
    };
    // SAFETY: a pure function of its two by-value arguments.
    match unsafe { ml_xpc_next_step(result, error) } {
        ffi::ML_XPC_USE_VERDICT => XpcNext::UseVerdict,
        ffi::ML_XPC_USE_SOCKET => XpcNext::UseSocket,
        ffi::ML_XPC_STOCK_BUSY => XpcNext::StockBusy,
        ffi::ML_XPC_STOCK_UNRESPONSIVE => XpcNext::StockUnresponsive,
        ffi::ML_XPC_SEND_AGAIN => XpcNext::SendAgain,
        _ => XpcNext::StockMalformed,
    }
}
