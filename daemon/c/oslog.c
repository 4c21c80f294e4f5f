/*
 * metaliftd's unified-log writer (macOS): the part of os_log only clang can build.
 *
 * os_log_with_type() is a macro: clang's __builtin_os_log_format lays out the
 * argument buffer the logging system decodes, the format string must sit in the
 * image's __TEXT,__oslogstring section (the log stores its offset, not its text),
 * and the call goes to the private _os_log_impl with this image's __dso_handle.
 * Rust cannot produce that, so this file does exactly that and nothing else:
 * one function per level, each taking one already-formatted string and logging
 * it with the format "%{public}s" (the text is for admins: executable, rule,
 * verdict, result must not read <private>). Everything else stays in Rust
 * (daemon/src/service/oslog.rs). Declarations are written by hand from <os/log.h> and
 * <os/trace_base.h> (macOS 13 SDK); no SDK header is needed. Built by
 * daemon/build.rs for macOS targets only.
 */

typedef struct os_log_s *os_log_t;
typedef unsigned char os_log_type_t;

#define OS_LOG_TYPE_DEFAULT ((os_log_type_t)0x00)
#define OS_LOG_TYPE_INFO ((os_log_type_t)0x01)
#define OS_LOG_TYPE_DEBUG ((os_log_type_t)0x02)
#define OS_LOG_TYPE_ERROR ((os_log_type_t)0x10)
#define OS_LOG_TYPE_FAULT ((os_log_type_t)0x11)

extern os_log_t os_log_create(const char *subsystem, const char *category);
extern _Bool os_log_type_enabled(os_log_t log, os_log_type_t type);
extern void _os_log_impl(void *dso, os_log_t log, os_log_type_t type,
                         const char *format, unsigned char *buf, unsigned int size);
/* The Mach-O header of the image this file is linked into (the linker defines it). */
extern char __dso_handle[];

/* A log handle for `subsystem`/`category`; never NULL (libSystem returns a
 * disabled handle rather than NULL), kept for the process's life. */
os_log_t metalift_oslog_create(const char *subsystem, const char *category) {
    return os_log_create(subsystem, category);
}

/* What os_log_with_type(log, type, "%{public}s", message) expands to. */
#define METALIFT_OSLOG_AT(name, type)                                              \
    void name(os_log_t log, const char *message) {                                \
        if (!os_log_type_enabled(log, type)) {                                     \
            return;                                                                \
        }                                                                          \
        __attribute__((section("__TEXT,__oslogstring,cstring_literals")))          \
        static const char format[] = "%{public}s";                                 \
        _Alignas(16) unsigned char                                                 \
            buf[__builtin_os_log_format_buffer_size("%{public}s", message)];       \
        _os_log_impl(__dso_handle, log, type, format,                              \
                     __builtin_os_log_format(buf, "%{public}s", message),          \
                     (unsigned int)sizeof(buf));                                   \
    }

METALIFT_OSLOG_AT(metalift_oslog_default, OS_LOG_TYPE_DEFAULT)
METALIFT_OSLOG_AT(metalift_oslog_info, OS_LOG_TYPE_INFO)
METALIFT_OSLOG_AT(metalift_oslog_debug, OS_LOG_TYPE_DEBUG)
METALIFT_OSLOG_AT(metalift_oslog_error, OS_LOG_TYPE_ERROR)
METALIFT_OSLOG_AT(metalift_oslog_fault, OS_LOG_TYPE_FAULT)
