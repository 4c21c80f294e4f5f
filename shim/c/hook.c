/*
 * hook.c — the Metal hooks: the same code on macOS and on the Linux simulation
 * (Debian's GCC Objective-C runtime). The runtime is reached through dlsym only
 * once Metal is there; the shim links no libobjc.
 *
 * What real Metal requires (../shared/REAL-METAL.md, and the working peers
 * veertuinc/anka-metal-unlock guest/anka_gpu_family_boost.m + guest/hooks.m and
 * trycua/cua libs/lume/metal-capability-shim): supportsFamily: is defined once,
 * in _MTLDevice, over a vector that -[_MTLDevice initGPUFamilySupport] builds
 * inside the device's init; the driver class defines the threadgroup memory and
 * IOGPUMetalDevice the working set. So, inside device creation:
 *
 * 1. -[_MTLDevice initGPUFamilySupport] (the one private selector metalift
 *    relies on) is replaced by device_init. On this process's first device it
 *    checks in and waits for the verdict (hard deadline), BEFORE calling the
 *    original. A missing selector: `failed` at once, nothing installed.
 * 2. Unlock: for supportsFamily:, maxThreadgroupMemoryLength and (when the
 *    profile sets it) recommendedMaxWorkingSetSize, the Method that
 *    class_getInstanceMethod finds for the device's class — wherever it is
 *    defined, _MTLDevice included — gets the shim's IMP with
 *    method_setImplementation, before the original initGPUFamilySupport runs,
 *    so Metal's own feature queries and the program see one device. Every
 *    selector is looked up before the first is patched: one missing, nothing is
 *    installed. Stock: nothing is installed at all.
 * 3. Nothing is asked of the half-built device beyond what the original
 *    initGPUFamilySupport has made safe (the family vector). The check that the
 *    patch took effect ("finish") runs at the first capability question the
 *    program asks: a question whose caller lies outside the images that build
 *    the device (the images of the device's classes, _MTLDevice's included) —
 *    Metal's own questions during creation (the feature queries) come from
 *    those images and are answered without it — or a question to a device
 *    whose class is no longer the one it was created as (an isa swap happens
 *    to a built object; the override then forwards from Metal's image). A
 *    question that only ever comes through Metal's own images otherwise (a
 *    forwarding wrapper defined in Metal.framework itself) never runs finish:
 *    the answers stay unlocked and the decision has no outcome (README,
 *    known limits). finish reads the stock answers
 *    through the saved originals and the effective ones through the live
 *    dispatch of the device's current class; a mismatch restores every
 *    original (method_setImplementation(original): the classes are exactly as
 *    they were) and reports `failed`.
 *
 * Linux only: GCC's libobjc copies IMPs into a dispatch table per class, and its
 * method_setImplementation refreshes only the defining class's table, so every
 * patch and restore is followed by __objc_update_dispatch_table_for_class on
 * each class from the defining class down to the device's (REAL-METAL.md, "Where
 * the Linux runtime differs"). Apple's objc4 flushes every cache itself
 * (objc-runtime-new.mm, _method_setImplementation -> flushCaches(nil, ...)).
 *
 * Every pointer called here came from the runtime (dlsym, method IMPs) and
 * every pointer handed to it is a C function: on arm64e clang signs and
 * authenticates them all (see shim/c/README.md).
 */
#include "metalift_shim.h"


typedef void *ml_id;
typedef void *ml_class;
typedef const void *ml_sel;
typedef void *ml_method;
typedef void (*ml_imp)(void);

typedef void (*init_fn)(ml_id, ml_sel);
typedef uint8_t (*supports_family_fn)(ml_id, ml_sel, long);
typedef unsigned long (*threadgroup_fn)(ml_id, ml_sel);
typedef uint64_t (*working_set_fn)(ml_id, ml_sel);

/* The runtime functions, identical in Apple's and GCC's <objc/runtime.h>. */
static struct {
    bool resolved;
    ml_class (*get_class)(const char *);
    ml_sel (*sel_register_name)(const char *);
    ml_method (*class_get_instance_method)(ml_class, ml_sel);
    const char *(*class_get_name)(ml_class);
    ml_class (*class_get_superclass)(ml_class);
    ml_imp (*class_get_method_implementation)(ml_class, ml_sel);
    ml_imp (*method_get_implementation)(ml_method);
    ml_imp (*method_set_implementation)(ml_method, ml_imp);
#ifdef __APPLE__
    /* Apple exports it (isa is not a plain pointer there). */
    ml_class (*object_get_class)(ml_id);
#else
    /* GCC's libobjc: see the file comment. (Its object_getClass is a header
     * inline, so the shim reads the first word instead: struct objc_object
     * { Class class_pointer; }. Not looked up: a failed dlsym would leave a
     * dlerror() string in the host.) */
    void (*update_dispatch_table)(ml_class);
#endif
} rt;

enum { SEL_SF, SEL_TG, SEL_WS, SEL_COUNT };
static const char *const sel_names[SEL_COUNT] = {
    "supportsFamily:", "maxThreadgroupMemoryLength", "recommendedMaxWorkingSetSize"};
static ml_sel sels[SEL_COUNT];

/* The state of the capability IMPs. */
enum mode {
    MODE_NONE,           /* nothing installed */
    MODE_PENDING_UNLOCK, /* installed, finish not run yet; answer unlocked */
    MODE_UNLOCKED,       /* finish confirmed the unlock */
};

static bool init_hooked; /* the device-init hook is in place (or failed for good) */
static init_fn original_init;
/* Held by the first device's handling (verdict wait, installing); a second
 * device init meanwhile waits here for the same decision. */
static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile pid_t first_device_pid; /* the pid whose first device was handled */

/* One capability method the shim may patch (the peers' slot table). */
struct slot {
    ml_method method;  /* the Method class_getInstanceMethod found */
    ml_imp original;   /* its IMP before the patch */
    ml_class defining; /* the class whose method list holds it */
    bool installed;
};
static volatile int mode = MODE_NONE;
static struct slot slots[SEL_COUNT];
static ml_class hooked_class;              /* the first device's class */
static struct ml_plan plan;                /* what the first device decided */
static char device_class_name[128];

/* The images that build the device (see the file comment, step 3). */
#define ML_CREATION_IMAGES 8
static const void *creation_images[ML_CREATION_IMAGES];
static unsigned creation_image_count;

/* finish: once, at the program's first capability question. */
static pthread_mutex_t finish_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile bool finish_done = true;
static volatile bool finishing;
static pthread_t finishing_thread;

static bool resolve_runtime(void *scope)
{
    if (rt.resolved)
        return true;
#define RESOLVE(field, name)                                                                       \
    do {                                                                                           \
        void *sym_ = dlsym(scope, name);                                                           \
        if (sym_ == NULL) {                                                                        \
            (void)dlerror(); /* not an Objective-C runtime: leave no error behind */               \
            return false;                                                                          \
        }                                                                                          \
        memcpy(&rt.field, &sym_, sizeof sym_);                                                     \
    } while (0)
    RESOLVE(get_class, "objc_getClass");
    RESOLVE(sel_register_name, "sel_registerName");
    RESOLVE(class_get_instance_method, "class_getInstanceMethod");
    RESOLVE(class_get_name, "class_getName");
    RESOLVE(class_get_superclass, "class_getSuperclass");
    RESOLVE(class_get_method_implementation, "class_getMethodImplementation");
    RESOLVE(method_get_implementation, "method_getImplementation");
    RESOLVE(method_set_implementation, "method_setImplementation");
#ifdef __APPLE__
    RESOLVE(object_get_class, "object_getClass");
#else
    RESOLVE(update_dispatch_table, "__objc_update_dispatch_table_for_class");
#endif
#undef RESOLVE
    for (int i = 0; i < SEL_COUNT; i++)
        sels[i] = rt.sel_register_name(sel_names[i]);
    rt.resolved = true;
    return true;
}

static ml_class class_of(ml_id object)
{
#ifdef __APPLE__
    return rt.object_get_class(object);
#else
    return *(ml_class *)object; /* GCC: struct objc_object { Class class_pointer; } */
#endif
}

static const char *class_name(ml_class cls)
{
    const char *name = cls ? rt.class_get_name(cls) : NULL;
    return name ? name : "?";
}

/* ---------------------------------------------------------- answers -- */

/* Asks `device` through the IMPs `imps` (NULL entries: not answered). */
static struct ml_answers read_with(ml_id device, const ml_imp imps[SEL_COUNT])
{
    struct ml_answers a = {0, 0, 0};
    if (imps[SEL_SF] != NULL) {
        supports_family_fn f = (supports_family_fn)imps[SEL_SF];
        for (unsigned i = 0; i < ML_KNOWN_FAMILIES; i++)
            if (f(device, sels[SEL_SF], (long)ml_known_family(i)))
                a.families |= 1u << i;
    }
    if (imps[SEL_TG] != NULL)
        a.threadgroup_memory = ((threadgroup_fn)imps[SEL_TG])(device, sels[SEL_TG]);
    if (imps[SEL_WS] != NULL)
        a.working_set = ((working_set_fn)imps[SEL_WS])(device, sels[SEL_WS]);
    return a;
}

/* The IMPs live dispatch calls for `cls` now (NULL: no such method, or not to
 * be asked). `upto` limits the questions: SEL_TG asks the families only. */
static void live_imps(ml_class cls, ml_imp out[SEL_COUNT], int upto)
{
    for (int i = 0; i < SEL_COUNT; i++)
        out[i] = i < upto && rt.class_get_instance_method(cls, sels[i]) != NULL
                     ? rt.class_get_method_implementation(cls, sels[i])
                     : NULL;
}

static struct ml_answers read_live(ml_id device, int upto)
{
    ml_imp imps[SEL_COUNT];
    live_imps(class_of(device), imps, upto);
    return read_with(device, imps);
}

/* ------------------------------------------------------- patching -- */

/* The class up the chain from `cls` whose own method list holds `m`. */
static ml_class defining_class(ml_class cls, ml_sel sel, ml_method m)
{
    ml_class c = cls;
    for (;;) {
        ml_class super = rt.class_get_superclass(c);
        if (super == NULL || rt.class_get_instance_method(super, sel) != m)
            return c;
        c = super;
    }
}

/* Linux: rebuild the dispatch tables from `top` down to `cls`, parents first
 * (each copies from its refreshed parent). macOS: nothing to do. */
static void refresh_dispatch(ml_class top, ml_class cls)
{
#ifdef __APPLE__
    (void)top;
    (void)cls;
#else
    ml_class chain[16];
    int n = 0;
    for (ml_class c = cls; c != NULL && n < 16; c = rt.class_get_superclass(c)) {
        chain[n++] = c;
        if (c == top)
            break;
    }
    while (n > 0)
        rt.update_dispatch_table(chain[--n]);
#endif
}

static void restore_originals(void)
{
    for (int i = SEL_COUNT - 1; i >= 0; i--) {
        if (slots[i].installed) {
            rt.method_set_implementation(slots[i].method, slots[i].original);
            refresh_dispatch(slots[i].defining, hooked_class);
            slots[i].installed = false;
        }
    }
    mode = MODE_NONE;
}

/* The images of the device's classes, from its own up to _MTLDevice. */
static void note_creation_images(ml_class cls)
{
    creation_image_count = 0;
    for (ml_class c = cls; c != NULL; c = rt.class_get_superclass(c)) {
        Dl_info info;
        if (dladdr(c, &info) != 0 && info.dli_fbase != NULL) {
            bool known = false;
            for (unsigned i = 0; i < creation_image_count; i++)
                known = known || creation_images[i] == info.dli_fbase;
            if (!known && creation_image_count < ML_CREATION_IMAGES)
                creation_images[creation_image_count++] = info.dli_fbase;
        }
        if (strcmp(class_name(c), "_MTLDevice") == 0)
            break;
    }
}

/* Whether `caller` (a return address) lies in an image that builds the device. */
static bool asked_by_metal(const void *caller)
{
    Dl_info info;
    if (dladdr(caller, &info) == 0)
        return false;
    for (unsigned i = 0; i < creation_image_count; i++)
        if (creation_images[i] == info.dli_fbase)
            return true;
    return false;
}

/* ------------------------------------------------------ the outcome -- */

static void report(uint64_t id, uint8_t result, const char *reason, struct ml_answers stock,
                   struct ml_answers effective)
{
    char families[200];
    size_t used = 0;
    families[0] = '\0';
    for (unsigned i = 0; i < ML_KNOWN_FAMILIES; i++) {
        if ((effective.families >> i) & 1u) {
            int n = snprintf(families + used, sizeof families - used, "%s%s", used ? "," : "",
                             ml_known_family_name(i));
            if (n < 0 || (size_t)n >= sizeof families - used)
                break;
            used += (size_t)n;
        }
    }
    static const char *const words[] = {"applied", "stock", "failed"};
    ml_log(result == ML_RESULT_FAILED ? ML_WARN : ML_INFO,
           "%s for %s (decision %llu): %s; answers %s / threadgroup memory %llu", words[result],
           device_class_name, (unsigned long long)id,
           result == ML_RESULT_APPLIED ? (plan.rule[0] ? plan.rule : "rule ?") : reason, families,
           (unsigned long long)effective.threadgroup_memory);
    struct ml_outcome o = {
        .decision_id = id,
        .result = result,
        .reason = result == ML_RESULT_APPLIED ? "" : reason,
        .device_class = device_class_name,
        .stock = stock,
        .effective = effective,
    };
    ml_session_report(&o);
}

/* The program's first capability question: check the patch against what the
 * finished device answers, keep it, or restore every original. */
static void finish(ml_id device)
{
    ml_imp stock_imps[SEL_COUNT];
    live_imps(hooked_class, stock_imps, SEL_COUNT);
    for (int i = 0; i < SEL_COUNT; i++)
        if (slots[i].installed)
            stock_imps[i] = slots[i].original;
    struct ml_answers stock = read_with(device, stock_imps);
    struct ml_answers effective = read_live(device, SEL_COUNT);
    struct ml_answers expected = ml_expected_answers(&plan.caps, stock);
    if (effective.families == expected.families &&
        effective.threadgroup_memory == expected.threadgroup_memory &&
        effective.working_set == expected.working_set) {
        mode = MODE_UNLOCKED;
        report(plan.decision_id, ML_RESULT_APPLIED, "", stock, effective);
        return;
    }
    char reason[256];
    snprintf(reason, sizeof reason,
             "the hooks did not take effect on %s (families %#x, expected %#x; threadgroup "
             "memory %llu, expected %llu); rolled back",
             class_name(class_of(device)), effective.families, expected.families,
             (unsigned long long)effective.threadgroup_memory,
             (unsigned long long)expected.threadgroup_memory);
    restore_originals();
    report(plan.decision_id, ML_RESULT_FAILED, reason, stock, read_live(device, SEL_COUNT));
}

/* Runs finish once per installation, for a question from the program; a
 * question from Metal's own images (the device is being built) or from
 * finish's own live reads (same thread) is answered without it. */
static void finish_if_asked_by_program(ml_id device, const void *caller)
{
    if (finish_done)
        return;
    if (finishing && pthread_equal(finishing_thread, pthread_self()))
        return;
    if (asked_by_metal(caller) && class_of(device) == hooked_class)
        return;
    pthread_mutex_lock(&finish_lock);
    if (!finish_done && mode == MODE_PENDING_UNLOCK) {
        finishing_thread = pthread_self();
        finishing = true;
        finish(device);
        finishing = false;
        finish_done = true;
    }
    pthread_mutex_unlock(&finish_lock);
}

static bool answering_unlocked(void)
{
    return mode == MODE_PENDING_UNLOCK || mode == MODE_UNLOCKED;
}

/* The caller of a replacement IMP (objc_msgSend jumps to it, so this is the
 * code that sent the message). clang strips the arm64e signature. */
#define ML_CALLER() __builtin_return_address(0)

__attribute__((noinline)) static uint8_t imp_supports_family(ml_id self, ml_sel cmd, long family)
{
    finish_if_asked_by_program(self, ML_CALLER());
    bool stock = ((supports_family_fn)slots[SEL_SF].original)(self, cmd, family) != 0;
    if (answering_unlocked())
        return ml_caps_supports_family(&plan.caps, family, stock) ? 1 : 0;
    return stock ? 1 : 0;
}

__attribute__((noinline)) static unsigned long imp_threadgroup(ml_id self, ml_sel cmd)
{
    finish_if_asked_by_program(self, ML_CALLER());
    unsigned long stock = ((threadgroup_fn)slots[SEL_TG].original)(self, cmd);
    if (answering_unlocked() && plan.caps.tg_memory > stock)
        return (unsigned long)plan.caps.tg_memory;
    return stock;
}

__attribute__((noinline)) static uint64_t imp_working_set(ml_id self, ml_sel cmd)
{
    finish_if_asked_by_program(self, ML_CALLER());
    uint64_t stock = ((working_set_fn)slots[SEL_WS].original)(self, cmd);
    if (answering_unlocked() && plan.caps.has_ws && plan.caps.working_set > stock)
        return plan.caps.working_set;
    return stock;
}

static const ml_imp replacement[SEL_COUNT] = {
    (ml_imp)imp_supports_family,
    (ml_imp)imp_threadgroup,
    (ml_imp)imp_working_set,
};

/* ------------------------------------------------------- first device -- */

/* What the first device's handling left to say once the original init ran. */
static uint8_t pending_result;          /* ML_RESULT_STOCK / _FAILED; _APPLIED: finish */
static char pending_reason[256];

/* Before the original initGPUFamilySupport of this process's first device:
 * check in, wait for the verdict, patch on unlock. */
static void before_first_init(ml_id device)
{
    ml_session_check_in();
    ml_session_plan(&plan, true);
    ml_class cls = class_of(device);
    snprintf(device_class_name, sizeof device_class_name, "%s", class_name(cls));
    pthread_mutex_lock(&finish_lock);
    if (mode != MODE_NONE) {
        /* Inherited from a parent process across fork: start from pristine. */
        finish_done = true;
        restore_originals();
    }
    pending_result = ML_RESULT_STOCK;
    snprintf(pending_reason, sizeof pending_reason, "%s", plan.reason);
    if (!plan.unlock) {
        pthread_mutex_unlock(&finish_lock);
        return;
    }
    int wanted = plan.caps.has_ws ? SEL_COUNT : SEL_WS;
    ml_method methods[SEL_COUNT] = {NULL, NULL, NULL};
    for (int i = 0; i < wanted; i++) {
        methods[i] = rt.class_get_instance_method(cls, sels[i]);
        if (methods[i] == NULL) {
            pending_result = ML_RESULT_FAILED;
            snprintf(pending_reason, sizeof pending_reason,
                     "selector -[%s %s] is missing; nothing was installed", device_class_name,
                     sel_names[i]);
            pthread_mutex_unlock(&finish_lock);
            return;
        }
    }
    hooked_class = cls;
    note_creation_images(cls);
    for (int i = 0; i < wanted; i++) {
        slots[i].method = methods[i];
        slots[i].original = rt.method_get_implementation(methods[i]);
        slots[i].defining = defining_class(cls, sels[i], methods[i]);
    }
    mode = MODE_PENDING_UNLOCK;
    finish_done = false;
    for (int i = 0; i < wanted; i++) {
        rt.method_set_implementation(slots[i].method, replacement[i]);
        refresh_dispatch(slots[i].defining, cls);
        slots[i].installed = true;
    }
    pending_result = ML_RESULT_APPLIED;
    pthread_mutex_unlock(&finish_lock);
    ml_log(ML_DEBUG, "capability methods of %s patched; checked at the program's first question",
           device_class_name);
}

/* After the original: a stock or failed outcome goes out now, with the family
 * answers (safe: the vector is built) and no driver getter asked (its state
 * may not be set yet, so threadgroup memory and working set read 0 there). */
static void after_first_init(ml_id device)
{
    if (pending_result == ML_RESULT_APPLIED)
        return;
    struct ml_answers now = read_live(device, SEL_TG);
    report(plan.decision_id, pending_result, pending_reason, now, now);
}

/* Replaces -[_MTLDevice initGPUFamilySupport]. */
static void device_init(ml_id self, ml_sel cmd)
{
    bool first = false;
    pid_t me = getpid();
    if (first_device_pid != me) {
        pthread_mutex_lock(&device_lock);
        if (first_device_pid != me) {
            before_first_init(self);
            first_device_pid = me;
            first = true;
        }
        pthread_mutex_unlock(&device_lock);
    }
    if (original_init != NULL)
        original_init(self, cmd);
    if (first)
        after_first_init(self);
}

/* Metal is here but cannot be hooked: `failed` at its first device creation
 * would need the hook, so check in now and report (no device init will ever
 * be seen; a process without the selector is one macOS update away). */
static void fail_without_device(const char *reason)
{
    ml_session_check_in();
    ml_session_plan(&plan, true);
    snprintf(device_class_name, sizeof device_class_name, "_MTLDevice");
    struct ml_answers none = {0, 0, 0};
    report(plan.decision_id, ML_RESULT_FAILED, reason, none, none);
}

bool ml_hook_try(void *scope)
{
    if (init_hooked)
        return true;
    if (!resolve_runtime(scope))
        return false;
    ml_class base = rt.get_class("_MTLDevice");
    if (base == NULL)
        return false;
    init_hooked = true;
    ml_method m = rt.class_get_instance_method(base, rt.sel_register_name("initGPUFamilySupport"));
    if (m == NULL) {
        fail_without_device("selector -[_MTLDevice initGPUFamilySupport] is missing: this Metal "
                            "is not supported");
        return true;
    }
    original_init = (init_fn)rt.method_get_implementation(m);
    rt.method_set_implementation(m, (ml_imp)device_init);
    refresh_dispatch(base, base);
    ml_log(ML_DEBUG, "hooked -[_MTLDevice initGPUFamilySupport]");
    return true;
}

void ml_hook_atfork_prepare(void)
{
    pthread_mutex_lock(&device_lock);
    pthread_mutex_lock(&finish_lock);
}

void ml_hook_atfork_parent(void)
{
    pthread_mutex_unlock(&finish_lock);
    pthread_mutex_unlock(&device_lock);
}

void ml_hook_atfork_child(void)
{
    pthread_mutex_unlock(&finish_lock);
    pthread_mutex_unlock(&device_lock);
}
