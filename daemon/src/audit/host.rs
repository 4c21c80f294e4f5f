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
//! # The clone's name (`instance`)
//!
//! Two clones of one image share more than a host name. Tart's `tart clone`
//! copies `config.json` (whose `ecid` is the `VZMacMachineIdentifier`, so the
//! platform UUID and serial number), `nvram.bin` and the disk verbatim, and draws
//! a new MAC address only when another VM on the same host already has the
//! source's (cirruslabs/tart `Sources/tart/VMDirectory.swift` `clone(to:generateMAC:)`,
//! `Sources/tart/Commands/Clone.swift`): clones on two hosts of a fleet keep the
//! image's MAC. Only the boot id differs by itself, and it is a random number no
//! orchestrator knows. So the orchestrator names the clone: it writes the name it
//! gave the VM (Tart's and Anka's VM name on the host, a CI job's runner name)
//! into the file `instance` beside the policy (`/etc/metalift/instance`), one
//! line. metaliftd reads it when it starts and again at every policy reload and
//! watcher re-check (every 2 s), so a clone named after boot carries the name
//! from then on; it is in every record's `host.instance`, the syslog HOSTNAME the
//! forwarder sends (`forward/frame.rs`), and the export bundle's name.
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
    /// The clone's name as the orchestrator gave it (the `instance` file beside
    /// the policy; see the module doc). Absent when none was given.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance: Option<String>,
}

/// The longest instance name taken (a syslog HOSTNAME may be 255; a file name
/// part of the export bundle's name is kept shorter).
pub const MAX_INSTANCE: usize = 128;

/// The instance file for the policy at `policy`: `instance` beside it.
#[must_use]
pub fn instance_path(policy: &std::path::Path) -> std::path::PathBuf {
    policy.with_file_name("instance")
}

/// The name in the instance file at `path`: its first line, trimmed; `Ok(None)`
/// when the file does not exist or is empty. A name that is not 1 to
/// [`MAX_INSTANCE`] printable ASCII characters without spaces (what a syslog
/// HOSTNAME may hold, RFC 5424 section 6.2.4) is an error that says so.
pub fn read_instance(path: &std::path::Path) -> std::io::Result<Option<String>> {
    let text = match std::fs::read(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let first = text.split(|&b| b == b'\n').next().unwrap_or_default();
    let name = String::from_utf8_lossy(first).trim().to_owned();
    if name.is_empty() {
        return Ok(None);
    }
    if name.len() > MAX_INSTANCE || !name.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!(
                "{}: {name:?} is not an instance name (1 to {MAX_INSTANCE} printable ASCII \
                 characters, no spaces)",
                path.display()
            ),
        ));
    }
    Ok(Some(name))
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
            instance: None,
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
    //! The boot session's UUID, by sysctl.
    pub(super) fn boot_id() -> Option<String> {
        let id = crate::macos::sysctl::string(c"kern.bootsessionuuid");
        if id.is_none() {
            tracing::warn!("sysctl kern.bootsessionuuid failed: audit records carry no boot id");
        }
        super::clean(&id?)
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

    #[test]
    fn the_instance_file_gives_one_printable_name_or_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = instance_path(&dir.path().join("policy.toml"));
        assert_eq!(path, dir.path().join("instance"));
        assert_eq!(read_instance(&path).unwrap(), None, "no file");
        std::fs::write(&path, "  \n").unwrap();
        assert_eq!(read_instance(&path).unwrap(), None, "empty");
        std::fs::write(&path, "ci-runner-17\nignored\n").unwrap();
        assert_eq!(
            read_instance(&path).unwrap().as_deref(),
            Some("ci-runner-17")
        );
        for bad in ["two words", "tab\there", &"x".repeat(MAX_INSTANCE + 1)] {
            std::fs::write(&path, bad).unwrap();
            let err = read_instance(&path).unwrap_err();
            assert!(err.to_string().contains("is not an instance name"), "{err}");
        }
    }

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
