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

/// The architectures the shim must contain on this platform (see [`needed_arches_on`]).
#[must_use]
pub fn needed_arches() -> Vec<Arch> {
    needed_arches_on(cfg!(target_os = "macos"), std::env::consts::ARCH)
}

/// The architectures the shim must contain: on macOS arm64, arm64e (arm64e
/// processes, Apple's own binaries, load only arm64e code: dyld
/// GradedArchitectures.cpp) and x86_64 (Rosetta processes); elsewhere the host's
/// own ELF (`host_arch` as in `std::env::consts::ARCH`).
///
/// On macOS a missing slice is fatal, not stock: an injected library is inherited
/// by every child, and dyld terminates a process whose inserted library has no
/// slice for it (dyld DyldRuntimeState.cpp, RuntimeState::loadInsertedLibraries:
/// "terminating because inserted dylib ... could not be loaded"), so without
/// x86_64 every Rosetta child of an injected CI agent dies at launch.
#[must_use]
pub fn needed_arches_on(macos: bool, host_arch: &str) -> Vec<Arch> {
    if macos {
        return vec![Arch::MachArm64, Arch::MachArm64e, Arch::MachX86_64];
    }
    let machine = match host_arch {
        "x86_64" => 0x3e,
        "aarch64" => 0xb7,
        _ => return Vec::new(),
    };
    vec![Arch::Elf { class: 2, machine }]
}

/// The shim: present, a library, with the architectures this platform needs.
pub fn shim(path: &Path) -> Check {
    shim_needing(path, &needed_arches())
}

/// The shim at `path`: present, a library, with every architecture in `needed`.
pub fn shim_needing(path: &Path, needed: &[Arch]) -> Check {
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
            // The jobs that name it: doctor's own fix (`launchd::missing_shim_fix`).
            .fix("reinstall metalift");
        }
        Err(e) => return Check::new("shim", Status::Fail, format!("{shown}: {e}")),
    };
    let list = |a: &[Arch]| {
        a.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" + ")
    };
    let missing: Vec<Arch> = needed
        .iter()
        .copied()
        .filter(|need| !arches.contains(need))
        .collect();
    if missing.is_empty() {
        return Check::new("shim", Status::Ok, format!("{shown}: {}", list(&arches)));
    }
    // ld.so skips a preload of the wrong ELF class (the process runs stock); dyld
    // terminates the process instead (see needed_arches_on).
    let mach = missing.iter().any(|a| !matches!(a, Arch::Elf { .. }));
    let consequence = if !mach {
        "processes of that architecture run stock"
    } else if missing.contains(&Arch::MachX86_64) {
        "dyld terminates every process of that architecture that inherits \
         DYLD_INSERT_LIBRARIES (x86_64: every Rosetta child of an injected process)"
    } else {
        "dyld terminates every process of that architecture that inherits \
         DYLD_INSERT_LIBRARIES"
    };
    Check::new(
        "shim",
        Status::Fail,
        format!(
            "{shown} has {} but lacks {}: {consequence}",
            list(&arches),
            list(&missing)
        ),
    )
    .fix("reinstall metalift (the .pkg ships a universal arm64 + arm64e + x86_64 shim)")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fat Mach-O header (`fat_header` + `fat_arch` entries, big-endian, as
    /// `lipo -create` writes it) with the given (cputype, cpusubtype) slices.
    fn fat_file(dir: &Path, slices: &[(u32, u32)]) -> std::path::PathBuf {
        let mut bytes = 0xcafe_babe_u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(&(slices.len() as u32).to_be_bytes());
        for (i, (cpu, sub)) in slices.iter().enumerate() {
            bytes.extend_from_slice(&cpu.to_be_bytes());
            bytes.extend_from_slice(&sub.to_be_bytes());
            let offset = 0x4000 * (i as u32 + 1);
            for field in [offset, 0x4000, 14] {
                bytes.extend_from_slice(&field.to_be_bytes());
            }
        }
        let path = dir.join("libmetalift.dylib");
        std::fs::write(&path, bytes).unwrap();
        path
    }

    const ARM64: (u32, u32) = (0x0100_000c, 0);
    /// CPU_SUBTYPE_ARM64E with the PTRAUTH_ABI capability bit, as Apple clang writes it.
    const ARM64E: (u32, u32) = (0x0100_000c, 0x8000_0002);
    const X86_64: (u32, u32) = (0x0100_0007, 3);

    #[test]
    fn given_macos_then_the_shim_needs_arm64_arm64e_and_x86_64() {
        assert_eq!(
            needed_arches_on(true, "aarch64"),
            [Arch::MachArm64, Arch::MachArm64e, Arch::MachX86_64]
        );
        assert_eq!(
            needed_arches_on(false, "x86_64"),
            [Arch::Elf {
                class: 2,
                machine: 0x3e
            }]
        );
    }

    #[test]
    fn given_a_universal_shim_with_every_macos_slice_then_the_check_is_ok() {
        let dir = tempfile::tempdir().unwrap();
        let path = fat_file(dir.path(), &[X86_64, ARM64, ARM64E]);
        let check = shim_needing(&path, &needed_arches_on(true, "aarch64"));
        assert_eq!(check.status, Status::Ok, "{check:?}");
        assert!(
            check.message.ends_with(": x86_64 + arm64 + arm64e"),
            "{check:?}"
        );
    }

    #[test]
    fn given_a_shim_without_x86_64_then_the_check_fails_naming_rosetta() {
        let dir = tempfile::tempdir().unwrap();
        let path = fat_file(dir.path(), &[ARM64, ARM64E]);
        let check = shim_needing(&path, &needed_arches_on(true, "aarch64"));
        assert_eq!(check.status, Status::Fail, "{check:?}");
        assert!(
            check
                .message
                .contains("has arm64 + arm64e but lacks x86_64: dyld terminates"),
            "{check:?}"
        );
        assert!(check.message.contains("Rosetta"), "{check:?}");
        assert!(check.fix.contains("x86_64"), "{check:?}");
    }

    #[test]
    fn given_a_shim_without_arm64e_then_the_check_fails_without_blaming_rosetta() {
        let dir = tempfile::tempdir().unwrap();
        let path = fat_file(dir.path(), &[ARM64, X86_64]);
        let check = shim_needing(&path, &needed_arches_on(true, "aarch64"));
        assert_eq!(check.status, Status::Fail, "{check:?}");
        assert!(
            check.message.contains("lacks arm64e: dyld terminates"),
            "{check:?}"
        );
        assert!(!check.message.contains("Rosetta"), "{check:?}");
    }
}
