/*
 * Simulated Metal: a test double of Metal.framework on Linux, written against
 * Debian's GCC Objective-C runtime (libobjc-12-dev), so that libmetalift's hooks
 * run on a real Objective-C runtime when no Mac is at hand.
 *
 * It is shaped like the real framework wherever the shim depends on it. Each
 * modelled behaviour names its evidence (the numbers are the sections of
 * ../shared/REAL-METAL.md; "decompile" is Metal.framework from an iOS 18 restore
 * image, EthanArbuckle/iPad_10.2_18.0_22A3354_Restore,
 * System/Library/Frameworks/Metal.framework/_MTLDevice.m):
 *
 *   class hierarchy    SimObject (NSObject) -> _MTLDevice -> IOGPUMetalDevice ->
 *                      AppleParavirtDevice (REAL-METAL 5: a runtime header dump).
 *   supportsFamily:    defined ONLY in _MTLDevice, a linear search of the vector
 *                      _supportedGPUFamilies (REAL-METAL 1: decompile; reims-vgpu
 *                      AGENTS.md: "Apple's paravirt plugin overrides neither, nor
 *                      supportsFamily:").
 *   the vector         built by -[_MTLDevice initGPUFamilySupport] from
 *                      [self featureProfile], which the driver class overrides
 *                      with a literal: 10001 -> Mac2 in the arm64 IOGPUFamily
 *                      plugin (REAL-METAL 2: reims-vgpu). What 10001 adds besides
 *                      Mac2 is what a guest answers (REAL-METAL 6: Apple1..5,
 *                      Common1..3, no Metal3).
 *   device init        -[_MTLDevice init] calls -initFeatureQueries, which calls
 *                      -initGPUFamilySupport and then builds a feature-query
 *                      object from the device and calls -validate on it
 *                      (REAL-METAL 3: decompile, -[_MTLDevice initFeatureQueries]).
 *                      The feature queries ask the device lazily
 *                      (decompile: -[_MTLDeviceFeatureQueries
 *                      familySupportsExtendedXR10Formats] returns
 *                      [self->_device supportsFamily:1003]). What -validate does
 *                      is not in the decompile we read: here it asks one family
 *                      (Apple4) while the device is still being built. That is an
 *                      assumption, chosen because it is the harsher one: a shim
 *                      that took the first capability question for "the device is
 *                      finished" would be wrong here.
 *   driver state       set after [super init] returns: AppleParavirtDevice's
 *                      threadgroup memory and IOGPUMetalDevice's working set read
 *                      as zero while _MTLDevice's init runs (REAL-METAL 3).
 *   derived answers    -requiresBFloat16Emulation is !supportsFamily:Apple9 and
 *                      -readWriteTextureSupport asks Apple4 (REAL-METAL 4:
 *                      decompile), so Metal reads its own family answers.
 *   working set        -recommendedMaxWorkingSetSize is IOGPUMetalDevice's
 *                      (REAL-METAL 5); the driver overrides featureProfile,
 *                      maxThreadgroupMemoryLength and name (REAL-METAL 5).
 *   stock answers      Apple5 at most, Mac2, Common3, no Metal3, 32768 bytes of
 *                      threadgroup memory, ~11.45 GB working set in a 16 GiB
 *                      guest, "Apple Paravirtual device" (REAL-METAL 6).
 *
 * No Foundation and no retain/release (the GCC runtime has neither): objects are
 * allocated with class_createInstance and never freed (Metal's default device
 * lives as long as the process anyway). `name` returns a C string.
 *
 * Build variants (probe/build.rs), each installed as libsimmetal.so in its own
 * directory so a test picks one with LD_LIBRARY_PATH, the way a macOS update
 * swaps Metal.framework under a process. Each is something an update could
 * plausibly change:
 *   SIMMETAL_NO_INIT_GPU_FAMILY_SUPPORT  the private selector is gone (the vector
 *                                        is built under another name);
 *   SIMMETAL_NO_WORKING_SET              IOGPUMetalDevice has no
 *                                        recommendedMaxWorkingSetSize;
 *   SIMMETAL_MOVED                       the getters moved into the driver class:
 *                                        AppleParavirtDevice defines
 *                                        supportsFamily: and the working set too
 *                                        (the shape the old simulation had);
 *   SIMMETAL_NO_EFFECT                   at the end of its init the driver swaps
 *                                        the device to a runtime subclass that
 *                                        answers from the ivars (replaced answers
 *                                        never take effect);
 *   SIMMETAL_WRAPPER / SIMMETAL_TOOLS    MTLCreateSystemDefaultDevice returns a
 *                                        wrapper that forwards every question to
 *                                        the real device, as an API-validation
 *                                        layer does; the wrapper class lives in an
 *                                        image of its own (libsimmetal_tools.so);
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

#if defined(SIMMETAL_STUB) || defined(SIMMETAL_WRAPPER)
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

/* dlopens `file` next to this library (once per file) and returns `symbol`. */
static void *sibling_symbol(void **handle, const char *file, const char *symbol)
{
    if (*handle == NULL) {
        Dl_info info;
        char path[4096];
        if (dladdr((void *)sibling_symbol, &info) == 0 || info.dli_fname == NULL)
            return NULL;
        const char *slash = strrchr(info.dli_fname, '/');
        int dir = slash ? (int)(slash - info.dli_fname) : 1;
        snprintf(path, sizeof path, "%.*s/%s", dir, slash ? info.dli_fname : ".", file);
        *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        if (*handle == NULL)
            return NULL;
    }
    return dlsym(*handle, symbol);
}
#endif

typedef id (*create_fn)(void);

#ifdef SIMMETAL_STUB

static create_fn driver(const char *symbol)
{
    static void *handle;
    void *sym = sibling_symbol(&handle, "libsimmetal_driver.so", symbol);
    create_fn f;
    memcpy(&f, &sym, sizeof f);
    return f;
}

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

/* A reference into libobjc, so the link keeps it as DT_NEEDED (Metal links
 * libobjc: the runtime is there from the start, the classes come later). */
__attribute__((visibility("default")))
void *SimMetalRuntime(void)
{
    return (void *)objc_getClass;
}

#else /* the classes */

typedef long NSInteger;
typedef unsigned long NSUInteger;

/* MTLGPUFamily values. */
enum {
    SimFamilyApple1 = 1001,
    SimFamilyApple4 = 1004,
    SimFamilyApple5 = 1005,
    SimFamilyApple9 = 1009,
    SimFamilyMac2 = 2002,
    SimFamilyCommon1 = 3001,
    SimFamilyCommon3 = 3003,
};

/* -featureProfile of the arm64 paravirtual plugin (REAL-METAL 2). */
#define SIM_PARAVIRT_ARM64_PROFILE 10001

#define SIM_MAX_FAMILIES 16

__attribute__((objc_root_class))
@interface SimObject
{
    Class isa;
}
+ (id)alloc;
- (id)init;
@end

#ifndef SIMMETAL_TOOLS

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

@interface _MTLDeviceFeatureQueries : SimObject
{
    id _device;
}
- (id)initWithDevice:(id)device;
- (void)validate;
- (BOOL)familySupportsExtendedXR10Formats;
@end

@interface _MTLDevice : SimObject
{
@public
    /* _supportedGPUFamilies (a std::vector in the decompile). */
    NSInteger _supportedGPUFamilies[SIM_MAX_FAMILIES];
    int _familyCount;
    id _featureQueries;
}
- (void)initFeatureQueries;
#ifndef SIMMETAL_NO_INIT_GPU_FAMILY_SUPPORT
- (void)initGPUFamilySupport;
#else
- (void)initGPUFamilySupportForProfile:(NSInteger)profile;
#endif
- (NSInteger)featureProfile;
- (BOOL)supportsFamily:(NSInteger)family;
- (BOOL)requiresBFloat16Emulation;
- (NSUInteger)readWriteTextureSupport;
- (BOOL)supportsExtendedXR10Formats;
- (NSUInteger)maxThreadgroupMemoryLength;
- (const char *)name;
@end

@implementation _MTLDeviceFeatureQueries
- (id)initWithDevice:(id)device
{
    self = [super init];
    _device = device;
    return self;
}
- (void)validate
{
    /* Assumed (see the file comment): a question while the device is half-built. */
    (void)[_device supportsFamily:SimFamilyApple4];
}
- (BOOL)familySupportsExtendedXR10Formats
{
    return [_device supportsFamily:1003];
}
@end

@implementation _MTLDevice
- (id)init
{
    self = [super init];
    _familyCount = 0;
    [self initFeatureQueries];
    return self;
}
- (void)initFeatureQueries
{
#ifndef SIMMETAL_NO_INIT_GPU_FAMILY_SUPPORT
    [self initGPUFamilySupport];
#else
    [self initGPUFamilySupportForProfile:[self featureProfile]];
#endif
    _featureQueries = [[_MTLDeviceFeatureQueries alloc] initWithDevice:self];
    [_featureQueries validate];
}
static void add_family(_MTLDevice *self, NSInteger family)
{
    if (self->_familyCount < SIM_MAX_FAMILIES)
        self->_supportedGPUFamilies[self->_familyCount++] = family;
}
static void build_families(_MTLDevice *self, NSInteger profile)
{
    NSInteger f;
    self->_familyCount = 0;
    if (profile == SIM_PARAVIRT_ARM64_PROFILE) {
        for (f = SimFamilyApple1; f <= SimFamilyApple5; f++)
            add_family(self, f);
        add_family(self, SimFamilyMac2);
        for (f = SimFamilyCommon1; f <= SimFamilyCommon3; f++)
            add_family(self, f);
    } else {
        add_family(self, SimFamilyCommon1);
    }
}
#ifndef SIMMETAL_NO_INIT_GPU_FAMILY_SUPPORT
- (void)initGPUFamilySupport
{
    build_families(self, [self featureProfile]);
}
#else
- (void)initGPUFamilySupportForProfile:(NSInteger)profile
{
    build_families(self, profile);
}
#endif
- (NSInteger)featureProfile
{
    return 0;
}
- (BOOL)supportsFamily:(NSInteger)family
{
    int i;
    for (i = 0; i < _familyCount; i++)
        if (_supportedGPUFamilies[i] == family)
            return YES;
    return NO;
}
- (BOOL)requiresBFloat16Emulation
{
    return ![self supportsFamily:SimFamilyApple9];
}
- (NSUInteger)readWriteTextureSupport
{
    return [self supportsFamily:SimFamilyApple4] ? 2 : 1;
}
- (BOOL)supportsExtendedXR10Formats
{
    return [_featureQueries familySupportsExtendedXR10Formats];
}
- (NSUInteger)maxThreadgroupMemoryLength
{
    /* The base value is not known; every driver overrides it (REAL-METAL 5). */
    return 0;
}
- (const char *)name
{
    return "";
}
@end

@interface IOGPUMetalDevice : _MTLDevice
{
    uint64_t _recommendedMaxWorkingSetSize;
}
#ifndef SIMMETAL_NO_WORKING_SET
- (uint64_t)recommendedMaxWorkingSetSize;
#endif
@end

@implementation IOGPUMetalDevice
- (id)init
{
    self = [super init];
    /* What a guest with 16 GiB of memory sees (REAL-METAL 6); set after
     * _MTLDevice's init, like the driver's own state. */
    _recommendedMaxWorkingSetSize = 11453251584ULL;
    return self;
}
#ifndef SIMMETAL_NO_WORKING_SET
- (uint64_t)recommendedMaxWorkingSetSize
{
    return _recommendedMaxWorkingSetSize;
}
#endif
@end

@interface AppleParavirtDevice : IOGPUMetalDevice
{
@public
    NSUInteger _maxThreadgroupMemoryLength;
}
@end

#ifdef SIMMETAL_NO_EFFECT
/* The swapped-in subclass asks its superclass, as an override does, and then
 * answers from the ivars: whatever replaced the methods of the device's classes
 * runs, and its answer is dropped. */
static BOOL noeffect_supports_family(id self, SEL cmd, NSInteger family)
{
    IMP super_imp = class_getMethodImplementation(objc_getClass("AppleParavirtDevice"), cmd);
    (void)((BOOL(*)(id, SEL, NSInteger))super_imp)(self, cmd, family);
    _MTLDevice *d = (_MTLDevice *)self;
    int i;
    for (i = 0; i < d->_familyCount; i++)
        if (d->_supportedGPUFamilies[i] == family)
            return YES;
    return NO;
}

static NSUInteger noeffect_threadgroup(id self, SEL cmd)
{
    IMP super_imp = class_getMethodImplementation(objc_getClass("AppleParavirtDevice"), cmd);
    (void)((NSUInteger(*)(id, SEL))super_imp)(self, cmd);
    return ((AppleParavirtDevice *)self)->_maxThreadgroupMemoryLength;
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

@implementation AppleParavirtDevice
- (id)init
{
    self = [super init];
    /* Driver state, set after [super init] returned (REAL-METAL 3). */
    _maxThreadgroupMemoryLength = 32768;
#ifdef SIMMETAL_NO_EFFECT
    swap_to_override_class(self);
#endif
    return self;
}
- (NSInteger)featureProfile
{
    return SIM_PARAVIRT_ARM64_PROFILE;
}
- (NSUInteger)maxThreadgroupMemoryLength
{
    return _maxThreadgroupMemoryLength;
}
#ifdef SIMMETAL_MOVED
- (BOOL)supportsFamily:(NSInteger)family
{
    return [super supportsFamily:family];
}
#ifndef SIMMETAL_NO_WORKING_SET
- (uint64_t)recommendedMaxWorkingSetSize
{
    return [super recommendedMaxWorkingSetSize];
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

#ifdef SIMMETAL_WRAPPER
/* The wrapper's constructor, from libsimmetal_tools.so. */
static id wrap(id device)
{
    static void *handle;
    void *sym = sibling_symbol(&handle, "libsimmetal_tools.so", "SimToolsWrapDevice");
    id (*f)(id);
    if (sym == NULL)
        return device;
    memcpy(&f, &sym, sizeof f);
    return f(device);
}
#else
#define wrap(device) (device)
#endif

/* Like Metal's: the system's default device, created once. Not thread-safe on the
 * first call (the probe and tests create it from one thread). */
__attribute__((visibility("default")))
id SIM_CREATE_DEFAULT(void)
{
    if (sim_default_device == nil)
        sim_default_device = wrap([[AppleParavirtDevice alloc] init]);
    return sim_default_device;
}

/* A new device on every call (thread-safe: nothing shared). */
__attribute__((visibility("default")))
id SIM_CREATE(void)
{
    return wrap([[AppleParavirtDevice alloc] init]);
}

#else /* SIMMETAL_TOOLS: the forwarding wrapper, an image of its own */

@interface SimToolsDevice : SimObject
{
@public
    id _baseObject;
}
@end

@implementation SimToolsDevice
- (BOOL)supportsFamily:(NSInteger)family
{
    return [_baseObject supportsFamily:family];
}
- (NSUInteger)maxThreadgroupMemoryLength
{
    return [_baseObject maxThreadgroupMemoryLength];
}
- (uint64_t)recommendedMaxWorkingSetSize
{
    return [_baseObject recommendedMaxWorkingSetSize];
}
- (BOOL)requiresBFloat16Emulation
{
    return [_baseObject requiresBFloat16Emulation];
}
- (const char *)name
{
    return [_baseObject name];
}
@end

__attribute__((visibility("default")))
id SimToolsWrapDevice(id device)
{
    SimToolsDevice *w = class_createInstance(objc_getClass("SimToolsDevice"), 0);
    w->_baseObject = device;
    return w;
}

#endif /* SIMMETAL_TOOLS */

#endif /* SIMMETAL_STUB */
