//! The other workspace binaries these tests drive beside `metalift`.
//!
//! cargo builds for an integration test only the binaries of its own package, so
//! `metaliftd` (package metalift-daemon), `metalift-probe` and libmetalift are
//! found beside `metalift` in the profile directory (`target/<profile>/`), not
//! through `CARGO_BIN_EXE_*`. A missing one fails the test with the fix; it never
//! skips.

use std::path::{Path, PathBuf};

/// `name` (`metaliftd`, `metalift-probe`, `libmetalift.so`) from this build, beside `metalift`.
pub fn workspace_binary(name: &str) -> PathBuf {
    let path = Path::new(env!("CARGO_BIN_EXE_metalift")).with_file_name(name);
    assert!(
        path.is_file(),
        "{} is missing: run `cargo build --workspace` first (scripts/test.sh does)",
        path.display()
    );
    path
}
