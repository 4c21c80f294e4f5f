/*
 * fork.c — the shim's pthread_atfork handlers, registered once Metal is in the
 * process. They never hold the forking thread: the prepare handler only tries
 * the shim's locks (a thread waiting for its verdict holds them, and the
 * forking thread holds dyld's API lock and the atfork lock meanwhile), the
 * parent releases what it got, and the child starts with fresh locks; its
 * state is reset lazily, by pid (session.c, hook.c), so a child never touches
 * the parent's connection; one forked before any device checks in for itself
 * when it creates one. On macOS a child forked in the middle of the parent's
 * check-in does not get that far: Metal's registration lock, held by the
 * parent's creating thread for the rest of MTLAddDevice, names a thread the
 * child does not have, and libplatform kills the child when its own device
 * creation takes it (_os_unfair_lock_corruption_abort); a child forked after
 * the parent registered gets the parent's device and checks in for nothing
 * (Metal registers once per process). Both are Metal's, modelled by the
 * simulation (probe/simmetal/simmetal.m) and described in shim/c/README.md.
 *
 * The one place that knows both hook.c's and session.c's locks, and their
 * order: device_lock (hook.c), then session_lock (session.c),
 * as a first device init takes them. Called by loader.c only, so neither
 * hook.c nor session.c depends on the other for it.
 */
#include "metalift_shim.h"


static void prepare(void)
{
    ml_hook_atfork_prepare();
    ml_session_atfork_prepare();
}

static void parent(void)
{
    ml_session_atfork_parent();
    ml_hook_atfork_parent();
}

static void child(void)
{
    ml_session_atfork_child();
    ml_hook_atfork_child();
}

static void register_once(void)
{
    (void)pthread_atfork(prepare, parent, child);
}

void ml_fork_register(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    (void)pthread_once(&once, register_once);
}
