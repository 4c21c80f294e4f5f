/*
 * config.c — what the environment may tell the shim: whether to stay out of
 * the way, where the daemon is, how long to wait, whether to talk on stderr.
 * Nothing here can unlock: every setting selects whom to ask or makes the shim
 * do less (whoever controls a process's environment can inject any library into
 * it anyway). The constructor reads only METALIFT_DISABLE; the rest is read
 * once Metal is in the process.
 */
#include "metalift_shim.h"


#ifdef __APPLE__
#define SYSTEM_SOCKET "/var/run/metalift/metalift.sock"
/* The system daemon's launchd job, as pkg/stage.sh installs it. Installed, the
 * system daemon is the one to ask even while its socket file is absent (a
 * restart): XPC goes through launchd, which keeps the job's MachServices port
 * and queues the message until the daemon takes it (launchd.plist(5),
 * MachServices), so the process need not go stock (review v5 P2-6.6). */
#define SYSTEM_JOB_PLIST "/Library/LaunchDaemons/com.metalift.metaliftd.plist"
#else
#define SYSTEM_SOCKET "/run/metalift/metalift.sock"
#endif

static bool is_one(const char *value)
{
    return value != NULL && value[0] == '1' && value[1] == '\0';
}

bool ml_config_disabled(void)
{
    return is_one(getenv("METALIFT_DISABLE"));
}

static bool is_space(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

int ml_config_parse_timeout(const char *raw)
{
    if (raw == NULL)
        return ML_DEFAULT_TIMEOUT_MS;
    const char *s = raw;
    const char *end = raw + strlen(raw);
    while (s < end && is_space(*s))
        s++;
    while (end > s && is_space(end[-1]))
        end--;
    if (s < end && *s == '+') /* u64::from_str accepts one leading '+' */
        s++;
    if (s == end)
        return -1;
    uint64_t value = 0;
    bool capped = false;
    for (; s < end; s++) {
        if (*s < '0' || *s > '9')
            return -1;
        uint64_t digit = (uint64_t)(*s - '0');
        if (value > UINT64_MAX / 10 || (value == UINT64_MAX / 10 && digit > UINT64_MAX % 10))
            return -1; /* does not fit a u64: Rust's parse fails too */
        value = value * 10 + digit;
        if (value > ML_MAX_TIMEOUT_MS)
            capped = true;
    }
    return capped ? ML_MAX_TIMEOUT_MS : (int)value;
}

static bool join(char *buf, size_t cap, const char *a, const char *b, const char *c)
{
    size_t la = strlen(a), lb = strlen(b), lc = strlen(c);
    if (la + lb + lc + 1 > cap)
        return false;
    memcpy(buf, a, la);
    memcpy(buf + la, b, lb);
    memcpy(buf + la + lb, c, lc + 1);
    return true;
}

bool ml_config_socket_path(char *buf, size_t cap, const char *metalift_socket,
                           bool system_exists, const char *private_dir)
{
    if (metalift_socket != NULL && metalift_socket[0] != '\0')
        return join(buf, cap, metalift_socket, "", "");
    if (system_exists)
        return join(buf, cap, SYSTEM_SOCKET, "", "");
    if (private_dir != NULL && private_dir[0] != '\0') {
        size_t n = strlen(private_dir);
        return join(buf, cap, private_dir, private_dir[n - 1] == '/' ? "" : "/", "metalift.sock");
    }
    return join(buf, cap, SYSTEM_SOCKET, "", "");
}

/* The user's private directory (socket_path.rs): $XDG_RUNTIME_DIR on Linux,
 * $TMPDIR on macOS, where launchd gives a user's processes their
 * DARWIN_USER_TEMP_DIR (the per-user T/ directory Libc's dirhelper makes 0700
 * for that user alone). Never confstr(_CS_DARWIN_USER_TEMP_DIR): its first
 * call in a process is a synchronous opendirectoryd request through dirhelper
 * with no timeout (apple-oss-distributions/Libc gen/confstr.c), and any place
 * the shim could ask it is under a lock of dyld's or Metal's (review v5
 * P2-2). A $TMPDIR that is not the caller's own (or root's) directory,
 * writable by nobody else, is refused by ml_config_load (socket_untrusted):
 * then there is no per-user agent. */
const char *ml_config_private_dir(char *buf, size_t cap)
{
    (void)buf;
    (void)cap;
#ifdef __APPLE__
    return getenv("TMPDIR");
#else
    return getenv("XDG_RUNTIME_DIR");
#endif
}

bool ml_config_agent_dir_trustworthy(unsigned dir_uid, unsigned dir_mode, unsigned caller_uid)
{
    return (dir_uid == caller_uid || dir_uid == 0) && (dir_mode & 022) == 0;
}

void ml_config_load(struct ml_config *out)
{
    memset(out, 0, sizeof *out);
    out->debug = is_one(getenv("METALIFT_DEBUG"));
    const char *timeout = getenv("METALIFT_TIMEOUT_MS");
    out->timeout_ms = ml_config_parse_timeout(timeout);
    if (out->timeout_ms < 0) {
        out->timeout_ms = ML_DEFAULT_TIMEOUT_MS;
        out->warning = "METALIFT_TIMEOUT_MS is not a number of milliseconds; using 2000 ms";
    }
    const char *explicit_socket = getenv("METALIFT_SOCKET");
    bool system_exists = false;
    if (explicit_socket == NULL || explicit_socket[0] == '\0') {
        system_exists = access(SYSTEM_SOCKET, F_OK) == 0;
#ifdef __APPLE__
        if (!system_exists)
            system_exists = access(SYSTEM_JOB_PLIST, F_OK) == 0;
#endif
    }
    char dir_buf[1024];
    const char *dir = NULL;
    if ((explicit_socket == NULL || explicit_socket[0] == '\0') && !system_exists)
        dir = ml_config_private_dir(dir_buf, sizeof dir_buf);
    out->socket_too_long =
        !ml_config_socket_path(out->socket, sizeof out->socket, explicit_socket, system_exists, dir);
    out->system_daemon = system_exists;
#ifdef __APPLE__
    /* A per-user daemon's directory must be the caller's own (or root's) and
     * writable by nobody else, never a link: otherwise a squatter's daemon
     * could answer. (DARWIN_USER_TEMP_DIR passes: the user's own, 0700.) */
    if (!out->socket_too_long && dir != NULL) {
        char dir[sizeof out->socket];
        memcpy(dir, out->socket, sizeof dir);
        char *slash = strrchr(dir, '/');
        struct stat st;
        if (slash != NULL) {
            *slash = '\0';
            if (lstat(dir, &st) == 0 &&
                (!S_ISDIR(st.st_mode) ||
                 !ml_config_agent_dir_trustworthy((unsigned)st.st_uid, (unsigned)st.st_mode,
                                                  (unsigned)getuid())))
                out->socket_untrusted = true;
        }
    }
#endif
}
