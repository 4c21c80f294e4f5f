//! The `metalift` admin commands, one module each. Each `run` returns the process exit code.
//!
//! Thin commands over two libraries: [`metalift_policy`] (the file format, validation,
//! the verdict) and [`metalift_daemon`] (metaliftd's defaults, its status client, the
//! audit records and their reader, the policy archive). The daemon's logic stays there;
//! what is here is what an admin types and reads.
//!
//! # Layout
//!
//! - [`validate`]: `metalift validate`: every problem in a policy, with its location.
//! - [`explain`]: `metalift explain`: which rule decides for an executable or a process, now or then.
//! - [`status`]: `metalift status`: what the running daemon serves, problems cause first.
//! - [`audit`]: `metalift audit`: decisions joined with outcomes, filters, summary, follow.
//! - [`exec`]: `metalift exec`: one command with libmetalift injected (`--require-unlock`).
//! - [`demo`]: `metalift demo`: a throw-away daemon and the probe, end to end.
//! - [`edit`]: `metalift edit`: visudo for the policy (lock, edit a copy, validate, install).
//! - [`doctor`]: `metalift doctor`: can this installation unlock anything, and the fix if not.
//! - [`schema`]: `metalift schema`: the JSON Schema of a policy file.
//! - [`verify`]: `metalift verify`: run a profile's kernels here and record the result (verified unlock).
//! - [`completions`], [`docs`]: shell completions and man pages from the clap definitions.
//! - [`reference`]: the exit status table and the command-line reference, for `--help` and the guide.
//! - [`report`]: `--json`, exit codes and how an error ends the process.
//! - [`sigpipe`]: a closed pipe ends the CLI quietly.
//! - [`host_severity`]: how much `"host"` on a chip unknown here weighs, for every tool.
#![deny(unsafe_code)]

pub mod audit;
pub mod completions;
pub mod daemon_args;
pub mod demo;
pub mod docs;
pub mod doctor;
pub mod edit;
pub mod exec;
pub mod explain;
pub mod gpu;
pub mod host_severity;
pub mod judgement;
pub mod macho;
pub mod reference;
pub mod report;
pub mod schema;
pub mod sigpipe;
pub mod status;
pub(crate) mod tools;
pub mod validate;
pub mod verify;
