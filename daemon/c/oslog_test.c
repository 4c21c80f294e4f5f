/*
 * Runs daemon/c/oslog.c on the build host (clang implements
 * __builtin_os_log_format on every target) against fake libSystem functions,
 * and checks what would reach the unified log: the type byte per level, the
 * format "%{public}s", and the argument buffer clang built, whose header must
 * say "one argument, a PUBLIC string, pointer-sized" (02 01 22 08) followed by
 * the message pointer. Nothing is logged when the level is disabled.
 *
 *   clang-22 -o oslog_test daemon/c/oslog_test.c daemon/c/oslog.c && ./oslog_test
 *
 * Run by scripts/macos-check.sh (CI). Exit status 0 when every check holds.
 */
#include <stdio.h>
#include <string.h>

typedef struct os_log_s *os_log_t;
struct os_log_s {
    int enabled;
};
static struct os_log_s fake_log = {1};

static int calls;
static unsigned char seen_type;
static const char *seen_format;
static unsigned char seen_buf[64];
static unsigned int seen_size;

os_log_t os_log_create(const char *subsystem, const char *category) {
    return strcmp(subsystem, "com.metalift") == 0 && strcmp(category, "daemon") == 0
               ? &fake_log
               : NULL;
}

_Bool os_log_type_enabled(os_log_t log, unsigned char type) {
    (void)type;
    return log->enabled;
}

void _os_log_impl(void *dso, os_log_t log, unsigned char type, const char *format,
                  unsigned char *buf, unsigned int size) {
    (void)dso;
    (void)log;
    calls++;
    seen_type = type;
    seen_format = format;
    seen_size = size < sizeof seen_buf ? size : sizeof seen_buf;
    memcpy(seen_buf, buf, seen_size);
}

os_log_t metalift_oslog_create(const char *subsystem, const char *category);
void metalift_oslog_default(os_log_t log, const char *message);
void metalift_oslog_info(os_log_t log, const char *message);
void metalift_oslog_debug(os_log_t log, const char *message);
void metalift_oslog_error(os_log_t log, const char *message);
void metalift_oslog_fault(os_log_t log, const char *message);

static int failures;
#define CHECK(cond)                                                                \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "oslog_test: FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
            failures++;                                                            \
        }                                                                          \
    } while (0)

int main(void) {
    static const struct {
        void (*fn)(os_log_t, const char *);
        unsigned char type;
    } levels[] = {
        {metalift_oslog_default, 0x00}, {metalift_oslog_info, 0x01},
        {metalift_oslog_debug, 0x02},   {metalift_oslog_error, 0x10},
        {metalift_oslog_fault, 0x11},
    };
    const char *message = "metaliftd: exe=/opt/llama/bin/llama-server rule=llama verdict=unlock";
    os_log_t log = metalift_oslog_create("com.metalift", "daemon");
    CHECK(log == &fake_log);
    for (size_t i = 0; i < sizeof levels / sizeof levels[0]; i++) {
        calls = 0;
        levels[i].fn(log, message);
        CHECK(calls == 1);
        CHECK(seen_type == levels[i].type);
        CHECK(seen_format != NULL && strcmp(seen_format, "%{public}s") == 0);
        CHECK(seen_size == 4 + sizeof(const char *));
        /* summary 0x02 (has a non-scalar), 1 argument, descriptor 0x22
         * (string | public), 8 bytes. */
        CHECK(seen_buf[0] == 0x02 && seen_buf[1] == 0x01);
        CHECK(seen_buf[2] == 0x22 && seen_buf[3] == sizeof(const char *));
        const char *passed = NULL;
        memcpy(&passed, seen_buf + 4, sizeof passed);
        CHECK(passed == message);
    }
    fake_log.enabled = 0;
    calls = 0;
    metalift_oslog_error(log, message);
    CHECK(calls == 0);
    if (failures == 0) {
        printf("oslog_test: ok (5 levels, public string argument)\n");
    }
    return failures == 0 ? 0 : 1;
}
