//! macOS system interfaces: libxpc, audit tokens, code signatures. The only place
//! (with `peer/macos.rs`, `transport/xpc.rs` and `oslog.rs`) where the daemon's macOS
//! code uses `unsafe`, one operation per block, each with a `// SAFETY:` line.
//!
//! # Layout
//!
//! - libxpc itself (declarations, dictionaries, the key layout and the
//!   exchange's checks) is in the `metalift-xpc` crate, shared with the shim.
//! - [`audit_token`]: pid, pid version, euid and executable from a kernel audit token.
//! - [`code_identity`]: `SecCode` from an audit token → team id, signing id, cdhash.
//!
//! # What was only type-checked (no Mac in CI): try these first on a Mac
//!
//! Everything below compiles for `aarch64-apple-darwin` (and the shim's half for
//! `arm64e-apple-darwin`, nightly `-Zbuild-std`) but has never run. What *did* run,
//! on Linux: the dictionary mapping (`metalift_xpc::dict`) and the exchange's checks
//! (`metalift_xpc::exchange`) against the real core, in `daemon/tests/core_in_memory.rs`. In
//! order of risk:
//!
//! 1. **XPC round trip** (`transport/xpc.rs`, `shim/src/transport/xpc.rs`): the
//!    listener and peer event handlers, `xpc_dictionary_create_reply`, the shim's
//!    `send_message_with_reply` against its deadline, the outcome sent before the
//!    barrier cancels, and the fallbacks (plain lookup → privileged lookup → Unix
//!    socket on `XPC_ERROR_CONNECTION_INVALID`; socket at once on `…_INTERRUPTED`).
//!    Try: load the LaunchAgent plist (it advertises `com.metalift.policy`), run
//!    `metalift-probe` with `DYLD_INSERT_LIBRARIES=libmetalift.dylib`, and check the
//!    audit log's `"transport": "xpc"`; then `launchctl bootout` the agent and check
//!    the shim falls back to the socket (`METALIFT_DEBUG=1` says why).
//! 2. **Audit tokens** ([`audit_token`]): `audit_token_t` as 8×u32 read through
//!    libbsm (`-lbsm`), `proc_pidpath_audittoken`, `LOCAL_PEERTOKEN` on the socket,
//!    the 56-byte `proc_uniqidentifierinfo` (flavor 18) whose `p_idversion` guards the
//!    parent path, and the private `xpc_dictionary_get_audit_token` found by `dlsym`
//!    (if it were gone, `metaliftd` logs that XPC is disabled and keeps the socket).
//!    Check: the decision record's `pid`, `uid`, `exe`, `parent_exe` for a shell
//!    child, against `ps -o pid,uid,comm`.
//! 3. **SecCode** ([`code_identity`]): `SecCodeCopyGuestWithAttributes` with
//!    `kSecGuestAttributeAudit`, `SecCodeCheckValidity` (no network),
//!    `SecCodeCopySigningInformation`; the ad-hoc flag and the 20-byte cdhash
//!    (`kSecCodeInfoUnique`). Compare the record's `team_id`, `signing_id` and
//!    `cdhash` with `codesign -dvvv <binary>` for a Developer ID binary (filled), a
//!    locally built ad-hoc one (no team/signing id) and an unsigned x86_64 one.
//! 4. **The shim's constructor under dyld**: creating an XPC connection (and so
//!    libdispatch worker threads) from a `DYLD_INSERT_LIBRARIES` constructor in
//!    arm64 and arm64e processes, its start-up cost for a process that never uses
//!    Metal (`ls`), sandboxed hosts (the mach lookup is denied: expect the socket
//!    path, and a sandbox log line), and a forked child that does not exec.
//! 5. **The unified log** (`oslog.rs`): that `syslog(3)` lines from `metaliftd`
//!    appear in `log show --predicate 'process == "metaliftd"' --last 1h` with the
//!    levels mapped as documented there (INFO persisted, DEBUG only with `--info`).
#![allow(unsafe_code)]

pub mod audit_token;
pub mod code_identity;
pub mod panic_boundary;
