//! metaliftd, the policy service, as a library: its thin binary runs it, and the
//! `metalift` CLI (`cli/`) reads through it (defaults, the status client, the audit log).
//!
//! # Layout
//!
//! The folders follow the two paths through the daemon, plus its own plumbing:
//!
//! - [`checkin`]: the path a check-in takes. [`checkin::transport`] (Unix socket;
//!   XPC on macOS) → [`checkin::peer`] (who is asking, from the kernel) on the
//!   [`checkin::blocking_pool`], with [`checkin::identity_cache`] → the core,
//!   [`checkin::server`]: decide with the live policy, audit, then answer.
//! - [`live_policy`]: the path a policy edit takes. [`live_policy::watcher`]
//!   (the policy's directories, read once a writer is done) →
//!   [`live_policy::store`] (parse, validate, compile, swap atomically) →
//!   [`live_policy::archive`] (the text of every policy made live, by hash);
//!   the host facts the compile uses: [`live_policy::host`] (the machine behind
//!   the lints) and [`live_policy::host_chip`] (`apple_family_max = "host"`).
//! - [`audit`]: the audit log (records, writer with rotation, one follower of the rotated
//!   files under both the reader for `metalift audit` and the forwarder).
//! - [`service`]: metaliftd's own plumbing: its lifecycle ([`service::run`]),
//!   [`service::config`], [`service::signals`], [`service::memory`] (handing a
//!   reload's freed memory back), [`service::oslog`] (the system log),
//!   [`service::status`] (the counters `metalift status` shows, and its client),
//!   [`service::full_disk_access`] (macOS).
//! - `macos` (macOS only): libxpc, audit tokens, code signatures.
//! - [`holder_lock`]: a lock file that names its holder (one daemon per audit
//!   log, one `metalift edit` per policy).
//! - [`scratch`]: a throw-away metaliftd on a directory of its own, for `metalift
//!   demo`/`verify`, the benchmarks and every test crate.
#![deny(unsafe_code)]

pub mod audit;
pub mod checkin;
pub mod holder_lock;
pub mod live_policy;
#[cfg(target_os = "macos")]
pub mod macos;
pub mod scratch;
pub mod service;
