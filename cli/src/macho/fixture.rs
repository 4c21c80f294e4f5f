//! Test fixtures: Mach-O bytes built here, carrying chosen code-signing flags and
//! entitlements (the layouts `super` reads), so the checks run on Linux.

// Self-contained (the CLI's integration tests include this file too); the same
// values as `super`'s, from <mach-o/loader.h>, <mach-o/fat.h> and xnu's cs_blobs.h.
#![allow(dead_code)]

const FAT_MAGIC: u32 = 0xcafe_babe;
const MH_MAGIC_64: u32 = 0xfeed_facf;
const LC_CODE_SIGNATURE: u32 = 0x1d;
const CSMAGIC_EMBEDDED_SIGNATURE: u32 = 0xfade_0cc0;
const CSMAGIC_CODEDIRECTORY: u32 = 0xfade_0c02;
const CSMAGIC_EMBEDDED_ENTITLEMENTS: u32 = 0xfade_7171;
const CSSLOT_CODEDIRECTORY: u32 = 0;
const CSSLOT_ENTITLEMENTS: u32 = 5;

/// A code signature: CodeDirectory flags and entitlement keys granted `true`.
pub(crate) struct Sign {
    flags: u32,
    keys: Vec<String>,
}

impl Sign {
    pub(crate) fn new(flags: u32) -> Sign {
        Sign {
            flags,
            keys: Vec::new(),
        }
    }

    pub(crate) fn entitle(mut self, key: &str) -> Sign {
        self.keys.push(key.to_owned());
        self
    }

    fn blob(&self) -> Vec<u8> {
        // CodeDirectory: magic, length, version, flags (the rest zero).
        let mut cd = Vec::new();
        for w in [CSMAGIC_CODEDIRECTORY, 44, 0x20400, self.flags] {
            cd.extend(w.to_be_bytes());
        }
        cd.resize(44, 0);
        let mut blobs = vec![(CSSLOT_CODEDIRECTORY, cd)];
        if !self.keys.is_empty() {
            let mut xml = String::from(
                "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<plist version=\"1.0\">\n<dict>\n",
            );
            for k in &self.keys {
                xml.push_str(&format!("\t<key>{k}</key>\n\t<true/>\n"));
            }
            xml.push_str("</dict>\n</plist>\n");
            let mut ent = CSMAGIC_EMBEDDED_ENTITLEMENTS.to_be_bytes().to_vec();
            ent.extend(u32::try_from(8 + xml.len()).unwrap_or(0).to_be_bytes());
            ent.extend(xml.as_bytes());
            blobs.push((CSSLOT_ENTITLEMENTS, ent));
        }
        let header = 12 + 8 * blobs.len();
        let mut index = Vec::new();
        let mut body: Vec<u8> = Vec::new();
        for (slot, b) in &blobs {
            index.extend(slot.to_be_bytes());
            index.extend(
                u32::try_from(header + body.len())
                    .unwrap_or(0)
                    .to_be_bytes(),
            );
            body.extend(b);
        }
        let mut out = CSMAGIC_EMBEDDED_SIGNATURE.to_be_bytes().to_vec();
        out.extend(
            u32::try_from(header + body.len())
                .unwrap_or(0)
                .to_be_bytes(),
        );
        out.extend(u32::try_from(blobs.len()).unwrap_or(0).to_be_bytes());
        out.extend(index);
        out.extend(body);
        out
    }
}

/// A thin 64-bit Mach-O executable of `cputype`/`subtype`, signed with `sign`.
pub(crate) fn thin(cputype: u32, subtype: u32, sign: Option<&Sign>) -> Vec<u8> {
    let ncmds = u32::from(sign.is_some());
    let sizeofcmds = if sign.is_some() { 16 } else { 0 };
    let mut out = Vec::new();
    // mach_header_64: magic, cputype, cpusubtype, filetype (MH_EXECUTE), ncmds,
    // sizeofcmds, flags, reserved.
    for w in [MH_MAGIC_64, cputype, subtype, 2, ncmds, sizeofcmds, 0, 0] {
        out.extend(w.to_le_bytes());
    }
    if let Some(sign) = sign {
        let blob = sign.blob();
        let dataoff = 32 + 16 + 16; // after the header, the command, some padding
        for w in [
            LC_CODE_SIGNATURE,
            16,
            dataoff,
            u32::try_from(blob.len()).unwrap_or(0),
        ] {
            out.extend(w.to_le_bytes());
        }
        out.resize(dataoff as usize, 0);
        out.extend(blob);
    }
    out
}

/// A fat file of `slices` (32-bit fat_arch, 16-byte aligned).
pub(crate) fn fat(slices: &[Vec<u8>]) -> Vec<u8> {
    let mut out = FAT_MAGIC.to_be_bytes().to_vec();
    out.extend(u32::try_from(slices.len()).unwrap_or(0).to_be_bytes());
    let mut offset = (8 + 20 * slices.len()).next_multiple_of(16);
    let mut layout = Vec::new();
    for s in slices {
        let cputype = u32::from_le_bytes([s[4], s[5], s[6], s[7]]);
        let subtype = u32::from_le_bytes([s[8], s[9], s[10], s[11]]);
        for w in [
            cputype,
            subtype,
            u32::try_from(offset).unwrap_or(0),
            u32::try_from(s.len()).unwrap_or(0),
            4,
        ] {
            out.extend(w.to_be_bytes());
        }
        layout.push(offset);
        offset = (offset + s.len()).next_multiple_of(16);
    }
    for (s, at) in slices.iter().zip(layout) {
        out.resize(at, 0);
        out.extend(s);
    }
    out
}
