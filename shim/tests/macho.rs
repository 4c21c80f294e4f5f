//! `shim/c/macho.c` on Mach-O headers built here: whether an address lies in
//! an image's segments, read from the image's own load commands, slid as the
//! header is mapped (how `imp_owner.c` tells, on macOS, whether a capability
//! method's class lies in its IMP's image without asking dyld: review v5
//! P2-1), and whether an image is Metal. The code runs here as on a Mac; only
//! the headers are this test's (laid out as `<mach-o/loader.h>` says).
#![cfg(shim_c)]

use metalift_shim::c;

const MH_MAGIC_64: u32 = 0xfeed_facf;
const MH_DYLIB: u32 = 6;
const LC_SEGMENT_64: u32 = 0x19;
const LC_ID_DYLIB: u32 = 0xd;
/// Where the image was linked to load: the header's __TEXT vmaddr.
const LINKED_AT: u64 = 0x1_8000_0000;

/// One `segment_command_64` (72 bytes, no sections).
fn segment(name: &str, vmaddr: u64, vmsize: u64, initprot: i32) -> Vec<u8> {
    let mut lc = Vec::new();
    lc.extend(LC_SEGMENT_64.to_le_bytes());
    lc.extend(72u32.to_le_bytes());
    let mut segname = [0u8; 16];
    segname[..name.len()].copy_from_slice(name.as_bytes());
    lc.extend(segname);
    lc.extend(vmaddr.to_le_bytes());
    lc.extend(vmsize.to_le_bytes());
    lc.extend(0u64.to_le_bytes()); // fileoff
    lc.extend(0u64.to_le_bytes()); // filesize
    lc.extend(initprot.to_le_bytes()); // maxprot
    lc.extend(initprot.to_le_bytes());
    lc.extend(0u32.to_le_bytes()); // nsects
    lc.extend(0u32.to_le_bytes()); // flags
    lc
}

/// An `LC_ID_DYLIB` naming `install_name`.
fn id_dylib(install_name: &str) -> Vec<u8> {
    let mut name = install_name.as_bytes().to_vec();
    name.push(0);
    while (24 + name.len()) % 8 != 0 {
        name.push(0);
    }
    let mut lc = Vec::new();
    lc.extend(LC_ID_DYLIB.to_le_bytes());
    lc.extend(u32::try_from(24 + name.len()).unwrap().to_le_bytes());
    lc.extend(24u32.to_le_bytes()); // name offset
    lc.extend([0u8; 12]); // timestamp, versions
    lc.extend(name);
    lc
}

/// A 64-bit Mach-O dylib header followed by `commands`.
fn image(commands: &[Vec<u8>]) -> Vec<u8> {
    let body: Vec<u8> = commands.concat();
    let mut h = Vec::new();
    h.extend(MH_MAGIC_64.to_le_bytes());
    h.extend(0x0100_000cu32.to_le_bytes()); // CPU_TYPE_ARM64
    h.extend(0u32.to_le_bytes());
    h.extend(MH_DYLIB.to_le_bytes());
    h.extend(u32::try_from(commands.len()).unwrap().to_le_bytes());
    h.extend(u32::try_from(body.len()).unwrap().to_le_bytes());
    h.extend(0u32.to_le_bytes()); // flags
    h.extend(0u32.to_le_bytes()); // reserved
    h.extend(body);
    h
}

/// A dylib's layout: __PAGEZERO-like unmapped space before it, __TEXT (the
/// header's segment), a gap, __DATA_CONST and __DATA (where classes are), and
/// __LINKEDIT (shared by every image in the shared cache).
fn metal_like() -> Vec<u8> {
    image(&[
        segment("__PAGEZERO", LINKED_AT - 0x1000_0000, 0x1000_0000, 0),
        segment("__TEXT", LINKED_AT, 0x8000, 5),
        segment("__DATA_CONST", LINKED_AT + 0x10000, 0x4000, 3),
        segment("__DATA", LINKED_AT + 0x14000, 0x2000, 3),
        segment("__LINKEDIT", LINKED_AT + 0x20000, 0x8000, 1),
        id_dylib("/System/Library/Frameworks/Metal.framework/Versions/A/Metal"),
    ])
}

#[test]
fn an_address_in_any_mapped_segment_is_the_images_slid_as_the_header_is() {
    let img = metal_like();
    // The header is at __TEXT's start wherever it is mapped: the offsets below
    // are from the header, i.e. vmaddr - LINKED_AT.
    assert!(c::macho_holds(&img, 0x10), "code in __TEXT");
    assert!(c::macho_holds(&img, 0x7fff), "the last byte of __TEXT");
    assert!(c::macho_holds(&img, 0x10000), "a class in __DATA_CONST");
    assert!(c::macho_holds(&img, 0x15000), "a class in __DATA");
}

#[test]
fn an_address_outside_every_mapped_segment_is_not_the_images() {
    let img = metal_like();
    assert!(!c::macho_holds(&img, 0x8000), "just past __TEXT");
    assert!(!c::macho_holds(&img, 0x9000), "the gap before __DATA_CONST");
    assert!(!c::macho_holds(&img, 0x16000), "just past __DATA");
    assert!(!c::macho_holds(&img, 0x20010), "__LINKEDIT names no image");
    assert!(!c::macho_holds(&img, -0x10), "__PAGEZERO maps nothing");
}

#[test]
fn a_header_without_text_or_with_commands_past_its_size_holds_nothing() {
    let no_text = image(&[segment("__DATA", LINKED_AT, 0x1000, 3)]);
    assert!(!c::macho_holds(&no_text, 0x10));
    let mut lying = metal_like();
    lying[16..20].copy_from_slice(&99u32.to_le_bytes()); // ncmds past sizeofcmds
    assert!(!c::macho_holds(&lying, 0x9000));
    let mut not_macho = metal_like();
    not_macho[0] = 0;
    assert!(!c::macho_holds(&not_macho, 0x10));
    assert!(!c::macho_is_metal(&not_macho));
}

#[test]
fn only_a_dylib_whose_install_name_is_metals_is_metal() {
    assert!(c::macho_is_metal(&metal_like()));
    let other = image(&[
        segment("__TEXT", LINKED_AT, 0x8000, 5),
        id_dylib("/System/Library/Frameworks/MetalKit.framework/Versions/A/MetalKit"),
    ]);
    assert!(!c::macho_is_metal(&other));
}
