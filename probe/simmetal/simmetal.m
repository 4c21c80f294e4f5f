/*
 * Simulated Metal: a test double of Metal.framework on Linux, written against
 * Debian's GCC Objective-C runtime (libobjc-12-dev), so that libmetalift's hooks
 * run on a real Objective-C runtime when no Mac is at hand.
 *
 * It is shaped like the real framework wherever the shim depends on it. Each
 * modelled behaviour names its evidence (the numbers are the items of
 * ../shared/REAL-METAL.md; "decompile" is Metal.framework from an iOS 18 restore
 * image, EthanArbuckle/iPad_10.2_18.0_22A3354_Restore,
 * System/Library/Frameworks/Metal.framework/_MTLDevice.m and
 * MTLIOAccelServiceGlobalContext.m; what is inferred for macOS from iOS
 * decompiles is marked "iOS"):
 *
 *   class hierarchy    SimObject (NSObject) -> _MTLDevice -> IOGPUMetalDevice ->
 *                      AppleParavirtDevice (REAL-METAL 5: a runtime header dump).
 *   device creation    MTLCreateSystemDefaultDevice -> MTLRegisterDevices takes a
 *                      process-wide lock (MTLRegisterDevices_lock, an
 *                      os_unfair_lock; modelled with its recursion and
 *                      dead-owner deaths, see sim_register_lock) and, under it:
 *                      1. the driver's -initWithAcceleratorPort: runs to
 *                         completion: every driver ivar (threadgroup memory,
 *                         working set) is set when it returns;
 *                      2. MTLAddDevice(device): -initLimits (Metal's own copy of
 *                         the limits, read from the finished driver), then
 *                         -initFeatureQueries (-> -initGPUFamilySupport, then the
 *                         feature-query object, which asks the device), then
 *                         -initWorkarounds, then the device joins the device array
 *                         (a dispatch_sync in Metal; a wrapper instead of the
 *                         device when a layer asks for one);
 *                      3. the lock is released.
 *                      (REAL-METAL 3: decompiled MTLAddDevice and
 *                      MTLRegisterDevices, "[v14[5] initFeatureQueries]",
 *                      "MTLRegisterDevices_lock"; iPad 18.0
 *                      -[MTLIOAccelServiceGlobalContext
 *                      processPendingCreateIOAccelServiceRequests]; static notes
 *                      on iOS 26 and 27 give the same order. iOS.) So every other
 *                      thread creating a device waits while the first one's
 *                      -initGPUFamilySupport runs, whatever it waits for.
 *   once per process   MTLRegisterDevices registers only while
 *                      _mtlIOAccelServiceGlobalContext is unset; every later
 *                      MTLCreateSystemDefaultDevice takes the lock, finds it set,
 *                      and returns the registered device from the device array
 *                      (decompiled MTLRegisterDevices and
 *                      MTLCreateSystemDefaultDevice). A child forked after the
 *                      parent registered inherits the registration in its
 *                      memory: its MTLCreateSystemDefaultDevice returns the
 *                      parent's device, no -initGPUFamilySupport runs again (so
 *                      nothing checks in), and the device answers whatever the
 *                      parent's patched methods answer. NOT modelled: what
 *                      using that device does in the child (its IOKit
 *                      connection is the parent's mach port, which a forked
 *                      child does not have; libdispatch poisons its root queues
 *                      in the child of a multithreaded parent, libdispatch
 *                      src/queue.c _dispatch_queue_atfork_child), and whether
 *                      registering anew works in a child forked before any
 *                      device (here it does).
 *   supportsFamily:    defined ONLY in _MTLDevice, a linear search of the vector
 *                      _supportedGPUFamilies with no NULL check: asked before
 *                      -initGPUFamilySupport built it, real Metal reads through a
 *                      null pointer; here that is an abort with a message
 *                      (REAL-METAL 1: decompile; reims-vgpu AGENTS.md).
 *   the vector         built by -[_MTLDevice initGPUFamilySupport] from
 *                      [self featureProfile], which the driver class overrides
 *                      with a literal (REAL-METAL 2). Which literal the arm64
 *                      paravirtual driver returns is not established: 990001
 *                      here is the simulation's own number (10001 pushes no
 *                      Apple family, as in the decompile); what the vector holds is what a guest
 *                      answers (REAL-METAL 6: Apple1..5, Mac2, Common1..3, no
 *                      Metal3).
 *   feature queries    -initFeatureQueries builds an _MTLDeviceFeatureQueries
 *                      from the device after the vector exists; it asks the
 *                      device lazily (decompile: -[_MTLDeviceFeatureQueries
 *                      familySupportsExtendedXR10Formats] returns
 *                      [self->_device supportsFamily:1003]). Here -validate asks
 *                      one family (Apple4) during creation: an assumption (what
 *                      -validate does is not in the decompile we read), kept so
 *                      that Metal's own questions reach the replaced methods
 *                      while the lock is held, as they may on a Mac.
 *   derived answers    -requiresBFloat16Emulation is !supportsFamily:Apple9 and
 *                      -readWriteTextureSupport asks Apple4 (REAL-METAL 4:
 *                      decompile), so Metal reads its own family answers; it
 *                      returns 2 or 0 (the decompile's values).
 *   working set        -recommendedMaxWorkingSetSize is IOGPUMetalDevice's
 *                      (REAL-METAL 5); the driver overrides featureProfile,
 *                      maxThreadgroupMemoryLength and name (REAL-METAL 5).
 *   limits             -initLimits keeps Metal's own copy of the threadgroup
 *                      memory limit, read before -initGPUFamilySupport (so before
 *                      any patch). What reads that copy is not in the evidence we
 *                      read; nothing here does.
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
 * swaps Metal.framework under a process. Each models something an update could
 * plausibly change (none of them is observed on a Mac):
 *   SIMMETAL_NO_INIT_GPU_FAMILY_SUPPORT  the private selector is gone (the vector
 *                                        is built under another name, still
 *                                        inside -initFeatureQueries);
 *   SIMMETAL_STOCK_APPLE7                the paravirtual device answers Apple7
 *                                        (and Metal3) by itself, as its host
 *                                        does (REAL-METAL 6: an M1 Ultra host
 *                                        reports Apple7): the day the unlock is
 *                                        unneeded (`metalift gpu`, doctor's
 *                                        stock GPU check);
 *   SIMMETAL_NO_WORKING_SET              IOGPUMetalDevice has no
 *                                        recommendedMaxWorkingSetSize;
 *   SIMMETAL_MOVED                       the getters moved into the driver class:
 *                                        AppleParavirtDevice defines
 *                                        supportsFamily: and the working set too;
 *   SIMMETAL_CACHED                      -initGPUFamilySupport ends by moving the
 *                                        device to a runtime subclass that answers
 *                                        from a copy of the vector and of the
 *                                        driver's limit, without calling the
 *                                        methods the shim patched: the patch
 *                                        never takes effect (the self-check must
 *                                        fail and restore everything);
 *   SIMMETAL_WRAPPER / SIMMETAL_TOOLS    MTLAddDevice registers a wrapper that
 *                                        forwards every question to the real
 *                                        device, as an API-validation layer does
 *                                        (REAL-METAL 3: "a wrapper a layer asks
 *                                        for"); that it forwards every question
 *                                        is MODELLED, not evidenced; its class
 *                                        lives in an image of its own
 *                                        (libsimmetal_tools.so), a leftover of v3's
 *                                        caller-image check, harmless now;
 *   SIMMETAL_STUB / SIMMETAL_DRIVER      dyld's order (`lateclasses`): the stub
 *                                        libsimmetal.so has no classes; it loads
 *                                        libsimmetal_driver.so (the classes) with
 *                                        dlopen inside MTLCreateSystemDefaultDevice,
 *                                        like the GPU driver bundle a real device
 *                                        creation loads. When Metal's image
 *                                        appears, _MTLDevice is not registered yet.
 * Retired: `noeffect` (the driver's init swapped the device to an overriding
 * subclass). In Metal's real order the driver's init is complete before
 * -initGPUFamilySupport runs, so the shim patches the methods of whatever
 * class the finished device has; that variant stopped modelling a failure.
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

#include <errno.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

typedef long NSInteger;
typedef unsigned long NSUInteger;

/* MTLGPUFamily values. */
enum {
    SimFamilyApple1 = 1001,
    SimFamilyApple4 = 1004,
    SimFamilyApple5 = 1005,
    SimFamilyApple7 = 1007,
    SimFamilyMetal3 = 5001,
    SimFamilyApple9 = 1009,
    SimFamilyMac2 = 2002,
    SimFamilyCommon1 = 3001,
    SimFamilyCommon3 = 3003,
};

/* -featureProfile of the simulated paravirtual driver: a number of the
 * simulation's own, not Apple's (REAL-METAL 2: which literal the arm64 driver
 * returns is not established). Not 10001: in the decompile that profile
 * pushes no Apple family at all (REAL-METAL 2; issue 31 item 9), and the
 * simulation builds it that way (build_families). */
#define SIM_PARAVIRT_ARM64_PROFILE 990001
/* The profile reims' driver returns: no Apple family in the decompile. */
#define SIM_PROFILE_10001 10001

#define SIM_MAX_FAMILIES 16

/* _supportedGPUFamilies: a std::vector in the decompile; here its storage,
 * allocated by -initGPUFamilySupport (NULL until then). */
struct sim_family_vector {
    int count;
    NSInteger families[SIM_MAX_FAMILIES];
};

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
    struct sim_family_vector *_supportedGPUFamilies;
    NSUInteger _limitsMaxThreadgroupMemoryLength; /* Metal's own copy (-initLimits) */
    BOOL _workaroundsReady;
    id _featureQueries;
}
- (void)initLimits;
- (void)initFeatureQueries;
- (void)initWorkarounds;
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
    /* Assumed (see the file comment): Metal asks the device during creation. */
    (void)[_device supportsFamily:SimFamilyApple4];
}
- (BOOL)familySupportsExtendedXR10Formats
{
    return [_device supportsFamily:1003];
}
@end

static BOOL vector_contains(const struct sim_family_vector *v, NSInteger family)
{
    int i;
    for (i = 0; i < v->count; i++)
        if (v->families[i] == family)
            return YES;
    return NO;
}

static void add_family(struct sim_family_vector *v, NSInteger family)
{
    if (v->count < SIM_MAX_FAMILIES)
        v->families[v->count++] = family;
}

static struct sim_family_vector *build_families(NSInteger profile)
{
    struct sim_family_vector *v = calloc(1, sizeof *v);
    NSInteger f;
    if (v == NULL)
        abort();
    if (profile == SIM_PARAVIRT_ARM64_PROFILE) {
#ifndef SIMMETAL_STOCK_APPLE7
        for (f = SimFamilyApple1; f <= SimFamilyApple5; f++)
            add_family(v, f);
#else
        /* MODELLED, not observed: the day the paravirtual device answers as its
         * host does. What a host answers is evidenced: a real M1 Ultra host
         * reports Apple7 and Metal4 (REAL-METAL 6); Apple7 hardware, so Apple1..7
         * and Metal3 here (Metal4 is not asked by llama.cpp or metalift). */
        for (f = SimFamilyApple1; f <= SimFamilyApple7; f++)
            add_family(v, f);
        add_family(v, SimFamilyMetal3);
#endif
        add_family(v, SimFamilyMac2);
        for (f = SimFamilyCommon1; f <= SimFamilyCommon3; f++)
            add_family(v, f);
    } else if (profile == SIM_PROFILE_10001) {
        /* The decompile's 10001 branch pushes no Apple family (REAL-METAL 2);
         * what else it pushes is not in the evidence read: nothing. */
    } else {
        add_family(v, SimFamilyCommon1);
    }
    return v;
}

#ifdef SIMMETAL_CACHED
static void move_to_cached_class(id self);
#endif

@implementation _MTLDevice
- (id)init
{
    /* Base state only: the vector, the limits and the feature queries come
     * later, from MTLAddDevice (REAL-METAL 3). */
    return [super init];
}
- (void)initLimits
{
    _limitsMaxThreadgroupMemoryLength = [self maxThreadgroupMemoryLength];
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
- (void)initWorkarounds
{
    _workaroundsReady = YES;
}
#ifndef SIMMETAL_NO_INIT_GPU_FAMILY_SUPPORT
- (void)initGPUFamilySupport
{
    _supportedGPUFamilies = build_families([self featureProfile]);
#ifdef SIMMETAL_CACHED
    move_to_cached_class(self);
#endif
}
#else
- (void)initGPUFamilySupportForProfile:(NSInteger)profile
{
    _supportedGPUFamilies = build_families(profile);
}
#endif
- (NSInteger)featureProfile
{
    return 0;
}
- (BOOL)supportsFamily:(NSInteger)family
{
    if (_supportedGPUFamilies == NULL) {
        /* Real Metal has no check here and reads through a null pointer
         * (REAL-METAL 1); a test double says why it stops. */
        fprintf(stderr, "simmetal: -[_MTLDevice supportsFamily:%ld] asked before "
                        "-initGPUFamilySupport built _supportedGPUFamilies (real Metal "
                        "reads through a null pointer here)\n",
                family);
        abort();
    }
    return vector_contains(_supportedGPUFamilies, family);
}
- (BOOL)requiresBFloat16Emulation
{
    return ![self supportsFamily:SimFamilyApple9];
}
- (NSUInteger)readWriteTextureSupport
{
    /* 2 (MTLReadWriteTextureTier2) with Apple4, else 0 (TierNone): the
     * decompile's two values (issue 31 item 9, from REAL-METAL 4's decompile). */
    return [self supportsFamily:SimFamilyApple4] ? 2 : 0;
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
- (id)initWithAcceleratorPort:(unsigned)port;
#ifndef SIMMETAL_NO_WORKING_SET
- (uint64_t)recommendedMaxWorkingSetSize;
#endif
@end

@implementation IOGPUMetalDevice
- (id)initWithAcceleratorPort:(unsigned)port
{
    (void)port;
    self = [super init];
    /* What a guest with 16 GiB of memory sees (REAL-METAL 6). */
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

@implementation AppleParavirtDevice
- (id)initWithAcceleratorPort:(unsigned)port
{
    self = [super initWithAcceleratorPort:port];
    /* Driver state: set before the driver's init returns, so before
     * MTLAddDevice (REAL-METAL 3). */
    _maxThreadgroupMemoryLength = 32768;
    return self;
}
- (NSInteger)featureProfile
{
    /* A test seam, SIMMETAL_FEATURE_PROFILE: which literal the arm64 driver
     * returns is not established (REAL-METAL 2), so a test may pick the
     * decompile's 10001 branch (no Apple family) to pin what it builds. */
    const char *profile = getenv("SIMMETAL_FEATURE_PROFILE");
    if (profile != NULL && *profile != '\0')
        return strtol(profile, NULL, 10);
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

#ifdef SIMMETAL_CACHED
/* The subclass answers from copies taken when the vector was built: whatever
 * replaced the methods of the device's original classes is never called. */
static BOOL cached_supports_family(id self, SEL cmd, NSInteger family)
{
    (void)cmd;
    return vector_contains(((_MTLDevice *)self)->_supportedGPUFamilies, family);
}

static NSUInteger cached_threadgroup(id self, SEL cmd)
{
    (void)cmd;
    return ((AppleParavirtDevice *)self)->_maxThreadgroupMemoryLength;
}

static void move_to_cached_class(id self)
{
    static Class sub;
    Class cls = object_getClass(self);
    if (sub == Nil) {
        SEL sf = sel_registerName("supportsFamily:");
        SEL tg = sel_registerName("maxThreadgroupMemoryLength");
        sub = objc_allocateClassPair(cls, "AppleParavirtDeviceFamilyCache", 0);
        class_addMethod(sub, sf, (IMP)cached_supports_family,
                        method_getTypeEncoding(class_getInstanceMethod(cls, sf)));
        class_addMethod(sub, tg, (IMP)cached_threadgroup,
                        method_getTypeEncoding(class_getInstanceMethod(cls, tg)));
        objc_registerClassPair(sub);
    }
    object_setClass(self, sub);
}
#endif

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

/* MTLRegisterDevices_lock, modelled as the os_unfair_lock it is in Metal
 * (decompiled MTLRegisterDevices: os_unfair_lock_lock(&MTLRegisterDevices_lock)),
 * with the three behaviours of one that a process can meet here:
 *
 *   contended   the caller waits for the owner to unlock (a futex here, xnu's
 *               ulock there);
 *   recursion   the owner taking it again dies: apple-oss-distributions/
 *               libplatform, src/os/lock.c, _os_unfair_lock_lock_slow ->
 *               _os_unfair_lock_recursive_abort, "Trying to recursively lock an
 *               os_unfair_lock";
 *   dead owner  a caller that finds it held by a thread that is not one of its
 *               process's dies: the lock word is the owner's thread port name,
 *               and xnu (bsd/kern/sys_ulock.c, ulock_resolve_owner, with
 *               PORT_INTRANS_THREAD_IN_CURRENT_TASK) cannot translate it to a
 *               thread of the caller's task, so ulock_wait returns EOWNERDEAD and
 *               _os_unfair_lock_lock_slow calls _os_unfair_lock_corruption_abort,
 *               "os_unfair_lock is corrupt, or owner thread exited without
 *               unlocking" (the message for a value in the port-name range,
 *               0x200..0x40000). That is the child forked while another thread
 *               holds the lock: the child has only the forking thread, and the
 *               word still names the parent's owner.
 *
 * The word here is the owner's Linux thread id; "a thread of this process" is
 * what tgkill(getpid(), tid, 0) answers, the analogue of translating a port name
 * in the caller's own task. A child forked while the lock is free finds 0 and
 * takes it. No atfork handler resets it: none in the Metal decompile we read
 * (MTLRegisterDevices, MTLDeviceArrayInitialize), and nothing resets an
 * os_unfair_lock by itself; that Metal registers none at all is NOT evidenced.
 *
 * How the process dies: libplatform's OS_BUG_CLIENT (private/os/
 * crashlog_private.h) sets the crash-log message and executes os_fatal_trap,
 * `brk` on arm64: the process dies of SIGTRAP (EXC_BREAKPOINT), not SIGABRT, and
 * writes nothing on stderr (the message is in the crash report). The simulation
 * prints the message on stderr (a test double says why it stops) and dies of
 * SIGTRAP. */
/* GCC's __atomic builtins: its Objective-C front end has no _Atomic. */
static uint32_t sim_register_lock;

static uint32_t sim_thread_self(void)
{
    return (uint32_t)syscall(SYS_gettid);
}

__attribute__((noreturn)) static void sim_unfair_lock_crash(const char *message, uint32_t value)
{
    fprintf(stderr, "simmetal: BUG IN CLIENT OF LIBPLATFORM: %s (MTLRegisterDevices_lock, "
                    "value %u, in pid %ld)\n",
            message, value, (long)getpid());
    signal(SIGTRAP, SIG_DFL);
    raise(SIGTRAP);
    abort();
}

/* Whether `tid` is a thread of this process (see above). */
static int sim_thread_of_this_process(uint32_t tid)
{
    return syscall(SYS_tgkill, (long)getpid(), (long)tid, 0) == 0 || errno != ESRCH;
}

static void sim_unfair_lock_lock(uint32_t *lock)
{
    uint32_t self = sim_thread_self();
    for (;;) {
        uint32_t current = 0;
        if (__atomic_compare_exchange_n(lock, &current, self, 0, __ATOMIC_ACQUIRE,
                                        __ATOMIC_RELAXED))
            return;
        if (current == self)
            sim_unfair_lock_crash("Trying to recursively lock an os_unfair_lock", current);
        if (!sim_thread_of_this_process(current))
            sim_unfair_lock_crash("os_unfair_lock is corrupt, or owner thread exited "
                                  "without unlocking",
                                  current);
        /* Re-checked every 100 ms: an owner that exits while we wait. */
        struct timespec tick = {0, 100 * 1000 * 1000};
        (void)syscall(SYS_futex, lock, FUTEX_WAIT_PRIVATE, current, &tick, NULL, 0);
    }
}

static void sim_unfair_lock_unlock(uint32_t *lock)
{
    uint32_t self = sim_thread_self();
    uint32_t current = __atomic_load_n(lock, __ATOMIC_RELAXED);
    /* libplatform, _os_unfair_lock_unlock_slow -> _os_unfair_lock_unowned_abort. */
    if (current != self)
        sim_unfair_lock_crash("Unlock of an os_unfair_lock not owned by current thread",
                              current);
    __atomic_store_n(lock, 0, __ATOMIC_RELEASE);
    (void)syscall(SYS_futex, lock, FUTEX_WAKE_PRIVATE, 1, NULL, NULL, 0);
}

static id sim_default_device;
#define SIM_MAX_DEVICES 64
static id sim_devices[SIM_MAX_DEVICES]; /* the device array */
static int sim_device_count;

/* MTLAddDevice: what Metal does with a finished driver object. */
static id sim_add_device(id device)
{
    [device initLimits];
    [device initFeatureQueries];
    [device initWorkarounds];
    device = wrap(device);
    if (sim_device_count < SIM_MAX_DEVICES)
        sim_devices[sim_device_count++] = device;
    return device;
}

/* One device creation in Metal's order; the lock is held by the caller. */
static id sim_register_device(void)
{
    return sim_add_device([[AppleParavirtDevice alloc] initWithAcceleratorPort:1]);
}

/* Like Metal's: every call takes the registration lock; the first registers
 * the device, later ones (a forked child's too: the pointer is inherited) find
 * it registered and return it (decompiled MTLRegisterDevices: registration only
 * while _mtlIOAccelServiceGlobalContext is unset). */
__attribute__((visibility("default")))
id SIM_CREATE_DEFAULT(void)
{
    sim_unfair_lock_lock(&sim_register_lock);
    if (sim_default_device == nil)
        sim_default_device = sim_register_device();
    id device = sim_default_device;
    sim_unfair_lock_unlock(&sim_register_lock);
    return device;
}

/* A new device on every call, created under the same lock (the two-threads
 * case: the second creation waits for the first's, as in Metal). A test API
 * of the simulation's, not Metal's: Metal registers each device once
 * (REAL-METAL 3) and has no call that creates another; this one exists so that
 * the shim's "second device" path can run at all. ASSUMED, not evidenced: that
 * a second registered device would reach -initGPUFamilySupport the same way. */
__attribute__((visibility("default")))
id SIM_CREATE(void)
{
    sim_unfair_lock_lock(&sim_register_lock);
    id device = sim_register_device();
    sim_unfair_lock_unlock(&sim_register_lock);
    return device;
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
