//! macOS system interfaces: libxpc, audit tokens, code signatures. The only place
//! (with `checkin/peer/macos.rs`, `checkin/transport/xpc/mod.rs` and `service/oslog.rs`) where the daemon's macOS
//! code uses `unsafe`, one operation per block, each with a `// SAFETY:` line.
//!
//! # Layout
//!
//! - libxpc itself (declarations, dictionaries, the key layout and the
//!   exchange's checks) is in the `metalift-xpc` crate, shared with the shim.
//! - [`audit_token`]: pid, pid version, euid and executable from a kernel audit token.
//! - [`code_identity`]: `SecCode` from an audit token → team id, signing id, cdhash,
//!   and which Apple-anchored requirement it satisfies (classified on every
//!   platform by `crate::checkin::peer::signature`).
//! - [`panic_boundary`]: every callback libxpc/libdispatch invokes runs inside it.
//! - [`user_temp_dir`]: `confstr(_CS_DARWIN_USER_TEMP_DIR)`, where a per-user
//!   daemon's socket lives.
//!
//! # Verified by construction here (object code, load commands, tests; Linux CI)
//!
//! - **Linked Mach-O** (`scripts/macos-build.sh`, checked by `scripts/macos-check.sh`
//!   in `scripts/ci-macos.sh`): metaliftd, metalift, metalift-probe are `MH_EXECUTE`,
//!   the shim and the inert stub `MH_DYLIB`; the binaries arm64, the shim and the
//!   inert stub universal with exactly arm64 and x86_64 (`llvm-lipo-22`; arm64e only
//!   from pkg/build.sh, ld64.lld-22 cannot link it), every file and slice
//!   `LC_BUILD_VERSION` macOS minos 13.0 with an embedded ad-hoc signature
//!   (`LC_CODE_SIGNATURE`, CodeDirectory flagged adhoc); each shim slice loads
//!   `/usr/lib/libSystem.B.dylib` only, imports only what zig's `libSystem.tbd`
//!   exports for its target (x86_64: `_fstat$INODE64`, never the 32-bit-inode
//!   `_fstat`), exports exactly `shim/c/exports.macos.txt`, install name
//!   `/usr/local/metalift/lib/libmetalift.dylib`, has an initializer; each inert
//!   stub slice exports nothing and has no initializer section. Every framework
//!   symbol the daemon, CLI and probe import resolves against `scripts/tbd/*.symbols`.
//! - **The os_log C layer** (`daemon/c/oslog.c`): compiled by clang, linked into
//!   metaliftd (`_metalift_oslog_*` defined, `__os_log_impl` imported, checked);
//!   and the same C file, run on Linux against fake libSystem functions
//!   (`daemon/c/oslog_test.c`, in `scripts/macos-check.sh`), logs each line once at
//!   its level's os_log type with the format `%{public}s` and the buffer clang's
//!   `__builtin_os_log_format` built: header `02 01 22 08` (one argument, a public
//!   string, pointer-sized), then the message pointer.
//!   The level mapping is unit-tested (`service/oslog.rs`).
//! - **The panic boundary** ([`panic_boundary`]): unit-tested on Linux (a panicking
//!   callback yields its fallback and is logged); both XPC handlers are wrapped
//!   (compiled for `aarch64-apple-darwin`).
//! - **launchd and the pkg scripts** (`cli/tests/pkg_install.rs`): every plist
//!   (and `pkg/*.xml`) is well-formed XML to a strict parser (roxmltree); both
//!   plists name only installed paths and flags metaliftd has, run `ProcessType`
//!   `Interactive`, restart only after a failure (`KeepAlive`/`SuccessfulExit =
//!   false`) with a `ThrottleInterval` of 30 s (launchd.plist(5): a job is spawned
//!   at most once per interval, counted from its previous *start*; the default is
//!   10 s; so a crash after 30 s of running restarts at once, and only a job that
//!   dies sooner waits out the rest), and keep no stdout/stderr file; the staged
//!   payload holds only `/usr/local/metalift`; pre/postinstall and uninstall run
//!   against a temporary root with stub `launchctl`/`stat`/`ps`: postinstall's
//!   links into `/usr/local/bin`, man, completion and schema directories leave an
//!   existing directory's owner and mode alone, uninstall removes only links that
//!   still point into metalift; the agent launcher runs for real (its log, status
//!   74 for an unwritable one, no `--socket`: metaliftd's default is the user's
//!   `DARWIN_USER_TEMP_DIR`, pure in `socket_path.rs`); metaliftd's one-line
//!   failure on an unopenable socket or log.
//! - **The watcher on FSEvents** (`live_policy/watcher/seam_tests.rs`): fed the events
//!   FSEvents delivers for an in-place write (the open's truncate or create, then
//!   the content change xnu's `vn_close` reports), a half-written policy never
//!   goes live.
//! - **Uninstall**: refuses (exit 1, nothing changed) while a plist, `launchctl
//!   getenv`, a profile or a process environment names the shim; `--force` leaves the
//!   inert stub at the shim's path (tests; the stub's object code is checked above).
//! - **XPC messages as frames** (`metalift_xpc::frame`: the frame body of
//!   `policy/src/wire.rs` as one data value, the one codec held to the shim's
//!   C by `shim/tests/wire_cross.rs`), the exchange's checks
//!   (`metalift_xpc::exchange`) and a peer's whole exchange
//!   (`checkin/transport/xpc_peer.rs`, the function `xpc/peer_task.rs` runs over
//!   libxpc) against the real core (`daemon/tests/core_in_memory.rs`, over an
//!   in-memory link; only the libxpc link itself is macOS-only).
//! - **The shim's arm64e object code** (PAC on every indirect branch and function
//!   pointer): `scripts/shim-arm64e-check.sh` (the shim's own check).
//!
//! # Verified only on a Mac (what, how): `.github/workflows/macos.yml` runs these
//!
//! 1. **XPC round trip** (`checkin/transport/xpc/`): the listener and peer handlers,
//!    `xpc_dictionary_create_reply`, the private per-message audit token found by
//!    `dlsym` (if absent, metaliftd logs it and answers every XPC check-in "use the
//!    socket"; it never reads the connection-level token).
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
//!    `launchctl print system/com.metalift.metaliftd` shows the process type
//!    `Interactive` (workflow: "Install the pkg"); a `kill -9` after the daemon ran
//!    longer than 30 s restarts it at once, one within 30 s of its start is
//!    restarted 30 s after that start ("Pushing respawn out by" in `log show`), an
//!    agent exiting 74 likewise, never in a loop (`launchctl print … | grep -i
//!    "last exit"`); launchd sets `HOME` for the agent.
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
//! 10. **Real Metal has the shape the simulation models** (issue 23; the workflow's
//!     "Real Metal unlocked under the shim" step): with a policy allowing the probe,
//!     `DYLD_INSERT_LIBRARIES=/usr/local/metalift/lib/libmetalift.dylib
//!     metalift-probe --json --expect-family 7` exits 0 and the audit's outcome is
//!     `applied` with stock Apple5 / 32768 and a working set that is not 0
//!     (`metalift audit --json --since 5m`). What that confirms, each an
//!     assumption the Linux tests cannot check:
//!     (a) `class_getInstanceMethod(AppleParavirtDevice, @selector(supportsFamily:))`
//!     is `_MTLDevice`'s Method and patching it before the original
//!     `-initGPUFamilySupport` reaches the device (outcome `applied`, not `failed`);
//!     (b) `-initGPUFamilySupport` runs in `MTLAddDevice`, after the driver's
//!     `-initWithAcceleratorPort:` returned, so the driver's answers read right
//!     after the original are the finished device's (the outcome's stock
//!     threadgroup memory is 32768 and its working set the guest's, never 0);
//!     (c) the outcome arrives with the check-in's decision id although the probe
//!     has not asked anything yet when it is sent (device creation itself reports);
//!     (d) a stock verdict's outcome (a policy with `stock = true` for the probe)
//!     carries the same true answers; (e) `requiresBFloat16Emulation` stays YES at
//!     Apple7 (`metalift-probe --json` prints `requires_bf16_emulation`);
//!     (f) with `MTL_DEBUG_LAYER=1` the probe is still Apple7 and the outcome is
//!     `applied` (the validation layer's wrapper is made after the check);
//!     (g) a process that links Metal and never creates a device
//!     (`metalift-probe --simmetal-dir` with the shim inserted) leaves no decision
//!     in the audit log; (h) `dlerror()` is NULL in a shimmed process after
//!     start-up.
//! 11. **Rosetta**: an x86_64 process under Rosetta with the shim inserted starts
//!     and checks in (arch `x86_64`), and Metal there answers as the verdict says.
//!     How: `softwareupdate --install-rosetta --agree-to-license`; `rustup target add
//!     x86_64-apple-darwin && cargo build --target x86_64-apple-darwin -p
//!     metalift-probe` (`lipo -archs` on it says `x86_64` only, so the kernel runs it
//!     translated); then `DYLD_INSERT_LIBRARIES=/usr/local/metalift/lib/libmetalift.dylib
//!     target/x86_64-apple-darwin/debug/metalift-probe` exits 0 and prints the device,
//!     and the last decision record in `/var/log/metalift/audit.jsonl` for it has
//!     `"arch":"x86_64"`. Not through `/usr/bin/env` or `arch -x86_64 env …`: under
//!     SIP dyld ignores `DYLD_*` for system binaries and deletes it from their
//!     environment, so their children never see it (dyld DyldProcessConfig.cpp,
//!     `ProcessConfig::Security::pruneEnvVars`); `arch -x86_64 -e
//!     DYLD_INSERT_LIBRARIES=… ./probe` works, `arch` setting it for the child. The
//!     same launch with an arm64 + arm64e-only shim must die with "terminating
//!     because inserted dylib … need 'x86_64'" (why the x86_64 slice exists).
//! 12. **The installer and shared directories** (workflow: "The pkg's payload is
//!     /usr/local/metalift only", "Install the pkg", "Uninstall"): the expanded
//!     pkg's `install-location` is `/usr/local/metalift` and its BOM climbs out of
//!     it nowhere; `stat` of `/usr/local`, `/usr/local/bin`, `/usr/local/share`,
//!     `/usr/local/share/man`, `/usr/local/etc` is the same before and after
//!     install and after uninstall (one that was absent comes out `root:wheel
//!     755`); Installer creates a missing `/usr/local` for the install location
//!     `root:wheel 0755` (not checkable on a runner that has it: by hand on a fresh
//!     VM); `man -w metalift` finds the linked page.
//! 13. **The per-user socket in `DARWIN_USER_TEMP_DIR`** ([`user_temp_dir`];
//!     workflow: "Per-user daemon socket"): `confstr` names the user's own 0700
//!     directory and a non-root metaliftd binds `metalift.sock` there; by hand: two
//!     users' agents (opt-in install) each bind their own; a sandboxed host or one
//!     with `DIRHELPER_USER_DIR_SUFFIX` set gets another directory from `confstr`
//!     and stays stock; the socket survives the system's cleaning of `T/` while the
//!     agent runs for days (`ls -l "$(getconf DARWIN_USER_TEMP_DIR)metalift.sock"`).
//! 14. **In-place writes on FSEvents** (workflow: "An in-place write with a pause",
//!     and `reload_watcher` under sudo in "Tests that need root-owned policy
//!     files"): a drop-in truncated, half-written, paused 2 s and completed loads
//!     once, whole. If FSEvents coalesces the truncate's `ItemInodeMetaMod` with
//!     the close's `ItemModified` differently than notify's order suggests, this is
//!     where it shows.
//! 15. **Anchors** (`code_identity::first_satisfied`, `crate::checkin::peer::signature`): the
//!     requirement texts compile (`SecRequirementCreateWithString`) and classify
//!     real code. How: `codesign --verify -R='anchor apple' /bin/ls` passes and a
//!     decision for `/bin/ls` records `"anchor": "apple"`; a Developer ID app's
//!     decision records `developer-id` with its `team_id`; the workflow's ad-hoc
//!     probe records `ad-hoc` and no `team_id`.
//! 16. **The self-signed impostor** (`daemon/tests/fixtures/self-signed-team/`, its
//!     README has the commands): `codesign -dvvv` shows `TeamIdentifier=ABCDE12345`
//!     and `codesign --verify` passes, `codesign --verify -R='anchor apple generic'`
//!     fails; run under the shim against the fixture's `policy.toml`, the last
//!     decision is `jq -e '.anchor == "untrusted" and .team_id == null and .rule ==
//!     null and .action == "stock"'`. Also that macOS runs a binary signed by an
//!     untrusted certificate at all (if AMFI refuses it, the check-in never happens:
//!     the step must then report that instead of passing).
//! 17. **Full Disk Access** (`crate::service::full_disk_access`, `checkin/peer/macos.rs`): without the
//!     grant, `metalift status --json | jq .full_disk_access` is `false`, `metalift
//!     doctor` warns (`disk access`), and the probe copied to `~/Downloads` and run
//!     there under the shim is decided with `"anchor": "unreadable"` and
//!     `"identity_error": "identity unreadable: permission denied"`; with a PPPC
//!     profile (or System Settings) granting it and the daemon restarted, `true`,
//!     `ok`, and the same run records its real anchor. That TCC refuses `open` with
//!     `EPERM` (Rust's `PermissionDenied`) for the system TCC database is assumed
//!     from common practice, checked by this step.
//! 18. **The macOS 14 guest warning** (`metalift doctor`, `guest`): on a macOS 14
//!     Virtualization.framework guest `sysctl -n kern.hv_vmm_present` prints `1`
//!     and doctor warns with `--no-mmap`; on macOS 15 it does not.
//! 19. **The shim's XPC client** (`shim/c/xpc.c`, `shim/c/xpc_reply.c`; workflow:
//!     "XPC round trip with per-message audit tokens"): a shimmed probe's decision
//!     record has `"transport": "xpc"` and its outcome (same decision id) is
//!     `applied`, so (a) `xpc_connection_create_mach_service(…,
//!     XPC_CONNECTION_MACH_SERVICE_PRIVILEGED)` from a user process reaches the
//!     LaunchDaemon; (b) the reply handler runs on a global queue while the
//!     device's creation waits on the semaphore (no deadlock inside Metal's
//!     registration lock); (c) the barrier delivers the outcome before the
//!     cancel. Also a child forked without exec *before any device* that then
//!     creates one checks in over the socket (libdispatch would stop it over
//!     XPC); a child forked after its parent registered gets the parent's
//!     device and checks in for nothing (Metal registers once per process:
//!     probe/simmetal/simmetal.m, "once per process"); the daemon started
//!     `--no-xpc` (its "use the socket" answer, which the shim's `xpc_reply.c`
//!     follows within the same deadline) is item 20.
//! 20. **"Use the socket" from a daemon that decides no XPC check-ins** (issue 23
//!     item 3; `metalift_xpc::exchange::{Serving, admit}`, tested on Linux through
//!     `daemon/tests/core_in_memory.rs`; workflow: "A daemon that decides no XPC
//!     check-ins answers "use the socket" at once"): with `--no-xpc` added to the
//!     LaunchDaemon's arguments, launchd still hands the daemon its mach service,
//!     the daemon answers each XPC check-in `Declined(UseSocket)` at once, the probe
//!     is unlocked in well under the shim's 2 s deadline, and its decision says
//!     `"transport": "unix"`. What only a Mac shows: that a reply sent right before
//!     the daemon's side is cancelled reaches the shim (the daemon lingers until the
//!     peer closes or the first-message deadline), and that a listener created
//!     outside launchd (metaliftd `--no-xpc` by hand) only logs. Not checkable on a
//!     runner: a macOS without `xpc_dictionary_get_audit_token` (the same answer,
//!     by construction: `Serving::new(true, false)`).
//! 21. **The socket's uid is fixed at connect** (issue 24 item 1;
//!     `checkin/peer/macos.rs`, `peer::socket_uid`, tested on Linux by
//!     `daemon/tests/socket_refusals.rs`; workflow: "A socket whose last user runs as
//!     another uid than the one that connected is refused and recorded"): the
//!     runner user connects, hands the descriptor to a root process that sends the
//!     check-in; `LOCAL_PEERCRED` (`xucred`, `XUCRED_VERSION`) still says the
//!     user's uid, `LOCAL_PEERTOKEN` says euid 0, and the daemon closes the
//!     connection unanswered with a `refused` record, reason `uid_changed`, `uid`
//!     the user's (`metalift audit --kind refused` lists it).
//! 22. **Refused XPC outcomes are records** (issue 24 items 2 and 3;
//!     `checkin/session.rs`, `Core::refuse`): by hand, a small client that
//!     checks in over XPC from one process and sends the outcome from a forked
//!     child on a second connection gets `refused` with reason `unexpected`; an
//!     outcome naming another decision id, `wrong_decision`. That libxpc always
//!     attaches a token to a received dictionary (so `no_audit_token` is never seen
//!     in practice) is assumed, and would show as such records.
//! 23. **Busy instead of a silent cancel** (issue 23 item 2): by hand, metaliftd with
//!     `--max-waiting-outcomes 1` and a client holding its check-in without an
//!     outcome: a second XPC check-in within `--outcome-idle-secs` (default 5) is
//!     answered `Declined(Busy)`, one after it is decided.
//! 24. **sha256 only for the code that runs** (issue 24 item 4;
//!     `peer::signature::file_hashes`, tested on Linux through
//!     `daemon/tests/core_in_memory.rs`): by hand, a signed program that sleeps before
//!     creating its device, replaced on disk by `cp` over its path (same inode)
//!     during the sleep; with a `sha256` rule naming the replacement's hash its
//!     decision is stock, `sha256` null and `identity_error` "file hashes not used:
//!     the running code no longer matches its file (errSecCSStaticCodeChanged)".
//!     That `SecCodeCheckValidity` reports -67034 for that case (not -67061, or a
//!     kill on page-in) is what this confirms; a replacement by `mv` (a new inode)
//!     is already caught by the same-inode check.
//! 25. **Requirements compiled once** (issue 24 item 5;
//!     `code_identity::requirements`): `SecRequirementCreateWithString` is called
//!     four times per daemon, and `SecCodeCheckValidity` accepts the shared
//!     `SecRequirement` from several threads at once (the pool runs eight
//!     identifications). How: item 15's anchors are still right after a burst of
//!     parallel check-ins (`for i in $(seq 1 32); do metalift exec -- /bin/ls & done`).
//! 26. **No stall a daemon can cause** (workflow: "A stopped daemon stalls one
//!     process, not every one"): with the LaunchDaemon loaded and its process
//!     stopped (`sudo kill -STOP $(pgrep metaliftd)`), the first shimmed probe's
//!     `device_creation_us` is about the deadline (2 s: launchd keeps the mach
//!     port, the message queues, no XPC error comes) and the next ones are below
//!     5 ms after one 300 ms probe (the marker in `$TMPDIR`, which launchd sets to
//!     `$(getconf DARWIN_USER_TEMP_DIR)`); after `kill -CONT` the next probe is
//!     unlocked again. Linux runs the same cases against the socket
//!     (`probe/tests/marker.rs`, `metalift-bench stalls`).
//! 27. **Verified unlock's kernels** (`probe/src/macos_compute.rs`,
//!     `probe/src/verify/kernels.rs`, `cli/src/verify.rs`; workflow: "The kernels an
//!     unlock promises run"): on the hosted runner's guest, Metal's compiler accepts
//!     each kernel's MSL (`simd_sum`, `simd_max`, `simdgroup_float8x8` with
//!     `simdgroup_multiply`, `bfloat`, a `[[threadgroup(0)]]` buffer of 32768
//!     bytes) and, unlocked as Apple7, the paravirtual GPU computes what the CPU does
//!     (`metalift-probe --verify --json | jq .verification.passed` is `true` with five
//!     passes); stock, only threadgroup memory is claimed and passes. `sudo metalift
//!     verify --profile NAME` then records a pass for the runner's chip and
//!     `kern.osversion`, after which a `require_verified` profile unlocks (stock with
//!     `unverified` before). Assumed until then: that `bfloat` compiles without
//!     compile options on the runner's macOS (MSL 3.1), and how Metal reports a
//!     threadgroup allocation beyond the GPU (the simulation fails the command buffer).
//! 28. **A decision's ancestors, and the CI recipe** (`audit_token::ancestors`;
//!     workflow: "CI recipe: a wrapper script's child unlocked"): a probe started by
//!     `sh -c` through `metalift exec --require-unlock` has a decision record whose
//!     `ancestors` names the `sh` (its `pbi_ppid` chain read with `proc_pidinfo` as
//!     root), so `--require-unlock --expect-family 7` passes for the wrapper; and
//!     `examples/ci-recipe.sh` exits 0 as written (both its steps inject with
//!     `metalift exec`, past the SIP-protected job shell).
//! 29. **Free space where the audit log is** (`crate::service::health`, `fstatvfs`
//!     through rustix; workflow: "A full audit volume makes the daemon degraded"):
//!     on an APFS volume filled with a ballast file, the daemon's measured free
//!     bytes fall under `LOW_SPACE_BYTES`, so `metalift status` exits 4 naming
//!     `audit_disk_full`. APFS counts purgeable space as used, so the figure can be
//!     lower than Finder's "available"; on Linux the same path is tested on a full
//!     tmpfs (`cli/tests/cli_health.rs`).
//! 30. **libmetalift v5 on the real system** (issue 31; only compiled here, and
//!     the shim's C only type-checked by clang-22 in `scripts/ci-shim.sh`): in a
//!     Terminal session `$TMPDIR` is the user's `DARWIN_USER_TEMP_DIR` (owned by
//!     the user, 0700), so the marker is written there, and a job without
//!     `TMPDIR` (or with a shared one) leaves no marker; `fs_usage -f filesys`
//!     on a shimmed probe shows no `confstr`/opendirectoryd traffic during the
//!     device creation (with the LaunchDaemon; with the per-user agent, once when
//!     Metal loads); the XPC reply handler runs on the queue
//!     `com.metalift.shim.reply` (`sample` while a check-in waits); a fork from
//!     another thread during a check-in returns at once (`hostile forkwait`
//!     built for macOS), and what the child does with Metal's registration lock
//!     is Metal's (libplatform traps, SIGTRAP/EXC_BREAKPOINT, on an
//!     `os_unfair_lock` whose owner is gone: `_os_unfair_lock_corruption_abort`);
//!     the per-uid limits key XPC peers by the audit token's euid
//!     (`audit_token_to_euid`): a user holding 300 idle XPC check-ins gets `Busy`
//!     past 256 while another user's check-in is answered.
//! 31. **Beside another shim on real Metal** (issue 31 item 4; `shim/c/imp_owner.c`,
//!     tested on Linux by `probe/tests/second_shim.rs` against a simulated Cua
//!     shim): a shimmed probe alone has no `other_shim` in its outcome, so
//!     `dladdr` puts each capability IMP in the image that holds its defining
//!     class (`supportsFamily:` and `_MTLDevice` in Metal.framework in the shared
//!     cache, `maxThreadgroupMemoryLength` in the driver bundle,
//!     `recommendedMaxWorkingSetSize` in IOGPU.framework) and nothing is judged
//!     another shim's; with Cua's `LumeMetalCapabilities.dylib` also inserted
//!     (`LUME_METAL_APPLE_FAMILY_MAX=1009`), listed before and after
//!     `libmetalift.dylib` in `DYLD_INSERT_LIBRARIES`, the outcome names its path
//!     with `patched` `after` and `before` (which is which follows dyld's
//!     initializer order, not read here), and `metalift-probe` answers Cua's
//!     Apple9 in both orders (where Cua's patched over metalift's, after
//!     metalift's rollback: outcome `failed`).
//! 32. **The frame as one XPC data value** (issue 40 part 1; `xpc/src/frame.rs`,
//!     `xpc/src/message.rs`, `shim/c/xpc.c`; on Linux only the bytes are tested,
//!     never libxpc): the first Mac run must confirm (a) the round trip:
//!     `xpc_dictionary_set_data` in the shim, `xpc_dictionary_get_data` in the
//!     daemon (and back for the verdict) hand over exactly the frame body —
//!     item 19's shimmed probe decided over XPC with its outcome recorded is
//!     that; (b) the audit token still names each message's sender with the
//!     frame as the dictionary's only value (`xpc_dictionary_get_audit_token`
//!     reads the message, not its keys: item 21's pid / pid version checks,
//!     and an outcome from another process still `other_process`); (c) size:
//!     a status reply cut at the frame limit (16 KiB of body, `metalift status`
//!     over XPC with a long status document, or a verdict with a 16 KiB rule
//!     and profile) arrives whole — libxpc sends large data values out of line,
//!     which no Linux test exercises; (d) the pointer `xpc_dictionary_get_data`
//!     returns stays valid while the reply dictionary is retained (the shim
//!     reads the verdict's strings from it until `ml_xpc_release_reply`; the
//!     header documents only NULL-for-absent and the length out-parameter);
//!     (e) across versions (`metalift_xpc::frame`, "Older peers"): a process
//!     still running an older libmetalift (one key per field) is answered
//!     "use the socket", checks in on the socket within its deadline, and
//!     metaliftd logs "an older libmetalift checked in over XPC"; a new shim
//!     against an older, not yet restarted metaliftd gets an XPC error (the
//!     older daemon refuses the message as `malformed`) and checks in on the
//!     socket — which of `XPC_ERROR_CONNECTION_INTERRUPTED` (sent again once)
//!     or `_INVALID` it sees is not documented; both end on the socket.
//! 33. **The forwarder's delivery window** (issue 42 items 1 and 2;
//!     `audit/forward/send_queue.rs`, `window.rs`, `deliver.rs`; only the Linux
//!     side runs here): the first Mac run must confirm (a) `SO_NWRITE` counts
//!     bytes sent and not yet acknowledged by the peer, as `SIOCOUTQ` does on
//!     Linux (xnu keeps unacknowledged data in `so_snd`): bytes written minus it
//!     must rise to the bytes written with a collector that reads, and stay
//!     below while its acknowledgements are held (`pfctl` dropping its ACKs), so
//!     a batch is not counted delivered early; (b) a collector that closes with
//!     unread data resets the connection and `peek` then fails
//!     (`ECONNRESET`): `Conn::peer_closed` must see it, the same as an end of
//!     stream; (c) `daemon/tests/forward_hangup.rs` and the RELP test in
//!     `forward_rsyslog.rs` (rsyslog with imrelp from Homebrew) pass when run
//!     there with their `cfg(target_os = "linux")` lifted.
//! 34. **A collector outage is health** (issue 43 item 1; `audit/forward/lag.rs`,
//!     `service::health::forward_behind`; on Linux `cli/tests/cli_health.rs` runs it
//!     end to end): by hand, `[audit.forward]` with `max_delay_seconds = 2` to a
//!     collector on the runner, stopped after a delivery: `metalift status` exits 4
//!     with `forward_behind` within 3 s of the next check-in (the forwarder thread at
//!     the `utility` QoS class still runs its rounds on an idle runner), and 0 again
//!     within a few seconds of the collector's return; `metalift audit flush
//!     --timeout 1` meanwhile says `not connected to …: nothing in flight` and names
//!     `metalift audit export`.
//! 35. **Per-user at the door** (issue 42 item 4; `checkin/transport/door.rs`,
//!     tested on Linux over the socket and over the in-memory XPC link by
//!     `daemon/tests/per_user_limits.rs` and `core_in_memory.rs`): the XPC
//!     listener charges a new peer to `xpc_connection_get_euid` (the euid of the
//!     peer's audit token at connect; not exercised off a Mac), so a user
//!     holding 1100 XPC connections that send nothing (a loop of
//!     `xpc_connection_create_mach_service` + `activate` without a message) has
//!     all but the newest 1024 cancelled while another user's shimmed probe is decided
//!     over XPC within its deadline (`metalift audit --last 1` shows
//!     `transport: xpc`); on the socket `LOCAL_PEERCRED` (tokio's `peer_cred`)
//!     keys the same share.
//! 36. **libmetalift after review v5's P2s** (issue 42 item 5; `shim/c/`, only
//!     type-checked here by `scripts/ci-shim.sh`): (a) with the opt-in
//!     LaunchAgent and no system socket, a Terminal-started shimmed probe
//!     reaches the agent through `$TMPDIR` (launchd's `DARWIN_USER_TEMP_DIR`,
//!     the directory `metaliftd --user` binds in, `macos/user_temp_dir.rs`), and
//!     `fs_usage -f filesys` shows no `confstr`/opendirectoryd traffic at all in
//!     a shimmed process; `env -u TMPDIR` gives stock with "no daemon"; (b) the
//!     launch-time replay only records Metal: a probe linking Metal is still
//!     hooked and unlocked (item 19), and `sample` during a constructor-time
//!     stall shows `ml_metal_arrived` called from `ml_constructor`, not from
//!     `image_added` under `_dyld_register_func_for_add_image`; a probe that
//!     `dlopen`s Metal late is still hooked from `image_added`; (c) the hook
//!     installs from `method_setImplementation`'s return value: the probe beside
//!     Cua's dylib (item 31) still reports the same `other_shim` outcomes; (d)
//!     `imp_owner.c` no longer gives dladdr the class: whether the class lies in
//!     its IMP's image is read from that image's load commands
//!     (`shim/c/macho.c`, tested on hand-built headers by `shim/tests/macho.rs`),
//!     so item 31's shimmed probe alone must still have no `other_shim` (each
//!     class found in its IMP's segments: Metal's and IOGPU's in the shared
//!     cache, the driver's in its bundle or the cache), and with Cua's dylib the
//!     same outcomes as item 31 says.
//! 37. **`metalift gpu`'s stock answers** (issue 43 item 7; `probe/src/macos.rs`
//!     `class_name`, only type-checked here): in a Virtualization.framework guest
//!     `metalift gpu --json` prints `"class": "AppleParavirtDevice"` (REAL-METAL 5),
//!     Apple5 and 32768 bytes (REAL-METAL 6), with `DYLD_INSERT_LIBRARIES` set to
//!     the shim in its environment (the probe runs without it); on an Apple7
//!     host, `metalift doctor`'s `stock gpu` check warns for an `apple7` profile.
//! 38. **The clone's name** (issue 43 item 3; `audit/host.rs`, run on Linux): two
//!     `tart clone`s of one image report the same `ioreg -rd1 -c
//!     IOPlatformExpertDevice` IOPlatformUUID and serial (the copied `ecid`), and
//!     `tart exec VM sudo sh -c "echo VM > /etc/metalift/instance"` makes the
//!     next records carry `host.instance = "VM"` within 2 s (the FSEvents-backed
//!     watcher's re-check), and rsyslog's `%hostname%` is the VM's name.
//! 39. **XPC while the system daemon restarts** (review v5 P2-6.6;
//!     `shim/c/config.c`, only compiled here): with the LaunchDaemon installed,
//!     `sudo launchctl kill SIGTERM system/com.metalift.metaliftd` and at once a
//!     shimmed probe: the probe's check-in goes by XPC (its debug log), launchd
//!     starts the daemon for the queued message, and the probe is unlocked
//!     within its deadline instead of "no daemon" stock; with the LaunchAgent
//!     mode (no daemon plist) nothing changes.
//! 40. **RELP's answers without TCP_QUICKACK** (issue 42; `audit/forward/conn.rs`
//!     `replies`, Linux-only option): with `transport = "relp"` to rsyslog's
//!     `examples/collectors/rsyslog-relp.conf` on another machine, run 10,000
//!     check-ins in a loop and watch `metalift status --json`'s
//!     `forwarder.records_behind`: if it grows and drains at about 128 records per
//!     delayed ACK (macOS's `net.inet.tcp.delayed_ack`), the forwarder needs a
//!     macOS way to acknowledge at once while it waits (on Linux, 0.2 MiB behind
//!     at 15,000 records/s).
#![allow(unsafe_code)]

pub mod audit_token;
pub mod code_identity;
pub mod panic_boundary;
pub mod sysctl;
pub mod user_temp_dir;
