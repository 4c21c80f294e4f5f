/*
 * macho.c — reading a 64-bit Mach-O header that is mapped in this process:
 * whether it is Metal (its LC_ID_DYLIB), and whether an address lies in one
 * of its segments. Pure memory reads of the image's own load commands: no
 * dyld call, so no dyld lock (review v5 P2-1). Compiled on every system so
 * the Linux tests can give it headers built by hand (shim/tests/macho.rs).
 */
#include "metalift_shim.h"

/* <mach-o/loader.h>, written by hand (no SDK needed). */
#define ML_MH_MAGIC_64 0xfeedfacfu
#define ML_MH_DYLIB 0x6u
#define ML_LC_ID_DYLIB 0xdu
#define ML_LC_SEGMENT_64 0x19u
#define ML_METAL_INSTALL_NAME "/System/Library/Frameworks/Metal.framework/Versions/A/Metal"
#define ML_HEADER_64 32u /* sizeof(struct mach_header_64) */

/* The load command at `offset`, or NULL when it would run past sizeofcmds. */
static const uint8_t *command(const uint8_t *base, uint32_t sizeofcmds, uint32_t offset,
                              uint32_t *cmd, uint32_t *cmdsize)
{
    if (offset > sizeofcmds || sizeofcmds - offset < 8)
        return NULL;
    const uint8_t *lc = base + ML_HEADER_64 + offset;
    memcpy(cmd, lc, 4);
    memcpy(cmdsize, lc + 4, 4);
    if (*cmdsize < 8 || *cmdsize > sizeofcmds - offset)
        return NULL;
    return lc;
}

/* Header fields; false unless a 64-bit Mach-O header. */
static bool header(const void *mh, uint32_t *filetype, uint32_t *ncmds, uint32_t *sizeofcmds)
{
    const uint8_t *h = mh;
    uint32_t magic;
    if (h == NULL)
        return false;
    memcpy(&magic, h, 4);
    if (magic != ML_MH_MAGIC_64)
        return false;
    memcpy(filetype, h + 12, 4);
    memcpy(ncmds, h + 16, 4);
    memcpy(sizeofcmds, h + 20, 4);
    return true;
}

bool ml_macho_is_metal(const void *mh)
{
    uint32_t filetype, ncmds, sizeofcmds, cmd, cmdsize;
    if (!header(mh, &filetype, &ncmds, &sizeofcmds) || filetype != ML_MH_DYLIB)
        return false;
    uint32_t offset = 0;
    for (uint32_t i = 0; i < ncmds; i++, offset += cmdsize) {
        const uint8_t *lc = command(mh, sizeofcmds, offset, &cmd, &cmdsize);
        if (lc == NULL)
            return false;
        if (cmd == ML_LC_ID_DYLIB) {
            uint32_t name;
            memcpy(&name, lc + 8, 4);
            return name < cmdsize && strcmp((const char *)lc + name, ML_METAL_INSTALL_NAME) == 0;
        }
    }
    return false;
}

/* Whether a segment command's 16-byte segname is `name` (NUL-padded). */
static bool segname_is(const uint8_t *lc, const char *name)
{
    for (size_t i = 0; i < 16; i++) {
        if ((char)lc[8 + i] != name[i])
            return false;
        if (name[i] == '\0')
            return true;
    }
    return true;
}

/* segment_command_64: segname at 8 (16 bytes), vmaddr 24, vmsize 32,
 * initprot 60. */
bool ml_macho_holds(const void *mh, const void *addr)
{
    uint32_t filetype, ncmds, sizeofcmds, cmd, cmdsize;
    if (!header(mh, &filetype, &ncmds, &sizeofcmds))
        return false;
    /* The slide is where the header is mapped minus __TEXT's vmaddr (the
     * header is __TEXT's start), the same for every segment of the image,
     * shared-cache images included (the cache slides as one: dyld-1378
     * common/MachOLoaded.cpp MachOLoaded::getSlide). */
    bool have_text = false;
    uint64_t text = 0;
    uint32_t offset = 0;
    for (uint32_t i = 0; i < ncmds && !have_text; i++, offset += cmdsize) {
        const uint8_t *lc = command(mh, sizeofcmds, offset, &cmd, &cmdsize);
        if (lc == NULL)
            return false;
        if (cmd == ML_LC_SEGMENT_64 && cmdsize >= 72 && segname_is(lc, "__TEXT")) {
            memcpy(&text, lc + 24, 8);
            have_text = true;
        }
    }
    if (!have_text)
        return false;
    uint64_t slide = (uint64_t)(uintptr_t)mh - text;
    uint64_t a = (uint64_t)(uintptr_t)addr;
    offset = 0;
    for (uint32_t i = 0; i < ncmds; i++, offset += cmdsize) {
        const uint8_t *lc = command(mh, sizeofcmds, offset, &cmd, &cmdsize);
        if (lc == NULL)
            return false;
        if (cmd != ML_LC_SEGMENT_64 || cmdsize < 72)
            continue;
        uint64_t vmaddr, vmsize;
        int32_t initprot;
        memcpy(&vmaddr, lc + 24, 8);
        memcpy(&vmsize, lc + 32, 8);
        memcpy(&initprot, lc + 60, 4);
        /* __PAGEZERO maps nothing; in the shared cache every image's
         * __LINKEDIT is the cache's one shared region, so it names no image. */
        if (initprot == 0 || segname_is(lc, "__LINKEDIT"))
            continue;
        uint64_t start = vmaddr + slide;
        if (a >= start && a - start < vmsize)
            return true;
    }
    return false;
}
