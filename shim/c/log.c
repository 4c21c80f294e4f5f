/*
 * log.c — where the shim's words go. Only Metal processes ever log (nothing
 * here runs before Metal is in the process).
 *
 * Linux: one syslog-format datagram ("<pri>ident[pid]: libmetalift: text") to
 * /dev/log, on a short-lived socket of the shim's own. Never libc's syslog():
 * its descriptor is shared process state that a program closing "all other
 * descriptors" may close and reuse, and syslog() would then write into the
 * program's file. No timestamp: journald and rsyslog stamp on receipt, and
 * formatting one would read the time zone.
 *
 * macOS: os_log with subsystem "com.metalift", category "shim", through
 * clang's __builtin_os_log_format (what <os/log.h>'s macros expand to; no SDK
 * is needed). The executable and the message are %{public}s so an admin reads
 * them in `log show` instead of <private>; failures use the error type.
 *
 * stderr: only with METALIFT_DEBUG=1, and only when fd 2 is open and is not the
 * shim's own socket (a program may have put it there with dup2); never a
 * SIGPIPE, whatever fd 2 is (to_stderr).
 */
#include "metalift_shim.h"


static volatile bool debug_on;

void ml_log_set_debug(bool on)
{
    debug_on = on;
}

bool ml_log_debug_enabled(void)
{
    return debug_on;
}

#ifdef __APPLE__
const char *ml_program_name(void)
{
    const char *name = getprogname();
    return name ? name : "?";
}
#else
extern char *program_invocation_short_name;
const char *ml_program_name(void)
{
    return program_invocation_short_name ? program_invocation_short_name : "?";
}
#endif

/* SIGPIPE is blocked on this thread around the write, and one that the write
 * raised (EPIPE: fd 2 is a pipe or socket nobody reads) is taken back off the
 * pending set before the mask is restored, unless one was pending already: a
 * debug line never kills or signals the host (issue v5, item 10). */
static void pipe_signal_set(sigset_t *set)
{
    sigemptyset(set);
    sigaddset(set, SIGPIPE);
}

static bool pipe_signal_pending(void)
{
    sigset_t pending;
    return sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE) == 1;
}

static void write_all(const char *text, size_t len)
{
    while (len > 0) {
        ssize_t n = write(2, text, len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;
        text += n;
        len -= (size_t)n;
    }
}

static void to_stderr(const char *text, size_t len)
{
    if (fcntl(2, F_GETFD) < 0 || ml_sock_is_shims(2))
        return;
    sigset_t pipe_only, old;
    pipe_signal_set(&pipe_only);
    bool was_pending = pipe_signal_pending();
    if (pthread_sigmask(SIG_BLOCK, &pipe_only, &old) != 0)
        return; /* cannot keep SIGPIPE from the host: say nothing */
#ifdef __APPLE__
    write_all(text, len);
#else
    struct stat st;
    if (fstat(2, &st) == 0 && S_ISSOCK(st.st_mode))
        (void)send(2, text, len, MSG_NOSIGNAL | MSG_DONTWAIT); /* not ours: never wait on it */
    else
        write_all(text, len);
#endif
    if (!was_pending && pipe_signal_pending()) {
        int taken;
        (void)sigwait(&pipe_only, &taken); /* pending: returns at once */
    }
    (void)pthread_sigmask(SIG_SETMASK, &old, NULL);
}

#ifdef __APPLE__
/* <os/log.h>'s OS_LOG_TYPE_* values. */
#define ML_OS_LOG_TYPE_DEFAULT 0x00
#define ML_OS_LOG_TYPE_DEBUG 0x02
#define ML_OS_LOG_TYPE_ERROR 0x10

extern void *__dso_handle;

/* What os_log_with_type() expands to, with the format kept in
 * __TEXT,__oslogstring as the unified log expects. */
#define ML_OS_LOG(log, type, fmt, ...)                                                             \
    do {                                                                                           \
        if (os_log_type_enabled(log, type)) {                                                      \
            __attribute__((section("__TEXT,__oslogstring,cstring_literals"))) static const char   \
                ml_fmt_[] = fmt;                                                                   \
            uint8_t ml_buf_[__builtin_os_log_format_buffer_size(fmt, __VA_ARGS__)];                \
            _os_log_impl(&__dso_handle, log, type, ml_fmt_,                                        \
                         (uint8_t *)__builtin_os_log_format(ml_buf_, fmt, __VA_ARGS__),            \
                         (uint32_t)sizeof(ml_buf_));                                               \
        }                                                                                          \
    } while (0)

static os_log_t shim_log;

static void to_system_log(enum ml_level level, const char *text)
{
    if (shim_log == NULL)
        shim_log = os_log_create("com.metalift", "shim");
    if (shim_log == NULL)
        return;
    const char *exe = ml_program_name();
    switch (level) {
    case ML_WARN:
        ML_OS_LOG(shim_log, ML_OS_LOG_TYPE_ERROR, "%{public}s: %{public}s", exe, text);
        break;
    case ML_INFO:
        ML_OS_LOG(shim_log, ML_OS_LOG_TYPE_DEFAULT, "%{public}s: %{public}s", exe, text);
        break;
    case ML_DEBUG:
        ML_OS_LOG(shim_log, ML_OS_LOG_TYPE_DEBUG, "%{public}s: %{public}s", exe, text);
        break;
    }
}
#else
static void to_system_log(enum ml_level level, const char *text)
{
    /* LOG_USER (1 << 3) | LOG_WARNING (4) / LOG_INFO (6) / LOG_DEBUG (7). */
    int pri = 8 + (level == ML_WARN ? 4 : level == ML_INFO ? 6 : 7);
    char line[768];
    int n = snprintf(line, sizeof line, "<%d>%s[%ld]: libmetalift: %s", pri, ml_program_name(),
                     (long)getpid(), text);
    if (n <= 0)
        return;
    size_t len = (size_t)n < sizeof line ? (size_t)n : sizeof line - 1;
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    fd = ml_fd_above_stdio(fd);
    if (fd < 0)
        return;
    struct sockaddr_un addr;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, "/dev/log", sizeof "/dev/log");
    (void)sendto(fd, line, len, MSG_NOSIGNAL | MSG_DONTWAIT, (const struct sockaddr *)&addr,
                 sizeof addr);
    close(fd);
}
#endif

void ml_log(enum ml_level level, const char *fmt, ...)
{
    if (level == ML_DEBUG && !debug_on)
        return;
    char text[640];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (n < 0)
        return;
    to_system_log(level, text);
    if (debug_on) {
        char line[700];
        int m = snprintf(line, sizeof line, "libmetalift: %s\n", text);
        if (m > 0)
            to_stderr(line, (size_t)m < sizeof line ? (size_t)m : sizeof line - 1);
    }
}
