//! The XPC side of metalift's check-in protocol, shared by metaliftd's XPC
//! listener and its tests: what a message dictionary carries (one frame body of
//! `metalift_policy::wire`) and what one peer may say, in which order.
//!
//! # Layout
//!
//! - [`frame`]: the frame body as the dictionary's one `data` value, and what
//!   becomes of an older peer's dictionary (built and tested on every platform).
//! - [`exchange`]: the pure order and checks of one XPC peer's messages.
//! - `sys` (macOS): the libxpc functions and globals metalift uses, declared by hand.
//! - `message` (macOS): an owned libxpc dictionary carrying one frame.
//!
//! Unsafe code lives only in the two macOS modules, one operation per block with
//! a `// SAFETY:` line.

pub mod exchange;
pub mod frame;
#[cfg(target_os = "macos")]
pub mod message;
#[cfg(target_os = "macos")]
pub mod sys;
