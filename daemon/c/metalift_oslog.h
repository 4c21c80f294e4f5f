/*
 * The functions daemon/c/oslog.c gives daemon/src/service/oslog.rs (macOS only).
 * Each logs one NUL-terminated, already-formatted string as "%{public}s".
 * daemon/c/oslog_test.c checks them on any host with clang.
 */
#ifndef METALIFT_OSLOG_H
#define METALIFT_OSLOG_H

typedef struct os_log_s *os_log_t;

os_log_t metalift_oslog_create(const char *subsystem, const char *category);
void metalift_oslog_default(os_log_t log, const char *message); /* persisted */
void metalift_oslog_info(os_log_t log, const char *message);    /* `log show --info` */
void metalift_oslog_debug(os_log_t log, const char *message);   /* `log show --debug` */
void metalift_oslog_error(os_log_t log, const char *message);   /* failures */
void metalift_oslog_fault(os_log_t log, const char *message);   /* bugs: panics */

#endif
