/*
 * unresponsive.c — remembering, per user and per daemon, that the daemon did
 * not answer a check-in, so later processes do not each wait out the deadline.
 *
 * Why: the verdict wait runs inside Metal's device creation, under Metal's
 * process-wide registration lock (REAL-METAL.md item 3). A daemon that is
 * registered but not answering — stopped with SIGSTOP, wedged, or a socket
 * that accepts and never replies (on macOS launchd keeps a loaded job's mach
 * port, so messages queue and no error ever comes: launchd.plist(5),
 * MachServices) — would cost every Metal process the whole deadline. The
 * first process that waits it out leaves a marker; for ML_UNRESPONSIVE_MS
 * after that, the same user's processes asking the same daemon skip the
 * check-in (stock, with the reason) after one lstat: no connection, no wait.
 * A daemon that recovers is asked again once the marker is that old.
 *
 * The marker: an empty-ish regular file named after the user and a hash of the
 * daemon's socket path, in the user's private directory ($XDG_RUNTIME_DIR on
 * Linux, DARWIN_USER_TEMP_DIR on macOS) or else /tmp. Its mtime is the time of
 * the finding. It is believed only when it is a regular file owned by this
 * user and writable by nobody else, so another user cannot make this user's
 * processes skip their check-ins (in /tmp's sticky directory they cannot
 * replace it either). The worst a marker can do is what an unresponsive daemon
 * does anyway: stock answers.
 */
#include "metalift_shim.h"

#ifdef __APPLE__
#define ML_MTIME(st) ((st).st_mtimespec)
#else
#define ML_MTIME(st) ((st).st_mtim)
#endif

/* FNV-1a, 64 bits: a short stable name for a socket path. */
static uint64_t fnv1a(const char *s)
{
    uint64_t h = 0xcbf29ce484222325ull;
    for (; *s != '\0'; s++) {
        h ^= (uint8_t)*s;
        h *= 0x100000001b3ull;
    }
    return h;
}

bool ml_unresponsive_marker_path(char *buf, size_t cap, const char *socket)
{
    char dir_buf[1024];
    const char *dir = ml_config_private_dir(dir_buf, sizeof dir_buf);
    if (dir == NULL || dir[0] != '/')
        dir = "/tmp";
    size_t n = strlen(dir);
    int len = snprintf(buf, cap, "%s%smetalift-unresponsive-%u-%016llx", dir,
                       dir[n - 1] == '/' ? "" : "/", (unsigned)getuid(),
                       (unsigned long long)fnv1a(socket));
    return len > 0 && (size_t)len < cap;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

bool ml_unresponsive_marker_fresh(const struct stat *st, unsigned uid, int64_t now_ms,
                                  int64_t *age_ms)
{
    if ((st->st_mode & S_IFMT) != S_IFREG || st->st_uid != uid || (st->st_mode & 022) != 0)
        return false;
    int64_t at = (int64_t)ML_MTIME(*st).tv_sec * 1000 + ML_MTIME(*st).tv_nsec / 1000000;
    int64_t age = now_ms - at;
    if (age < 0 || age >= ML_UNRESPONSIVE_MS)
        return false;
    *age_ms = age;
    return true;
}

bool ml_unresponsive_recent(const char *socket, int64_t *age_ms)
{
    char path[1200];
    struct stat st;
    if (!ml_unresponsive_marker_path(path, sizeof path, socket) || lstat(path, &st) != 0)
        return false;
    return ml_unresponsive_marker_fresh(&st, (unsigned)getuid(), wall_ms(), age_ms);
}

void ml_unresponsive_note(const char *socket)
{
    char path[1200];
    if (!ml_unresponsive_marker_path(path, sizeof path, socket))
        return;
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
    if (fd < 0) {
        ml_log(ML_DEBUG, "cannot note the unresponsive daemon at %s", path);
        return;
    }
    fd = ml_fd_above_stdio(fd); /* never hold 0-2, even for a moment longer */
    if (fd < 0)
        return;
    struct stat st;
    /* Only our own regular file is touched (O_NOFOLLOW refused a link). The
     * byte written sets the mtime on every system. */
    if (fstat(fd, &st) == 0 && (st.st_mode & S_IFMT) == S_IFREG && st.st_uid == getuid())
        (void)write(fd, "1", 1);
    close(fd);
}
