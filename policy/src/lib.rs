//! metalift's policy engine: pure, with no I/O beyond reading the files it is asked to load.
//!
//! # Layout
//!
//! - [`profile`]: capability profiles (what an unlocked process is told).
//! - [`subject`]: who is asking, as the kernel tells it.
//! - [`verdict`]: the `#[must_use]` decision and its explanation trace.
//! - [`wire`]: the check-in protocol's messages and frames, shared with the shim.
#![forbid(unsafe_code)]

pub mod profile;
pub mod subject;
pub mod verdict;
pub mod wire;

pub use profile::Capabilities;
pub use subject::Subject;
pub use verdict::{Action, Considered, Mode, Verdict};
