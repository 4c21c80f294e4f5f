/*
 * metalift_shim.h — the one header of libmetalift, the shim metalift injects
 * (LD_PRELOAD on Linux, DYLD_INSERT_LIBRARIES on macOS).
 *
 * Every internal function of the shim is declared and documented here; each
 * .c file holds one concern:
 *
 *   loader.c   the constructor, Metal detection, watching for Metal's arrival
 *              (Linux: the exported dlopen interposer; macOS: dyld's add-image
 *              callback), the pending retry while _MTLDevice is not registered.
 *   session.c  the one check-in per process (per pid: a forked child checks in
 *              for itself), the verdict wait, the outcome report.
 *   socket.c   the daemon connection and its descriptor hygiene.
 *   wire.c     the check-in / outcome encoders and the verdict decoder: the
 *              one C codec, for the socket and XPC alike, held to
 *              policy/src/wire.rs by the Rust tests and a fuzz target.
 *   hook.c     the Objective-C runtime (dlsym), the device-init hook, the
 *              capability IMPs, the self-check / roll-back when the original
 *              -initGPUFamilySupport returns.
 *   imp_owner.c  whose an IMP is (Metal's, metalift's, another shim's), by
 *              the image that holds it.
 *   macho.c    reading a mapped Mach-O header: is it Metal, does it hold an
 *              address (no dyld call).
 *   config.c   the environment: METALIFT_DISABLE, _SOCKET, _TIMEOUT_MS, _DEBUG.
 *   fork.c     the pthread_atfork handlers (both hook.c's and session.c's locks).
 *   xpc.c      macOS: the check-in over XPC (per-message audit tokens), each
 *              message wire.c's frame body as one data value.
 *   xpc_reply.c what an XPC check-in's answer means: verdict, socket, stock.
 *   log.c      the system log (Linux /dev/log, macOS os_log) and debug stderr.
 *   unresponsive.c  a daemon found not answering, remembered per user for a
 *              short while so later processes skip the wait.
 *
 * Why C and why one library: see shim/c/README.md. In short: on arm64e every
 * pointer that crosses to or from the OS must be signed or authenticated by the
 * compiler, which clang does and rustc does not; and with no Rust runtime there
 * is nothing heavy left to keep out of processes that never touch Metal.
 *
 * Rules for every function here: never allocate, never unwind, never block in
 * the constructor; every descriptor operation goes through socket.c.
 */
#ifndef METALIFT_SHIM_H
#define METALIFT_SHIM_H

#ifndef __APPLE__
#ifndef _GNU_SOURCE
#define _GNU_SOURCE /* program_invocation_short_name, RTLD_NEXT, SOCK_CLOEXEC */
#endif
#endif

/* The compiler's own headers, on every target. */
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __APPLE__
/*
 * macOS: libSystem declared by hand, so every .c compiles for
 * arm64e-apple-macos13 / arm64-apple-macos13 without an SDK (Linux CI runs
 * clang-22 on them). Values and layouts are those of the macOS 13 SDK for
 * arm64 (64-bit inodes; struct stat is the arm64 `stat`, no $INODE64 suffix).
 * On a Mac the same declarations are used: no SDK header is included.
 */
typedef long ssize_t;
typedef int pid_t;
typedef int32_t dev_t;
typedef uint64_t ino_t;
typedef uint16_t mode_t;
typedef uint32_t uid_t;
typedef uint32_t socklen_t;
struct timespec {
    long tv_sec;
    long tv_nsec;
};
struct stat {
    dev_t st_dev;
    mode_t st_mode;
    uint16_t st_nlink;
    ino_t st_ino;
    uint32_t st_uid;
    uint32_t st_gid;
    dev_t st_rdev;
    struct timespec st_atimespec, st_mtimespec, st_ctimespec, st_birthtimespec;
    int64_t st_size;
    int64_t st_blocks;
    int32_t st_blksize;
    uint32_t st_flags;
    uint32_t st_gen;
    int32_t st_lspare;
    int64_t st_qspare[2];
};
#define S_IFMT 0170000
#define S_IFSOCK 0140000
#define S_ISSOCK(m) (((m) & S_IFMT) == S_IFSOCK)
#define S_IFDIR 0040000
#define S_ISDIR(m) (((m) & S_IFMT) == S_IFDIR)
#define S_IFREG 0100000
struct sockaddr {
    uint8_t sa_len;
    uint8_t sa_family;
    char sa_data[14];
};
struct sockaddr_un {
    uint8_t sun_len;
    uint8_t sun_family;
    char sun_path[104];
};
struct pollfd {
    int fd;
    short events;
    short revents;
};
typedef struct {
    long __sig;
    char __opaque[56];
} pthread_mutex_t;
typedef struct {
    long __sig;
    char __opaque[8];
} pthread_once_t;
typedef struct _opaque_pthread_t *pthread_t;
#define PTHREAD_MUTEX_INITIALIZER {0x32AAABA7, {0}}
#define PTHREAD_ONCE_INIT {0x30B1BCBA, {0}}
#define AF_UNIX 1
#define SOCK_STREAM 1
#define SOCK_DGRAM 2
#define SOL_SOCKET 0xffff
#define SO_NOSIGPIPE 0x1022
#define MSG_DONTWAIT 0x80
#define F_OK 0
#define F_GETFD 1
#define F_SETFD 2
#define F_SETFL 4
#define F_DUPFD_CLOEXEC 67
#define FD_CLOEXEC 1
#define O_NONBLOCK 0x4
#define POLLIN 0x1
#define POLLOUT 0x4
#define CLOCK_MONOTONIC 6
#define CLOCK_REALTIME 0
#define O_RDONLY 0x0
#define O_WRONLY 0x1
#define O_RDWR 0x2
#define O_CREAT 0x200
#define O_NOFOLLOW 0x100
#define O_CLOEXEC 0x1000000
#define RTLD_NEXT ((void *)-1)
#define RTLD_DEFAULT ((void *)-2)
#define ENOENT 2
#define EINTR 4
#define EIO 5
#define EBADF 9
#define ENOMEM 12
#define EACCES 13
#define ENOTDIR 20
#define EMFILE 24
#define EPIPE 32
#define EAGAIN 35
#define EWOULDBLOCK EAGAIN
#define ECONNRESET 54
#define ENOTCONN 57
#define ETIMEDOUT 60
#define ECONNREFUSED 61
#define ENAMETOOLONG 63
#define ESTALE 70
#define EPROTO 100
extern int *__error(void);
#define errno (*__error())
/* <signal.h>: a sigset_t is a 32-bit mask, bit (signal - 1). */
typedef uint32_t sigset_t;
#define SIGPIPE 13
#define SIG_BLOCK 1
#define SIG_SETMASK 3
#define sigemptyset(set) (*(set) = 0, 0)
#define sigaddset(set, sig) (*(set) |= 1u << ((sig) - 1), 0)
#define sigismember(set, sig) ((*(set) & (1u << ((sig) - 1))) != 0)
extern int pthread_sigmask(int how, const sigset_t *set, sigset_t *old);
extern int sigpending(sigset_t *set);
extern int sigwait(const sigset_t *set, int *sig);
extern int access(const char *path, int mode);
extern int clock_gettime(int clock, struct timespec *ts);
extern int close(int fd);
extern int connect(int fd, const struct sockaddr *addr, socklen_t len);
typedef struct dl_info {
    const char *dli_fname;
    void *dli_fbase;
    const char *dli_sname;
    void *dli_saddr;
} Dl_info;
extern int dladdr(const void *addr, Dl_info *info);
extern char *dlerror(void);
extern void *dlsym(void *handle, const char *symbol);
extern int fcntl(int fd, int cmd, ...);
#if defined(__x86_64__)
extern int fstat(int fd, struct stat *st) __asm("_fstat$INODE64"); /* the 64-bit-inode stat */
extern int lstat(const char *path, struct stat *st) __asm("_lstat$INODE64");
#else
extern int fstat(int fd, struct stat *st);
extern int lstat(const char *path, struct stat *st);
#endif
extern char *getenv(const char *name);
extern pid_t getpid(void);
extern const char *getprogname(void);
extern uid_t getuid(void);
extern int memcmp(const void *a, const void *b, size_t n);
extern int open(const char *path, int flags, ...);
extern void *memcpy(void *dst, const void *src, size_t n);
extern void *memset(void *dst, int c, size_t n);
extern int poll(struct pollfd *fds, unsigned int nfds, int timeout);
extern int pthread_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void));
extern int pthread_equal(pthread_t a, pthread_t b);
extern int pthread_mutex_lock(pthread_mutex_t *m);
extern int pthread_mutex_trylock(pthread_mutex_t *m);
extern int pthread_mutex_unlock(pthread_mutex_t *m);
extern int pthread_once(pthread_once_t *once, void (*init)(void));
extern pthread_t pthread_self(void);
extern ssize_t pread(int fd, void *buf, size_t len, int64_t offset);
extern ssize_t pwrite(int fd, const void *buf, size_t len, int64_t offset);
extern ssize_t recv(int fd, void *buf, size_t len, int flags);
extern ssize_t send(int fd, const void *buf, size_t len, int flags);
extern ssize_t sendto(int fd, const void *buf, size_t len, int flags,
                      const struct sockaddr *to, socklen_t tolen);
extern int setsockopt(int fd, int level, int name, const void *value, socklen_t len);
extern int snprintf(char *buf, size_t cap, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
extern int socket(int domain, int type, int protocol);
extern int strcmp(const char *a, const char *b);
extern size_t strlen(const char *s);
extern char *strrchr(const char *s, int c);
extern int vsnprintf(char *buf, size_t cap, const char *fmt, va_list ap)
    __attribute__((format(printf, 3, 0)));
extern int unlink(const char *path);
extern ssize_t write(int fd, const void *buf, size_t len);
/* dyld and the unified log. */
struct mach_header;
extern void _dyld_register_func_for_add_image(void (*func)(const struct mach_header *mh,
                                                           intptr_t vmaddr_slide));
typedef struct os_log_s *os_log_t;
extern os_log_t os_log_create(const char *subsystem, const char *category);
extern void _os_log_impl(void *dso, os_log_t log, uint8_t type, const char *format,
                         uint8_t *buf, uint32_t size);
extern bool os_log_type_enabled(os_log_t oslog, uint8_t type);
#else
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#endif

/* Overridable only for shim/build.rs's bindgen, which skips declarations of
 * hidden visibility (the Rust tests link these from a static library). */
#ifndef ML_HIDDEN
#define ML_HIDDEN __attribute__((visibility("hidden")))
#endif
#define ML_EXPORT __attribute__((visibility("default")))

/* The shim's version, sent in the check-in (advisory): the workspace version,
 * passed by shim/build.rs and pkg/build.sh as -DML_SHIM_VERSION="x.y.z". */
#ifndef ML_SHIM_VERSION
#error "ML_SHIM_VERSION is the workspace version: build with shim/build.rs or pkg/build.sh"
#endif

/* ---------------------------------------------------------------- wire.c -- */

/* Mirrors policy/src/wire.rs (PROTOCOL_VERSION = ML_WIRE_PROTOCOL, MAX_FRAME, LENGTH_PREFIX). */
#define ML_WIRE_PROTOCOL 1
#define ML_WIRE_MAX_FRAME (16 * 1024)
#define ML_WIRE_PREFIX 4
#define ML_WIRE_KIND_CHECK_IN 1
#define ML_WIRE_KIND_VERDICT 2
#define ML_WIRE_KIND_OUTCOME 3

/* The number of GPU families the shim reads (wire.rs KNOWN_FAMILIES). */
#define ML_KNOWN_FAMILIES 16
/* wire.rs KNOWN_FAMILIES[i]: the MTLGPUFamily value of bit i of a families mask. */
ML_HIDDEN int64_t ml_known_family(unsigned index);
/* Its name ("Apple7"), for log lines. */
ML_HIDDEN const char *ml_known_family_name(unsigned index);

/* Why a verdict could not be decoded: as wire.rs's WireError where the shim
 * reads the message, plus ML_WIRE_NOT_VERDICT for any other kind (4 was
 * UNKNOWN_KIND, now NOT_VERDICT too: the shim judges only what it receives). */
enum ml_wire_status {
    ML_WIRE_OK = 0,
    ML_WIRE_OVERSIZE = 1,
    ML_WIRE_TRUNCATED = 2,
    ML_WIRE_VERSION = 3,
    ML_WIRE_BAD_FIELD = 5,
    ML_WIRE_MISSING = 6,
    ML_WIRE_NOT_VERDICT = 7,
    /* A well-formed Declined (wire.rs Message::Declined): value is the reason,
     * ML_DECLINED_USE_SOCKET or ML_DECLINED_BUSY. Not an error of the peer: the
     * daemon's refusal, to act on at once. */
    ML_WIRE_DECLINED = 8,
};
#define ML_DECLINED_USE_SOCKET 1
#define ML_DECLINED_BUSY 2

/* A device's answers (wire.rs Answers). */
struct ml_answers {
    uint32_t families; /* bit i: supportsFamily:(ml_known_family(i)) said YES */
    uint64_t threadgroup_memory;
    uint64_t working_set;
};

/* A decoded verdict (wire.rs VerdictMsg). Strings point into the decoded body. */
struct ml_verdict {
    uint64_t decision_id;
    uint8_t unlock;        /* WireAction: 1 unlock, 0 stock */
    uint8_t has_caps;      /* capabilities present */
    uint8_t family_max;    /* Capabilities::apple_family_max */
    uint8_t has_ws;        /* recommended_working_set present */
    uint64_t tg_memory;    /* Capabilities::max_threadgroup_memory */
    uint64_t working_set;  /* Capabilities::recommended_working_set */
    const char *profile;   /* NULL when absent; not NUL-terminated */
    size_t profile_len;
    const char *rule;      /* NULL when absent; not NUL-terminated */
    size_t rule_len;
    uint8_t monitor;       /* Mode: 1 monitor, 0 enforce */
    uint8_t would_unlock;
};

/* The result of decoding: status, and for BAD_FIELD / MISSING the field name,
 * for VERSION / NOT_VERDICT the byte, for OVERSIZE the length. */
struct ml_wire_error {
    enum ml_wire_status status;
    const char *field;
    uint64_t value;
};

/* Another shim found on the capability methods (wire.rs OtherShim). */
struct ml_other_shim {
    const char *image;   /* NULL: none found (the fields are not sent) */
    const char *methods; /* its selectors, joined with ',' */
    uint8_t patched;     /* ML_OTHER_BEFORE / ML_OTHER_AFTER */
};
#define ML_OTHER_BEFORE 0 /* its IMPs were there when metalift looked */
#define ML_OTHER_AFTER 1  /* it patched over metalift's (or Metal's) later */

/* An outcome to report (wire.rs Outcome). Strings are NUL-terminated. */
struct ml_outcome {
    uint64_t decision_id;
    uint8_t result; /* 0 applied, 1 stock, 2 failed */
    const char *reason;
    const char *device_class;
    struct ml_answers stock; /* through the IMPs found (as found: other.patched BEFORE) */
    struct ml_answers effective;
    struct ml_other_shim other;
};
#define ML_RESULT_APPLIED 0
#define ML_RESULT_STOCK 1
#define ML_RESULT_FAILED 2

/* wire.rs frame_length: the body length announced by a 4-byte prefix, or an
 * error (OVERSIZE above ML_WIRE_MAX_FRAME, TRUNCATED below 2). */
ML_HIDDEN struct ml_wire_error ml_wire_frame_length(const uint8_t prefix[4], size_t *len);
/* wire.rs decode_body restricted to what the shim receives: fills *out and
 * returns OK only when decode_body returns Ok(Message::Verdict) (the same
 * values); DECLINED (value: the reason) only when it returns Ok(Declined);
 * NOT_VERDICT (value: the kind byte) for every other kind, known or not, its
 * fields unread; otherwise an error. Used for the socket's frames and XPC's
 * data values alike. */
ML_HIDDEN struct ml_wire_error ml_wire_decode_verdict(const uint8_t *body, size_t len,
                                                      struct ml_verdict *out);
/* wire.rs encode_frame(Message::CheckIn): writes the frame (prefix included)
 * into buf (at most cap bytes, cap >= 64) and returns its length. `claimed`
 * may be NULL (field absent). Strings are cut at a UTF-8 boundary to fit. */
ML_HIDDEN size_t ml_wire_encode_check_in(uint8_t *buf, size_t cap, const char *shim_version,
                                         const char *arch, const char *claimed);
/* ml_wire_encode_check_in plus the advisory `job` field (wire.rs tag 9): `job`
 * may be NULL or "" (field absent), else NAME=value lines (job.c). */
ML_HIDDEN size_t ml_wire_encode_check_in_job(uint8_t *buf, size_t cap, const char *shim_version,
                                             const char *arch, const char *claimed,
                                             const char *job);
/* wire.rs encode_frame(Message::Outcome), as above. */
ML_HIDDEN size_t ml_wire_encode_outcome(uint8_t *buf, size_t cap, const struct ml_outcome *o);
/* The length of the longest valid UTF-8 prefix of s[0..len], by Rust's
 * from_utf8 rules (no overlongs, no surrogates, nothing above U+10FFFF). */
ML_HIDDEN size_t ml_utf8_valid_prefix(const uint8_t *s, size_t len);
/* What a device must answer once the verdict's capabilities apply over `stock`
 * (hook.rs expected_answers / profile.rs Capabilities). */
ML_HIDDEN struct ml_answers ml_expected_answers(const struct ml_verdict *v,
                                                struct ml_answers stock);
/* Capabilities::supports_family: the effective answer given the stock one. */
ML_HIDDEN bool ml_caps_supports_family(const struct ml_verdict *v, int64_t family, bool stock);

/* ----------------------------------------------------------- xpc_reply.c -- */

/* What to do after an XPC check-in (see xpc_reply.c). */
enum ml_xpc_next {
    ML_XPC_USE_VERDICT = 0,        /* the reply is a verdict */
    ML_XPC_USE_SOCKET = 1,         /* check in on the Unix socket, same deadline */
    ML_XPC_STOCK_BUSY = 2,         /* declined: no place free; stock now */
    ML_XPC_STOCK_UNRESPONSIVE = 3, /* no reply by the deadline; note it, stock */
    ML_XPC_STOCK_MALFORMED = 4,    /* a reply that is no verdict; stock */
    ML_XPC_SEND_AGAIN = 5,         /* XPC_ERROR_CONNECTION_INTERRUPTED: send again over
                                    * XPC, once, same deadline (then the socket) */
};
/* `read_result` is ml_xpc_read_verdict's (0, -ETIMEDOUT, -EPROTO with `e`, or
 * another negative errno for an XPC error before a reply). */
ML_HIDDEN enum ml_xpc_next ml_xpc_next_step(int read_result, struct ml_wire_error e);

/* The mach service metaliftd's LaunchDaemon advertises (xpc/src/frame.rs
 * DEFAULT_SERVICE). */
#define ML_XPC_SERVICE "com.metalift.policy"

/* ---------------------------------------------------------------- xpc.c -- */

#ifdef __APPLE__
/* The XPC check-in (macOS): the kernel stamps every message with the sender's
 * audit token, so the daemon identifies each one (check-in and outcome) by
 * pid and pid version; a Unix socket's LOCAL_PEERTOKEN names only whoever last
 * used the socket (docs/src/security.md, "Who is asking"). */

/* The constructor's note of the pid this image started in (no allocation). */
ML_HIDDEN void ml_xpc_note_image_start(void);
/* Whether libxpc may be used here: not in a child forked without exec, where
 * libdispatch refuses to run (the pid differs from the one noted at start). */
ML_HIDDEN bool ml_xpc_usable(void);
/* Opens a connection to ML_XPC_SERVICE in the system domain and sends the
 * check-in `frame` (wire.c's, length prefix included: its body is sent); the
 * verdict arrives asynchronously. Returns 0, or an errno value. */
ML_HIDDEN int ml_xpc_check_in(const uint8_t *frame, size_t len);
/* Waits until `deadline_ms` (ml_now_ms clock) for the reply. 0: *out is
 * decoded (its strings live until ml_xpc_release_reply); -ETIMEDOUT: no reply
 * (a reply arriving later is dropped by the handler, never read);
 * -ECONNREFUSED: XPC_ERROR_CONNECTION_INVALID (no such service);
 * -EAGAIN: XPC_ERROR_CONNECTION_INTERRUPTED (the daemon exited; launchd
 * relaunches it); -ECONNRESET: another XPC error before a reply; -EPROTO with *error set: the
 * reply is no verdict (ML_WIRE_DECLINED: the daemon's refusal; MISSING
 * "metalift.frame": a dictionary without the frame's data value). */
ML_HIDDEN int ml_xpc_read_verdict(int64_t deadline_ms, struct ml_verdict *out,
                                  struct ml_wire_error *error);
/* Sends the check-in again on the same connection (after
 * XPC_ERROR_CONNECTION_INTERRUPTED: libxpc's contract is to send again; the
 * connection looks the service up anew). 0, or an errno value. */
ML_HIDDEN int ml_xpc_send_again(const uint8_t *frame, size_t len);
/* Releases the reply ml_xpc_read_verdict handed over (idempotent). */
ML_HIDDEN void ml_xpc_release_reply(void);
/* Sends the outcome `frame` (wire.c's) on the same connection (same process:
 * the daemon checks the audit token against the check-in's) and closes it
 * once sent. */
ML_HIDDEN void ml_xpc_report(const uint8_t *frame, size_t len);
/* Closes the connection (after the outcome, or when the verdict is unusable). */
ML_HIDDEN void ml_xpc_close(void);
/* A forked child: forget the parent's connection without touching libxpc
 * (which is unusable after fork without exec). */
ML_HIDDEN void ml_xpc_forget(void);
#endif

/* -------------------------------------------------------------- config.c -- */

/* Bounds and default of METALIFT_TIMEOUT_MS (see shim/c/README.md for why). */
#define ML_DEFAULT_TIMEOUT_MS 2000
#define ML_MAX_TIMEOUT_MS 10000

struct ml_config {
    char socket[104]; /* sun_path fits 104 bytes on macOS, 108 on Linux */
    bool socket_too_long;
    /* macOS: the per-user agent's directory is not the caller's (or root's), or
     * others can write it: a squatter's daemon could answer. Do not connect. */
    bool socket_untrusted;
    /* `socket` is the system daemon's (METALIFT_SOCKET unset, the daemon's
     * socket exists): on macOS that daemon is reached over XPC. */
    bool system_daemon;
    int timeout_ms;
    bool debug;
    const char *warning; /* static text, or NULL */
};

/* METALIFT_DISABLE=1 (exactly "1"). The only thing the constructor reads. */
ML_HIDDEN bool ml_config_disabled(void);
/* Reads the rest of the environment (only once Metal is present). */
ML_HIDDEN void ml_config_load(struct ml_config *out);
/* METALIFT_TIMEOUT_MS's value parsed like Rust's `s.trim().parse::<u64>()`,
 * capped at ML_MAX_TIMEOUT_MS; -1 when garbled. NULL gives the default. */
ML_HIDDEN int ml_config_parse_timeout(const char *raw);
/* Mirroring policy/src/socket_path.rs client_socket: METALIFT_SOCKET; else the
 * system socket if it exists; else metalift.sock in the user's private
 * directory ($XDG_RUNTIME_DIR on Linux, $TMPDIR on macOS); else
 * the system socket. Writes at most cap bytes; returns false when the path
 * does not fit. The inputs are passed in so tests need no environment. */
ML_HIDDEN bool ml_config_socket_path(char *buf, size_t cap, const char *metalift_socket,
                                     bool system_exists, const char *private_dir);

/* The user's private directory as the process's environment has it:
 * $XDG_RUNTIME_DIR on Linux, $TMPDIR on macOS (launchd sets it to the user's
 * DARWIN_USER_TEMP_DIR); never confstr. NULL when unset. Whoever uses it
 * checks the directory (owner, mode) first: the socket's in ml_config_load,
 * the marker's in unresponsive.c. buf and cap are unused (kept for callers). */
ML_HIDDEN const char *ml_config_private_dir(char *buf, size_t cap);

/* Whether a per-user agent's socket directory may be trusted: owned by the
 * caller or root, writable by nobody else (socket_path.rs
 * agent_dir_is_trustworthy). Pure, so the Linux tests compare it with Rust's. */
ML_HIDDEN bool ml_config_agent_dir_trustworthy(unsigned dir_uid, unsigned dir_mode,
                                               unsigned caller_uid);

/* -------------------------------------------------------- unresponsive.c -- */

/* How long a marker stays in force after its skip (see unresponsive.c); a
 * recovered daemon is asked with the full deadline again after this. */
#define ML_UNRESPONSIVE_MS 10000
/* The longest skip, however many timeouts in a row. */
#define ML_UNRESPONSIVE_MAX_SKIP_MS 60000
/* The deadline of a probe: a check-in while a marker is in force. A few
 * hundred ms, not tens: a probe that times out makes the timeouts consecutive
 * and skips every process of the user for 10 s and more, and one cold
 * identification on macOS (SecCode on a new executable, a hash-cache miss, the
 * first XPC lookup) can take longer than 50 ms (review v5 P2-5). Only the one
 * process that probes a daemon that is really gone pays it: the next is skipped. */
#define ML_PROBE_MS 300

/* What a check-in does given the marker. */
enum ml_marker_step {
    ML_MARKER_NONE,  /* no marker in force: the full deadline */
    ML_MARKER_PROBE, /* a check-in with a deadline of ML_PROBE_MS */
    ML_MARKER_SKIP,  /* no check-in: stock, the reason in the debug log */
};

/* One look at the marker of the daemon at one socket. */
struct ml_marker {
    bool path_ok;          /* the private directory is usable: a marker may exist */
    char path[1200];
    unsigned count;        /* timeouts in a row it records (0: none in force) */
    int64_t age_ms;        /* since the last of them */
    enum ml_marker_step step;
};

/* Whether `st` (lstat) may hold markers for `uid`: a directory of that user's
 * that nobody else may write. Pure, for the tests. */
ML_HIDDEN bool ml_unresponsive_dir_usable(const struct stat *st, unsigned uid);
/* Whether `st` (fstat of the open marker) may be read or written for `uid`: a
 * regular file of that user's, writable by nobody else, with one link. */
ML_HIDDEN bool ml_unresponsive_file_usable(const struct stat *st, unsigned uid);
/* How long check-ins are skipped after `count` timeouts in a row. */
ML_HIDDEN int64_t ml_unresponsive_skip_ms(unsigned count);
/* What a marker of `count` timeouts, `age_ms` old, asks of a check-in. Pure. */
ML_HIDDEN enum ml_marker_step ml_unresponsive_step(unsigned count, int64_t age_ms);
/* Where the marker for the daemon at `socket` lives; false when the private
 * directory is missing or not usable (then there is no marker at all). */
ML_HIDDEN bool ml_unresponsive_marker_path(char *buf, size_t cap, const char *socket);
/* Reads the marker (getenv, lstat, open, fstat, pread: no IPC) into *m and
 * returns what the check-in should do. */
ML_HIDDEN enum ml_marker_step ml_unresponsive_look(const char *socket, struct ml_marker *m);
/* The check-in `m` was looked up for timed out: one more in a row. */
ML_HIDDEN void ml_unresponsive_note(const struct ml_marker *m);
/* The daemon answered: the marker `m` found in force is removed. */
ML_HIDDEN void ml_unresponsive_clear(const struct ml_marker *m);

/* -------------------------------------------------------------- socket.c -- */

/* The shim's one connection, recognised by what it was when opened. */
struct ml_sock {
    int fd;      /* -1: none */
    dev_t dev;
    ino_t ino;
};
#define ML_SOCK_NONE ((struct ml_sock){-1, 0, 0})

/* Creates a close-on-exec, non-blocking, SIGPIPE-free stream socket above fd 2
 * (F_DUPFD_CLOEXEC when it lands on 0-2), connects it to `path` and records its
 * identity. Returns 0, or an errno value (the socket is closed then). */
ML_HIDDEN int ml_sock_connect(struct ml_sock *s, const char *path);
/* Whether s->fd is still the socket opened (same dev/ino, still a socket). */
ML_HIDDEN bool ml_sock_is_ours(const struct ml_sock *s);
/* Sends all of buf (MSG_NOSIGNAL), waiting at most timeout_ms for room.
 * Verifies first; returns 0 or an errno value (ESTALE: not ours any more). */
ML_HIDDEN int ml_sock_send(const struct ml_sock *s, const void *buf, size_t len, int timeout_ms);
/* Waits until `deadline_ms` (ml_now_ms clock) for bytes and reads them. Verifies
 * first. Returns bytes read (0: peer closed), -ETIMEDOUT, -ESTALE or -errno. */
ML_HIDDEN ssize_t ml_sock_recv(const struct ml_sock *s, void *buf, size_t cap,
                               int64_t deadline_ms);
/* Closes the socket if it is still ours, else forgets it untouched. */
ML_HIDDEN void ml_sock_close(struct ml_sock *s);
/* Forgets the socket without touching the descriptor (it is someone else's). */
ML_HIDDEN void ml_sock_forget(struct ml_sock *s);
/* Whether fd names the shim's live socket (log.c: never write debug text there). */
ML_HIDDEN bool ml_sock_is_shims(int fd);
/* Moves fd above 2 with F_DUPFD_CLOEXEC when it sits on 0-2; returns the fd to
 * use (closing the low one) or -1. */
ML_HIDDEN int ml_fd_above_stdio(int fd);
/* A monotonic clock in milliseconds. */
ML_HIDDEN int64_t ml_now_ms(void);

/* ------------------------------------------------------------- session.c -- */

/* What the first device will do (the only place a verdict becomes an unlock). */
struct ml_plan {
    bool unlock;
    uint64_t decision_id;
    struct ml_verdict caps; /* the verdict (capabilities valid when unlock) */
    char rule[128];
    char reason[256];       /* why stock (for the outcome) */
};

/* Checks in for this process if it has not yet (Metal has arrived). Idempotent
 * per pid: in a forked child it drops the inherited connection (after verifying
 * it, never writing on it) and checks in anew. Never blocks. */
ML_HIDDEN void ml_session_check_in(void);
/* Waits (at most the deadline, from now) for the verdict and turns it into a
 * plan; without `wait` takes it only if it has arrived. Once per check-in. */
ML_HIDDEN void ml_session_plan(struct ml_plan *out, bool wait);
/* Sends the outcome on this process's own check-in connection and closes it. */
ML_HIDDEN void ml_session_report(const struct ml_outcome *o);
/* Turns a decoded verdict into a plan (session.rs plan_from_verdict). */
ML_HIDDEN void ml_plan_from_verdict(const struct ml_verdict *v, struct ml_plan *out);
/* The session lock around fork (fork.c calls these, after hook.c's). */
ML_HIDDEN void ml_session_atfork_prepare(void);
ML_HIDDEN void ml_session_atfork_parent(void);
ML_HIDDEN void ml_session_atfork_child(void);
/* The process that owns the session's state (for fork checks elsewhere). */
ML_HIDDEN pid_t ml_session_pid(void);

/* --------------------------------------------------------------- macho.c -- */

/* Whether `mh` is a 64-bit Mach-O dylib whose LC_ID_DYLIB names Metal. */
ML_HIDDEN bool ml_macho_is_metal(const void *mh);
/* Whether `addr` lies in a mapped segment (not __PAGEZERO, not __LINKEDIT) of
 * the 64-bit Mach-O image whose header is mapped at `mh`; reads only the
 * image's load commands (no dyld call, no lock). */
ML_HIDDEN bool ml_macho_holds(const void *mh, const void *addr);

/* ----------------------------------------------------------- imp_owner.c -- */

/* Whose code an IMP is, judged by the image that holds it (imp_owner.c). */
enum ml_imp_owner {
    ML_IMP_METAL,    /* the image that defines the method's class: Metal's own */
    ML_IMP_METALIFT, /* this shim's image */
    ML_IMP_OTHER,    /* any other image (or none): another shim's */
};

/* Judges `imp`, the IMP found on a method of `defining_class` (the class whose
 * own method list holds the Method). For ML_IMP_OTHER, copies the holding
 * image's path into `image` (cap bytes; "?" when no image holds it). Bounded:
 * two or three dladdr calls, no IPC, no allocation. */
ML_HIDDEN enum ml_imp_owner ml_imp_owner(const void *imp, const void *defining_class,
                                         char *image, size_t cap);

/* ---------------------------------------------------------------- hook.c -- */

/* Metal is mapped: find _MTLDevice through the runtime resolved in `scope`
 * (a dlopen handle, or RTLD_DEFAULT) and hook -initGPUFamilySupport (without
 * it, -initWorkarounds or -initFeatureQueries, to report at the first device).
 * Never checks in or waits: it runs inside the loader's callback. Returns
 * true when done (hooked, or failed for good), false when _MTLDevice is not
 * registered yet (the loader retries on later images). */
ML_HIDDEN bool ml_hook_try(void *scope);
/* The device-init lock, re-initialised in a forked child (atfork). */
ML_HIDDEN void ml_hook_atfork_prepare(void);
ML_HIDDEN void ml_hook_atfork_parent(void);
ML_HIDDEN void ml_hook_atfork_child(void);

/* ---------------------------------------------------------------- fork.c -- */

/* Registers the pthread_atfork handlers (once; loader.c, when Metal is there):
 * hook.c's locks, then session.c's, in the order a first device takes them. */
ML_HIDDEN void ml_fork_register(void);

/* -------------------------------------------------------------- loader.c -- */

/* Linux: whether Metal's image (libsimmetal.so) is in the process, by
 * dl_iterate_phdr. (macOS needs none: dyld's add-image callback sees every
 * image, loaded or later.) */
#ifdef __linux__
ML_HIDDEN bool ml_metal_mapped(void);
#endif
/* Metal was seen (at load, on a dlopen, in dyld's callback): try to hook,
 * remembering "pending" when _MTLDevice is not there yet. No check-in: that
 * waits for the first device creation (hook.c). */
ML_HIDDEN void ml_metal_arrived(void *scope);

/* ----------------------------------------------------------------- log.c -- */

enum ml_level { ML_DEBUG, ML_INFO, ML_WARN };
/* Sets stderr echo (METALIFT_DEBUG=1). */
ML_HIDDEN void ml_log_set_debug(bool on);
ML_HIDDEN bool ml_log_debug_enabled(void);
/* One log line: the system log (not ML_DEBUG unless debug mode) and, in debug
 * mode, stderr. printf-style; formatted into a fixed buffer, never allocating.
 * Linux: a datagram to /dev/log on a socket of the shim's own; macOS: os_log
 * (subsystem com.metalift, category shim), the text public, error type for
 * ML_WARN. Called only once Metal is there. */
ML_HIDDEN void ml_log(enum ml_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* The executable's short name (for log lines; no /proc). */
ML_HIDDEN const char *ml_program_name(void);

/* ---------------------------------------------------------------- job.c -- */

/* policy/src/job.rs MAX_VALUE_LEN and MAX_JOB_LEN + 1 (the NUL). */
#define ML_JOB_VALUE_MAX 128
#define ML_JOB_CLAIMS_MAX 1024

/* The CI job claims: every allow-listed variable `lookup` answers with a
 * value job.rs keeps, as NAME=value lines in list order, NUL-terminated in buf
 * (cap bytes, at most ML_JOB_CLAIMS_MAX used); returns the length, 0 for none.
 * Pure: the caller chooses the lookup (tests pass a table). */
ML_HIDDEN size_t ml_job_format(char *buf, size_t cap, const char *(*lookup)(const char *name));
/* ml_job_format over this process's environment (getenv): call at check-in. */
ML_HIDDEN size_t ml_job_claims(char *buf, size_t cap);

#endif /* METALIFT_SHIM_H */
