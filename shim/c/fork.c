/*
 * fork.c — the shim's pthread_atfork handlers, registered once Metal is in the
 * process. A fork while the first device waits for its verdict is delayed until
 * the verdict (the prepare handler takes the locks that wait holds, at most the
 * deadline), and the child starts with every lock released; its state is reset
 * lazily, by pid (session.c, hook.c).
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
