//! The `metalift` admin commands, one module each. Each `run` returns the process exit code.

pub mod audit;
pub mod completions;
pub mod demo;
pub mod docs;
pub mod doctor;
pub mod edit;
pub mod exec;
pub mod explain;
pub mod report;
pub mod schema;
pub mod sigpipe;
pub mod status;
pub mod validate;
