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
 * Metal's registration lock. dladdr takes the loader's lock (glibc
 * dl_load_lock; dyld's loaders read lock: dyld-1378 dyld/DyldAPIs.cpp
 * APIs::findImageMappedAt, locks.withLoadersReadLock, for an address outside
 * the shared cache), looks up the nearest symbol in the image's own table, and
 * does no IPC: bounded work. No lock-order inversion with a thread that holds
 * dyld's lock and waits for Metal's: dyld releases the loaders write lock
 * before it runs initializers and load notifiers "to avoid deadlocks with
 * other framework locks, that might call dyld inquiry functions" (the same
 * file, APIs::dlopen_from), so a library whose initializer creates a device
 * waits for Metal's lock without holding dyld's. On macOS this reading of
 * dyld and objc4 is not run here (no Mac): the Linux simulation runs the same
 * code against glibc's dladdr.
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
    const void *class_base = image_of(defining_class, &class_path);
    if (imp_base != NULL && imp_base == class_base)
        return ML_IMP_METAL;
    if (imp_base != NULL && imp_base == own_base)
        return ML_IMP_METALIFT;
    if (cap > 0)
        snprintf(image, cap, "%s", imp_path != NULL && imp_path[0] != '\0' ? imp_path : "?");
    return ML_IMP_OTHER;
}
