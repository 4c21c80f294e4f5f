//! macOS system interfaces: libxpc, audit tokens, code signatures. The only place
//! (with `peer/macos.rs`, `transport/xpc.rs` and `oslog.rs`) where the daemon's macOS
//! code uses `unsafe`, one operation per block, each with a `// SAFETY:` line.
//!
//! # Layout
//!
//! - [`xpc_sys`]: the ~25 libxpc functions and globals, declared by hand.
//! - [`xpc_dict`]: an owned XPC dictionary behind `wire_dict`'s traits.
//! - [`wire_dict`]: the pure mapping of wire messages onto dictionary keys.
//! - [`exchange`]: the pure order and checks of one XPC peer's messages.
//! - [`audit_token`]: pid, pid version, euid and executable from a kernel audit token.
//! - [`code_identity`]: `SecCode` from an audit token → team id, signing id, cdhash.
//!
//! # What was only type-checked (no Mac in CI): try these first on a Mac
//!
//! Everything here compiles for `aarch64-apple-darwin` (and the shim's half for
//! `arm64e-apple-darwin`) but has never run. In order of risk:
//!
//! 1. **XPC round trip** (`transport/xpc.rs`, `shim/src/transport/xpc.rs`): the
//!    listener's event handlers, `xpc_dictionary_create_reply`, the shim's
//!    `send_message_with_reply` + deadline, and the fallback to the Unix socket on
//!    `XPC_ERROR_CONNECTION_INVALID`. Try: `metaliftd --mach-service com.metalift.policy`
//!    from the LaunchAgent plist, then `metalift-probe` with the shim injected.
//! 2. **Audit-token layout and accessors** ([`audit_token`]): `audit_token_t` as 8×u32,
//!    the libbsm accessors (`-lbsm`), `proc_pidpath_audittoken`, `LOCAL_PEERTOKEN`,
//!    the 56-byte `proc_uniqidentifierinfo` whose `p_idversion` guards the parent path.
//!    The private `xpc_dictionary_get_audit_token` is resolved with `dlsym`.
//! 3. **SecCode calls** ([`code_identity`]): `SecCodeCopyGuestWithAttributes` with
//!    `kSecGuestAttributeAudit`, `SecCodeCheckValidity`, `SecCodeCopySigningInformation`;
//!    the ad-hoc flag and cdhash (`kSecCodeInfoUnique`, 20 bytes). Compare with
//!    `codesign -dvvv <binary>` for a Developer ID, an ad-hoc and an unsigned binary.
//! 4. **The shim's constructor under dyld**: creating an XPC connection from a
//!    `DYLD_INSERT_LIBRARIES` constructor (libxpc is initialised by libSystem first)
//!    in arm64 and arm64e processes.
//! 5. **The unified log** (`oslog.rs`): that `syslog(3)` lines from metaliftd show up in
//!    `log show --predicate 'process == "metaliftd"' --last 1h` with the levels mapped
//!    as documented there.
#![allow(unsafe_code)]

pub mod audit_token;
pub mod code_identity;
pub mod exchange;
pub mod wire_dict;
pub mod xpc_dict;
pub mod xpc_sys;
