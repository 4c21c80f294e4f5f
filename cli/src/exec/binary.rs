//! Which CPU slices an executable or a shim contains, read from its ELF or Mach-O
//! header, so `metalift exec` can say when the loader will refuse the shim.
//!
//! Only the headers are read (a few hundred bytes), never the whole file.

use std::fmt;
use std::fs::File;
use std::io::{self, Read};
use std::path::{Path, PathBuf};

/// One loadable architecture, as the dynamic loader matches it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Arch {
    /// Mach-O `CPU_TYPE_ARM64`, subtype `ARM64_ALL`/`ARM64_V8`.
    MachArm64,
    /// Mach-O `CPU_TYPE_ARM64`, subtype `ARM64E` (pointer authentication ABI).
    MachArm64e,
    /// Mach-O `CPU_TYPE_X86_64` (runs under Rosetta 2 on Apple Silicon).
    MachX86_64,
    /// Any other Mach-O CPU type (raw `cputype`).
    MachOther(i32),
    /// ELF: `EI_CLASS` (1 = 32-bit, 2 = 64-bit) and `e_machine`.
    Elf {
        /// `EI_CLASS`.
        class: u8,
        /// `e_machine`.
        machine: u16,
    },
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Arch::MachArm64 => f.write_str("arm64"),
            Arch::MachArm64e => f.write_str("arm64e"),
            Arch::MachX86_64 => f.write_str("x86_64"),
            Arch::MachOther(cpu) => write!(f, "Mach-O cputype {cpu:#x}"),
            Arch::Elf { class, machine } => {
                let bits = match class {
                    1 => "32-bit",
                    2 => "64-bit",
                    _ => "?-bit",
                };
                match machine {
                    0x3e => write!(f, "{bits} x86-64 ELF"),
                    0xb7 => write!(f, "{bits} aarch64 ELF"),
                    0x03 => write!(f, "{bits} i386 ELF"),
                    0x28 => write!(f, "{bits} arm ELF"),
                    other => write!(f, "{bits} ELF machine {other:#x}"),
                }
            }
        }
    }
}

/// What an executable file is, as far as injection cares.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Format {
    /// A native image with these slices (one for ELF and thin Mach-O, several for fat).
    Native(Vec<Arch>),
    /// A `#!` script: the kernel runs `interpreter`, so that is what gets the shim.
    Script {
        /// The interpreter named on the `#!` line.
        interpreter: PathBuf,
        /// Its first argument, if any (`python3` in `#!/usr/bin/env python3`).
        argument: Option<String>,
    },
    /// Anything else (unknown magic, truncated header).
    Unknown,
}

const FAT_MAGIC: u32 = 0xcafe_babe;
const FAT_MAGIC_64: u32 = 0xcafe_babf;
const MH_MAGIC_64: u32 = 0xfeed_facf;
const MH_CIGAM_64: u32 = 0xcffa_edfe;
const CPU_TYPE_X86_64: i32 = 0x0100_0007;
const CPU_TYPE_ARM64: i32 = 0x0100_000c;
const CPU_SUBTYPE_MASK: u32 = 0xff00_0000;
const CPU_SUBTYPE_ARM64E: u32 = 2;
/// A fat header claiming more slices than this is a Java class file (same magic).
const MAX_FAT_ARCHS: u32 = 32;
/// Enough for a fat header with `MAX_FAT_ARCHS` 64-bit entries and a long `#!` line.
const HEADER_LEN: usize = 8 + 32 * MAX_FAT_ARCHS as usize;

/// Reads the format of the file at `path`.
pub fn read_format(path: &Path) -> io::Result<Format> {
    let mut header = Vec::with_capacity(HEADER_LEN);
    File::open(path)?
        .take(HEADER_LEN as u64)
        .read_to_end(&mut header)?;
    Ok(parse_format(&header))
}

/// Classifies a file from its first bytes.
pub fn parse_format(header: &[u8]) -> Format {
    if let Some(line) = header.strip_prefix(b"#!") {
        return parse_shebang(line);
    }
    if header.len() >= 20 && header.starts_with(b"\x7fELF") {
        let class = header[4];
        let machine = match header[5] {
            2 => u16::from_be_bytes([header[18], header[19]]),
            _ => u16::from_le_bytes([header[18], header[19]]),
        };
        return Format::Native(vec![Arch::Elf { class, machine }]);
    }
    let Some(magic) = be_u32(header, 0) else {
        return Format::Unknown;
    };
    match magic {
        FAT_MAGIC | FAT_MAGIC_64 => parse_fat(header, magic == FAT_MAGIC_64),
        MH_CIGAM_64 | MH_MAGIC_64 => {
            // Thin 64-bit Mach-O: the header's own byte order follows the magic.
            let read = if magic == MH_CIGAM_64 { le_u32 } else { be_u32 };
            match (read(header, 4), read(header, 8)) {
                (Some(cpu), Some(sub)) => Format::Native(vec![mach_arch(cpu as i32, sub)]),
                _ => Format::Unknown,
            }
        }
        _ => Format::Unknown,
    }
}

fn parse_fat(header: &[u8], is_64: bool) -> Format {
    let Some(count) = be_u32(header, 4) else {
        return Format::Unknown;
    };
    if count == 0 || count > MAX_FAT_ARCHS {
        return Format::Unknown;
    }
    let entry_len = if is_64 { 32 } else { 20 };
    let mut arches = Vec::new();
    for i in 0..count as usize {
        let at = 8 + i * entry_len;
        match (be_u32(header, at), be_u32(header, at + 4)) {
            (Some(cpu), Some(sub)) => arches.push(mach_arch(cpu as i32, sub)),
            _ => return Format::Unknown,
        }
    }
    Format::Native(arches)
}

fn parse_shebang(line: &[u8]) -> Format {
    let end = line.iter().position(|&b| b == b'\n').unwrap_or(line.len());
    let Ok(text) = std::str::from_utf8(&line[..end]) else {
        return Format::Unknown;
    };
    let mut words = text.split_whitespace();
    match words.next() {
        Some(interpreter) => Format::Script {
            interpreter: PathBuf::from(interpreter),
            argument: words.next().map(str::to_owned),
        },
        None => Format::Unknown,
    }
}

fn mach_arch(cpu: i32, subtype: u32) -> Arch {
    match cpu {
        CPU_TYPE_ARM64 if subtype & !CPU_SUBTYPE_MASK == CPU_SUBTYPE_ARM64E => Arch::MachArm64e,
        CPU_TYPE_ARM64 => Arch::MachArm64,
        CPU_TYPE_X86_64 => Arch::MachX86_64,
        other => Arch::MachOther(other),
    }
}

fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

fn le_u32(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// The target's slices that the shim lacks, among those the loader may pick.
///
/// On Apple Silicon the kernel runs an arm64 or arm64e slice when there is one
/// (either may be chosen, so the shim needs both to be safe), and an x86_64-only
/// binary under Rosetta. So: if the target has any arm64-family slice, those are
/// the ones that matter; otherwise all of its slices do. ELF images have one.
pub fn missing_slices(target: &[Arch], shim: &[Arch]) -> Vec<Arch> {
    let arm: Vec<Arch> = target
        .iter()
        .copied()
        .filter(|a| matches!(a, Arch::MachArm64 | Arch::MachArm64e))
        .collect();
    let relevant = if arm.is_empty() { target.to_vec() } else { arm };
    let mut missing: Vec<Arch> = relevant.into_iter().filter(|a| !shim.contains(a)).collect();
    missing.sort();
    missing.dedup();
    missing
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thin_arm64(subtype: u32) -> Vec<u8> {
        let mut h = MH_MAGIC_64.to_le_bytes().to_vec();
        h.extend_from_slice(&CPU_TYPE_ARM64.to_le_bytes());
        h.extend_from_slice(&subtype.to_le_bytes());
        h.extend_from_slice(&[0; 20]);
        h
    }

    fn fat(entries: &[(i32, u32)]) -> Vec<u8> {
        let mut h = FAT_MAGIC.to_be_bytes().to_vec();
        h.extend_from_slice(&(entries.len() as u32).to_be_bytes());
        for (cpu, sub) in entries {
            h.extend_from_slice(&cpu.to_be_bytes());
            h.extend_from_slice(&sub.to_be_bytes());
            h.extend_from_slice(&[0; 12]);
        }
        h
    }

    #[test]
    fn thin_arm64_and_arm64e_are_told_apart() {
        assert_eq!(
            parse_format(&thin_arm64(0)),
            Format::Native(vec![Arch::MachArm64])
        );
        // The capability bits in the high byte (CPU_SUBTYPE_PTRAUTH_ABI) do not matter.
        assert_eq!(
            parse_format(&thin_arm64(0x8000_0002)),
            Format::Native(vec![Arch::MachArm64e])
        );
    }

    #[test]
    fn fat_binary_lists_every_slice() {
        let header = fat(&[(CPU_TYPE_X86_64, 3), (CPU_TYPE_ARM64, 2)]);
        assert_eq!(
            parse_format(&header),
            Format::Native(vec![Arch::MachX86_64, Arch::MachArm64e])
        );
    }

    #[test]
    fn java_class_file_is_not_a_fat_binary() {
        let mut header = FAT_MAGIC.to_be_bytes().to_vec();
        header.extend_from_slice(&[0, 0, 0, 0x41]); // class file version 65
        assert_eq!(parse_format(&header), Format::Unknown);
    }

    #[test]
    fn elf_class_and_machine_are_read() {
        let mut header = b"\x7fELF\x02\x01\x01".to_vec();
        header.resize(18, 0);
        header.extend_from_slice(&0xb7u16.to_le_bytes());
        assert_eq!(
            parse_format(&header),
            Format::Native(vec![Arch::Elf {
                class: 2,
                machine: 0xb7
            }])
        );
    }

    #[test]
    fn shebang_names_interpreter_and_argument() {
        assert_eq!(
            parse_format(b"#!/usr/bin/env python3\nprint(1)\n"),
            Format::Script {
                interpreter: PathBuf::from("/usr/bin/env"),
                argument: Some("python3".into()),
            }
        );
        assert_eq!(parse_format(b"#!\n"), Format::Unknown);
    }

    #[test]
    fn x86_64_only_target_needs_an_x86_64_shim_slice() {
        let shim = [Arch::MachArm64, Arch::MachArm64e];
        assert_eq!(
            missing_slices(&[Arch::MachX86_64], &shim),
            vec![Arch::MachX86_64]
        );
        // A universal target runs its arm64 slice: the universal shim covers it.
        assert!(missing_slices(&[Arch::MachX86_64, Arch::MachArm64], &shim).is_empty());
    }

    #[test]
    fn arm64e_target_needs_an_arm64e_shim_slice() {
        assert_eq!(
            missing_slices(&[Arch::MachArm64, Arch::MachArm64e], &[Arch::MachArm64]),
            vec![Arch::MachArm64e]
        );
    }

    #[test]
    fn elf_targets_must_match_class_and_machine() {
        let x86 = Arch::Elf {
            class: 2,
            machine: 0x3e,
        };
        let i386 = Arch::Elf {
            class: 1,
            machine: 0x03,
        };
        assert!(missing_slices(&[x86], &[x86]).is_empty());
        assert_eq!(missing_slices(&[i386], &[x86]), vec![i386]);
    }
}
