/*
 * hook.c — the Metal hooks: the same code on macOS and on the Linux simulation
 * (Debian's GCC Objective-C runtime). The runtime is reached through dlsym only
 * once Metal is there; the shim links no libobjc.
 *
 * Order inside device creation:
 *
 * 1. -[_MTLDevice initGPUFamilySupport] (the one private selector metalift
 *    relies on) is replaced by device_init, which calls the original and then,
 *    on this process's first device only, waits for the verdict (hard
 *    deadline). A missing selector: `failed` at once, nothing installed.
 * 2. Whatever the verdict, if the device's concrete class itself defines
 *    supportsFamily: and maxThreadgroupMemoryLength (and
 *    recommendedMaxWorkingSetSize when the profile sets it), those methods are
 *    replaced on that class by IMPs that answer from the original IMP's answer
 *    (unlock: Apple family <= ceiling OR original; threadgroup memory and
 *    working set: the larger; otherwise: the original answer). Methods the
 *    class inherits are never touched: an override added to a class cannot be
 *    removed again, so a roll-back could not leave the class as it was.
 * 3. Nothing is read while the device is still being initialised (a device
 *    asked mid-init may answer wrongly: the lateanswers simulation). The first
 *    capability question anyone asks — after -init returned — runs "finish"
 *    once: it reads the stock answers through the saved originals and the
 *    effective answers through the live dispatch of the device's current class.
 *    Unlock: effective must equal expected, else every original is restored
 *    (roll-back) and the outcome is `failed`. Stock: the originals are restored
 *    at once and the outcome is `stock`. The outcome goes out on the session.
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
    ml_imp (*class_replace_method)(ml_class, ml_sel, ml_imp, const char *);
    ml_imp (*class_get_method_implementation)(ml_class, ml_sel);
    ml_imp (*method_get_implementation)(ml_method);
    ml_imp (*method_set_implementation)(ml_method, ml_imp);
    const char *(*method_get_type_encoding)(ml_method);
    /* Apple exports it (isa is not a plain pointer there); GCC has it only as
     * a header inline, whose body reads the first word (struct objc_object). */
    ml_class (*object_get_class)(ml_id);
} rt;

enum { SEL_SF, SEL_TG, SEL_WS, SEL_COUNT };
static const char *const sel_names[SEL_COUNT] = {
    "supportsFamily:", "maxThreadgroupMemoryLength", "recommendedMaxWorkingSetSize"};
static ml_sel sels[SEL_COUNT];

/* The state of the capability IMPs. */
enum mode {
    MODE_NONE,           /* nothing installed */
    MODE_PENDING_UNLOCK, /* installed, finish not run yet; answer unlocked */
    MODE_PENDING_STOCK,  /* installed, finish not run yet; answer the original */
    MODE_UNLOCKED,       /* finish confirmed the unlock */
    MODE_RESTORED,       /* originals restored (stock, or rolled back) */
};

static bool init_hooked;     /* the device-init hook is in place (or failed for good) */
static init_fn original_init;
/* Held by the first device's handling (verdict wait, installing); a second
 * device init meanwhile waits here for the same decision. */
static pthread_mutex_t device_lock = PTHREAD_MUTEX_INITIALIZER;
static volatile pid_t first_device_pid; /* the pid whose first device was handled */

static volatile int mode = MODE_NONE;
static ml_class hooked_class;
static ml_imp originals[SEL_COUNT];        /* saved before any replacement */
static const char *types[SEL_COUNT];
static bool installed[SEL_COUNT];
static struct ml_plan plan;                /* what the first device decided */
static char device_class_name[128];

/* finish: once, at the first capability question. */
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
        if (sym_ == NULL)                                                                          \
            return false;                                                                          \
        memcpy(&rt.field, &sym_, sizeof sym_);                                                     \
    } while (0)
    RESOLVE(get_class, "objc_getClass");
    RESOLVE(sel_register_name, "sel_registerName");
    RESOLVE(class_get_instance_method, "class_getInstanceMethod");
    RESOLVE(class_get_name, "class_getName");
    RESOLVE(class_get_superclass, "class_getSuperclass");
    RESOLVE(class_replace_method, "class_replaceMethod");
    RESOLVE(class_get_method_implementation, "class_getMethodImplementation");
    RESOLVE(method_get_implementation, "method_getImplementation");
    RESOLVE(method_set_implementation, "method_setImplementation");
    RESOLVE(method_get_type_encoding, "method_getTypeEncoding");
#undef RESOLVE
    void *get = dlsym(scope, "object_getClass");
    if (get != NULL)
        memcpy(&rt.object_get_class, &get, sizeof get);
    for (int i = 0; i < SEL_COUNT; i++)
        sels[i] = rt.sel_register_name(sel_names[i]);
    rt.resolved = true;
    return true;
}

static ml_class class_of(ml_id object)
{
    if (rt.object_get_class != NULL)
        return rt.object_get_class(object);
    return *(ml_class *)object; /* GCC: struct objc_object { Class class_pointer; } */
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

/* The IMPs live dispatch would call for `cls` now (NULL: no such method). */
static void live_imps(ml_class cls, ml_imp out[SEL_COUNT])
{
    for (int i = 0; i < SEL_COUNT; i++)
        out[i] = rt.class_get_instance_method(cls, sels[i]) != NULL
                     ? rt.class_get_method_implementation(cls, sels[i])
                     : NULL;
}

static struct ml_answers read_live(ml_id device)
{
    ml_imp imps[SEL_COUNT];
    live_imps(class_of(device), imps);
    return read_with(device, imps);
}

/* ------------------------------------------------------ replacements -- */

static void restore_originals(void)
{
    for (int i = SEL_COUNT - 1; i >= 0; i--) {
        if (installed[i]) {
            rt.class_replace_method(hooked_class, sels[i], originals[i], types[i]);
            installed[i] = false;
        }
    }
    mode = MODE_RESTORED;
}

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

/* The first capability question: check the replacements against what the
 * device answers after its init, keep them, or restore every original. */
static void finish(ml_id device)
{
    ml_imp stock_imps[SEL_COUNT];
    live_imps(hooked_class, stock_imps);
    for (int i = 0; i < SEL_COUNT; i++)
        if (installed[i])
            stock_imps[i] = originals[i];
    struct ml_answers stock = read_with(device, stock_imps);
    if (mode == MODE_PENDING_UNLOCK) {
        struct ml_answers effective = read_live(device);
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
        report(plan.decision_id, ML_RESULT_FAILED, reason, stock, read_live(device));
        return;
    }
    restore_originals();
    report(plan.decision_id, ML_RESULT_STOCK, plan.reason, stock, read_live(device));
}

/* Runs finish once per installation; a re-entrant call from finish's own
 * live reads (same thread) answers without it. */
static void ensure_finished(ml_id device)
{
    if (finish_done)
        return;
    if (finishing && pthread_equal(finishing_thread, pthread_self()))
        return;
    pthread_mutex_lock(&finish_lock);
    if (!finish_done) {
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

static uint8_t imp_supports_family(ml_id self, ml_sel cmd, long family)
{
    ensure_finished(self);
    bool stock = ((supports_family_fn)originals[SEL_SF])(self, cmd, family) != 0;
    if (answering_unlocked())
        return ml_caps_supports_family(&plan.caps, family, stock) ? 1 : 0;
    return stock ? 1 : 0;
}

static unsigned long imp_threadgroup(ml_id self, ml_sel cmd)
{
    ensure_finished(self);
    unsigned long stock = ((threadgroup_fn)originals[SEL_TG])(self, cmd);
    if (answering_unlocked() && plan.caps.tg_memory > stock)
        return (unsigned long)plan.caps.tg_memory;
    return stock;
}

static uint64_t imp_working_set(ml_id self, ml_sel cmd)
{
    ensure_finished(self);
    uint64_t stock = ((working_set_fn)originals[SEL_WS])(self, cmd);
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

/* The class up the chain from `cls` that itself defines `sel`'s method `m`. */
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

static void first_device(ml_id device)
{
    ml_session_check_in(); /* no-op unless this pid has not checked in (a forked child) */
    ml_session_plan(&plan, true);
    ml_class cls = class_of(device);
    snprintf(device_class_name, sizeof device_class_name, "%s", class_name(cls));
    /* Installing and finishing exclude each other: a capability question on
     * another thread waits until every replacement is in place. */
    pthread_mutex_lock(&finish_lock);
    if (mode != MODE_NONE && mode != MODE_RESTORED) {
        /* Inherited from a parent process across fork: start from pristine. */
        finish_done = true;
        restore_originals();
    }
    int wanted = plan.unlock && plan.caps.has_ws ? SEL_COUNT : SEL_WS;
    ml_method methods[SEL_COUNT] = {NULL, NULL, NULL};
    char reason[256];
    for (int i = 0; i < wanted; i++) {
        methods[i] = rt.class_get_instance_method(cls, sels[i]);
        if (methods[i] == NULL) {
            snprintf(reason, sizeof reason, "selector -[%s %s] is missing; nothing was installed",
                     device_class_name, sel_names[i]);
            struct ml_answers now = read_live(device);
            pthread_mutex_unlock(&finish_lock);
            report(plan.decision_id, ML_RESULT_FAILED, reason, now, now);
            return;
        }
    }
    for (int i = 0; i < wanted; i++) {
        ml_class super = rt.class_get_superclass(cls);
        if (super != NULL && rt.class_get_instance_method(super, sels[i]) == methods[i]) {
            struct ml_answers now = read_live(device);
            pthread_mutex_unlock(&finish_lock);
            if (!plan.unlock) {
                report(plan.decision_id, ML_RESULT_STOCK, plan.reason, now, now);
                return;
            }
            snprintf(reason, sizeof reason,
                     "-[%s %s] is inherited from %s; metalift replaces only methods the device "
                     "class defines, so a roll-back can leave nothing behind",
                     device_class_name, sel_names[i],
                     class_name(defining_class(cls, sels[i], methods[i])));
            report(plan.decision_id, ML_RESULT_FAILED, reason, now, now);
            return;
        }
    }
    hooked_class = cls;
    for (int i = 0; i < wanted; i++) {
        originals[i] = rt.method_get_implementation(methods[i]);
        types[i] = rt.method_get_type_encoding(methods[i]);
    }
    mode = plan.unlock ? MODE_PENDING_UNLOCK : MODE_PENDING_STOCK;
    finish_done = false;
    for (int i = 0; i < wanted; i++) {
        rt.class_replace_method(cls, sels[i], replacement[i], types[i]);
        installed[i] = true;
    }
    pthread_mutex_unlock(&finish_lock);
    ml_log(ML_DEBUG, "capability methods of %s replaced; checked at the first question",
           device_class_name);
}

/* Replaces -[_MTLDevice initGPUFamilySupport]. */
static void device_init(ml_id self, ml_sel cmd)
{
    if (original_init != NULL)
        original_init(self, cmd);
    pid_t me = getpid();
    if (first_device_pid == me)
        return;
    pthread_mutex_lock(&device_lock);
    if (first_device_pid != me) {
        first_device(self);
        first_device_pid = me;
    }
    pthread_mutex_unlock(&device_lock);
}

/* Metal is here but cannot be hooked: `failed` now, with the decision id if
 * the verdict has already arrived (no device init will ever be seen). */
static void fail_without_device(const char *reason)
{
    ml_session_plan(&plan, false);
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
    ml_session_register_atfork();
    ml_method m = rt.class_get_instance_method(base, rt.sel_register_name("initGPUFamilySupport"));
    if (m == NULL) {
        fail_without_device("selector -[_MTLDevice initGPUFamilySupport] is missing: this Metal "
                            "is not supported");
        return true;
    }
    original_init = (init_fn)rt.method_get_implementation(m);
    rt.method_set_implementation(m, (ml_imp)device_init);
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
