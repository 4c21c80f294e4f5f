//! The XPC side of metalift's check-in protocol, shared by metaliftd's XPC listener
//! and libmetalift's XPC client so that both speak one dictionary layout.
//!
//! # Layout
//!
//! - [`dict`]: the pure mapping of [`metalift_policy::wire::Message`]s onto
//!   dictionary keys (built and tested on every platform).
//! - [`exchange`]: the pure order and checks of one XPC peer's messages.
//! - `sys` (macOS): the ~25 libxpc functions and globals, declared by hand.
//! - `xpc_dict` (macOS): an owned libxpc dictionary behind [`dict`]'s traits.
//!
//! Unsafe code lives only in the two macOS modules, one operation per block with
//! a `// SAFETY:` line.

pub mod dict;
pub mod exchange;
#[cfg(target_os = "macos")]
pub mod sys;
#[cfg(target_os = "macos")]
pub mod xpc_dict;
