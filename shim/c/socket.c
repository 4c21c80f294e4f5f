/*
 * socket.c — the shim's connection to metaliftd, and the descriptor hygiene
 * that keeps it from ever touching a descriptor of the host program.
 *
 * - Created close-on-exec and non-blocking (a shell's children check in for
 *   themselves; nothing here may block a process).
 * - Never on 0, 1 or 2: a program started with its standard descriptors closed
 *   would otherwise print into the shim's socket. Moved with F_DUPFD_CLOEXEC.
 * - Recognised by (st_dev, st_ino) taken when it was opened: before every read,
 *   write or close the shim checks that the number still names that socket. A
 *   program that closed "all other descriptors" and opened a file on the same
 *   number keeps its file: the shim forgets the number without touching it.
 * - No write can raise SIGPIPE: MSG_NOSIGNAL (Linux), SO_NOSIGPIPE (macOS).
 */
#include "metalift_shim.h"


#ifdef __APPLE__
#define ML_SEND_FLAGS 0
#else
#define ML_SEND_FLAGS MSG_NOSIGNAL
#endif

/* The identity of the live socket, for ml_sock_is_shims (read without a lock:
 * log.c only uses it to decide whether to skip a debug line). */
static volatile dev_t live_dev;
static volatile ino_t live_ino;
static volatile int live_fd = -1;

int64_t ml_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int ml_fd_above_stdio(int fd)
{
    if (fd < 0 || fd > 2)
        return fd;
    int moved = fcntl(fd, F_DUPFD_CLOEXEC, 3);
    close(fd); /* our own low descriptor, created a moment ago */
    return moved;
}

static int new_socket(void)
{
#ifdef __APPLE__
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    fd = ml_fd_above_stdio(fd);
    if (fd < 0)
        return -1;
    int one = 1;
    if (fcntl(fd, F_SETFD, FD_CLOEXEC) != 0 || fcntl(fd, F_SETFL, O_NONBLOCK) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_NOSIGPIPE, &one, sizeof one) != 0) {
        close(fd);
        return -1;
    }
    return fd;
#else
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -1;
    /* F_DUPFD_CLOEXEC keeps close-on-exec but not O_NONBLOCK (a file status
     * flag, shared by both numbers: it stays set). */
    return ml_fd_above_stdio(fd);
#endif
}

int ml_sock_connect(struct ml_sock *s, const char *path)
{
    struct sockaddr_un addr;
    *s = ML_SOCK_NONE;
    size_t n = strlen(path);
    if (n >= sizeof addr.sun_path)
        return ENAMETOOLONG;
    int fd = new_socket();
    if (fd < 0)
        return errno ? errno : EMFILE;
    memset(&addr, 0, sizeof addr);
    addr.sun_family = AF_UNIX;
    memcpy(addr.sun_path, path, n + 1);
    if (connect(fd, (const struct sockaddr *)&addr, sizeof addr) != 0) {
        int e = errno;
        close(fd);
        return e;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
        close(fd);
        return EBADF;
    }
    s->fd = fd;
    s->dev = st.st_dev;
    s->ino = st.st_ino;
    live_dev = st.st_dev;
    live_ino = st.st_ino;
    live_fd = fd;
    return 0;
}

bool ml_sock_is_ours(const struct ml_sock *s)
{
    struct stat st;
    if (s->fd < 0 || fstat(s->fd, &st) != 0)
        return false;
    return S_ISSOCK(st.st_mode) && st.st_dev == s->dev && st.st_ino == s->ino;
}

bool ml_sock_is_shims(int fd)
{
    struct stat st;
    if (live_fd < 0 || fstat(fd, &st) != 0)
        return false;
    return S_ISSOCK(st.st_mode) && st.st_dev == live_dev && st.st_ino == live_ino;
}

static int wait_for(int fd, short events, int64_t deadline_ms)
{
    for (;;) {
        int64_t left = deadline_ms - ml_now_ms();
        if (left < 0)
            left = 0;
        struct pollfd p = {.fd = fd, .events = events, .revents = 0};
        int rc = poll(&p, 1, (int)(left > 60000 ? 60000 : left));
        if (rc > 0)
            return 0;
        if (rc == 0 && ml_now_ms() >= deadline_ms)
            return ETIMEDOUT;
        if (rc < 0 && errno != EINTR)
            return errno;
    }
}

int ml_sock_send(const struct ml_sock *s, const void *buf, size_t len, int timeout_ms)
{
    if (!ml_sock_is_ours(s))
        return ESTALE;
    const uint8_t *p = buf;
    int64_t deadline = ml_now_ms() + timeout_ms;
    while (len > 0) {
        ssize_t n = send(s->fd, p, len, ML_SEND_FLAGS);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            int e = wait_for(s->fd, POLLOUT, deadline);
            if (e != 0)
                return e;
            if (!ml_sock_is_ours(s))
                return ESTALE;
            continue;
        }
        return n < 0 ? errno : EIO;
    }
    return 0;
}

ssize_t ml_sock_recv(const struct ml_sock *s, void *buf, size_t cap, int64_t deadline_ms)
{
    for (;;) {
        if (!ml_sock_is_ours(s))
            return -ESTALE;
        ssize_t n = recv(s->fd, buf, cap, 0);
        if (n >= 0)
            return n;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return -errno;
        int e = wait_for(s->fd, POLLIN, deadline_ms);
        if (e != 0)
            return -e;
    }
}

void ml_sock_forget(struct ml_sock *s)
{
    if (s->fd >= 0 && s->fd == live_fd)
        live_fd = -1;
    *s = ML_SOCK_NONE;
}

void ml_sock_close(struct ml_sock *s)
{
    if (ml_sock_is_ours(s))
        close(s->fd);
    ml_sock_forget(s);
}
