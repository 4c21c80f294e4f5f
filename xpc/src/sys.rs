//! The libxpc functions metalift uses, declared by hand (no SDK needed at build time).
//!
//! Declarations follow the macOS SDK's `<xpc/connection.h>` and `<xpc/xpc.h>` (as
//! vendored, for example, in Zig's `lib/libc/include/any-darwin-any/xpc/`); each
//! item names its header. libxpc is re-exported by libSystem, which every Rust
//! program on macOS links, so no `#[link]` attribute is needed.
//!
//! One function is private (absent from the SDK headers, present in libxpc and
//! used by Chromium, launchd tooling and most XPC servers that check their peers):
//! `xpc_dictionary_get_audit_token`, the token of *this* message. It is looked up
//! with `dlsym` at run time ([`PrivateXpc::load`]), never linked, so a macOS
//! release that drops it costs the XPC identities (the daemon then answers every
//! XPC check-in "use the socket") instead of the whole daemon failing to load.
//! `xpc_connection_get_audit_token` is deliberately not used: it names the sender
//! of the connection's last message received, not necessarily this one's.
//!
//! Only what metaliftd's listener still calls is declared: the messages carry
//! one frame body as a `data` value (`frame.rs`), so of the dictionary API only
//! the data getter and setter, the reply, and what answers an older shim
//! (`frame::legacy`: one uint64 and strings) remain. Declarations only: no
//! policy, no state. (The shim is C and declares its own, in `shim/c/xpc.c`.)
#![allow(non_camel_case_types, non_upper_case_globals)]

use std::ffi::{c_char, c_void};

use block2::Block;

/// `xpc_object_t` (`<xpc/base.h>`): every XPC value, retained/released with
/// [`xpc_retain`]/[`xpc_release`].
pub type xpc_object_t = *mut c_void;
/// `xpc_connection_t` (`<xpc/connection.h>`): an [`xpc_object_t`] of type connection.
pub type xpc_connection_t = xpc_object_t;
/// `xpc_type_t` (`<xpc/xpc.h>`): the address of one of the `_xpc_type_*` globals.
pub type xpc_type_t = *const XpcTypeS;
/// `xpc_handler_t` (`<xpc/xpc.h>`): `void (^)(xpc_object_t)`.
pub type xpc_handler_t = Block<dyn Fn(xpc_object_t)>;
/// `dispatch_queue_t`; NULL selects libdispatch's default target queue.
pub type dispatch_queue_t = *mut c_void;

/// `XPC_CONNECTION_MACH_SERVICE_LISTENER` (`<xpc/connection.h>`): the caller
/// listens for the named service (it must be advertised in the job's plist).
pub const XPC_CONNECTION_MACH_SERVICE_LISTENER: u64 = 1 << 0;

/// Opaque `struct _xpc_type_s`.
#[repr(C)]
#[derive(Debug)]
pub struct XpcTypeS {
    _opaque: [u8; 0],
}

/// Opaque `struct _xpc_dictionary_s` (the type of the well-known error objects).
#[repr(C)]
#[derive(Debug)]
pub struct XpcDictionaryS {
    _opaque: [u8; 0],
}

/// `audit_token_t` (`<mach/message.h>`): eight 32-bit words filled by the kernel.
/// Read it only through libbsm's accessors (see `audit_token.rs`).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct audit_token_t {
    /// The raw words; their meaning is libbsm's business.
    pub val: [u32; 8],
}

extern "C" {
    // <xpc/xpc.h>: XPC_TYPE_* are the addresses of these globals.
    /// `XPC_TYPE_CONNECTION`.
    pub static _xpc_type_connection: XpcTypeS;
    /// `XPC_TYPE_ERROR`.
    pub static _xpc_type_error: XpcTypeS;
    /// `XPC_TYPE_DICTIONARY`.
    pub static _xpc_type_dictionary: XpcTypeS;

    // <xpc/connection.h>: XPC_ERROR_* are the addresses of these globals.
    /// `XPC_ERROR_CONNECTION_INTERRUPTED`: the peer went away; a reply will never come.
    pub static _xpc_error_connection_interrupted: XpcDictionaryS;
    /// `XPC_ERROR_CONNECTION_INVALID`: the service is not in this bootstrap (or the
    /// connection was cancelled).
    pub static _xpc_error_connection_invalid: XpcDictionaryS;
    /// `XPC_ERROR_TERMINATION_IMMINENT`: the service is being asked to exit.
    pub static _xpc_error_termination_imminent: XpcDictionaryS;
    /// `XPC_ERROR_KEY_DESCRIPTION` (`<xpc/xpc.h>`): the error dictionaries' text key.
    pub static _xpc_error_key_description: *const c_char;

    // <xpc/connection.h>
    /// Creates a (not yet active) connection to, or listener for, a mach service.
    pub fn xpc_connection_create_mach_service(
        name: *const c_char,
        targetq: dispatch_queue_t,
        flags: u64,
    ) -> xpc_connection_t;
    /// Sets the event handler (copies the block). Must precede activation.
    pub fn xpc_connection_set_event_handler(connection: xpc_connection_t, handler: &xpc_handler_t);
    /// Activates a connection (macOS 10.12+); nothing flows before this.
    pub fn xpc_connection_activate(connection: xpc_connection_t);
    /// Cancels a connection; its handler then sees `XPC_ERROR_CONNECTION_INVALID` once.
    pub fn xpc_connection_cancel(connection: xpc_connection_t);
    /// Sends a dictionary (logically copied) with no reply expected.
    pub fn xpc_connection_send_message(connection: xpc_connection_t, message: xpc_object_t);
    /// The effective uid of the peer (from its audit token when it connected).
    pub fn xpc_connection_get_euid(connection: xpc_connection_t) -> u32;

    // <xpc/xpc.h>
    /// The type of any XPC object.
    pub fn xpc_get_type(object: xpc_object_t) -> xpc_type_t;
    /// +1 on an XPC object.
    pub fn xpc_retain(object: xpc_object_t) -> xpc_object_t;
    /// -1 on an XPC object.
    pub fn xpc_release(object: xpc_object_t);
    /// A reply dictionary for a received message; NULL when it expects none.
    pub fn xpc_dictionary_create_reply(original: xpc_object_t) -> xpc_object_t;
    /// The value under `key` (not retained), or NULL.
    pub fn xpc_dictionary_get_value(xdict: xpc_object_t, key: *const c_char) -> xpc_object_t;
    /// The string under `key` (borrowed), or NULL if absent or not a string.
    pub fn xpc_dictionary_get_string(xdict: xpc_object_t, key: *const c_char) -> *const c_char;
    /// Stores a copy of a NUL-terminated string.
    pub fn xpc_dictionary_set_string(
        xdict: xpc_object_t,
        key: *const c_char,
        string: *const c_char,
    );
    /// Stores an unsigned 64-bit integer.
    pub fn xpc_dictionary_set_uint64(xdict: xpc_object_t, key: *const c_char, value: u64);
    /// Stores a copy of `length` bytes as a data value (`bytes` may be NULL
    /// when `length` is 0).
    pub fn xpc_dictionary_set_data(
        xdict: xpc_object_t,
        key: *const c_char,
        bytes: *const c_void,
        length: usize,
    );
    /// The bytes of the data value under `key` and their count in `*length`
    /// (`length` may be NULL); NULL when the key is absent or not a data
    /// value. The bytes belong to the dictionary's value (not retained).
    pub fn xpc_dictionary_get_data(
        xdict: xpc_object_t,
        key: *const c_char,
        length: *mut usize,
    ) -> *const c_void;
}

/// `void xpc_dictionary_get_audit_token(xpc_object_t, audit_token_t *)` (private;
/// declared so by Chromium's `xpc_private` stubs and Dopamine's `xpc_private.h`):
/// the audit token the kernel attached to *this* received message.
pub type XpcDictionaryGetAuditToken = unsafe extern "C" fn(xpc_object_t, *mut audit_token_t);
/// The private libxpc entry point, resolved at run time.
#[derive(Debug, Clone, Copy)]
pub struct PrivateXpc {
    /// Per message, so no later message can stand in for this one.
    pub dictionary_get_audit_token: Option<XpcDictionaryGetAuditToken>,
}

impl PrivateXpc {
    /// Looks the function up in the already loaded libxpc.
    #[must_use]
    pub fn load() -> Self {
        // SAFETY: dlsym with RTLD_DEFAULT and a NUL-terminated name only reads the
        // loaded images' symbol tables.
        let by_message = unsafe {
            libc::dlsym(
                libc::RTLD_DEFAULT,
                c"xpc_dictionary_get_audit_token".as_ptr(),
            )
        };
        PrivateXpc {
            dictionary_get_audit_token: (!by_message.is_null()).then(|| {
                // SAFETY: the symbol is libxpc's function of exactly this C signature
                // (see the type's doc); a non-null dlsym result is its address.
                unsafe {
                    std::mem::transmute::<*mut c_void, XpcDictionaryGetAuditToken>(by_message)
                }
            }),
        }
    }
}
