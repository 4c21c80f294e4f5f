//! The path a check-in takes: a transport accepts it, the peer is identified by
//! the kernel (off the async executor, bounded), and the core decides, audits and
//! answers.
//!
//! - [`transport`]: how check-ins arrive (Unix socket; XPC on macOS) and the limits.
//! - [`peer`]: who is asking, from the kernel (`linux.rs`, `macos.rs`).
//! - [`blocking_pool`]: where identity work runs: blocking threads, bounded.
//! - [`per_user`]: each uid's share of every bound (places, workers).
//! - [`identity_cache`]: executable sha256 by (dev, ino, size, mtime, ctime).
//! - [`session`]: a check-in's steps from admission to outcome, written once
//!   for every transport (places, the token check, refusals).
//! - [`server`]: the transport-independent core: decide, audit, then answer;
//!   `decision`: what a decision becomes (its audit record, the wire verdict).

pub mod blocking_pool;
mod decision;
pub mod identity_cache;
pub mod peer;
pub mod per_user;
pub mod server;
pub mod session;
pub mod transport;
