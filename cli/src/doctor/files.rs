//! The files of an installation: the audit log (writable, size, rotation) and the
//! shim (present, with every architecture its targets need).

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use super::check::{Check, Status};
use crate::exec::binary::{read_format, Arch, Format};
use metalift_daemon::audit::reader::log_files;

/// The audit log: present, writable by the daemon, and how large with its rotations.
pub fn audit_log(path: &Path) -> Check {
    let shown = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Check::new(
                "audit log",
                Status::Warn,
                format!("no audit log at {shown}"),
            )
            .fix("metaliftd creates it when it starts; check its --audit-log");
        }
        Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
            return Check::new(
                "audit log",
                Status::Warn,
                format!("cannot inspect {shown}: permission denied"),
            )
            .fix("run metalift doctor with sudo");
        }
        Err(e) => return Check::new("audit log", Status::Fail, format!("{shown}: {e}")),
    };
    let writable = if rustix::process::geteuid().is_root() {
        // Opening for append writes nothing.
        OpenOptions::new().append(true).open(path).is_ok()
    } else {
        meta.uid() == 0 && meta.mode() & 0o200 != 0
    };
    if !writable {
        return Check::new(
            "audit log",
            Status::Fail,
            format!("{shown} is not writable by metaliftd: every decision will be stock"),
        )
        .fix(format!("sudo chown root {shown} && sudo chmod u+w {shown}"));
    }
    let files = log_files(path).unwrap_or_default();
    let total: u64 = files
        .iter()
        .filter_map(|f| std::fs::metadata(f).ok())
        .map(|m| m.len())
        .sum();
    let rotated = files.len().saturating_sub(1);
    let mut message = format!(
        "{shown}: writable, {} live, {} in total with {rotated} rotated file{}",
        human(meta.len()),
        human(total),
        if rotated == 1 { "" } else { "s" }
    );
    let world = meta.mode() & 0o004 != 0;
    if world {
        message.push_str("; readable by every user");
        return Check::new("audit log", Status::Warn, message).fix(format!(
            "the log names every process: sudo chmod o-r {shown}"
        ));
    }
    Check::new("audit log", Status::Ok, message)
}

fn human(bytes: u64) -> String {
    const MIB: f64 = 1024.0 * 1024.0;
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / MIB)
    } else {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    }
}

/// The architectures the shim must contain on this platform: arm64 and arm64e
/// on macOS (arm64e processes load only arm64e code), the host's own ELF
/// elsewhere.
#[must_use]
pub fn needed_arches() -> Vec<Arch> {
    if cfg!(target_os = "macos") {
        return vec![Arch::MachArm64, Arch::MachArm64e];
    }
    let machine = match std::env::consts::ARCH {
        "x86_64" => 0x3e,
        "aarch64" => 0xb7,
        _ => return Vec::new(),
    };
    vec![Arch::Elf { class: 2, machine }]
}

/// The shim: present, a library, with the architectures it needs.
pub fn shim(path: &Path) -> Check {
    let shown = path.display();
    let arches = match read_format(path) {
        Ok(Format::Native(arches)) => arches,
        Ok(_) => {
            return Check::new(
                "shim",
                Status::Fail,
                format!("{shown} is not a loadable library: every process runs stock"),
            )
            .fix("reinstall metalift")
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Check::new(
                "shim",
                Status::Fail,
                format!("{shown} is missing: dyld refuses to start any job that still names it"),
            )
            .fix("reinstall metalift, or remove DYLD_INSERT_LIBRARIES from the jobs below")
        }
        Err(e) => return Check::new("shim", Status::Fail, format!("{shown}: {e}")),
    };
    let list = |a: &[Arch]| {
        a.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" + ")
    };
    let missing: Vec<Arch> = needed_arches()
        .into_iter()
        .filter(|need| !arches.contains(need))
        .collect();
    if missing.is_empty() {
        Check::new("shim", Status::Ok, format!("{shown}: {}", list(&arches)))
    } else {
        Check::new(
            "shim",
            Status::Fail,
            format!(
                "{shown} has {} but lacks {}: processes of that architecture run stock",
                list(&arches),
                list(&missing)
            ),
        )
        .fix("reinstall metalift (the .pkg ships a universal arm64 + arm64e shim)")
    }
}
