//! metaliftd and the metalift admin CLI, as a library the thin binaries call.
//!
//! # Layout
//!
//! - [`cli`]: one module per `metalift` subcommand.
//! - [`audit`]: the audit log (records, writer with rotation, reader for `metalift audit`).
//! - [`policy_store`]: the live policy, swapped atomically on reload.
#![deny(unsafe_code)]

pub mod audit;
pub mod cli;
pub mod policy_store;
