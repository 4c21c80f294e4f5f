//! metaliftd, the policy service, as a library: its thin binary runs it, and the
//! `metalift` CLI (`cli/`) reads through it (defaults, the status client, the audit log).
//!
//! # Layout
//!
//! - [`config`]: metaliftd's flags and defaults, resolved into a `Config`.
//! - [`service`]: metaliftd's lifecycle: audit log, policy, socket, serve, stop cleanly.
//! - [`signals`]: signal dispositions (SIGXFSZ ignored: a full log means stock, not death).
//! - [`server`]: the transport-independent core: decide, audit, then answer.
//! - [`transport`]: how check-ins arrive (Unix socket; XPC on macOS) and the limits.
//! - [`peer`]: who is asking, from the kernel (`linux.rs`, `macos.rs`).
//! - [`identity_cache`]: executable sha256 by (dev, ino, size, mtime, ctime).
//! - [`blocking_pool`]: where identity work runs: blocking threads, bounded.
//! - [`full_disk_access`]: whether the daemon can read what TCC guards (macOS).
//! - [`status`]: the counters `metalift status` shows, and its client.
//! - [`memory`]: hands memory freed by a reload back to the system (glibc `malloc_trim`).
//! - [`oslog`]: a `tracing` layer into the system log (the unified log on macOS).
//! - [`audit`]: the audit log (records, writer with rotation, reader for `metalift audit`).
//! - [`policy_store`]: the live policy, swapped atomically on reload.
//! - [`policy_archive`]: the text of every policy made live, by hash, for `explain`.
//! - [`policy_host`]: the real machine behind the policy lints; path resolution.
//! - [`host_chip`]: the host chip's brand, for `apple_family_max = "host"`.
//! - [`watcher`]: watches the policy's directories and reloads on change.
#![deny(unsafe_code)]

pub mod audit;
pub mod blocking_pool;
pub mod config;
pub mod full_disk_access;
pub mod host_chip;
pub mod identity_cache;
#[cfg(target_os = "macos")]
pub mod macos;
pub mod memory;
pub mod oslog;
pub mod peer;
pub mod policy_archive;
pub mod policy_host;
pub mod policy_store;
pub mod server;
pub mod service;
pub mod signals;
pub mod status;
pub mod transport;
pub mod watcher;
