//! The host `metalift validate` lints against: the daemon's real file system and
//! user database, plus this crate's Mach-O reader for unlock rules whose
//! executable cannot take the shim (`super::shim_fit`).

use std::path::{Path, PathBuf};

use metalift_daemon::live_policy::host::RealHost;
use metalift_policy::{Host, PathFact};

/// [`RealHost`] and [`super::shim_fit::check`].
#[derive(Debug, Default, Clone, Copy)]
pub struct LintHost;

impl Host for LintHost {
    fn resolve(&self, path: &Path) -> PathFact {
        RealHost.resolve(path)
    }

    fn entries(&self, dir: &Path) -> Vec<PathBuf> {
        RealHost.entries(dir)
    }

    fn user_name(&self, uid: u32) -> Option<String> {
        RealHost.user_name(uid)
    }

    fn shim_problems(&self, path: &Path) -> Vec<String> {
        super::shim_fit::check(path)
            .into_iter()
            .map(|u| format!("{}; {}", u.message, u.fix))
            .collect()
    }
}
