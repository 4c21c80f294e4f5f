//! The macOS build this machine runs (e.g. `24A335`), for verified unlock: a
//! verification (`metalift verify`) holds for one host chip and one macOS build,
//! so after an OS update a profile with `require_verified = true` answers stock
//! until the image is verified again (`crate::live_policy::verification`).
//!
//! Where the build comes from, first that answers (the same seam as the chip's
//! brand, `crate::live_policy::host_chip`):
//!
//! 1. `METALIFT_HOST_OS_BUILD` in the environment of the process that asks: for
//!    Linux test rigs, which have no macOS build, and for tests that play an OS
//!    update. Documented as test-only: on a Mac, leave it unset so the daemon and
//!    `metalift verify` both read the kernel's answer;
//! 2. macOS: `sysctlbyname("kern.osversion")`, the build string `sw_vers
//!    -buildVersion` prints;
//! 3. otherwise none (a verification then records `null`, and matches only a
//!    daemon that has none either).

use std::sync::OnceLock;

/// The override for the build string (see the module doc).
pub const OS_BUILD_ENV: &str = "METALIFT_HOST_OS_BUILD";

/// This process's view of the OS build: its environment's override, else the
/// machine's. Read on every call (cheap; `metalift verify` calls it once).
#[must_use]
pub fn os_build() -> Option<String> {
    match std::env::var(OS_BUILD_ENV) {
        Ok(b) if !b.trim().is_empty() => Some(b.trim().to_owned()),
        _ => platform::os_build(),
    }
}

/// The build metaliftd compares verifications with: [`os_build`], read once per
/// process (an OS update restarts the machine, and with it the daemon).
#[must_use]
pub fn daemon_os_build() -> Option<&'static str> {
    static BUILD: OnceLock<Option<String>> = OnceLock::new();
    BUILD
        .get_or_init(|| {
            let build = os_build();
            match &build {
                Some(b) => tracing::info!(build = %b, "macOS build (for verified unlock)"),
                None => tracing::info!("no macOS build known (set {OS_BUILD_ENV} on a test rig)"),
            }
            build
        })
        .as_deref()
}

#[cfg(target_os = "macos")]
mod platform {
    //! The build, by sysctl.
    pub(super) fn os_build() -> Option<String> {
        crate::macos::sysctl::string(c"kern.osversion")
    }
}

#[cfg(not(target_os = "macos"))]
mod platform {
    //! No macOS build outside macOS.
    pub(super) fn os_build() -> Option<String> {
        None
    }
}
