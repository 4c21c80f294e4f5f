//! metaliftd and the metalift admin CLI, as a library the thin binaries call.
//!
//! # Layout
//!
//! - [`cli`]: one module per `metalift` subcommand.
#![deny(unsafe_code)]

pub mod cli;
