/*
 * Simulated Metal: a stand-in for Metal.framework on Linux, written against
 * Debian's GCC Objective-C runtime (libobjc-12-dev), so that libmetalift's hooks
 * run on a real Objective-C runtime when no Mac is at hand.
 *
 * It mirrors the shape of the real thing where the shim depends on it:
 *   - a private base class `_MTLDevice` whose -init calls -initGPUFamilySupport
 *     (the one private selector the shim hooks) and whose answers are read from
 *     state that -initGPUFamilySupport fills in;
 *   - the concrete class `AppleParavirtDevice` (what Virtualization.framework's
 *     guest GPU is), which overrides the capability getters like the real one:
 *     Apple1..Apple5, Mac2, Common1..3 (no Metal3), 32768 bytes of threadgroup memory,
 *     named "Apple Paravirtual device";
 *   - the C entry point MTLCreateSystemDefaultDevice(), and SimMetalCreateDevice()
 *     which makes a new device on every call (for the two-threads test).
 *
 * No Foundation and no retain/release (the GCC runtime has neither): the root
 * class is our own, allocated with class_createInstance and never freed (Metal's
 * default device lives as long as the process anyway). `name` returns a C string.
 *
 * Build variants (see probe/build.rs), each installed as libsimmetal.so in its own
 * directory so a test picks one with LD_LIBRARY_PATH, the way a macOS update
 * swaps Metal.framework under a process:
 *   SIMMETAL_NO_INIT_GPU_FAMILY_SUPPORT  the private selector is gone (the shim must
 *                                        report `failed` and hook nothing);
 *   SIMMETAL_NO_WORKING_SET              recommendedMaxWorkingSetSize is gone;
 *   SIMMETAL_LATE_ANSWERS                -initGPUFamilySupport sets only the
 *                                        portable answers; the real ones are set
 *                                        later in -init (a shim reading mid-init
 *                                        would see wrong stock answers);
 *   SIMMETAL_NO_EFFECT                   at the end of -init the device's class is
 *                                        swapped to a runtime subclass that
 *                                        overrides the getters again (replaced
 *                                        answers never take effect);
 *   SIMMETAL_INHERITED                   AppleParavirtDevice defines no
 *                                        capability getter: they live only in
 *                                        _MTLDevice;
 *   SIMMETAL_STUB / SIMMETAL_DRIVER      dyld's order (`lateclasses`): the stub
 *                                        libsimmetal.so has no classes; it loads
 *                                        libsimmetal_driver.so (the classes) with
 *                                        dlopen inside MTLCreateSystemDefaultDevice,
 *                                        like the GPU driver bundle a real device
 *                                        creation loads. When Metal's image
 *                                        appears, _MTLDevice is not registered yet.
 */
#include <objc/objc.h>
#include <objc/runtime.h>
#include <stdint.h>

#ifdef SIMMETAL_STUB
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef id (*create_fn)(void);

/* Loads the driver next to this library (once) and returns its entry point. */
static create_fn driver(const char *symbol)
{
    static void *handle;
    if (handle == NULL) {
        Dl_info info;
        char path[4096];
        if (dladdr((void *)driver, &info) == 0 || info.dli_fname == NULL)
            return NULL;
        const char *slash = strrchr(info.dli_fname, '/');
        int dir = slash ? (int)(slash - info.dli_fname) : 1;
        snprintf(path, sizeof path, "%.*s/libsimmetal_driver.so", dir,
                 slash ? info.dli_fname : ".");
        handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (handle == NULL)
            return NULL;
    }
    void *sym = dlsym(handle, symbol);
    create_fn f;
    memcpy(&f, &sym, sizeof f);
    return f;
}

/* Keep the GCC runtime linked, as Metal links libobjc: the class would come
 * from the driver, but the runtime is here from the start. */
__attribute__((visibility("default")))
id MTLCreateSystemDefaultDevice(void)
{
    create_fn f = driver("SimDriverCreateSystemDefaultDevice");
    return f ? f() : nil;
}

__attribute__((visibility("default")))
id SimMetalCreateDevice(void)
{
    create_fn f = driver("SimDriverCreateDevice");
    return f ? f() : nil;
}

/* A reference into libobjc, so the link keeps it as DT_NEEDED. */
__attribute__((visibility("default")))
void *SimMetalRuntime(void)
{
    return (void *)objc_getClass;
}

#else /* the classes */

typedef long NSInteger;
typedef unsigned long NSUInteger;

/* The GPU families this device answers YES for (MTLGPUFamily values). Apple
 * families are cumulative, as on real hardware: an Apple5 GPU answers Apple1..5. */
enum {
    SimFamilyApple1 = 1001,
    SimFamilyApple5 = 1005,
    SimFamilyMac2 = 2002,
    SimFamilyCommon1 = 3001,
    SimFamilyCommon2 = 3002,
    SimFamilyCommon3 = 3003,
};

#define SIM_MAX_FAMILIES 16

__attribute__((objc_root_class))
@interface SimObject
{
    Class isa;
}
+ (id)alloc;
- (id)init;
@end

@implementation SimObject
+ (id)alloc
{
    return class_createInstance(self, 0);
}
- (id)init
{
    return self;
}
@end

@interface _MTLDevice : SimObject
{
    /* Filled by -initGPUFamilySupport (or directly by -init in the variants). */
    NSInteger families[SIM_MAX_FAMILIES];
    int family_count;
    NSUInteger tg_memory;
    uint64_t working_set;
}
- (void)addFamily:(NSInteger)family;
#ifndef SIMMETAL_NO_INIT_GPU_FAMILY_SUPPORT
- (void)initGPUFamilySupport;
#endif
- (void)fillFamilies;
- (BOOL)supportsFamily:(NSInteger)family;
- (NSUInteger)maxThreadgroupMemoryLength;
#ifndef SIMMETAL_NO_WORKING_SET
- (uint64_t)recommendedMaxWorkingSetSize;
#endif
- (const char *)name;
@end

#ifdef SIMMETAL_NO_EFFECT
/* The swapped-in subclass asks its superclass, as an override does, but then
 * answers from _MTLDevice's own getters (the ivars): whatever replaced the
 * methods of the device's original class runs, and its answer is dropped. */
static BOOL noeffect_supports_family(id self, SEL cmd, NSInteger family)
{
    IMP super_imp = class_getMethodImplementation(objc_getClass("AppleParavirtDevice"), cmd);
    (void)((BOOL(*)(id, SEL, NSInteger))super_imp)(self, cmd, family);
    IMP base = class_getMethodImplementation(objc_getClass("_MTLDevice"), cmd);
    return ((BOOL(*)(id, SEL, NSInteger))base)(self, cmd, family);
}

static NSUInteger noeffect_threadgroup(id self, SEL cmd)
{
    IMP super_imp = class_getMethodImplementation(objc_getClass("AppleParavirtDevice"), cmd);
    (void)((NSUInteger(*)(id, SEL))super_imp)(self, cmd);
    IMP base = class_getMethodImplementation(objc_getClass("_MTLDevice"), cmd);
    return ((NSUInteger(*)(id, SEL))base)(self, cmd);
}

static void swap_to_override_class(id self)
{
    static Class sub;
    Class cls = object_getClass(self);
    if (sub == Nil) {
        SEL sf = sel_registerName("supportsFamily:");
        SEL tg = sel_registerName("maxThreadgroupMemoryLength");
        sub = objc_allocateClassPair(cls, "AppleParavirtDeviceOverride", 0);
        class_addMethod(sub, sf, (IMP)noeffect_supports_family,
                        method_getTypeEncoding(class_getInstanceMethod(cls, sf)));
        class_addMethod(sub, tg, (IMP)noeffect_threadgroup,
                        method_getTypeEncoding(class_getInstanceMethod(cls, tg)));
        objc_registerClassPair(sub);
    }
    object_setClass(self, sub);
}
#endif

@implementation _MTLDevice
- (id)init
{
    self = [super init];
    family_count = 0;
    tg_memory = 0;
    working_set = 0;
#ifndef SIMMETAL_NO_INIT_GPU_FAMILY_SUPPORT
    [self initGPUFamilySupport];
#else
    [self fillFamilies];
#endif
#ifdef SIMMETAL_LATE_ANSWERS
    /* The real answers arrive only now, after -initGPUFamilySupport returned. */
    [self fillFamilies];
#endif
#ifdef SIMMETAL_NO_EFFECT
    swap_to_override_class(self);
#endif
    return self;
}
- (void)addFamily:(NSInteger)family
{
    if (family_count < SIM_MAX_FAMILIES)
        families[family_count++] = family;
}
#ifndef SIMMETAL_NO_INIT_GPU_FAMILY_SUPPORT
- (void)initGPUFamilySupport
{
#ifdef SIMMETAL_LATE_ANSWERS
    /* Only the portable answers so far. */
    family_count = 0;
    [self addFamily:SimFamilyCommon1];
    tg_memory = 16384;
#else
    [self fillFamilies];
#endif
}
#endif
- (void)fillFamilies
{
    /* A generic device supports only the portable families. */
    family_count = 0;
    [self addFamily:SimFamilyCommon1];
    tg_memory = 16384;
    working_set = 0;
}
- (BOOL)supportsFamily:(NSInteger)family
{
    int i;
    for (i = 0; i < family_count; i++)
        if (families[i] == family)
            return YES;
    return NO;
}
- (NSUInteger)maxThreadgroupMemoryLength
{
    return tg_memory;
}
#ifndef SIMMETAL_NO_WORKING_SET
- (uint64_t)recommendedMaxWorkingSetSize
{
    return working_set;
}
#endif
- (const char *)name
{
    return "Simulated Metal device";
}
@end

@interface AppleParavirtDevice : _MTLDevice
@end

@implementation AppleParavirtDevice
- (void)fillFamilies
{
    NSInteger apple;
    family_count = 0;
    for (apple = SimFamilyApple1; apple <= SimFamilyApple5; apple++)
        [self addFamily:apple];
    [self addFamily:SimFamilyMac2];
    [self addFamily:SimFamilyCommon1];
    [self addFamily:SimFamilyCommon2];
    [self addFamily:SimFamilyCommon3];
    tg_memory = 32768;
    /* What a guest with 16 GiB of memory typically sees. */
    working_set = 11453251584ULL;
}
#ifndef SIMMETAL_INHERITED
- (BOOL)supportsFamily:(NSInteger)family
{
    return [super supportsFamily:family];
}
- (NSUInteger)maxThreadgroupMemoryLength
{
    return tg_memory;
}
#ifndef SIMMETAL_NO_WORKING_SET
- (uint64_t)recommendedMaxWorkingSetSize
{
    return working_set;
}
#endif
#endif
- (const char *)name
{
    return "Apple Paravirtual device";
}
@end

static id sim_default_device;

#ifdef SIMMETAL_DRIVER
#define SIM_CREATE_DEFAULT SimDriverCreateSystemDefaultDevice
#define SIM_CREATE SimDriverCreateDevice
#else
#define SIM_CREATE_DEFAULT MTLCreateSystemDefaultDevice
#define SIM_CREATE SimMetalCreateDevice
#endif

/* Like Metal's: the system's default device, created once. Not thread-safe on the
 * first call (the probe and tests create it from one thread). */
__attribute__((visibility("default")))
id SIM_CREATE_DEFAULT(void)
{
    if (sim_default_device == nil)
        sim_default_device = [[AppleParavirtDevice alloc] init];
    return sim_default_device;
}

/* A new device on every call (thread-safe: nothing shared). */
__attribute__((visibility("default")))
id SIM_CREATE(void)
{
    return [[AppleParavirtDevice alloc] init];
}

#endif /* SIMMETAL_STUB */
