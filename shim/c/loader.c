/*
 * loader.c — the constructor, Metal detection, and watching for Metal.
 *
 * The constructor runs in every injected process, so it does almost nothing:
 * it reads METALIFT_DISABLE, looks for Metal, and registers the watch. No
 * allocation, no /proc, no locale or time zone, no connection. When Metal is
 * there (linked by the executable, like llama.cpp, or loaded later, like
 * PyTorch's MPS) the device-init hook is installed (hook.c); the check-in waits
 * for the process's first device creation. A process that links Metal but never
 * creates a device (every AppKit tool links it) makes no connection, holds no
 * socket, leaves no audit record and no log line.
 *
 * Linux: Metal is the simulated one, recognised by its soname libsimmetal.so in
 * dl_iterate_phdr. Later arrivals are seen by the exported dlopen interposer:
 * LD_PRELOAD puts it first in the global scope, so every dlopen the program and
 * its libraries make goes through it; it calls the real dlopen and acts after
 * it returned (outside the loader lock). glibc's own internal loads (NSS,
 * iconv) do not pass through it. Known limit: glibc resolves a bare library
 * name against the calling object's DT_RUNPATH, and the caller it sees is now
 * the shim (which has none).
 *
 * macOS: Metal is recognised by the LC_ID_DYLIB install name in the image's
 * mach header (no dladdr per image) from dyld's add-image callback, which dyld
 * calls at registration for every image already loaded and then for each later
 * one (dyld-1378 dyld/DyldAPIs.cpp APIs::_dyld_register_func_for_add_image). So
 * the constructor needs no dlopen(RTLD_NOLOAD) probe, whose failure would leave
 * a dlerror() string in the host (DyldAPIs.cpp, APIs::dlopen_from sets the
 * per-thread error). dyld calls those callbacks before the Objective-C runtime
 * maps the image: dyld-1378 dyld/DyldRuntimeState.cpp RuntimeState::notifyLoad
 * runs every _notifyAddImage function first and only then _notifyObjCMapped3
 * (objc's map_images); objc4-951.1 runtime/objc-opt.mm getPreoptimizedClass
 * skips classes of images whose "loaded" bit is clear, and that bit is set by
 * runtime/objc-os.mm addHeader (hi->setLoaded(true)), called from
 * map_images_nolock. So inside Metal's own notification
 * objc_getClass("_MTLDevice") is nil: Metal's arrival is remembered (hook
 * "pending") and the hook is retried on every later add-image callback —
 * creating a device loads the GPU driver bundle, whose notification comes after
 * Metal's map_images and sees its classes. (Metal linked by the executable is
 * mapped before our constructor runs, so the registration's first callbacks
 * find the class at once.) Verified by reading the sources, not run: no Mac
 * here. The Linux simulation reproduces the order with the `lateclasses`
 * variant (the classes live in a second library that libsimmetal.so dlopens
 * inside MTLCreateSystemDefaultDevice), covered by probe/tests/shim.rs.
 */
#include "metalift_shim.h"


enum loader_state {
    LOADING,  /* the constructor has not run: loads meanwhile are not examined */
    WATCHING, /* waiting for Metal, or for _MTLDevice once Metal is there */
    INERT,    /* METALIFT_DISABLE=1: do nothing at all */
};

static volatile int loader_state = LOADING;
static volatile bool metal_seen; /* Metal's image has been seen */
static volatile bool hook_done;  /* _MTLDevice found (hooked, or failed for good) */
static pthread_mutex_t loader_lock = PTHREAD_MUTEX_INITIALIZER;

#ifdef __linux__
/* A child forked while another thread of the parent was inside
 * ml_metal_arrived (the dlopen interposer calls it after the real dlopen
 * returned, outside glibc's loader lock, so nothing stops a fork then) would
 * inherit loader_lock held by a thread it does not have, and deadlock at its
 * next dlopen. The child's only thread holds nothing: a fresh lock (review v5
 * P2-6.4). macOS needs none: its callers hold dyld's locks, which a fork takes
 * first (dyld-1378 dyld/DyldAPIs.cpp APIs::_dyld_atfork_prepare). */
static void loader_atfork_child(void)
{
    loader_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
}

static void register_loader_atfork(void)
{
    (void)pthread_atfork(NULL, NULL, loader_atfork_child);
}
#endif

void ml_metal_arrived(void *scope)
{
#ifdef __linux__
    /* Before the lock is ever taken, so a fork that finds it held resets it. */
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    (void)pthread_once(&once, register_loader_atfork);
#endif
    pthread_mutex_lock(&loader_lock);
    metal_seen = true;
    ml_fork_register();
    if (!hook_done) {
        hook_done = ml_hook_try(scope);
        if (!hook_done)
            ml_log(ML_DEBUG, "Metal is loaded but _MTLDevice is not registered yet; "
                             "retrying on each later image");
    }
    pthread_mutex_unlock(&loader_lock);
}

#ifdef __linux__

static int find_simmetal(struct dl_phdr_info *info, size_t size, void *found)
{
    (void)size;
    const char *name = info->dlpi_name;
    if (name == NULL)
        return 0;
    const char *base = strrchr(name, '/');
    base = base ? base + 1 : name;
    if (strcmp(base, "libsimmetal.so") == 0) {
        *(bool *)found = true;
        return 1;
    }
    return 0;
}

bool ml_metal_mapped(void)
{
    bool found = false;
    dl_iterate_phdr(find_simmetal, &found);
    return found;
}

typedef void *(*dlopen_fn)(const char *, int);

/* The interposed dlopen(3): exactly the real one, then a look for Metal. The
 * real one is resolved on first use: another preloaded library's constructor
 * may call dlopen before ours has run. */
ML_EXPORT void *dlopen(const char *file, int flags)
{
    static dlopen_fn real;
    if (real == NULL) {
        void *sym = dlsym(RTLD_NEXT, "dlopen");
        if (sym == NULL)
            return NULL;
        memcpy(&real, &sym, sizeof sym);
    }
    void *handle = real(file, flags);
    if (handle != NULL && loader_state == WATCHING && !hook_done &&
        (metal_seen || ml_metal_mapped()))
        ml_metal_arrived(handle);
    return handle;
}

#endif /* __linux__ */

#ifdef __APPLE__

/* Set while the constructor's _dyld_register_func_for_add_image replays the
 * images already loaded. dyld runs that replay inside withLoadersReadLock
 * (dyld-1378 dyld/DyldAPIs.cpp APIs::_dyld_register_func_for_add_image), i.e.
 * holding _loadersLock, a recursive mutex (dyld/DyldRuntimeState.cpp
 * RuntimeLocks::withLoadersReadLock). Installing the hook there would take
 * pthread_atfork's lock (ml_fork_register) and objc's runtimeLock under
 * _loadersLock, the inverse of fork's order (Libsystem init.c
 * libSystem_atfork_prepare: the atfork handlers' lock, objc, then
 * _dyld_atfork_prepare -> RuntimeLocks::takeLockBeforeFork), so the replay
 * only records that Metal is there, and the constructor installs after the
 * registration returned (review v5 P2-3). */
static volatile bool replaying;

/* dyld's add-image callback: cheap for every image until Metal; then, while
 * _MTLDevice is pending, a retry per image (never during the replay). */
static void image_added(const struct mach_header *mh, intptr_t slide)
{
    (void)slide;
    if (loader_state != WATCHING || hook_done)
        return;
    if (!metal_seen && !ml_macho_is_metal(mh))
        return;
    if (replaying) {
        metal_seen = true; /* the header only: installed after registration */
        return;
    }
    ml_metal_arrived(RTLD_DEFAULT);
}

#endif /* __APPLE__ */

__attribute__((constructor)) static void ml_constructor(void)
{
#ifdef __APPLE__
    ml_xpc_note_image_start();
#endif
    if (ml_config_disabled()) {
        loader_state = INERT;
        return;
    }
    loader_state = WATCHING;
#ifdef __APPLE__
    /* dyld calls back at once for every image already loaded (Metal included),
     * then for each later one; the replay only records Metal (see replaying). */
    replaying = true;
    _dyld_register_func_for_add_image(image_added);
    replaying = false;
    if (metal_seen)
        ml_metal_arrived(RTLD_DEFAULT);
#else
    if (ml_metal_mapped())
        ml_metal_arrived(RTLD_DEFAULT);
#endif
}
