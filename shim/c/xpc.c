/*
 * xpc.c — the check-in over XPC (macOS): the transport the shim uses to reach
 * the LaunchDaemon, so that the kernel names the sender of every message.
 *
 * Why: on a Unix socket, LOCAL_PEERTOKEN is computed when the daemon asks,
 * from the peer socket's last_pid — whichever process last sent, received or
 * polled on it (apple-oss-distributions/xnu bsd/kern/uipc_usrreq.c,
 * uipc_ctloutput; bsd/kern/uipc_socket.c, so_update_last_owner_locked) — so a
 * client could check in, then exec another binary or hand the descriptor to
 * another process before the daemon looks. An XPC message carries the audit
 * token the kernel stamped on that message, and metaliftd binds the outcome to
 * the check-in's pid and pid version (xpc/src/exchange.rs).
 *
 * Messages: each is a dictionary with one value, ML_XPC_FRAME_KEY, a data
 * value holding wire.c's frame body (the frame without its 4-byte length
 * prefix: the data value knows its length) — the same bytes the socket
 * carries, so wire.c is the one codec; the dictionary adds nothing but what
 * XPC itself gives (the per-message audit token, read by the daemon). The
 * key and the daemon's side: xpc/src/frame.rs. A reply without that data
 * value is refused as malformed (MISSING "metalift.frame"): stock. An older
 * metaliftd (whose messages had one dictionary key per field) sends none: it
 * refuses this shim's message as malformed and closes, which reaches us as an
 * XPC error before a reply, and the check-in goes to the socket, whose frames
 * are unchanged (xpc_reply.c). The frames are session.c's, encoded once for
 * either transport.
 *
 * Shape: one connection to the mach service ML_XPC_SERVICE in the system
 * domain (XPC_CONNECTION_MACH_SERVICE_PRIVILEGED: a job of the same name in a
 * user's own launchd domain cannot answer instead), the check-in sent with
 * xpc_connection_send_message_with_reply, the reply awaited on a dispatch
 * semaphore until the session's deadline (the reply handler runs on the
 * shim's own serial queue), the outcome sent on the same
 * connection and the connection cancelled behind a barrier once it is out.
 *
 * Why not xpc_connection_send_message_with_reply_sync, which libxpc's header
 * recommends over a semaphore (it donates the waiter's priority to the
 * daemon): it has no timeout. A daemon that is loaded but stopped (SIGSTOP,
 * wedged) keeps its mach port — launchd holds it for a loaded job
 * (launchd.plist(5), MachServices) — so the message queues and the sync call
 * returns only when the daemon runs again, while this wait holds Metal's
 * registration lock (REAL-METAL.md item 3). The deadline needs the
 * asynchronous call; the priority donation it loses matters little, because
 * metaliftd runs as ProcessType Interactive (the plists in launchd/).
 *
 * The reply handoff has one owner at a time: the handler stores the reply
 * under reply_lock only while the reader still waits for it (`waiting`); the
 * reader, under the same lock, takes it and ends the wait. A reply that
 * arrives after the deadline is released by the handler itself, never
 * touched by the reader or by the barrier (the race the previous version had
 * on `reply`). The barrier block only cancels and releases the connection.
 *
 * Blocks: libxpc takes its handlers as blocks. Every block here captures
 * nothing (it reads and writes this file's statics), so clang emits each as a
 * global block (_NSConcreteGlobalBlock, in libSystem): no Block_copy, no heap,
 * no blocks runtime call. On arm64e clang signs each block's invoke pointer
 * (scripts/shim-arm64e-check.sh checks the object code). Still libSystem only:
 * libxpc and libdispatch are part of it.
 *
 * fork: libxpc cannot be used in a forked child that did not exec (libdispatch
 * stops such a child that touches it); the constructor notes the pid the image
 * started in, session.c asks ml_xpc_usable before choosing XPC (else the
 * daemon's socket) and drops an inherited connection with ml_xpc_forget,
 * without a libxpc call.
 */
#include "metalift_shim.h"

#ifdef __APPLE__

/* libxpc and libdispatch, declared by hand as <xpc/xpc.h>, <xpc/connection.h>
 * and libdispatch's headers declare them (no SDK needed to build the shim). */
typedef void *xpc_object_t;
typedef const struct _xpc_type_s *xpc_type_t;
typedef void *dispatch_queue_t;
typedef void *dispatch_semaphore_t;
typedef uint64_t dispatch_time_t;
typedef void (^dispatch_block_t)(void);
typedef void (^xpc_handler_t)(xpc_object_t object);
typedef xpc_object_t xpc_connection_t;

/* libdispatch queue.h: a NULL attribute is DISPATCH_QUEUE_SERIAL. */
extern dispatch_queue_t dispatch_queue_create(const char *label, void *attr);
extern dispatch_semaphore_t dispatch_semaphore_create(intptr_t value);
extern intptr_t dispatch_semaphore_wait(dispatch_semaphore_t sema, dispatch_time_t timeout);
extern intptr_t dispatch_semaphore_signal(dispatch_semaphore_t sema);
extern dispatch_time_t dispatch_time(dispatch_time_t when, int64_t delta);
extern xpc_connection_t xpc_connection_create_mach_service(const char *name,
                                                           dispatch_queue_t targetq,
                                                           uint64_t flags);
extern void xpc_connection_set_event_handler(xpc_connection_t connection, xpc_handler_t handler);
extern void xpc_connection_resume(xpc_connection_t connection);
extern void xpc_connection_send_message(xpc_connection_t connection, xpc_object_t message);
extern void xpc_connection_send_message_with_reply(xpc_connection_t connection,
                                                   xpc_object_t message,
                                                   dispatch_queue_t replyq,
                                                   xpc_handler_t handler);
extern void xpc_connection_send_barrier(xpc_connection_t connection, dispatch_block_t barrier);
extern void xpc_connection_cancel(xpc_connection_t connection);
extern xpc_type_t xpc_get_type(xpc_object_t object);
extern xpc_object_t xpc_retain(xpc_object_t object);
extern void xpc_release(xpc_object_t object);
extern xpc_object_t xpc_dictionary_create(const char *const *keys, const xpc_object_t *values,
                                          size_t count);
/* <xpc/xpc.h> (macOS 10.7+): copies `length` bytes into a data value under
 * `key`. */
extern void xpc_dictionary_set_data(xpc_object_t xdict, const char *key, const void *bytes,
                                    size_t length);
/* <xpc/xpc.h> (macOS 10.7+): the bytes of the data value under `key` and, in
 * *length, their count; NULL when the key is absent or not a data value. The
 * bytes are the dictionary's (xpc_dictionary_get_value "does not grant the
 * caller a reference"): valid while the dictionary lives, here until
 * ml_xpc_release_reply. */
extern const void *xpc_dictionary_get_data(xpc_object_t xdict, const char *key, size_t *length);
extern const struct _xpc_type_s _xpc_type_error;
extern const struct _xpc_dictionary_s _xpc_error_connection_invalid;
extern const struct _xpc_dictionary_s _xpc_error_connection_interrupted;

/* The dictionary key of a metalift XPC message (xpc/src/frame.rs key::FRAME). */
#define ML_XPC_FRAME_KEY "metalift.frame"
#define ML_DISPATCH_TIME_NOW 0ull
#define ML_XPC_PRIVILEGED (1ull << 1)

static pid_t image_start_pid; /* the pid the constructor ran in */
static xpc_connection_t connection;
static dispatch_semaphore_t reply_ready; /* signalled when `reply` is stored */
/* The shim's own serial queue for the reply handler: never the shared global
 * queue, where the host's work (or a burst of it) can delay a reply into a
 * timeout (issue v5, item 7). Made once, with the semaphore. */
static dispatch_queue_t reply_queue;
static pthread_mutex_t reply_lock = PTHREAD_MUTEX_INITIALIZER;
static xpc_object_t reply;  /* under reply_lock: stored by the handler, taken by the reader */
static bool waiting;        /* under reply_lock: the reader still wants this check-in's reply */
static xpc_object_t taken;  /* the reader's, after ml_xpc_read_verdict (session lock held) */

void ml_xpc_note_image_start(void)
{
    image_start_pid = getpid();
}

bool ml_xpc_usable(void)
{
    return image_start_pid != 0 && image_start_pid == getpid();
}

static int send_check_in(const uint8_t *frame, size_t len);

int ml_xpc_check_in(const uint8_t *frame, size_t len)
{
    if (reply_ready == NULL)
        reply_ready = dispatch_semaphore_create(0);
    if (reply_ready == NULL)
        return ENOMEM;
    if (reply_queue == NULL)
        reply_queue = dispatch_queue_create("com.metalift.shim.reply", NULL);
    if (reply_queue == NULL)
        return ENOMEM;
    connection = xpc_connection_create_mach_service(ML_XPC_SERVICE, NULL, ML_XPC_PRIVILEGED);
    if (connection == NULL)
        return ENOMEM;
    /* Connection events (invalid, interrupted) also reach the reply handler. */
    xpc_connection_set_event_handler(connection, ^(xpc_object_t event) {
        (void)event;
    });
    xpc_connection_resume(connection);
    int e = send_check_in(frame, len);
    if (e != 0)
        ml_xpc_close();
    return e;
}

int ml_xpc_send_again(const uint8_t *frame, size_t len)
{
    if (connection == NULL)
        return ENOTCONN;
    return send_check_in(frame, len);
}

/* A message holding `frame`'s body (wire.c's frame after its length prefix)
 * as its one data value; NULL when libxpc cannot make one. */
static xpc_object_t frame_message(const uint8_t *frame, size_t len)
{
    if (len < ML_WIRE_PREFIX)
        return NULL;
    xpc_object_t message = xpc_dictionary_create(NULL, NULL, 0);
    if (message != NULL)
        xpc_dictionary_set_data(message, ML_XPC_FRAME_KEY, frame + ML_WIRE_PREFIX,
                                len - ML_WIRE_PREFIX);
    return message;
}

/* Sends the check-in `frame` on `connection`, the reply to be stored for
 * ml_xpc_read_verdict. */
static int send_check_in(const uint8_t *frame, size_t len)
{
    xpc_object_t message = frame_message(frame, len);
    if (message == NULL)
        return ENOMEM;
    pthread_mutex_lock(&reply_lock);
    waiting = true;
    reply = NULL;
    pthread_mutex_unlock(&reply_lock);
    xpc_connection_send_message_with_reply(connection, message, reply_queue,
                                           ^(xpc_object_t answer) {
                                               pthread_mutex_lock(&reply_lock);
                                               bool wanted = waiting && reply == NULL;
                                               if (wanted)
                                                   reply = xpc_retain(answer);
                                               pthread_mutex_unlock(&reply_lock);
                                               if (wanted)
                                                   dispatch_semaphore_signal(reply_ready);
                                           });
    xpc_release(message);
    return 0;
}

int ml_xpc_read_verdict(int64_t deadline_ms, struct ml_verdict *out, struct ml_wire_error *error)
{
    int64_t left = deadline_ms - ml_now_ms();
    if (left < 0)
        left = 0;
    bool signalled = dispatch_semaphore_wait(
                         reply_ready, dispatch_time(ML_DISPATCH_TIME_NOW, left * 1000000)) == 0;
    pthread_mutex_lock(&reply_lock);
    taken = reply;
    reply = NULL;
    waiting = false;
    pthread_mutex_unlock(&reply_lock);
    if (taken != NULL && !signalled)
        /* Stored between the timeout and the lock: consume its signal too. */
        (void)dispatch_semaphore_wait(reply_ready, ML_DISPATCH_TIME_NOW);
    if (taken == NULL)
        return -ETIMEDOUT;
    if (taken == (xpc_object_t)&_xpc_error_connection_invalid)
        return -ECONNREFUSED;
    if (taken == (xpc_object_t)&_xpc_error_connection_interrupted)
        return -EAGAIN;
    if (xpc_get_type(taken) == &_xpc_type_error)
        return -ECONNRESET;
    size_t len = 0;
    const uint8_t *body = xpc_dictionary_get_data(taken, ML_XPC_FRAME_KEY, &len);
    if (body == NULL)
        *error = (struct ml_wire_error){ML_WIRE_MISSING, ML_XPC_FRAME_KEY, 0};
    else
        *error = ml_wire_decode_verdict(body, len, out);
    return error->status == ML_WIRE_OK ? 0 : -EPROTO;
}

void ml_xpc_release_reply(void)
{
    if (taken != NULL) {
        xpc_release(taken);
        taken = NULL;
    }
}

void ml_xpc_report(const uint8_t *frame, size_t len)
{
    if (connection == NULL)
        return;
    xpc_object_t message = frame_message(frame, len);
    if (message != NULL) {
        xpc_connection_send_message(connection, message);
        xpc_release(message);
    }
    ml_xpc_close();
}

void ml_xpc_close(void)
{
    if (connection == NULL)
        return;
    /* The barrier runs once everything sent before it is out; only then is the
     * connection cancelled and released (its last reference). The reply is
     * not the barrier's: the reader released it, or the handler drops it. */
    xpc_connection_send_barrier(connection, ^{
        xpc_connection_t c = connection;
        connection = NULL;
        if (c != NULL) {
            xpc_connection_cancel(c);
            xpc_release(c);
        }
    });
}

void ml_xpc_forget(void)
{
    connection = NULL;
    reply = NULL;
    taken = NULL;
    waiting = false;
    reply_ready = NULL;
    reply_queue = NULL;
    reply_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
}

#endif /* __APPLE__ */
