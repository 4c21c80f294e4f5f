//! The host's chip brand, for `apple_family_max = "host"` and for the ceiling no
//! unlock exceeds (never above the host: the policy crate's `ceiling` module): read
//! once by metaliftd and handed to the policy compiler (the brand → family table is
//! the policy crate's `chip` module, pure and tested).
//!
//! Where the brand comes from, first that answers:
//!
//! 1. the daemon's own environment, `METALIFT_HOST_CHIP_BRAND` (for Linux test rigs
//!    and for a guest whose brand string is unhelpful). Only metaliftd reads it: it
//!    is the environment launchd gives the daemon, never a client's — `metalift
//!    explain` takes `--host-chip-brand` as an explicit what-if instead;
//! 2. macOS: `sysctlbyname("machdep.cpu.brand_string")`. In a Virtualization.framework
//!    guest it names the host's chip, e.g. "Apple M2 (Virtual)";
//! 3. otherwise none: `"host"` resolves to 7, with a warning in the policy's load, and
//!    a numeric ceiling cannot be capped (Apple9 and above draw a warning).

use std::path::Path;
use std::sync::OnceLock;

use metalift_policy::{load_within, CompileOptions, HostFamily, LoadError, LoadOptions, Loaded};

/// The daemon's override for the brand string (see the module doc).
pub const BRAND_ENV: &str = "METALIFT_HOST_CHIP_BRAND";

/// The machine's own brand string, without any override: what `metalift explain`
/// uses by default. `None` where the platform has no such string (Linux).
#[must_use]
pub fn machine_brand() -> Option<String> {
    platform::brand()
}

/// The brand metaliftd resolves `"host"` with: its environment's override, else the
/// machine's. Read once per process; the first call logs what was found.
#[must_use]
pub fn daemon_host() -> &'static HostFamily {
    static HOST: OnceLock<HostFamily> = OnceLock::new();
    HOST.get_or_init(|| {
        let (brand, from) = match std::env::var(BRAND_ENV) {
            Ok(b) if !b.trim().is_empty() => (Some(b.trim().to_owned()), BRAND_ENV),
            _ => (machine_brand(), "sysctl machdep.cpu.brand_string"),
        };
        let host = HostFamily { brand };
        match (&host.brand, host.known_family()) {
            (Some(brand), Some(family)) => {
                tracing::info!(%brand, family, from, "host chip: apple_family_max = \"host\" means {family}");
            }
            (Some(brand), None) => tracing::warn!(
                %brand, from,
                "host chip not known to metalift: apple_family_max = \"host\" means {}",
                host.family()
            ),
            (None, _) => tracing::warn!(
                "host chip brand not readable (set {BRAND_ENV} for metaliftd): apple_family_max = \"host\" means {}",
                host.family()
            ),
        }
        host
    })
}

/// [`metalift_policy::load`] with `"host"` resolved for this daemon's machine: what
/// the policy store calls to load the policy.
pub fn load(path: &Path, opts: &LoadOptions, max_bytes: u64) -> Result<Loaded, LoadError> {
    load_within(
        path,
        opts,
        &CompileOptions {
            host: daemon_host().clone(),
            // The policy_loaded record warns about a rule that has already ended.
            now: Some(std::time::SystemTime::now()),
        },
        max_bytes,
    )
}

#[cfg(target_os = "macos")]
mod platform {
    //! The brand string, by sysctl.
    pub(super) fn brand() -> Option<String> {
        crate::macos::sysctl::string(c"machdep.cpu.brand_string")
    }
}

#[cfg(not(target_os = "macos"))]
mod platform {
    //! No brand string outside macOS (Linux's /proc/cpuinfo names no Apple GPU).
    pub(super) fn brand() -> Option<String> {
        None
    }
}
