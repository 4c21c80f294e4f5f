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
 *   - the C entry point MTLCreateSystemDefaultDevice().
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
 *   SIMMETAL_NO_WORKING_SET              recommendedMaxWorkingSetSize is gone (a
 *                                        profile with a working-set floor fails
 *                                        midway and must be rolled back).
 */
#include <objc/objc.h>
#include <objc/runtime.h>
#include <stdint.h>

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
    /* Filled by -initGPUFamilySupport (or directly by -init in the variant without it). */
    NSInteger families[SIM_MAX_FAMILIES];
    int family_count;
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

@implementation _MTLDevice
- (id)init
{
    self = [super init];
    family_count = 0;
#ifndef SIMMETAL_NO_INIT_GPU_FAMILY_SUPPORT
    [self initGPUFamilySupport];
#else
    [self fillFamilies];
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
    [self fillFamilies];
}
#endif
- (void)fillFamilies
{
    /* A generic device supports only the portable families. */
    [self addFamily:SimFamilyCommon1];
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
    return 16384;
}
#ifndef SIMMETAL_NO_WORKING_SET
- (uint64_t)recommendedMaxWorkingSetSize
{
    return 0;
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
    for (apple = SimFamilyApple1; apple <= SimFamilyApple5; apple++)
        [self addFamily:apple];
    [self addFamily:SimFamilyMac2];
    [self addFamily:SimFamilyCommon1];
    [self addFamily:SimFamilyCommon2];
    [self addFamily:SimFamilyCommon3];
}
- (BOOL)supportsFamily:(NSInteger)family
{
    return [super supportsFamily:family];
}
- (NSUInteger)maxThreadgroupMemoryLength
{
    return 32768;
}
#ifndef SIMMETAL_NO_WORKING_SET
- (uint64_t)recommendedMaxWorkingSetSize
{
    /* What a guest with 16 GiB of memory typically sees. */
    return 11453251584ULL;
}
#endif
- (const char *)name
{
    return "Apple Paravirtual device";
}
@end

static id sim_default_device;

/* Like Metal's: the system's default device, created once. Not thread-safe on the
 * first call (the probe and tests create it from one thread). */
__attribute__((visibility("default")))
id MTLCreateSystemDefaultDevice(void)
{
    if (sim_default_device == nil)
        sim_default_device = [[AppleParavirtDevice alloc] init];
    return sim_default_device;
}
