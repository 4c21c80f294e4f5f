//! The policy's life in the daemon: watched, loaded (parse, validate, compile),
//! swapped in atomically or refused with the last good one kept, and archived.
//!
//! - [`watcher`]: watches the policy's directories and reloads on change.
//! - [`store`]: the live policy, swapped atomically on reload.
//! - [`archive`]: the text of every policy made live, by hash, for `explain`.
//! - [`archive_retry`]: texts the archive could not take yet, written again later.
//! - [`host`]: the real machine behind the policy lints; path resolution.
//! - `load_attempt`: one load (valid, missing or refused) and a refusal's audit record.
//! - [`host_chip`]: the host chip's brand, for `apple_family_max = "host"`.
//! - [`host_os`]: the macOS build, for verified unlock.
//! - [`verification`]: verified unlock (`require_verified = true`): the recorded
//!   verifications and the gate that answers stock without a passing one.

pub mod archive;
pub mod archive_retry;
pub mod host;
pub mod host_chip;
pub mod host_os;
mod load_attempt;
pub mod store;
pub mod verification;
pub mod watcher;
