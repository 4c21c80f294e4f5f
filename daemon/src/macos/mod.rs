//! macOS system interfaces: libxpc, audit tokens, code signatures. The only place
//! (with `peer/macos.rs`, `transport/xpc.rs` and `oslog.rs`) where the daemon's macOS
//! code uses `unsafe`, one operation per block, each with a `// SAFETY:` line.
//!
//! # Layout
//!
//! - libxpc itself (declarations, dictionaries, the key layout and the
//!   exchange's checks) is in the `metalift-xpc` crate, shared with the shim.
//! - [`audit_token`]: pid, pid version, euid and executable from a kernel audit token.
//! - [`code_identity`]: `SecCode` from an audit token → team id, signing id, cdhash,
//!   and which Apple-anchored requirement it satisfies (classified on every
//!   platform by `crate::peer::signature`).
//! - [`panic_boundary`]: every callback libxpc/libdispatch invokes runs inside it.
//!
//! # Verified by construction here (object code, load commands, tests; Linux CI)
//!
//! - **Linked Mach-O** (`scripts/macos-build.sh`, checked by `scripts/macos-check.sh`
//!   in `scripts/ci-macos.sh`): metaliftd, metalift, metalift-probe are `MH_EXECUTE`,
//!   the shim and the inert stub `MH_DYLIB`; all arm64, `LC_BUILD_VERSION` macOS
//!   minos 13.0, an embedded ad-hoc signature (`LC_CODE_SIGNATURE`, CodeDirectory
//!   flagged adhoc); the shim loads `/usr/lib/libSystem.B.dylib` only, exports exactly
//!   `shim/c/exports.txt`, install name `/usr/local/metalift/lib/libmetalift.dylib`;
//!   the inert stub exports nothing and has no initializer section. Every framework
//!   symbol the daemon, CLI and probe import resolves against `scripts/tbd/*.symbols`.
//! - **The os_log C layer** (`daemon/c/oslog.c`): compiled by clang, linked into
//!   metaliftd (`_metalift_oslog_*` defined, `__os_log_impl` imported, checked);
//!   and the same C file, run on Linux against fake libSystem functions
//!   (`daemon/c/oslog_test.c`, in `scripts/macos-check.sh`), logs each line once at
//!   its level's os_log type with the format `%{public}s` and the buffer clang's
//!   `__builtin_os_log_format` built: header `02 01 22 08` (one argument, a public
//!   string, pointer-sized), then the message pointer.
//!   The level mapping is unit-tested (`oslog.rs`).
//! - **The panic boundary** ([`panic_boundary`]): unit-tested on Linux (a panicking
//!   callback yields its fallback and is logged); both XPC handlers are wrapped
//!   (compiled for `aarch64-apple-darwin`).
//! - **launchd and the pkg scripts** (`cli/tests/pkg_install.rs`): both plists
//!   parse, name only installed paths and flags metaliftd has, restart only after a
//!   failure (`KeepAlive`/`SuccessfulExit = false`) with `ThrottleInterval` ≥ 10 s,
//!   and keep no stdout/stderr file; pre/postinstall and uninstall run against a
//!   temporary root with stub `launchctl`/`stat`/`ps`; the agent launcher runs for
//!   real (own 0700 socket directory, refuses a squatted one with status 73, an
//!   unwritable log with 74); metaliftd's one-line failure on an unopenable socket
//!   or log (status 1).
//! - **Uninstall**: refuses (exit 1, nothing changed) while a plist, `launchctl
//!   getenv`, a profile or a process environment names the shim; `--force` leaves the
//!   inert stub at the shim's path (tests; the stub's object code is checked above).
//! - **XPC dictionaries** (`metalift_xpc::dict`) and the exchange's checks
//!   (`metalift_xpc::exchange`) against the real core (`daemon/tests/core_in_memory.rs`).
//! - **The shim's arm64e object code** (PAC on every indirect branch and function
//!   pointer): `scripts/shim-arm64e-check.sh` (the shim's own check).
//!
//! # Verified only on a Mac (what, how): `.github/workflows/macos.yml` runs these
//!
//! 1. **XPC round trip** (`transport/xpc.rs`): the listener and peer handlers,
//!    `xpc_dictionary_create_reply`, the private per-message audit token found by
//!    `dlsym` (if absent, metaliftd logs that XPC is disabled and keeps the socket).
//!    How: install the pkg, `sudo launchctl print system/com.metalift.metaliftd`
//!    shows the `com.metalift.policy` endpoint; `cargo test --workspace` on macOS.
//! 2. **Audit tokens** ([`audit_token`]): `audit_token_t` through libbsm,
//!    `proc_pidpath_audittoken`, `LOCAL_PEERTOKEN` on the socket, the 56-byte
//!    `proc_uniqidentifierinfo` whose `p_idversion` guards the parent path. How: a
//!    decision record's `pid`, `uid`, `exe`, `parent_exe` for a shell child against
//!    `ps -o pid,uid,comm`.
//! 3. **SecCode** ([`code_identity`]): team id, signing id and cdhash. How: the
//!    record's `cdhash` against `codesign -dvvv`'s `CDHash=` for a Developer ID
//!    binary, an ad-hoc one and an unsigned x86_64 one (the workflow does the
//!    ad-hoc probe).
//! 4. **The unified log reads in clear**: `log show --predicate 'subsystem ==
//!    "com.metalift"' --last 1h --info` shows metaliftd's lines at the documented
//!    levels and no `<private>`. Also for the Linux-linked metaliftd: zig's linker
//!    merges `__TEXT,__oslogstring` into `__cstring` (Apple's ld keeps it, and the
//!    pkg is linked by Apple's ld), so check `log show` with that binary too.
//! 5. **launchd behaviour**: the LaunchDaemon starts at boot and serves every user
//!    (an ssh session and a second user reach `/var/run/metalift/metalift.sock`);
//!    `kill -9` restarts it no sooner than 30 s; an agent exiting 73 is retried at
//!    the throttle, not in a loop (`launchctl print … | grep -i "last exit"`); two
//!    users' agents get `/Users/Shared/metalift/<uid>/` (0700, `Umask` 077); launchd
//!    sets `HOME` for the agent.
//! 6. **dyld and uninstall**: `DYLD_INSERT_LIBRARIES=/nonexistent.dylib
//!    /usr/local/bin/metalift --version` stops with "terminating because inserted
//!    dylib" (the reason uninstall refuses), and the inert stub in its place lets it
//!    run (`DYLD_INSERT_LIBRARIES=/usr/local/metalift/lib/libmetalift.dylib` after
//!    `uninstall.sh --force`).
//! 7. **The Linux-linked binaries run**: copy `target/macos-out` to a Mac, `codesign
//!    -v` each, run `metaliftd --help`, `metalift --version`, `metalift-probe`.
//! 8. **arm64e**: `otool -arch arm64e -hv libmetalift.dylib` says `E PAC00` (pkg/build.sh
//!    checks it); with SIP off, an arm64e system binary starts with the shim
//!    inserted (`csrutil status` reported by the workflow).
//! 9. **The shim under dyld** (the shim's half): constructor cost for a process that
//!    never uses Metal (`ls`), Metal loaded late by `dlopen` (`metalift-probe-dlopen`),
//!    sandboxed hosts, fork without exec.
//! 10. **Anchors** (`code_identity::first_satisfied`, `crate::peer::signature`): the
//!     requirement texts compile (`SecRequirementCreateWithString`) and classify
//!     real code. How: `codesign --verify -R='anchor apple' /bin/ls` passes and a
//!     decision for `/bin/ls` records `"anchor": "apple"`; a Developer ID app's
//!     decision records `developer-id` with its `team_id`; the workflow's ad-hoc
//!     probe records `ad-hoc` and no `team_id`.
//! 11. **The self-signed impostor** (`daemon/tests/fixtures/self-signed-team/`, its
//!     README has the commands): `codesign -dvvv` shows `TeamIdentifier=ABCDE12345`
//!     and `codesign --verify` passes, `codesign --verify -R='anchor apple generic'`
//!     fails; run under the shim against the fixture's `policy.toml`, the last
//!     decision is `jq -e '.anchor == "untrusted" and .team_id == null and .rule ==
//!     null and .action == "stock"'`. Also that macOS runs a binary signed by an
//!     untrusted certificate at all (if AMFI refuses it, the check-in never happens:
//!     the step must then report that instead of passing).
//! 12. **Full Disk Access** (`crate::full_disk_access`, `peer/macos.rs`): without the
//!     grant, `metalift status --json | jq .full_disk_access` is `false`, `metalift
//!     doctor` warns (`disk access`), and the probe copied to `~/Downloads` and run
//!     there under the shim is decided with `"anchor": "unreadable"` and
//!     `"identity_error": "identity unreadable: permission denied"`; with a PPPC
//!     profile (or System Settings) granting it and the daemon restarted, `true`,
//!     `ok`, and the same run records its real anchor. That TCC refuses `open` with
//!     `EPERM` (Rust's `PermissionDenied`) for the system TCC database is assumed
//!     from common practice, checked by this step.
//! 13. **The macOS 14 guest warning** (`metalift doctor`, `guest`): on a macOS 14
//!     Virtualization.framework guest `sysctl -n kern.hv_vmm_present` prints `1`
//!     and doctor warns with `--no-mmap`; on macOS 15 it does not.
#![allow(unsafe_code)]

pub mod audit_token;
pub mod code_identity;
pub mod panic_boundary;
