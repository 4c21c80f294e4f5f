//! metaliftd and the metalift admin CLI, as a library the thin binaries call.
//!
//! # Layout
//!
//! - [`cli`]: one module per `metalift` subcommand.
//! - [`audit`]: the audit log (records, writer with rotation, reader for `metalift audit`).
//! - [`policy_store`]: the live policy, swapped atomically on reload.
//! - [`watcher`]: watches the policy's directories and reloads on change.
#![deny(unsafe_code)]

pub mod audit;
pub mod cli;
pub mod policy_store;
pub mod watcher;
