/*
 * A second shim for the simulation: a test double of Cua's
 * LumeMetalCapabilities, which Tart's images ship and enable for some jobs
 * (shared/REAL-METAL.md "How the working peers hook it"). Built by
 * probe/build.rs as libsimpeer.so next to the simulated Metal; the tests load
 * it with LD_PRELOAD before or after libmetalift (probe/tests/second_shim.rs).
 *
 * Every behaviour is Cua's, read from trycua/cua
 * libs/lume/metal-capability-shim/Sources/LumeMetalCapabilities.m:
 *
 * - loadConfiguration: enabled only when LUME_METAL_APPLE_FAMILY_MAX is a
 *   number in [1001, 2000); LUME_METAL_MAX_THREADGROUP_MEMORY defaults to
 *   65536; LUME_METAL_RECOMMENDED_WORKING_SET_SIZE is optional. Numbers are
 *   strtoull(.., 0) with the whole string consumed.
 * - initializeLumeMetalCapabilities (a constructor; the dylib links Metal, so
 *   Metal's classes are there): replaces -[_MTLDevice initGPUFamilySupport]
 *   with method_setImplementation, keeping the returned IMP as the original.
 * - hookInitGPUFamilySupport: installDeviceHooks(self), then the original.
 * - installDeviceHooks (once, under @synchronized([device class])): takes
 *   class_getInstanceMethod([device class], sel) for maxThreadgroupMemoryLength,
 *   supportsFamily: and (when configured) recommendedMaxWorkingSetSize; any
 *   missing: nothing is installed. Then, in that order,
 *   method_setImplementation on each Method, keeping each returned IMP as the
 *   original (so it wraps whatever was there: Metal's, or another shim's).
 * - hookSupportsFamily: original || (family >= 1001 && family <= max).
 * - hookMaxThreadgroupMemoryLength, hookRecommendedMaxWorkingSetSize:
 *   max(original, configured).
 * - It never restores anything.
 *
 * Two differences, both forced by the Linux runtime and neither a behaviour
 * Cua's code has on macOS: @synchronized is a pthread mutex here (no
 * Foundation), and after each method_setImplementation the dispatch tables
 * from the root class down to the device's class are rebuilt with GCC's
 * __objc_update_dispatch_table_for_class, because GCC's libobjc refreshes only
 * the defining class's table where Apple's objc4 flushes every cache itself
 * (shared/REAL-METAL.md "Where the Linux runtime differs"; objc4
 * objc-runtime-new.mm _method_setImplementation -> flushCaches(nil, ...)).
 * Without it the peer's patch would not be seen on Linux where it is on a Mac.
 */
#include <errno.h>
#include <objc/runtime.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern void __objc_update_dispatch_table_for_class(Class cls);

typedef unsigned long long LumeU64;
typedef long NSInteger;           /* Foundation's, on LP64 (as simmetal.m) */
typedef unsigned long NSUInteger;

static struct {
    BOOL enabled;
    LumeU64 appleFamilyMax;
    LumeU64 maxThreadgroupMemory;
    BOOL hasRecommendedWorkingSetSize;
    LumeU64 recommendedWorkingSetSize;
} gConfiguration;

static IMP gOriginalInitGPUFamilySupport;
static IMP gOriginalMaxThreadgroupMemoryLength;
static IMP gOriginalRecommendedMaxWorkingSetSize;
static IMP gOriginalSupportsFamily;
static BOOL gDeviceHooksInstalled;
static pthread_mutex_t gInstallLock = PTHREAD_MUTEX_INITIALIZER;

static BOOL parseUnsignedEnvironmentValue(const char *name, LumeU64 *value)
{
    const char *raw = getenv(name);
    if (!raw || !*raw)
        return NO;
    errno = 0;
    char *end = NULL;
    unsigned long long parsed = strtoull(raw, &end, 0);
    if (errno != 0 || end == raw || !end || *end != '\0')
        return NO;
    *value = parsed;
    return YES;
}

static BOOL loadConfiguration(void)
{
    LumeU64 appleFamilyMax = 0;
    if (!parseUnsignedEnvironmentValue("LUME_METAL_APPLE_FAMILY_MAX", &appleFamilyMax) ||
        appleFamilyMax < 1001 || appleFamilyMax >= 2000)
        return NO;
    LumeU64 maxThreadgroupMemory = 65536;
    const char *rawTg = getenv("LUME_METAL_MAX_THREADGROUP_MEMORY");
    if (rawTg && *rawTg &&
        !parseUnsignedEnvironmentValue("LUME_METAL_MAX_THREADGROUP_MEMORY", &maxThreadgroupMemory))
        return NO;
    LumeU64 workingSet = 0;
    const char *rawWs = getenv("LUME_METAL_RECOMMENDED_WORKING_SET_SIZE");
    BOOL hasWs = rawWs && *rawWs;
    if (hasWs &&
        !parseUnsignedEnvironmentValue("LUME_METAL_RECOMMENDED_WORKING_SET_SIZE", &workingSet))
        return NO;
    gConfiguration.enabled = YES;
    gConfiguration.appleFamilyMax = appleFamilyMax;
    gConfiguration.maxThreadgroupMemory = maxThreadgroupMemory;
    gConfiguration.hasRecommendedWorkingSetSize = hasWs;
    gConfiguration.recommendedWorkingSetSize = workingSet;
    return YES;
}

/* GCC only: see the file comment. Parents first: each copies from its parent. */
static void refreshDispatch(Class cls)
{
    Class chain[16];
    int n = 0;
    for (Class c = cls; c != Nil && n < 16; c = class_getSuperclass(c))
        chain[n++] = c;
    while (n > 0)
        __objc_update_dispatch_table_for_class(chain[--n]);
}

static NSUInteger hookMaxThreadgroupMemoryLength(id self, SEL selector)
{
    NSUInteger original =
        gOriginalMaxThreadgroupMemoryLength
            ? ((NSUInteger(*)(id, SEL))gOriginalMaxThreadgroupMemoryLength)(self, selector)
            : 0;
    return original < gConfiguration.maxThreadgroupMemory
               ? (NSUInteger)gConfiguration.maxThreadgroupMemory
               : original;
}

static uint64_t hookRecommendedMaxWorkingSetSize(id self, SEL selector)
{
    uint64_t original =
        gOriginalRecommendedMaxWorkingSetSize
            ? ((uint64_t(*)(id, SEL))gOriginalRecommendedMaxWorkingSetSize)(self, selector)
            : 0;
    return original < gConfiguration.recommendedWorkingSetSize
               ? gConfiguration.recommendedWorkingSetSize
               : original;
}

static BOOL hookSupportsFamily(id self, SEL selector, NSInteger family)
{
    BOOL original = gOriginalSupportsFamily
                        ? ((BOOL(*)(id, SEL, NSInteger))gOriginalSupportsFamily)(self, selector,
                                                                                 family)
                        : NO;
    BOOL isConfiguredAppleFamily =
        family >= 1001 && (LumeU64)family <= gConfiguration.appleFamilyMax;
    return original || isConfiguredAppleFamily;
}

static BOOL replaceMethod(Class deviceClass, const char *name, IMP replacement, IMP *original)
{
    Method method = class_getInstanceMethod(deviceClass, sel_registerName(name));
    if (!method)
        return NO;
    *original = method_setImplementation(method, replacement);
    refreshDispatch(deviceClass);
    return *original != NULL;
}

static void installDeviceHooks(id device)
{
    Class deviceClass = object_getClass(device);
    pthread_mutex_lock(&gInstallLock);
    if (gDeviceHooksInstalled) {
        pthread_mutex_unlock(&gInstallLock);
        return;
    }
    Method tg = class_getInstanceMethod(deviceClass, sel_registerName("maxThreadgroupMemoryLength"));
    Method sf = class_getInstanceMethod(deviceClass, sel_registerName("supportsFamily:"));
    Method ws = gConfiguration.hasRecommendedWorkingSetSize
                    ? class_getInstanceMethod(deviceClass,
                                              sel_registerName("recommendedMaxWorkingSetSize"))
                    : NULL;
    if (!tg || !sf || (gConfiguration.hasRecommendedWorkingSetSize && !ws)) {
        fprintf(stderr, "[LumeMetalCapabilities] Required device methods are unavailable; "
                        "leaving stock capabilities unchanged\n");
        pthread_mutex_unlock(&gInstallLock);
        return;
    }
    BOOL installed = replaceMethod(deviceClass, "maxThreadgroupMemoryLength",
                                   (IMP)hookMaxThreadgroupMemoryLength,
                                   &gOriginalMaxThreadgroupMemoryLength);
    installed = installed && replaceMethod(deviceClass, "supportsFamily:",
                                           (IMP)hookSupportsFamily, &gOriginalSupportsFamily);
    if (installed && gConfiguration.hasRecommendedWorkingSetSize)
        installed = replaceMethod(deviceClass, "recommendedMaxWorkingSetSize",
                                  (IMP)hookRecommendedMaxWorkingSetSize,
                                  &gOriginalRecommendedMaxWorkingSetSize);
    if (installed)
        gDeviceHooksInstalled = YES;
    fprintf(stderr, "[LumeMetalCapabilities] %s (appleFamilyMax=%llu maxThreadgroupMemory=%llu)\n",
            installed ? "Enabled" : "Capability hook installation was incomplete",
            gConfiguration.appleFamilyMax, gConfiguration.maxThreadgroupMemory);
    pthread_mutex_unlock(&gInstallLock);
}

static void hookInitGPUFamilySupport(id self, SEL selector)
{
    installDeviceHooks(self);
    ((void (*)(id, SEL))gOriginalInitGPUFamilySupport)(self, selector);
}

__attribute__((constructor)) static void initializeLumeMetalCapabilities(void)
{
    if (!loadConfiguration())
        return;
    Class deviceClass = objc_getClass("_MTLDevice");
    if (!deviceClass)
        return;
    Method method = class_getInstanceMethod(deviceClass, sel_registerName("initGPUFamilySupport"));
    if (!method)
        return;
    gOriginalInitGPUFamilySupport = method_setImplementation(method, (IMP)hookInitGPUFamilySupport);
    refreshDispatch(deviceClass);
}
