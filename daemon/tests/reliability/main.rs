//! metaliftd's reliability suite (issue 7): the real daemon under load, killed,
//! starved of disk, attacked by local clients, and handed badly owned policies.
//!
//! Short form by default (what CI runs in `cargo test`); the long form with
//! `METALIFT_RELIABILITY=long cargo test -p metalift-daemon --test reliability`.
//! Nothing here asserts on speed: every wait has a hang guard, and liveness is
//! shown by the order of events, not by a stopwatch. RELIABILITY.md records
//! the runs.
//!
//! - `load`: 64 clients while valid and invalid policies are written every few ms.
//! - `crash`: SIGKILL mid-load, the shim during the gap, restart.
//! - `disk_full`: the audit log's file system full, then space back.
//! - `hostile`: garbage, oversize frames, idle and non-reading clients.
//! - `ownership`: policies with the wrong owner or mode, under load.
#![cfg(target_os = "linux")]

mod crash;
mod disk_full;
mod hostile;
mod load;
mod ownership;
mod support;
