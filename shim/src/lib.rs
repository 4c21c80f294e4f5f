//! metalift-shim: builds libmetalift, the shim metalift injects, from C
//! (`shim/c/`, see `shim/c/README.md` for why C), and tests its C parts.
//!
//! # Layout
//!
//! - `build.rs` compiles `shim/c/*.c` into `target/<profile>/libmetalift.so`
//!   (Linux; `libmetalift.dylib` on a Mac) — [`LIBRARY`] is its path.
//! - [`c`] (when the target is the host): safe wrappers over the pure C helpers
//!   (`wire.c`, `config.c`), linked into this crate, so the tests in `tests/`
//!   and the fuzz target `wire_decode_c` can hold the C to the Rust reference
//!   (`metalift_policy::wire`, `metalift_policy::profile`).
//!
//! Nothing in this crate runs inside injected processes.

/// The built shim library (`target/<profile>/libmetalift.so`); empty when this
/// target builds no shim (e.g. `cargo check --target aarch64-apple-darwin` on Linux).
pub const LIBRARY: &str = env!("METALIFT_SHIM_LIBRARY");

#[cfg(shim_c)]
pub mod c;
