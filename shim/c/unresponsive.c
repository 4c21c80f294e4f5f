/*
 * unresponsive.c — remembering, per user and per daemon, that the daemon did
 * not answer a check-in, so later processes do not each wait out the deadline.
 *
 * Why: the verdict wait runs inside Metal's device creation, under Metal's
 * process-wide registration lock (REAL-METAL.md item 3). A daemon that is
 * registered but not answering — stopped with SIGSTOP, wedged, or a socket
 * that accepts and never replies (on macOS launchd keeps a loaded job's mach
 * port, so messages queue and no error ever comes: launchd.plist(5),
 * MachServices) — would cost every Metal process the whole deadline.
 *
 * What a marker does (issue "libmetalift v5", items 1, 2 and 7). The marker
 * holds how many check-ins in a row timed out (`count`); its mtime is the last.
 * - No marker in force: a check-in with the full deadline. A timeout writes
 *   count 1.
 * - count 1 (one timeout): the next check-ins are probes — real check-ins with
 *   a deadline of ML_PROBE_MS (300 ms) — never a silent skip, so one slow
 *   reply (a reload, a hashing burst) costs later processes almost nothing and
 *   never their unlock when the daemon answers.
 * - A probe that times out too makes the timeouts consecutive: count 2, and
 *   for ml_unresponsive_skip_ms(count) — 10 s, then 20, 40, 60 s as the
 *   timeouts go on — check-ins are skipped (stock, no connection, the reason
 *   in the debug log). After the skip, probes again.
 * - Any answer (a verdict, a refusal, a closed connection) removes the marker.
 * - A marker is in force for its skip plus ML_UNRESPONSIVE_MS; older, it is
 *   forgotten and the next check-in has the full deadline again.
 *
 * Where: the user's private directory as the process already has it
 * (ml_config_private_dir: $XDG_RUNTIME_DIR on Linux, $TMPDIR on macOS, never
 * confstr) and nowhere else. lstat must show a directory owned by this user
 * and writable by nobody else; otherwise there is no marker at all, never a
 * shared directory such as /tmp. (lstat does follow a final link when the
 * variable ends in "/", as launchd's $TMPDIR does; harmless: owner and mode
 * are then checked on the directory it names, which is what is used.)
 *
 * Safe in any directory anyway: the marker is opened with O_NOFOLLOW and
 * never O_TRUNC, and read or written only when fstat on the open descriptor
 * says a regular file of this user's, writable by nobody else, with one link
 * (on macOS any user may hard-link another user's file: xnu linkat_internal
 * checks no ownership). The worst a marker can do is what an unresponsive
 * daemon does anyway: stock answers.
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

bool ml_unresponsive_dir_usable(const struct stat *st, unsigned uid)
{
    return S_ISDIR(st->st_mode) && st->st_uid == uid && (st->st_mode & 022) == 0;
}

bool ml_unresponsive_marker_path(char *buf, size_t cap, const char *socket)
{
    const char *dir = ml_config_private_dir(NULL, 0);
    struct stat st;
    if (dir == NULL || dir[0] != '/' || lstat(dir, &st) != 0 ||
        !ml_unresponsive_dir_usable(&st, (unsigned)getuid()))
        return false;
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

bool ml_unresponsive_file_usable(const struct stat *st, unsigned uid)
{
    return (st->st_mode & S_IFMT) == S_IFREG && st->st_uid == uid && st->st_nlink == 1 &&
           (st->st_mode & 022) == 0;
}

int64_t ml_unresponsive_skip_ms(unsigned count)
{
    if (count < 2)
        return 0;
    int64_t skip = ML_UNRESPONSIVE_MS;
    for (unsigned i = 2; i < count && skip < ML_UNRESPONSIVE_MAX_SKIP_MS; i++)
        skip *= 2;
    return skip < ML_UNRESPONSIVE_MAX_SKIP_MS ? skip : ML_UNRESPONSIVE_MAX_SKIP_MS;
}

enum ml_marker_step ml_unresponsive_step(unsigned count, int64_t age_ms)
{
    int64_t skip = ml_unresponsive_skip_ms(count);
    if (count == 0 || age_ms < 0 || age_ms >= skip + ML_UNRESPONSIVE_MS)
        return ML_MARKER_NONE;
    return age_ms < skip ? ML_MARKER_SKIP : ML_MARKER_PROBE;
}

/* Opens the marker without following a link or truncating; the descriptor only
 * when fstat says it is a file this user may trust (else -1, closed). */
static int open_marker(const char *path, int flags, struct stat *st)
{
    int fd = open(path, flags | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK, 0600);
    if (fd < 0)
        return -1;
    fd = ml_fd_above_stdio(fd); /* never hold 0-2, even for a moment longer */
    if (fd < 0)
        return -1;
    if (fstat(fd, st) != 0 || !ml_unresponsive_file_usable(st, (unsigned)getuid())) {
        close(fd);
        return -1;
    }
    return fd;
}

static unsigned parse_count(const char *text, ssize_t n)
{
    unsigned count = 0;
    for (ssize_t i = 0; i < n && text[i] >= '0' && text[i] <= '9' && count < 1000; i++)
        count = count * 10 + (unsigned)(text[i] - '0');
    return count == 0 ? 1 : count; /* a marker says at least one timeout */
}

enum ml_marker_step ml_unresponsive_look(const char *socket, struct ml_marker *m)
{
    memset(m, 0, sizeof *m);
    m->path_ok = ml_unresponsive_marker_path(m->path, sizeof m->path, socket);
    if (!m->path_ok)
        return ML_MARKER_NONE;
    struct stat st;
    int fd = open_marker(m->path, O_RDONLY, &st);
    if (fd < 0)
        return ML_MARKER_NONE;
    char text[16];
    ssize_t n = pread(fd, text, sizeof text, 0);
    close(fd);
    int64_t at = (int64_t)ML_MTIME(st).tv_sec * 1000 + ML_MTIME(st).tv_nsec / 1000000;
    m->count = parse_count(text, n);
    m->age_ms = wall_ms() - at;
    m->step = ml_unresponsive_step(m->count, m->age_ms);
    if (m->step == ML_MARKER_NONE)
        m->count = 0; /* forgotten: the next timeout is the first again */
    return m->step;
}

void ml_unresponsive_note(const struct ml_marker *m)
{
    if (!m->path_ok)
        return;
    struct stat st;
    int fd = open_marker(m->path, O_RDWR | O_CREAT, &st);
    if (fd < 0) {
        ml_log(ML_DEBUG, "cannot note the unresponsive daemon at %s", m->path);
        return;
    }
    /* Fixed width, at offset 0: no truncation is ever needed. The write sets
     * the mtime on every system. */
    char text[12];
    unsigned count = m->count + 1 < 1000 ? m->count + 1 : 999;
    int len = snprintf(text, sizeof text, "%03u\n", count);
    if (len > 0)
        (void)pwrite(fd, text, (size_t)len, 0);
    close(fd);
}

void ml_unresponsive_clear(const struct ml_marker *m)
{
    if (!m->path_ok || m->step == ML_MARKER_NONE)
        return;
    /* In a directory of this user's that nobody else may write, the name is
     * still the marker that was judged. */
    (void)unlink(m->path);
}
