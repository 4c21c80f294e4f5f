/*
 * job.c — the job this process says it runs in: the allow-listed
 * environment variables of policy/src/job.rs (JOB_VARIABLES), read at check-in
 * (never in the constructor) and sent as one advisory `job` field of
 * NAME=value lines. The daemon records them under the decision's advisory and
 * never matches on them, so nothing here can unlock anything.
 *
 * Bounded like job.rs: a value is kept only if it is 1..ML_JOB_VALUE_MAX bytes
 * of valid UTF-8 with no control character; the whole text fits the caller's
 * buffer (at most ML_JOB_CLAIMS_MAX). No allocation: getenv and memcpy.
 */
#include "metalift_shim.h"


static const char *const job_variables[] = {
    "METALIFT_JOB_ID", "METALIFT_JOB_URL",
    "GITHUB_RUN_ID",   "GITHUB_RUN_ATTEMPT", "GITHUB_JOB",        "GITHUB_REPOSITORY",
    "RUNNER_NAME",     "CI_JOB_ID",          "CI_PIPELINE_ID",    "CI_PROJECT_PATH",
    "BUILDKITE_JOB_ID", "BUILDKITE_BUILD_ID", "BUILD_TAG",
};

/* Whether `value` (len bytes) may be claimed: job.rs parse keeps exactly these. */
static bool value_ok(const char *value, size_t len)
{
    if (len == 0 || len > ML_JOB_VALUE_MAX)
        return false;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)value[i];
        if (c < 0x20 || c == 0x7F)
            return false;
    }
    /* C1 controls (U+0080..U+009F) are control characters to Rust too. */
    for (size_t i = 0; i + 1 < len; i++) {
        if ((unsigned char)value[i] == 0xC2 && (unsigned char)value[i + 1] >= 0x80 &&
            (unsigned char)value[i + 1] <= 0x9F)
            return false;
    }
    return ml_utf8_valid_prefix((const uint8_t *)value, len) == len;
}

size_t ml_job_format(char *buf, size_t cap, const char *(*lookup)(const char *name))
{
    size_t n = 0;
    if (cap == 0)
        return 0;
    if (cap > ML_JOB_CLAIMS_MAX)
        cap = ML_JOB_CLAIMS_MAX;
    buf[0] = '\0';
    for (size_t i = 0; i < sizeof job_variables / sizeof job_variables[0]; i++) {
        const char *name = job_variables[i];
        const char *value = lookup(name);
        if (value == NULL)
            continue;
        size_t name_len = strlen(name), value_len = strlen(value);
        if (!value_ok(value, value_len))
            continue;
        size_t need = (n > 0 ? 1 : 0) + name_len + 1 + value_len;
        if (n + need + 1 > cap)
            continue; /* a later, shorter claim may still fit */
        if (n > 0)
            buf[n++] = '\n';
        memcpy(buf + n, name, name_len);
        n += name_len;
        buf[n++] = '=';
        memcpy(buf + n, value, value_len);
        n += value_len;
        buf[n] = '\0';
    }
    return n;
}

static const char *env_lookup(const char *name)
{
    return getenv(name);
}

size_t ml_job_claims(char *buf, size_t cap)
{
    return ml_job_format(buf, cap, env_lookup);
}
