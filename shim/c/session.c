/*
 * session.c — the process's one conversation with metaliftd: checked in at the
 * first device creation, the verdict awaited there, closed by the outcome
 * sent when Metal's -initGPUFamilySupport returns.
 *
 * One conversation per pid. A forked child inherits the parent's state and
 * descriptor; the first time the child touches the session (its first device)
 * it drops the inherited connection — closing only its own copy, and only after
 * verifying that the number still names that socket — and checks in on a
 * connection of its own, so the daemon identifies the child by its own pid and
 * the child never writes on the parent's connection.
 *
 * Transport: the daemon's Unix socket (socket.c) on Linux; on macOS XPC
 * (xpc.c) whenever the system daemon is the one asked and the process is not a
 * child forked without exec, so the kernel names the sender of every message.
 * A "use the socket" answer and every XPC error before a reply fall back to the
 * socket within the same deadline (xpc_reply.c).
 *
 * Never long when the daemon cannot answer: this wait holds Metal's
 * registration lock (REAL-METAL.md item 3). The deadline is taken first, so
 * it covers the check-in and the verdict wait (the environment, the marker,
 * the connection), and nothing here makes IPC (the per-user socket's
 * directory is $TMPDIR, config.c). It does not cover what follows the
 * verdict under the same lock: the outcome's send on the socket (up to
 * 100 ms more, ml_session_report), and the waits for objc's runtimeLock and
 * dyld's loader lock while hook.c patches, reads and restores IMPs (another
 * thread's image load or dlclose holds them); so the window is the deadline
 * + <=100 ms + those lock waits (review v5 P2-6.1). A daemon that let a
 * check-in run into the deadline is noted (unresponsive.c): later check-ins
 * of this user to that daemon are short probes, and skipped only after
 * timeouts in a row.
 *
 * The verdict becomes a plan here and only here (ml_plan_from_verdict): an
 * unlock needs an enforce-mode verdict that says unlock and carries
 * capabilities, read in this process before the deadline. Anything else is
 * stock with the reason kept for the outcome.
 */
#include "metalift_shim.h"


enum state {
    IDLE,        /* no check-in yet (in this pid) */
    SENT,        /* check-in sent; verdict unread */
    UNREACHABLE, /* no verdict will come; reason kept */
    DECIDED,     /* verdict read (or given up); the outcome is still to be sent */
    CLOSED,      /* outcome sent, or nowhere to send it */
};

/* Held by the first device while it checks in and waits for the verdict
 * (bounded by the deadline), and while the outcome is sent; never by the
 * constructor or the loader, which only install the hook (loader.c). */
static pthread_mutex_t session_lock = PTHREAD_MUTEX_INITIALIZER;
static enum state state = IDLE;
static pid_t owner;                /* the pid this state belongs to */
static struct ml_sock sock = {-1, 0, 0};
static bool via_xpc;               /* this check-in went out over XPC (macOS) */
static char socket_path[104];      /* where the socket check-in goes (or went) */
static int timeout_ms = ML_DEFAULT_TIMEOUT_MS;
/* The verdict deadline: taken first thing in ml_session_check_in, so it covers
 * everything the shim does inside the device creation (issue v5, item 1). */
static int64_t deadline_ms;
static int wait_ms;                /* deadline_ms minus the start: the full one, or a probe's */
static struct ml_marker marker;    /* the unresponsive marker as this check-in found it */
static bool marker_timed_out;      /* this check-in ran into its deadline */
static char reason_unreachable[256];
/* Bytes of the verdict frame read so far (a frame is at most this long). */
static uint8_t rx[ML_WIRE_MAX_FRAME + ML_WIRE_PREFIX];
static size_t rx_len;

pid_t ml_session_pid(void)
{
    return owner;
}

static const char *arch_name(void)
{
#if defined(__arm64e__)
    return "arm64e";
#elif defined(__aarch64__)
    return "aarch64";
#elif defined(__x86_64__)
    return "x86_64";
#else
    return "unknown";
#endif
}

/* Short errno texts of our own: strerror may load message catalogs. (Tables
 * and if-chains rather than switches: a dense switch becomes a jump table, an
 * indirect `br` that scripts/shim-arm64e-check.sh refuses on arm64e.) */
static const struct {
    int code;
    const char *text;
} errno_texts[] = {
    {ENOENT, "No such file or directory"},
    {ECONNREFUSED, "Connection refused"},
    {EACCES, "Permission denied"},
    {ENAMETOOLONG, "File name too long"},
    {EAGAIN, "Resource temporarily unavailable"},
    {ETIMEDOUT, "Timed out"},
    {EMFILE, "Too many open files"},
    {ENOTDIR, "Not a directory"},
    {EPIPE, "Broken pipe"},
    {ECONNRESET, "Connection reset by peer"},
};

static const char *errno_text(int e)
{
    for (size_t i = 0; i < sizeof errno_texts / sizeof errno_texts[0]; i++)
        if (errno_texts[i].code == e)
            return errno_texts[i].text;
    return "error";
}

/* Called with the lock held: a forked child starts over, never touching the
 * parent's connection (ml_sock_close verifies before closing its own copy). */
static void reset_if_forked(void)
{
    pid_t me = getpid();
    if (owner == me)
        return;
    if (owner != 0)
        ml_sock_close(&sock);
    sock = ML_SOCK_NONE;
#ifdef __APPLE__
    if (via_xpc)
        ml_xpc_forget(); /* the parent's; libxpc is unusable in a forked child */
#endif
    via_xpc = false;
    state = IDLE;
    rx_len = 0;
    owner = me;
}

/* The check-in frame, the same bytes for either transport (wire.c), into
 * frame[CHECK_IN_CAP]; returns its length. */
#define CHECK_IN_CAP (256 + ML_JOB_CLAIMS_MAX)
static size_t encode_check_in(uint8_t frame[CHECK_IN_CAP])
{
    char job[ML_JOB_CLAIMS_MAX];
    ml_job_claims(job, sizeof job);
    return ml_wire_encode_check_in_job(frame, CHECK_IN_CAP, ML_SHIM_VERSION, arch_name(), NULL,
                                       job);
}

/* Connects to socket_path and sends the check-in frame: 0 or an errno value. */
static int socket_check_in(void)
{
    int e = ml_sock_connect(&sock, socket_path);
    if (e == 0) {
        uint8_t frame[CHECK_IN_CAP];
        size_t n = encode_check_in(frame);
        e = ml_sock_send(&sock, frame, n, 0);
        if (e != 0)
            ml_sock_close(&sock);
    }
    return e;
}

/* Skip, probe or ask with the full deadline, as the marker says (unresponsive.c):
 * false when the check-in is skipped (reason_unreachable set). */
static bool consult_marker(const char *socket, int64_t start)
{
    enum ml_marker_step step = ml_unresponsive_look(socket, &marker);
    marker_timed_out = false;
    wait_ms = timeout_ms;
    if (step == ML_MARKER_SKIP) {
        snprintf(reason_unreachable, sizeof reason_unreachable,
                 "the daemon at %s did not answer %u check-ins in a row, the last %lld ms ago; "
                 "skipped for %lld s",
                 socket, marker.count, (long long)marker.age_ms,
                 (long long)(ml_unresponsive_skip_ms(marker.count) / 1000));
        ml_log(ML_DEBUG, "%s", reason_unreachable);
        return false;
    }
    if (step == ML_MARKER_PROBE) {
        if (wait_ms > ML_PROBE_MS)
            wait_ms = ML_PROBE_MS;
        ml_log(ML_DEBUG,
               "the daemon at %s did not answer a check-in %lld ms ago; probing it (%d ms)",
               socket, (long long)marker.age_ms, wait_ms);
    }
    deadline_ms = start + wait_ms;
    return true;
}

void ml_session_check_in(void)
{
    int64_t start = ml_now_ms(); /* first: the deadline covers everything below */
    pthread_mutex_lock(&session_lock);
    reset_if_forked();
    if (state != IDLE) {
        pthread_mutex_unlock(&session_lock);
        return;
    }
    struct ml_config config;
    ml_config_load(&config);
    ml_log_set_debug(config.debug);
    if (config.warning)
        ml_log(ML_WARN, "%s", config.warning);
    timeout_ms = config.timeout_ms;
    deadline_ms = start + timeout_ms;
    memset(&marker, 0, sizeof marker);
    if (config.socket_too_long) {
        snprintf(reason_unreachable, sizeof reason_unreachable,
                 "no daemon: the socket path is too long for a Unix socket");
        state = UNREACHABLE;
    } else if (config.socket_untrusted) {
        snprintf(reason_unreachable, sizeof reason_unreachable,
                 "no daemon: %s is not in a directory of yours or root's, or others can "
                 "write it",
                 config.socket);
        ml_log(ML_WARN, "%s", reason_unreachable);
        state = UNREACHABLE;
    } else if (!consult_marker(config.socket, start)) {
        state = UNREACHABLE;
    } else {
        snprintf(socket_path, sizeof socket_path, "%s", config.socket);
        int e;
#ifdef __APPLE__
        via_xpc = config.system_daemon && ml_xpc_usable();
        if (via_xpc) {
            uint8_t frame[CHECK_IN_CAP];
            size_t n = encode_check_in(frame);
            e = ml_xpc_check_in(frame, n);
        } else {
            e = socket_check_in();
        }
#else
        e = socket_check_in();
#endif
        if (e == 0) {
            ml_log(ML_DEBUG, "checked in at %s", via_xpc ? "mach service " ML_XPC_SERVICE
                                                         : config.socket);
            state = SENT;
        } else {
            snprintf(reason_unreachable, sizeof reason_unreachable, "no daemon at %s: %s",
                     config.socket, errno_text(e));
            ml_log(ML_DEBUG, "%s", reason_unreachable);
            state = UNREACHABLE;
        }
    }
    pthread_mutex_unlock(&session_lock);
}

static void set_stock(struct ml_plan *out, uint64_t id, const char *reason)
{
    out->unlock = false;
    out->decision_id = id;
    snprintf(out->reason, sizeof out->reason, "%s", reason);
}

static void copy_text(char *dst, size_t cap, const char *src, size_t len)
{
    if (len >= cap) {
        len = cap - 1;
        while (len > 0 && ((uint8_t)src[len] & 0xC0) == 0x80)
            len--;
    }
    memcpy(dst, src, len);
    dst[len] = '\0';
}

void ml_plan_from_verdict(const struct ml_verdict *v, struct ml_plan *out)
{
    memset(out, 0, sizeof *out);
    out->decision_id = v->decision_id;
    out->caps = *v;
    out->caps.profile = NULL;
    out->caps.rule = NULL;
    char rule[128];
    if (v->rule)
        copy_text(rule, sizeof rule, v->rule, v->rule_len);
    else
        snprintf(rule, sizeof rule, "no rule matched");
    if (v->rule)
        copy_text(out->rule, sizeof out->rule, v->rule, v->rule_len);
    if (v->unlock && !v->monitor && v->has_caps) {
        out->unlock = true;
    } else if (v->unlock && !v->monitor) {
        set_stock(out, v->decision_id, "malformed verdict: unlock without capabilities");
    } else if (v->monitor) {
        snprintf(out->reason, sizeof out->reason, "monitor mode: %s (%s)",
                 (v->would_unlock || v->unlock) ? "would unlock" : "stock", rule);
    } else {
        snprintf(out->reason, sizeof out->reason, "verdict: stock (%s)", rule);
    }
}

static const char *kind_name(uint64_t kind)
{
    static const char *const names[] = {"message", "check-in", "verdict",   "outcome",
                                        "status request", "status", "declined"};
    return kind < sizeof names / sizeof names[0] ? names[kind] : "message";
}

/* wire.rs WireError's Display, prefixed "malformed verdict: ". */
static void describe_wire_error(struct ml_plan *out, struct ml_wire_error e)
{
    const char *p = "malformed verdict";
    char *r = out->reason;
    size_t n = sizeof out->reason;
    unsigned long long v = (unsigned long long)e.value;
    if (e.status == ML_WIRE_OVERSIZE)
        snprintf(r, n, "%s: frame of %llu bytes exceeds the %d-byte limit", p, v,
                 ML_WIRE_MAX_FRAME);
    else if (e.status == ML_WIRE_TRUNCATED)
        snprintf(r, n, "%s: truncated frame", p);
    else if (e.status == ML_WIRE_VERSION)
        snprintf(r, n, "%s: protocol version %llu (this build speaks %d)", p, v,
                 ML_WIRE_PROTOCOL);
    else if (e.status == ML_WIRE_BAD_FIELD)
        snprintf(r, n, "%s: malformed field `%s`", p, e.field);
    else if (e.status == ML_WIRE_MISSING)
        snprintf(r, n, "%s: missing field `%s`", p, e.field);
    else if (e.status == ML_WIRE_NOT_VERDICT)
        snprintf(r, n, "%s: unexpected %s", p, kind_name(e.value));
    else if (e.status == ML_WIRE_DECLINED && e.value == ML_DECLINED_BUSY)
        snprintf(r, n, "the daemon declined the check-in: every place for a waiting check-in "
                       "is taken");
    else if (e.status == ML_WIRE_DECLINED)
        snprintf(r, n, "the daemon declined the check-in on its socket (\"use the socket\")");
}

/* No verdict by the deadline: stock, and the daemon is noted unresponsive so
 * that this user's next processes probe it (or skip it) rather than wait. */
static void timed_out(struct ml_plan *out)
{
    if (marker.step == ML_MARKER_PROBE)
        snprintf(out->reason, sizeof out->reason,
                 "no verdict before the probe's deadline (%d ms; the daemon did not answer "
                 "a check-in %lld ms before)",
                 wait_ms, (long long)marker.age_ms);
    else
        snprintf(out->reason, sizeof out->reason, "no verdict before the deadline (%d ms)",
                 wait_ms);
    marker_timed_out = true;
    ml_unresponsive_note(&marker);
}

/* Reads one frame into rx until the deadline; with the lock held, state SENT. */
static void read_verdict(struct ml_plan *out, int64_t deadline)
{
    size_t need = ML_WIRE_PREFIX;
    for (;;) {
        if (rx_len >= ML_WIRE_PREFIX) {
            size_t body_len;
            struct ml_wire_error e = ml_wire_frame_length(rx, &body_len);
            if (e.status != ML_WIRE_OK) {
                describe_wire_error(out, e);
                return;
            }
            need = ML_WIRE_PREFIX + body_len;
            if (rx_len >= need) {
                struct ml_verdict v;
                e = ml_wire_decode_verdict(rx + ML_WIRE_PREFIX, body_len, &v);
                if (e.status != ML_WIRE_OK)
                    describe_wire_error(out, e);
                else
                    ml_plan_from_verdict(&v, out);
                return;
            }
        }
        ssize_t n = ml_sock_recv(&sock, rx + rx_len, need - rx_len, deadline);
        if (n > 0) {
            rx_len += (size_t)n;
            continue;
        }
        if (n == 0) {
            set_stock(out, 0, "the daemon closed the connection without a verdict");
        } else if (n == -ETIMEDOUT) {
            timed_out(out);
        } else if (n == -ESTALE) {
            set_stock(out, 0, "the check-in socket was closed or replaced by the program");
            ml_sock_forget(&sock); /* not ours any more: never touch it again */
        } else {
            snprintf(out->reason, sizeof out->reason, "reading the verdict: %s",
                     errno_text((int)-n));
        }
        return;
    }
}

#ifdef __APPLE__
/* The XPC twin of read_verdict; what each answer means is xpc_reply.c's.
 * Returns false when no decision was made that an outcome could report on
 * (busy: the daemon declined; the socket fallback found no daemon): the
 * session is then closed, and ml_session_report sends nothing. */
static bool read_xpc_verdict(struct ml_plan *out, int64_t deadline)
{
    struct ml_verdict v;
    struct ml_wire_error e = {ML_WIRE_OK, NULL, 0};
    int r = ml_xpc_read_verdict(deadline, &v, &e);
    enum ml_xpc_next next = ml_xpc_next_step(r, e);
    if (next == ML_XPC_SEND_AGAIN) {
        /* The daemon exited mid-request (launchd relaunches it): send again
         * over XPC, once, within the same deadline; a second interruption,
         * or a failed send, goes to the socket (xpc_reply.c). */
        ml_xpc_release_reply();
        ml_log(ML_DEBUG, "XPC connection interrupted; sending the check-in again");
        next = ML_XPC_USE_SOCKET;
        uint8_t frame[CHECK_IN_CAP];
        size_t n = encode_check_in(frame);
        if (ml_xpc_send_again(frame, n) == 0) {
            e = (struct ml_wire_error){ML_WIRE_OK, NULL, 0};
            r = ml_xpc_read_verdict(deadline, &v, &e);
            next = ml_xpc_next_step(r, e);
            if (next == ML_XPC_SEND_AGAIN)
                next = ML_XPC_USE_SOCKET;
        }
    }
    if (next == ML_XPC_USE_VERDICT) {
        ml_plan_from_verdict(&v, out);
        ml_xpc_release_reply();
        return true;
    }
    ml_xpc_release_reply();
    if (next == ML_XPC_USE_SOCKET) {
        ml_xpc_close();
        via_xpc = false;
        ml_log(ML_DEBUG, "%s from mach service %s; checking in at %s",
               r == -EPROTO ? "\"use the socket\"" : "no reply", ML_XPC_SERVICE, socket_path);
        int err = socket_check_in();
        if (err != 0) {
            snprintf(out->reason, sizeof out->reason, "no daemon at %s: %s", socket_path,
                     errno_text(err));
            return false;
        }
        read_verdict(out, deadline);
        return true;
    }
    if (next == ML_XPC_STOCK_UNRESPONSIVE) {
        timed_out(out);
        return true;
    }
    describe_wire_error(out, e);
    if (next == ML_XPC_STOCK_BUSY) {
        /* No decision was made: nothing to report on this connection, and
         * the daemon holds a place for it until it closes. */
        ml_xpc_close();
        via_xpc = false;
        return false;
    }
    return true;
}
#endif

void ml_session_plan(struct ml_plan *out, bool wait)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&session_lock);
    reset_if_forked();
    if (state == SENT) {
        int64_t deadline = wait ? deadline_ms : ml_now_ms();
        bool decided = true;
#ifdef __APPLE__
        if (via_xpc)
            decided = read_xpc_verdict(out, deadline);
        else
#endif
            read_verdict(out, deadline);
        if (!marker_timed_out)
            ml_unresponsive_clear(&marker); /* it answered (or hung up): not unresponsive */
        state = decided ? DECIDED : CLOSED;
    } else if (state == UNREACHABLE) {
        set_stock(out, 0, reason_unreachable);
        state = CLOSED;
    } else if (state == IDLE) {
        set_stock(out, 0, "no check-in was made");
        state = CLOSED;
    } else {
        set_stock(out, 0, "the verdict was already used by an earlier device");
    }
    pthread_mutex_unlock(&session_lock);
}

void ml_session_report(const struct ml_outcome *o)
{
    pthread_mutex_lock(&session_lock);
    if (owner == getpid() && state == DECIDED) {
        uint8_t frame[1024];
        size_t n = ml_wire_encode_outcome(frame, sizeof frame, o);
#ifdef __APPLE__
        if (via_xpc) {
            ml_xpc_report(frame, n);
            state = CLOSED;
            pthread_mutex_unlock(&session_lock);
            return;
        }
#endif
        /* Best effort, bounded: a daemon that stopped reading loses the record. */
        (void)ml_sock_send(&sock, frame, n, 100);
        ml_sock_close(&sock);
        state = CLOSED;
    }
    pthread_mutex_unlock(&session_lock);
}

/* Whether the prepare handler got session_lock. */
static bool session_lock_held_at_fork;

void ml_session_atfork_prepare(void)
{
    /* Never waits for the verdict another thread may be awaiting under it. */
    session_lock_held_at_fork = pthread_mutex_trylock(&session_lock) == 0;
}

void ml_session_atfork_parent(void)
{
    if (session_lock_held_at_fork)
        pthread_mutex_unlock(&session_lock);
}

void ml_session_atfork_child(void)
{
    /* A fresh lock in the child, whoever held the parent's; the state itself
     * is reset lazily (reset_if_forked, by pid), never using the parent's
     * connection. */
    session_lock = (pthread_mutex_t)PTHREAD_MUTEX_INITIALIZER;
}
