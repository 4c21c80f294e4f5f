/*
 * imp_owner.c — whose an IMP is: Metal's own, metalift's, or another shim's
 * (e.g. Cua's LumeMetalCapabilities, which Tart's images ship: REAL-METAL.md
 * "How the working peers hook it").
 *
 * The judgement is by the image that holds the code, found with dladdr, and
 * compared with the image that holds the class defining the method:
 *
 * - Apple's own rule for "the image of a class" is the image mapped at the
 *   class's address: objc4-951.1 runtime/objc-runtime.mm class_getImageName ->
 *   internal_class_getImageName -> dyld_image_path_containing_address(cls).
 *   dladdr answers the same question for any address: dyld-1378
 *   dyld/DyldAPIs.cpp APIs::dladdr strips the pointer's authentication
 *   (stripPointer, so a signed arm64e IMP is fine) and then findImageMappedAt,
 *   any segment of any loaded image, shared cache included; dli_fbase is the
 *   image's mach header, dli_fname its path. glibc's dladdr
 *   (elf/dl-addr.c _dl_addr) likewise finds the object whose mapping holds
 *   the address, data included.
 * - So an IMP is Metal's own when the image holding it also holds the class
 *   whose method list holds the Method (slot.defining in hook.c): _MTLDevice's
 *   supportsFamily: in Metal.framework, AppleParavirtDevice's
 *   maxThreadgroupMemoryLength in the driver bundle, IOGPUMetalDevice's
 *   recommendedMaxWorkingSetSize in IOGPU.framework; on Linux all three in the
 *   simulated Metal's libsimmetal.so. The same rule on both systems, no list
 *   of Apple paths to keep up to date.
 * - It is metalift's when it lies in this shim's own image (the image holding
 *   this function).
 * - Anything else is another shim's: the path of the image holding it is
 *   reported. Code in no image at all (a JIT, an imp_implementationWithBlock
 *   trampoline outside libobjc) is another shim's too, reported as "?".
 *
 * Known limit: an Apple category defined in another Apple image than its
 * class (none is known on these methods) would be reported as another shim;
 * the report names the image, so a reader can tell.
 *
 * Called once per capability method at patch time and, for a method whose IMP
 * changed, once after the original -initGPUFamilySupport returned: inside
 * Metal's registration lock, after the verdict, so not bounded by the
 * deadline. On macOS only the IMP is given to dladdr, never the class (review
 * v5 P2-1). dyld-1378 dyld/DyldAPIs.cpp APIs::findImageMappedAt answers
 * without a lock only for an address in a shared-cache region mapped R|X
 * (cache text: Metal's, the driver's and IOGPU's IMPs) or in a permanent
 * range (launch-time images, the inserted shims among them; addPermanentRanges
 * in dyld/DyldRuntimeState.cpp); anything else, a class in the cache's data
 * included, goes through locks.withLoadersReadLock, which is _loadersLock, a
 * recursive mutex with no reader sharing (RuntimeLocks::withLoadersReadLock),
 * held by a dlclose while it runs the dead images' terminators and
 * remove-image callbacks (RuntimeState::decDlRefCount -> garbageCollectImages)
 * and by a dlopen while it maps. So whether the class lies in the IMP's image
 * is read from that image's own load commands (macho.c ml_macho_holds: its
 * segments, slid as the header is), with no dyld call. dladdr of an IMP in a
 * dlopen'ed, unloadable image (another shim loaded late) still takes
 * _loadersLock: a wait bounded only by the holder, listed in shim/c/README.md.
 * On Linux (the simulation) both go to glibc's dladdr (elf/dl-addr.c
 * _dl_addr, under dl_load_lock), as before.
 */
#include "metalift_shim.h"

/* The base of the image holding `addr`, or NULL; its path into *path. */
static const void *image_of(const void *addr, const char **path)
{
    Dl_info info;
    memset(&info, 0, sizeof info);
    *path = NULL;
    if (addr == NULL || dladdr(addr, &info) == 0)
        return NULL;
    *path = info.dli_fname;
    return info.dli_fbase;
}

enum ml_imp_owner ml_imp_owner(const void *imp, const void *defining_class, char *image,
                               size_t cap)
{
    /* This library's base, found once (callers hold hook.c's device lock). */
    static const void *own_base;
    const char *imp_path, *class_path, *own_path;
    if (own_base == NULL)
        own_base = image_of((const void *)ml_imp_owner, &own_path);
    const void *imp_base = image_of(imp, &imp_path);
#ifdef __APPLE__
    (void)class_path;
    bool same_image = imp_base != NULL && ml_macho_holds(imp_base, defining_class);
#else
    const void *class_base = image_of(defining_class, &class_path);
    bool same_image = imp_base != NULL && imp_base == class_base;
#endif
    if (same_image)
        return ML_IMP_METAL;
    if (imp_base != NULL && imp_base == own_base)
        return ML_IMP_METALIFT;
    if (cap > 0)
        snprintf(image, cap, "%s", imp_path != NULL && imp_path[0] != '\0' ? imp_path : "?");
    return ML_IMP_OTHER;
}
