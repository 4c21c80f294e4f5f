//! A small, pure Mach-O reader: the slices of a (fat or thin) executable and, for
//! each, its code signature's CodeDirectory flags and entitlements. Enough to say
//! before it fails that an executable will not take the shim (`shim_fit`).
//!
//! Layouts (all from Apple's open source, no guessing):
//! - `<mach-o/fat.h>`: `fat_header` (`FAT_MAGIC` 0xcafebabe, `FAT_MAGIC_64`
//!   0xcafebabf, big-endian) and `fat_arch` / `fat_arch_64`.
//! - `<mach-o/loader.h>`: `mach_header_64` (`MH_MAGIC_64` 0xfeedfacf, little-endian
//!   on arm64 and x86_64), load commands, `LC_CODE_SIGNATURE` (0x1d) as a
//!   `linkedit_data_command` (dataoff, datasize).
//! - xnu `osfmk/kern/cs_blobs.h` (every value below checked against
//!   apple-oss-distributions/xnu at xnu-11417.101.15): the SuperBlob (`CSMAGIC_EMBEDDED_SIGNATURE`
//!   0xfade0cc0, big-endian, an index of (type, offset)), `CSSLOT_CODEDIRECTORY`
//!   0 and `CSSLOT_ENTITLEMENTS` 5, `CSMAGIC_CODEDIRECTORY` 0xfade0c02 (flags at
//!   byte 12), `CSMAGIC_EMBEDDED_ENTITLEMENTS` 0xfade7171 (an XML plist after the
//!   8-byte blob header), and the flags `CS_RESTRICT` 0x800, `CS_REQUIRE_LV`
//!   0x2000, `CS_RUNTIME` 0x10000.
#![forbid(unsafe_code)]

pub mod lint_host;
pub mod shim_fit;

/// `CS_RESTRICT`: dyld treats the process as restricted (no DYLD_* variables).
pub const CS_RESTRICT: u32 = 0x0000_0800;
/// `CS_REQUIRE_LV`: library validation (only Apple's or the same team's libraries).
pub const CS_REQUIRE_LV: u32 = 0x0000_2000;
/// `CS_RUNTIME`: the Hardened Runtime.
pub const CS_RUNTIME: u32 = 0x0001_0000;

const FAT_MAGIC: u32 = 0xcafe_babe;
const FAT_MAGIC_64: u32 = 0xcafe_babf;
const MH_MAGIC_64: u32 = 0xfeed_facf;
const MH_MAGIC: u32 = 0xfeed_face;
const LC_CODE_SIGNATURE: u32 = 0x1d;
const CSMAGIC_EMBEDDED_SIGNATURE: u32 = 0xfade_0cc0;
const CSMAGIC_CODEDIRECTORY: u32 = 0xfade_0c02;
const CSMAGIC_EMBEDDED_ENTITLEMENTS: u32 = 0xfade_7171;
const CSSLOT_CODEDIRECTORY: u32 = 0;
const CSSLOT_ENTITLEMENTS: u32 = 5;

/// `CPU_TYPE_X86_64`.
pub const CPU_TYPE_X86_64: u32 = 0x0100_0007;
/// `CPU_TYPE_ARM64`.
pub const CPU_TYPE_ARM64: u32 = 0x0100_000c;
/// `CPU_SUBTYPE_ARM64E` (after `CPU_SUBTYPE_MASK`).
pub const CPU_SUBTYPE_ARM64E: u32 = 2;

/// One architecture's image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Slice {
    /// `arm64`, `arm64e`, `x86_64`, or `cputype 0x…`.
    pub arch: String,
    /// The CodeDirectory's flags (`None`: not signed).
    pub cs_flags: Option<u32>,
    /// The entitlements plist's XML text (`None`: none embedded).
    pub entitlements: Option<String>,
}

impl Slice {
    /// Whether the entitlements grant `key` (`<key>KEY</key><true/>`).
    #[must_use]
    pub fn entitled(&self, key: &str) -> bool {
        let Some(xml) = &self.entitlements else {
            return false;
        };
        let tag = format!("<key>{key}</key>");
        xml.find(&tag)
            .is_some_and(|at| xml[at + tag.len()..].trim_start().starts_with("<true/>"))
    }
}

/// Why bytes are not a Mach-O this reader understands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// No Mach-O or fat magic at the start.
    #[error("not a Mach-O executable")]
    NotMachO,
    /// A header, command or blob runs past the end of the file.
    #[error("truncated Mach-O: {0}")]
    Truncated(&'static str),
}

/// The slices of `bytes` (one for a thin file).
///
/// # Errors
/// Not a Mach-O, or a structure runs past the end.
pub fn slices(bytes: &[u8]) -> Result<Vec<Slice>, Error> {
    match be32(bytes, 0).ok_or(Error::NotMachO)? {
        FAT_MAGIC | FAT_MAGIC_64 => {
            let is64 = be32(bytes, 0) == Some(FAT_MAGIC_64);
            let count = be32(bytes, 4).ok_or(Error::Truncated("fat header"))?;
            let size = if is64 { 32 } else { 20 };
            (0..count as usize)
                .map(|i| {
                    let at = 8 + i * size;
                    let (offset, len) = if is64 {
                        (be64(bytes, at + 8), be64(bytes, at + 16))
                    } else {
                        (
                            be32(bytes, at + 8).map(u64::from),
                            be32(bytes, at + 12).map(u64::from),
                        )
                    };
                    let (offset, len) = offset.zip(len).ok_or(Error::Truncated("fat_arch"))?;
                    let start =
                        usize::try_from(offset).map_err(|_| Error::Truncated("fat_arch"))?;
                    let end = start
                        .checked_add(
                            usize::try_from(len).map_err(|_| Error::Truncated("fat_arch"))?,
                        )
                        .filter(|&e| e <= bytes.len())
                        .ok_or(Error::Truncated("a fat slice"))?;
                    thin(&bytes[start..end])
                })
                .collect()
        }
        _ => Ok(vec![thin(bytes)?]),
    }
}

fn thin(bytes: &[u8]) -> Result<Slice, Error> {
    let magic = le32(bytes, 0).ok_or(Error::NotMachO)?;
    let header = match magic {
        MH_MAGIC_64 => 32,
        MH_MAGIC => 28,
        _ => return Err(Error::NotMachO),
    };
    let cputype = le32(bytes, 4).ok_or(Error::Truncated("mach header"))?;
    let subtype = le32(bytes, 8).ok_or(Error::Truncated("mach header"))? & 0x00ff_ffff;
    let ncmds = le32(bytes, 16).ok_or(Error::Truncated("mach header"))?;
    let arch = match (cputype, subtype) {
        (CPU_TYPE_ARM64, CPU_SUBTYPE_ARM64E) => "arm64e".to_owned(),
        (CPU_TYPE_ARM64, _) => "arm64".to_owned(),
        (CPU_TYPE_X86_64, _) => "x86_64".to_owned(),
        (other, _) => format!("cputype {other:#x}"),
    };
    let mut at = header;
    let mut signature = None;
    for _ in 0..ncmds {
        let cmd = le32(bytes, at).ok_or(Error::Truncated("load command"))?;
        let size = le32(bytes, at + 4).ok_or(Error::Truncated("load command"))? as usize;
        if cmd == LC_CODE_SIGNATURE {
            let off = le32(bytes, at + 8).ok_or(Error::Truncated("LC_CODE_SIGNATURE"))? as usize;
            let len = le32(bytes, at + 12).ok_or(Error::Truncated("LC_CODE_SIGNATURE"))? as usize;
            signature = Some(
                bytes
                    .get(off..off.saturating_add(len))
                    .ok_or(Error::Truncated("the code signature"))?,
            );
        }
        if size < 8 {
            return Err(Error::Truncated("a load command smaller than its header"));
        }
        at += size;
    }
    let (cs_flags, entitlements) = match signature {
        Some(blob) => super_blob(blob)?,
        None => (None, None),
    };
    Ok(Slice {
        arch,
        cs_flags,
        entitlements,
    })
}

fn super_blob(blob: &[u8]) -> Result<(Option<u32>, Option<String>), Error> {
    if be32(blob, 0) != Some(CSMAGIC_EMBEDDED_SIGNATURE) {
        return Ok((None, None));
    }
    let count = be32(blob, 8).ok_or(Error::Truncated("SuperBlob"))?;
    let (mut flags, mut entitlements) = (None, None);
    for i in 0..count as usize {
        let slot = be32(blob, 12 + i * 8).ok_or(Error::Truncated("SuperBlob index"))?;
        let off = be32(blob, 16 + i * 8).ok_or(Error::Truncated("SuperBlob index"))? as usize;
        match slot {
            CSSLOT_CODEDIRECTORY if be32(blob, off) == Some(CSMAGIC_CODEDIRECTORY) => {
                flags = Some(be32(blob, off + 12).ok_or(Error::Truncated("CodeDirectory"))?);
            }
            CSSLOT_ENTITLEMENTS if be32(blob, off) == Some(CSMAGIC_EMBEDDED_ENTITLEMENTS) => {
                let len = be32(blob, off + 4).ok_or(Error::Truncated("entitlements"))? as usize;
                let xml = blob
                    .get(off + 8..off + len.max(8))
                    .ok_or(Error::Truncated("entitlements"))?;
                entitlements = Some(String::from_utf8_lossy(xml).into_owned());
            }
            _ => {}
        }
    }
    Ok((flags, entitlements))
}

fn be32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn be64(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

fn le32(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

#[cfg(test)]
pub(crate) mod fixture;

#[cfg(test)]
mod tests {
    use super::fixture::{fat, thin, Sign};
    use super::*;

    #[test]
    fn a_thin_hardened_arm64_slice_gives_its_flags_and_entitlements() {
        let bytes = thin(
            CPU_TYPE_ARM64,
            0,
            Some(
                &Sign::new(CS_RUNTIME).entitle("com.apple.security.cs.disable-library-validation"),
            ),
        );
        let s = slices(&bytes).unwrap();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].arch, "arm64");
        assert_eq!(s[0].cs_flags, Some(CS_RUNTIME));
        assert!(s[0].entitled("com.apple.security.cs.disable-library-validation"));
        assert!(!s[0].entitled("com.apple.security.cs.allow-dyld-environment-variables"));
    }

    #[test]
    fn a_fat_file_gives_every_slice_and_an_unsigned_one_has_no_flags() {
        let bytes = fat(&[
            thin(CPU_TYPE_X86_64, 3, None),
            thin(CPU_TYPE_ARM64, CPU_SUBTYPE_ARM64E, Some(&Sign::new(0))),
        ]);
        let s = slices(&bytes).unwrap();
        let arches: Vec<&str> = s.iter().map(|s| s.arch.as_str()).collect();
        assert_eq!(arches, ["x86_64", "arm64e"]);
        assert_eq!(s[0].cs_flags, None);
        assert_eq!(s[1].cs_flags, Some(0));
    }

    #[test]
    fn text_and_truncated_files_are_errors_not_panics() {
        assert_eq!(slices(b"#!/bin/sh\n"), Err(Error::NotMachO));
        let bytes = thin(CPU_TYPE_ARM64, 0, Some(&Sign::new(CS_RUNTIME)));
        for cut in [3, 20, 40, bytes.len() - 5] {
            assert!(slices(&bytes[..cut]).is_err(), "cut at {cut}");
        }
    }
}
