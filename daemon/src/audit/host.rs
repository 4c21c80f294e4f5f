//! The `host` part of every audit record: which machine wrote it. Cloned CI guests
//! share serial numbers and often host names, so beside the name it carries the
//! **boot session id** (random per boot: it tells two clones of one image apart)
//! and the admin's `[audit.labels]` (`metalift_policy::labels`, e.g. the image).
//!
//! The name and boot id are read once, when the log opens (neither changes while
//! the daemon runs); the labels are replaced on every policy load. The writer's
//! pid (metaliftd's, for every record it writes) tells two daemons' records
//! apart if they ever shared a log (issue 34: the log is now locked, but a
//! collector joining logs still sees which run wrote what).
//!
//! The macOS build (`os_build`) is read once too, from the same source verified
//! unlock compares with (`crate::live_policy::host_os`).
//!
//! Where the boot id comes from (`platform`):
//! - Linux: `/proc/sys/kernel/random/boot_id` (a UUID the kernel draws at boot;
//!   proc_sys_kernel(5)).
//! - macOS: `sysctlbyname("kern.bootsessionuuid")`: xnu's
//!   `bsd/kern/kern_sysctl.c` declares `SYSCTL_STRING(_kern, OID_AUTO,
//!   bootsessionuuid, CTLFLAG_RD | CTLFLAG_LOCKED, &bootsessionuuid_string,
//!   sizeof(bootsessionuuid_string), "")`, a `uuid_string_t` (37 bytes with its
//!   NUL) that `iokit/Kernel/IOPMrootDomain.cpp` fills at boot. Verify on a Mac.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Which machine, which boot, which image wrote a record.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Host {
    /// The host name (`uname -n`); clones of one image often share it.
    pub name: String,
    /// The boot session id (a UUID, new at every boot); `null` when unreadable.
    pub boot_id: Option<String>,
    /// The admin's `[audit.labels]` in the live policy (empty when none).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// The pid of the process that wrote the record: metaliftd's for every record
    /// it writes (`metalift verify`'s for the `verification` it appends itself).
    /// Absent from records of older daemons, and from a host part that describes
    /// a machine rather than a writer (`metalift audit export`'s manifest).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// The macOS build the machine runs (`24A335`; `crate::live_policy::host_os`),
    /// read once when the log opens (an update reboots): what a fleet's records are
    /// grouped by after a macOS update. Absent where none is known (Linux without
    /// the test rig's override) and from records of older daemons.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_build: Option<String>,
}

impl Host {
    /// This machine's name and boot id, with no labels yet.
    #[must_use]
    pub fn this_machine() -> Host {
        Host {
            name: rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned(),
            boot_id: platform::boot_id(),
            labels: BTreeMap::new(),
            pid: None,
            os_build: crate::live_policy::host_os::os_build(),
        }
    }

    /// This machine, as the host part of the records this process writes: with its pid.
    #[must_use]
    pub fn this_writer() -> Host {
        Host {
            pid: Some(std::process::id()),
            ..Host::this_machine()
        }
    }
}

/// A boot id as read: trimmed, and only if it looks like one (hex and dashes).
fn clean(raw: &str) -> Option<String> {
    let id = raw.trim();
    (!id.is_empty() && id.len() <= 64 && id.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-'))
        .then(|| id.to_ascii_lowercase())
}

#[cfg(target_os = "linux")]
mod platform {
    //! The boot id from procfs.
    pub(super) fn boot_id() -> Option<String> {
        match std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
            Ok(text) => super::clean(&text),
            Err(error) => {
                tracing::warn!(%error, "cannot read /proc/sys/kernel/random/boot_id: audit records carry no boot id");
                None
            }
        }
    }
}

#[cfg(target_os = "macos")]
mod platform {
    //! `sysctlbyname("kern.bootsessionuuid")`: the only FFI here.
    #![allow(unsafe_code)]

    use std::ffi::CStr;

    pub(super) fn boot_id() -> Option<String> {
        let name = c"kern.bootsessionuuid";
        let mut buf = [0u8; 64];
        let mut len: libc::size_t = buf.len();
        // SAFETY: `name` is NUL-terminated; `buf` is writable for `len` bytes and
        // `len` says so; sysctlbyname writes at most `len` bytes and updates it.
        let rc = unsafe {
            libc::sysctlbyname(
                name.as_ptr(),
                buf.as_mut_ptr().cast(),
                &mut len,
                std::ptr::null_mut(),
                0,
            )
        };
        if rc != 0 || len == 0 || len > buf.len() {
            tracing::warn!("sysctl kern.bootsessionuuid failed: audit records carry no boot id");
            return None;
        }
        let text = CStr::from_bytes_until_nul(&buf[..len])
            .ok()?
            .to_str()
            .ok()?;
        super::clean(text)
    }
}

#[cfg(not(any(target_os = "linux", target_os = "macos")))]
mod platform {
    //! No boot id known elsewhere.
    pub(super) fn boot_id() -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machine_has_the_kernels_boot_id_and_its_uname() {
        let host = Host::this_machine();
        let kernel = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
        assert_eq!(host.boot_id.as_deref(), Some(kernel.trim()));
        assert!(!host.name.is_empty());
    }

    #[test]
    fn only_a_hex_uuid_is_taken_as_a_boot_id() {
        assert_eq!(clean("6A8B-01\n").as_deref(), Some("6a8b-01"));
        assert_eq!(clean("not a uuid"), None);
        assert_eq!(clean(""), None);
    }
}
