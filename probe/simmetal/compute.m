/*
 * Simulated Metal, the compute path: what `metalift-probe --verify` needs to
 * compile a kernel from source, run it and read its buffers, on Linux.
 *
 * Compiled into the same libsimmetal.so as simmetal.m (probe/build.rs), as a
 * category on _MTLDevice plus classes of its own. It reads one thing of the
 * device, Metal's own -requiresBFloat16Emulation, and nothing else: not
 * supportsFamily: directly, not maxThreadgroupMemoryLength. Real Metal compiles
 * for the GPU that is there and the GPU runs the kernel or does not; the
 * capability answers the shim patches are questions an application asks (Apple's
 * documentation of MTLDevice: the family answers *describe* the GPU; MSL language
 * features are gated by the MSL version and the target GPU). The one exception
 * is Metal's own: -requiresBFloat16Emulation is !supportsFamily:Apple9
 * (REAL-METAL 4, decompile), so an Apple9 claim switches Metal's bf16 emulation
 * off, whatever the GPU has. See "bf16" below.
 *
 * What is evidence and what is only modelled:
 *
 *   EVIDENCED  The paravirtual device runs simdgroup reductions, simdgroup
 *              matrices and bfloat kernels once llama.cpp is let use them: Cua
 *              measured llama.cpp at 98.25-99.59% of bare metal in a guest with
 *              the unlock (REAL-METAL "How the working peers hook it"), which
 *              needs MUL_MAT through simd_sum and simdgroup_float8x8; kronk
 *              reproduced it on macOS 26.6.1. magnitudedev/magnitude's probe runs
 *              a real simd_sum (expects 528 from 1..32) before it injects (as
 *              issue 25 reports it; not re-read here).
 *              Hence the default build: the host GPU executes every kernel.
 *   EVIDENCED  No shipping Apple GPU has more than 32768 bytes of threadgroup
 *              memory (Apple's Metal feature set tables; REAL-METAL 6: the guest
 *              answers 32768; it records only Apple7/Metal4 for an M1 Ultra
 *              host, so the host's 32768 rests on the tables alone).
 *              SIM_HOST_THREADGROUP_MEMORY.
 *   MODELLED   How a too-large threadgroup allocation fails: here the command
 *              buffer completes with an error. On real Metal, with the API
 *              validation layer, -setThreadgroupMemoryLength: above the limit is a
 *              validation error; without it, what the driver does is not known to
 *              us. Either way the probe reports the kernel as failed.
 *   MODELLED   The two breakages (build variants, selected like the others with
 *              LD_LIBRARY_PATH, see probe/build.rs): they stand for a macOS or
 *              host update after which the host GPU no longer executes what the
 *              unlock claims. Users report both shapes (VeloxQuant-MLX#395 and
 *              ahrefs/ocannl#942 ask whether the paravirtual device computes
 *              correctly; kronk: "fails open ... returns you to the Apple 5
 *              path"), but no public log shows which one a real update produces,
 *              nor the compiler's message:
 *     SIMMETAL_COMPUTE_NO_COMPILE   the shader compiler rejects every source that
 *                                   uses simd_* or simdgroup_* functions
 *                                   (newLibraryWithSource: returns nil + error);
 *     SIMMETAL_COMPUTE_WRONG        kernels run, but simdgroup operations act on
 *                                   16-wide halves (reductions) and the matrix
 *                                   store writes the transpose: wrong numbers,
 *                                   no error, the "garbage" failure.
 *   EVIDENCED  bf16: Metal asks itself -requiresBFloat16Emulation, which is
 *              ![self supportsFamily:Apple9] (REAL-METAL 4: the decompile), so a
 *              patched Apple9 answer turns the emulation off. Apple GPUs below
 *              Apple9 (M1: Apple7, M2: Apple8; Apple's MTLGPUFamily documentation,
 *              the table in policy/src/chip.rs) are the ones Metal emulates bf16
 *              on. So: with the emulation on, or on an Apple9+ host, the bfloat
 *              kernel computes right (emulated or native).
 *   MODELLED   What an Apple7/8 GPU does with bfloat code compiled without the
 *              emulation: no evidence we read says (a compile error, a fault and
 *              wrong numbers are all possible). Here it computes wrong numbers
 *              without an error: each bfloat's 16 bits go through the half
 *              (IEEE binary16) arithmetic the GPU does have. Any of the three
 *              fails `verify`'s bfloat kernel; this one fails it as `differs`.
 *              Where it is decided: at -newLibraryWithSource:, which asks the
 *              device once (that the real compiler reads the flag there, and not
 *              at pipeline creation, is inferred).
 *   MODELLED   The host chip: SIMMETAL_HOST_CHIP_BRAND, a brand string as
 *              `sysctl machdep.cpu.brand_string` gives it ("Apple M2 (Virtual)"),
 *              mapped like policy/src/chip.rs (M1 7, M2 8, M3/M4 9, M5 10);
 *              unset or unknown: an M1 (Apple7, the host REAL-METAL 6 records).
 *   MODELLED   Execution is synchronous at -commit (real Metal runs the command
 *              buffer later; the probe waits with -waitUntilCompleted, so the
 *              difference is not observable to it).
 *   SHAPE      Strings are C strings (no Foundation on the GCC runtime): the
 *              source, function names and error descriptions are `const char *`
 *              where Metal takes and returns NSString. MTLSize is passed by value
 *              as in Metal. Objects are never freed (as in simmetal.m).
 *
 * "Running" a kernel means executing a C implementation of that kernel, chosen by
 * its function name; the MSL text itself is not compiled. The probe's kernels
 * (probe/src/verify/kernels.rs) are the only ones the simulated compiler knows;
 * any other function name is "not found" (newFunctionWithName: returns nil).
 */
#if !defined(SIMMETAL_STUB) && !defined(SIMMETAL_TOOLS)

#include <objc/objc.h>
#include <objc/runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef unsigned long NSUInteger;

typedef struct {
    NSUInteger width, height, depth;
} MTLSize;

/* MTLCommandBufferStatus values. */
enum { SimStatusNotEnqueued = 0, SimStatusCompleted = 4, SimStatusError = 5 };

/* The host GPU's threadgroup memory (see the file comment: evidenced). */
#define SIM_HOST_THREADGROUP_MEMORY 32768
/* Threads in a simdgroup on every Apple GPU (Apple's feature set tables). */
#define SIM_SIMD_WIDTH 32
/* maxTotalThreadsPerThreadgroup of a simple compute pipeline on Apple GPUs. */
#define SIM_MAX_THREADS 1024
#define SIM_MAX_BUFFERS 8
#define SIM_MAX_DISPATCHES 8

enum sim_kernel {
    SimKernelNone = 0,
    SimKernelSimdSum,
    SimKernelSimdMax,
    SimKernelSimdgroupMM,
    SimKernelBfloat,
    SimKernelThreadgroup,
};

static const struct {
    const char *name;
    enum sim_kernel kernel;
} sim_kernels[] = {
    {"metalift_simd_sum", SimKernelSimdSum},
    {"metalift_simd_max", SimKernelSimdMax},
    {"metalift_simdgroup_mm", SimKernelSimdgroupMM},
    {"metalift_bfloat", SimKernelBfloat},
    {"metalift_threadgroup", SimKernelThreadgroup},
};

/* One bound buffer, as the kernel sees it. */
struct sim_binding {
    unsigned char *bytes;
    NSUInteger length;
};

/* One recorded dispatch. */
struct sim_dispatch {
    enum sim_kernel kernel;
    /* Compiled with Metal's bf16 emulation off (see the file comment). */
    int native_bfloat;
    struct sim_binding buffers[SIM_MAX_BUFFERS];
    NSUInteger threadgroup_length;
    MTLSize groups, threads;
};

/* A root class of our own: nothing here depends on simmetal.m's classes but
 * _MTLDevice, which the category below extends. */
__attribute__((objc_root_class))
@interface SimComputeObject
{
    Class isa;
}
+ (id)alloc;
- (id)init;
@end

@implementation SimComputeObject
+ (id)alloc
{
    return class_createInstance(self, 0);
}
- (id)init
{
    return self;
}
@end

/* NSError's part the probe reads. */
@interface SimError : SimComputeObject
{
@public
    char _description[256];
}
- (const char *)localizedDescription;
@end

@implementation SimError
- (const char *)localizedDescription
{
    return _description;
}
@end

static id sim_error(const char *fmt, const char *arg)
{
    SimError *e = [[SimError alloc] init];
    snprintf(e->_description, sizeof e->_description, fmt, arg);
    return e;
}

@interface SimBuffer : SimComputeObject
{
@public
    unsigned char *_bytes;
    NSUInteger _length;
}
- (void *)contents;
- (NSUInteger)length;
@end

@implementation SimBuffer
- (void *)contents
{
    return _bytes;
}
- (NSUInteger)length
{
    return _length;
}
@end

@interface SimFunction : SimComputeObject
{
@public
    enum sim_kernel _kernel;
    int _nativeBfloat;
    const char *_name;
}
- (const char *)name;
@end

@implementation SimFunction
- (const char *)name
{
    return _name;
}
@end

@interface SimLibrary : SimComputeObject
{
@public
    char *_source;
    int _nativeBfloat;
}
- (id)newFunctionWithName:(const char *)name;
@end

@implementation SimLibrary
/* A function the simulated compiler knows, defined in this library's source. */
- (id)newFunctionWithName:(const char *)name
{
    size_t i;
    char needle[128];
    if (name == NULL)
        return nil;
    snprintf(needle, sizeof needle, "kernel void %s(", name);
    if (strstr(_source, needle) == NULL)
        return nil;
    for (i = 0; i < sizeof sim_kernels / sizeof sim_kernels[0]; i++) {
        if (strcmp(sim_kernels[i].name, name) == 0) {
            SimFunction *f = [[SimFunction alloc] init];
            f->_kernel = sim_kernels[i].kernel;
            f->_nativeBfloat = _nativeBfloat;
            f->_name = sim_kernels[i].name;
            return f;
        }
    }
    return nil;
}
@end

@interface SimComputePipelineState : SimComputeObject
{
@public
    enum sim_kernel _kernel;
    int _nativeBfloat;
}
- (NSUInteger)maxTotalThreadsPerThreadgroup;
- (NSUInteger)threadExecutionWidth;
@end

@implementation SimComputePipelineState
- (NSUInteger)maxTotalThreadsPerThreadgroup
{
    return SIM_MAX_THREADS;
}
- (NSUInteger)threadExecutionWidth
{
    return SIM_SIMD_WIDTH;
}
@end

@class SimCommandBuffer;

@interface SimComputeCommandEncoder : SimComputeObject
{
@public
    SimCommandBuffer *_commandBuffer;
    struct sim_dispatch _next;
}
- (void)setComputePipelineState:(id)state;
- (void)setBuffer:(id)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index;
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index;
- (void)dispatchThreadgroups:(MTLSize)groups threadsPerThreadgroup:(MTLSize)threads;
- (void)endEncoding;
@end

@interface SimCommandBuffer : SimComputeObject
{
@public
    struct sim_dispatch _dispatches[SIM_MAX_DISPATCHES];
    int _count;
    NSUInteger _status;
    id _error;
}
- (id)computeCommandEncoder;
- (void)commit;
- (void)waitUntilCompleted;
- (NSUInteger)status;
- (id)error;
@end

@implementation SimComputeCommandEncoder
- (void)setComputePipelineState:(id)state
{
    _next.kernel = ((SimComputePipelineState *)state)->_kernel;
    _next.native_bfloat = ((SimComputePipelineState *)state)->_nativeBfloat;
}
- (void)setBuffer:(id)buffer offset:(NSUInteger)offset atIndex:(NSUInteger)index
{
    SimBuffer *b = buffer;
    if (index >= SIM_MAX_BUFFERS || b == nil || offset > b->_length)
        return;
    _next.buffers[index].bytes = b->_bytes + offset;
    _next.buffers[index].length = b->_length - offset;
}
- (void)setThreadgroupMemoryLength:(NSUInteger)length atIndex:(NSUInteger)index
{
    if (index == 0)
        _next.threadgroup_length = length;
}
- (void)dispatchThreadgroups:(MTLSize)groups threadsPerThreadgroup:(MTLSize)threads
{
    SimCommandBuffer *cb = _commandBuffer;
    _next.groups = groups;
    _next.threads = threads;
    if (cb->_count < SIM_MAX_DISPATCHES)
        cb->_dispatches[cb->_count++] = _next;
}
- (void)endEncoding
{
}
@end

/* ---- the host GPU: the kernels, in C ------------------------------------- */

/* Lanes a simdgroup operation combines: the whole simdgroup, or (the broken
 * variant) 16-lane halves of it. */
#ifdef SIMMETAL_COMPUTE_WRONG
#define SIM_REDUCE_WIDTH 16
#else
#define SIM_REDUCE_WIDTH SIM_SIMD_WIDTH
#endif

static int fits(const struct sim_binding *b, NSUInteger bytes)
{
    return b->bytes != NULL && b->length >= bytes;
}

/* out[t] = simd_sum(in[t]) or simd_max(in[t]) over each simdgroup. */
static const char *run_reduction(const struct sim_dispatch *d, int max)
{
    NSUInteger n = d->groups.width * d->threads.width, t, lane;
    float *in = (float *)d->buffers[0].bytes, *out = (float *)d->buffers[1].bytes;
    if (!fits(&d->buffers[0], n * 4) || !fits(&d->buffers[1], n * 4))
        return "a buffer is smaller than the grid";
    for (t = 0; t < n; t += SIM_REDUCE_WIDTH) {
        float acc = in[t];
        for (lane = 1; lane < SIM_REDUCE_WIDTH && t + lane < n; lane++)
            acc = max ? (in[t + lane] > acc ? in[t + lane] : acc) : acc + in[t + lane];
        for (lane = 0; lane < SIM_REDUCE_WIDTH && t + lane < n; lane++)
            out[t + lane] = acc;
    }
    return NULL;
}

/* c = a * b, 8x8 row-major (simdgroup_load/multiply/store with stride 8). */
static const char *run_simdgroup_mm(const struct sim_dispatch *d)
{
    float *a = (float *)d->buffers[0].bytes, *b = (float *)d->buffers[1].bytes;
    float *c = (float *)d->buffers[2].bytes;
    int i, j, k;
    if (!fits(&d->buffers[0], 256) || !fits(&d->buffers[1], 256) || !fits(&d->buffers[2], 256))
        return "a matrix buffer is smaller than 8x8 floats";
    for (i = 0; i < 8; i++)
        for (j = 0; j < 8; j++) {
            float acc = 0;
            for (k = 0; k < 8; k++)
                acc += a[i * 8 + k] * b[k * 8 + j];
#ifdef SIMMETAL_COMPUTE_WRONG
            c[j * 8 + i] = acc;
#else
            c[i * 8 + j] = acc;
#endif
        }
    return NULL;
}

/* float -> bfloat, round to nearest even (MSL's conversion), back as a float. */
static float to_bfloat(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u = (u + 0x7fff + ((u >> 16) & 1)) & 0xffff0000u;
    memcpy(&x, &u, 4);
    return x;
}

/* The Apple family of the simulated host chip (see the file comment). */
static int sim_host_family(void)
{
    static const struct {
        const char *generation;
        int family;
    } chips[] = {{"M1", 7}, {"M2", 8}, {"M3", 9}, {"M4", 9}, {"M5", 10}};
    const char *brand = getenv("SIMMETAL_HOST_CHIP_BRAND");
    const char *apple = brand ? strstr(brand, "Apple ") : NULL;
    size_t i;
    if (apple == NULL)
        return 7;
    apple += strlen("Apple ");
    for (i = 0; i < sizeof chips / sizeof chips[0]; i++) {
        size_t len = strlen(chips[i].generation);
        if (strncmp(apple, chips[i].generation, len) == 0 &&
            (apple[len] == '\0' || apple[len] == ' '))
            return chips[i].family;
    }
    return 7;
}

/* A bfloat's 16 bits read as an IEEE binary16 (the modelled wrong path). */
static float bfloat_bits_as_half(float x)
{
    uint32_t u, sign, exponent, mantissa, f;
    memcpy(&u, &x, 4);
    u >>= 16;
    sign = (u >> 15) & 1;
    exponent = (u >> 10) & 0x1f;
    mantissa = u & 0x3ff;
    if (exponent == 0x1f)
        f = (sign << 31) | 0x7f800000u | (mantissa << 13);
    else if (exponent == 0)
        f = sign << 31; /* subnormal halves: flushed, close enough for a wrong answer */
    else
        f = (sign << 31) | ((exponent + 112) << 23) | (mantissa << 13);
    memcpy(&x, &f, 4);
    return x;
}

/* out[t] = float(bfloat(a[t]) * bfloat(b[t]) + bfloat(1)), each step in bfloat;
 * compiled without the emulation for a host below Apple9, the modelled wrong
 * arithmetic instead. */
static const char *run_bfloat(const struct sim_dispatch *d)
{
    NSUInteger n = d->groups.width * d->threads.width, t;
    float *a = (float *)d->buffers[0].bytes, *b = (float *)d->buffers[1].bytes;
    float *out = (float *)d->buffers[2].bytes;
    int wrong = d->native_bfloat && sim_host_family() < 9;
    if (!fits(&d->buffers[0], n * 4) || !fits(&d->buffers[1], n * 4) || !fits(&d->buffers[2], n * 4))
        return "a buffer is smaller than the grid";
    for (t = 0; t < n; t++) {
        if (wrong) {
            float x = bfloat_bits_as_half(to_bfloat(a[t]));
            float y = bfloat_bits_as_half(to_bfloat(b[t]));
            out[t] = x * y + bfloat_bits_as_half(to_bfloat(1.0f));
        } else {
            out[t] = to_bfloat(to_bfloat(to_bfloat(a[t]) * to_bfloat(b[t])) + 1.0f);
        }
    }
    return NULL;
}

/* Every thread fills its words of the threadgroup buffer; after the barrier each
 * reads the words of its mirror thread (width - 1 - tid) and sums them. */
static const char *run_threadgroup(const struct sim_dispatch *d)
{
    NSUInteger width = d->threads.width, words, t, i;
    uint32_t *out = (uint32_t *)d->buffers[0].bytes, *scratch;
    if (d->threadgroup_length > SIM_HOST_THREADGROUP_MEMORY)
        return "threadgroup memory length exceeds what the GPU has (32768 bytes)";
    if (!fits(&d->buffers[0], width * 4) || !fits(&d->buffers[1], 4))
        return "a buffer is smaller than the threadgroup";
    words = *(uint32_t *)d->buffers[1].bytes;
    if (words * 4 > d->threadgroup_length)
        return "the kernel reads past its threadgroup buffer";
    scratch = calloc(words ? words : 1, 4);
    if (scratch == NULL)
        return "out of memory";
    for (t = 0; t < width; t++)
        for (i = t; i < words; i += width)
            scratch[i] = (uint32_t)i * 2654435761u + 12345u;
    for (t = 0; t < width; t++) {
        uint32_t sum = 0;
        for (i = width - 1 - t; i < words; i += width)
            sum += scratch[i];
        out[t] = sum;
    }
    free(scratch);
    return NULL;
}

static const char *run(const struct sim_dispatch *d)
{
    if (d->threads.width * d->threads.height * d->threads.depth > SIM_MAX_THREADS)
        return "more threads per threadgroup than the pipeline allows";
    if (d->threads.height != 1 || d->threads.depth != 1 || d->groups.height != 1 ||
        d->groups.depth != 1)
        return "the simulation runs one-dimensional grids only";
    switch (d->kernel) {
    case SimKernelSimdSum:
        return run_reduction(d, 0);
    case SimKernelSimdMax:
        return run_reduction(d, 1);
    case SimKernelSimdgroupMM:
        return run_simdgroup_mm(d);
    case SimKernelBfloat:
        return run_bfloat(d);
    case SimKernelThreadgroup:
        return run_threadgroup(d);
    case SimKernelNone:
        break;
    }
    return "no compute pipeline state set";
}

/* ---- the hung-kernel variant (SIMMETAL_COMPUTE_HANG) ---------------------
 * MODELLED: a kernel that never completes (a Metal test suite hung for 47 minutes
 * on the paravirtual device, JustVugg/colibri#947). Built as `hang/` (probe/
 * build.rs): -waitUntilCompleted never returns for a command buffer holding the
 * simdgroup matrix kernel; every other kernel completes, so a test can see which
 * one `metalift verify` names `hung`. */
#ifdef SIMMETAL_COMPUTE_HANG
#include <unistd.h>
static void sim_hang_if_matrix(const struct sim_dispatch *d, int count)
{
    int i;
    for (i = 0; i < count; i++)
        if (d[i].kernel == SimKernelSimdgroupMM)
            for (;;)
                pause();
}
#define SIM_MAYBE_HANG(cb) sim_hang_if_matrix((cb)->_dispatches, (cb)->_count)
#else
#define SIM_MAYBE_HANG(cb) ((void)0)
#endif

@implementation SimCommandBuffer
- (id)computeCommandEncoder
{
    SimComputeCommandEncoder *e = [[SimComputeCommandEncoder alloc] init];
    e->_commandBuffer = self;
    memset(&e->_next, 0, sizeof e->_next);
    return e;
}
- (void)commit
{
    int i;
    _status = SimStatusCompleted;
    for (i = 0; i < _count; i++) {
        const char *why = run(&_dispatches[i]);
        if (why != NULL) {
            _status = SimStatusError;
            _error = sim_error("command buffer execution failed: %s", why);
            return;
        }
    }
}
- (void)waitUntilCompleted
{
    SIM_MAYBE_HANG(self);
}
- (NSUInteger)status
{
    return _status;
}
- (id)error
{
    return _error;
}
@end

@interface SimCommandQueue : SimComputeObject
- (id)commandBuffer;
@end

@implementation SimCommandQueue
- (id)commandBuffer
{
    SimCommandBuffer *cb = [[SimCommandBuffer alloc] init];
    cb->_count = 0;
    cb->_status = SimStatusNotEnqueued;
    cb->_error = nil;
    return cb;
}
@end

/* ---- the device's side ---------------------------------------------------- */

__attribute__((objc_root_class))
@interface _MTLDevice
@end

/* Metal's own derived answer (simmetal.m: !supportsFamily:Apple9). */
@interface _MTLDevice (SimComputeMetal)
- (BOOL)requiresBFloat16Emulation;
@end

@interface _MTLDevice (SimCompute)
- (id)newLibraryWithSource:(const char *)source options:(id)options error:(id *)error;
- (id)newComputePipelineStateWithFunction:(id)function error:(id *)error;
- (id)newCommandQueue;
- (id)newBufferWithLength:(NSUInteger)length options:(NSUInteger)options;
@end

@implementation _MTLDevice (SimCompute)
- (id)newLibraryWithSource:(const char *)source options:(id)options error:(id *)error
{
    SimLibrary *lib;
    (void)options;
    if (source == NULL) {
        if (error)
            *error = sim_error("%s", "no source");
        return nil;
    }
#ifdef SIMMETAL_COMPUTE_NO_COMPILE
    if (strstr(source, "simd_") != NULL || strstr(source, "simdgroup_") != NULL) {
        if (error)
            *error = sim_error("program_source: error: %s (simulated: a host update broke "
                               "the GPU's simdgroup support)",
                               "simdgroup functions are not supported on this GPU");
        return nil;
    }
#endif
    lib = [[SimLibrary alloc] init];
    /* Metal compiles with its bf16 emulation as it derives it (file comment). */
    lib->_nativeBfloat = ![self requiresBFloat16Emulation];
    lib->_source = strdup(source);
    if (lib->_source == NULL) {
        if (error)
            *error = sim_error("%s", "out of memory");
        return nil;
    }
    return lib;
}
- (id)newComputePipelineStateWithFunction:(id)function error:(id *)error
{
    SimComputePipelineState *p;
    if (function == nil) {
        if (error)
            *error = sim_error("%s", "no function");
        return nil;
    }
    p = [[SimComputePipelineState alloc] init];
    p->_kernel = ((SimFunction *)function)->_kernel;
    p->_nativeBfloat = ((SimFunction *)function)->_nativeBfloat;
    return p;
}
- (id)newCommandQueue
{
    return [[SimCommandQueue alloc] init];
}
- (id)newBufferWithLength:(NSUInteger)length options:(NSUInteger)options
{
    SimBuffer *b;
    (void)options;
    b = [[SimBuffer alloc] init];
    b->_bytes = calloc(length ? length : 1, 1);
    if (b->_bytes == NULL)
        return nil;
    b->_length = length;
    return b;
}
@end

#endif /* !SIMMETAL_STUB && !SIMMETAL_TOOLS */
