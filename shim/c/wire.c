/*
 * wire.c — the shim's half of the check-in protocol (policy/src/wire.rs is the
 * reference): encode the check-in and the outcome, decode what the shim
 * receives (a verdict, or the daemon's Declined). The one C codec: the same
 * bodies travel on the Unix socket (after a length prefix) and over XPC (as
 * one data value, xpc.c).
 *
 * Held to wire.rs by the Rust crate metalift-shim, which compiles this file
 * into its tests (shim/tests/wire_cross.rs) and its fuzz target: the encoders
 * byte-exact with wire.rs; the decoder accepts only what decode_body accepts,
 * with the same values. Any other kind, known to wire.rs or not, is refused as
 * "not a verdict" without reading its fields: the shim never receives one.
 * Pure: no I/O, no allocation, no globals.
 */
#include "metalift_shim.h"


enum {
    TAG_SHIM_VERSION = 1,
    TAG_ARCH = 2,
    TAG_CLAIMED_EXE = 3,
    TAG_JOB = 9,
    TAG_DECISION_ID = 10,
    TAG_ACTION = 11,
    TAG_FAMILY_MAX = 12,
    TAG_TG_MEMORY = 13,
    TAG_WORKING_SET = 14,
    TAG_PROFILE = 15,
    TAG_RULE = 16,
    TAG_MODE = 17,
    TAG_WOULD_UNLOCK = 18,
    TAG_RESULT = 20,
    TAG_REASON = 21,
    TAG_DEVICE_CLASS = 22,
    TAG_STOCK_FAMILIES = 23,
    TAG_STOCK_TG = 24,
    TAG_STOCK_WS = 25,
    TAG_EFF_FAMILIES = 26,
    TAG_EFF_TG = 27,
    TAG_EFF_WS = 28,
    TAG_OTHER_SHIM_IMAGE = 29,
    TAG_OTHER_SHIM_METHODS = 31,
    TAG_OTHER_SHIM_PATCHED = 32,
    TAG_DECLINE_REASON = 40,
};

enum { KIND_DECLINED = 6 };

static const struct {
    const char *name;
    int64_t value;
} known_families[ML_KNOWN_FAMILIES] = {
    {"Apple1", 1001},  {"Apple2", 1002},  {"Apple3", 1003},  {"Apple4", 1004},
    {"Apple5", 1005},  {"Apple6", 1006},  {"Apple7", 1007},  {"Apple8", 1008},
    {"Apple9", 1009},  {"Apple10", 1010}, {"Mac2", 2002},    {"Common1", 3001},
    {"Common2", 3002}, {"Common3", 3003}, {"Metal3", 5001},  {"Metal4", 5002},
};

int64_t ml_known_family(unsigned index)
{
    return index < ML_KNOWN_FAMILIES ? known_families[index].value : 0;
}

const char *ml_known_family_name(unsigned index)
{
    return index < ML_KNOWN_FAMILIES ? known_families[index].name : "?";
}

static struct ml_wire_error ok(void)
{
    return (struct ml_wire_error){ML_WIRE_OK, NULL, 0};
}

static struct ml_wire_error err(enum ml_wire_status status, const char *field, uint64_t value)
{
    return (struct ml_wire_error){status, field, value};
}

/* Length of the longest valid UTF-8 prefix of s[0..len] (Rust's from_utf8 rules:
 * no overlongs, no surrogates, nothing above U+10FFFF). */
size_t ml_utf8_valid_prefix(const uint8_t *s, size_t len)
{
    size_t i = 0;
    while (i < len) {
        uint8_t c = s[i];
        size_t need;
        uint8_t lo = 0x80, hi = 0xBF;
        if (c < 0x80) {
            i++;
            continue;
        } else if (c >= 0xC2 && c <= 0xDF) {
            need = 1;
        } else if (c == 0xE0) {
            need = 2, lo = 0xA0;
        } else if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF) {
            need = 2;
        } else if (c == 0xED) {
            need = 2, hi = 0x9F;
        } else if (c == 0xF0) {
            need = 3, lo = 0x90;
        } else if (c >= 0xF1 && c <= 0xF3) {
            need = 3;
        } else if (c == 0xF4) {
            need = 3, hi = 0x8F;
        } else {
            return i;
        }
        if (len - i <= need)
            return i;
        if (s[i + 1] < lo || s[i + 1] > hi)
            return i;
        for (size_t k = 2; k <= need; k++)
            if (s[i + k] < 0x80 || s[i + k] > 0xBF)
                return i;
        i += need + 1;
    }
    return len;
}

/* ------------------------------------------------------------ decoding -- */

/* wire.rs Fields: at most one value per tag. */
struct fields {
    const uint8_t *value[256];
    uint16_t len[256];
    uint8_t present[256];
};

static struct ml_wire_error fields_parse(struct fields *f, const uint8_t *rest, size_t n)
{
    memset(f->present, 0, sizeof f->present);
    while (n > 0) {
        if (n < 3)
            return err(ML_WIRE_TRUNCATED, NULL, 0);
        uint8_t tag = rest[0];
        size_t len = (size_t)rest[1] | ((size_t)rest[2] << 8);
        if (n - 3 < len)
            return err(ML_WIRE_TRUNCATED, NULL, 0);
        if (f->present[tag])
            return err(ML_WIRE_BAD_FIELD, "repeated tag", 0);
        f->present[tag] = 1;
        f->value[tag] = rest + 3;
        f->len[tag] = (uint16_t)len;
        rest += 3 + len;
        n -= 3 + len;
    }
    return ok();
}

/* Fields::str: absent is fine; present must be UTF-8. */
static struct ml_wire_error f_str(const struct fields *f, int tag, const char *name,
                                  const char **out, size_t *out_len)
{
    if (out)
        *out = NULL;
    if (!f->present[tag])
        return ok();
    if (ml_utf8_valid_prefix(f->value[tag], f->len[tag]) != f->len[tag])
        return err(ML_WIRE_BAD_FIELD, name, 0);
    if (out) {
        *out = (const char *)f->value[tag];
        *out_len = f->len[tag];
    }
    return ok();
}

static uint64_t le64(const uint8_t *p)
{
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* Fields::u64: absent (*has = 0) or exactly 8 bytes. */
static struct ml_wire_error f_u64(const struct fields *f, int tag, const char *name, int *has,
                                  uint64_t *out)
{
    *has = f->present[tag];
    *out = 0;
    if (!*has)
        return ok();
    if (f->len[tag] != 8)
        return err(ML_WIRE_BAD_FIELD, name, 0);
    *out = le64(f->value[tag]);
    return ok();
}

static struct ml_wire_error f_required_u64(const struct fields *f, int tag, const char *name,
                                           uint64_t *out)
{
    int has;
    struct ml_wire_error e = f_u64(f, tag, name, &has, out);
    if (e.status != ML_WIRE_OK)
        return e;
    return has ? ok() : err(ML_WIRE_MISSING, name, 0);
}

static struct ml_wire_error f_required_u8(const struct fields *f, int tag, const char *name,
                                          uint8_t *out)
{
    if (!f->present[tag])
        return err(ML_WIRE_MISSING, name, 0);
    if (f->len[tag] != 1)
        return err(ML_WIRE_BAD_FIELD, name, 0);
    *out = f->value[tag][0];
    return ok();
}

static struct ml_wire_error f_flag(const struct fields *f, int tag, const char *name, uint8_t *out)
{
    *out = 0;
    if (!f->present[tag])
        return ok();
    if (f->len[tag] == 1 && f->value[tag][0] <= 1) {
        *out = f->value[tag][0];
        return ok();
    }
    return err(ML_WIRE_BAD_FIELD, name, 0);
}

#define TRY(expr)                                                                                  \
    do {                                                                                           \
        struct ml_wire_error e_ = (expr);                                                          \
        if (e_.status != ML_WIRE_OK)                                                               \
            return e_;                                                                             \
    } while (0)

static struct ml_wire_error decode_verdict_fields(const struct fields *f, struct ml_verdict *v)
{
    uint8_t action;
    int has;
    uint64_t max;
    memset(v, 0, sizeof *v);
    TRY(f_required_u8(f, TAG_ACTION, "action", &action));
    if (action > 1)
        return err(ML_WIRE_BAD_FIELD, "action", 0);
    v->unlock = action;
    TRY(f_u64(f, TAG_FAMILY_MAX, "apple_family_max", &has, &max));
    if (has) {
        if (max > 255)
            return err(ML_WIRE_BAD_FIELD, "apple_family_max", 0);
        int has_tg, has_ws;
        TRY(f_u64(f, TAG_TG_MEMORY, "max_threadgroup_memory", &has_tg, &v->tg_memory));
        if (!has_tg)
            return err(ML_WIRE_MISSING, "max_threadgroup_memory", 0);
        TRY(f_u64(f, TAG_WORKING_SET, "recommended_working_set", &has_ws, &v->working_set));
        v->has_caps = 1;
        v->family_max = (uint8_t)max;
        v->has_ws = (uint8_t)has_ws;
    }
    if (v->unlock && !v->has_caps)
        return err(ML_WIRE_MISSING, "apple_family_max", 0);
    TRY(f_required_u64(f, TAG_DECISION_ID, "decision_id", &v->decision_id));
    TRY(f_str(f, TAG_PROFILE, "profile", &v->profile, &v->profile_len));
    TRY(f_str(f, TAG_RULE, "rule", &v->rule, &v->rule_len));
    uint8_t mode;
    TRY(f_required_u8(f, TAG_MODE, "mode", &mode));
    if (mode > 1)
        return err(ML_WIRE_BAD_FIELD, "mode", 0);
    v->monitor = mode;
    TRY(f_flag(f, TAG_WOULD_UNLOCK, "would_unlock", &v->would_unlock));
    return ok();
}

/* wire.rs Declined: the reason byte (1 use the socket, 2 busy), then the
 * detail text, which must be UTF-8 as for Rust (it is not kept: session.c
 * words the refusal itself). */
static struct ml_wire_error decode_declined_fields(const struct fields *f)
{
    uint8_t reason;
    TRY(f_required_u8(f, TAG_DECLINE_REASON, "decline_reason", &reason));
    if (reason != ML_DECLINED_USE_SOCKET && reason != ML_DECLINED_BUSY)
        return err(ML_WIRE_BAD_FIELD, "decline_reason", 0);
    TRY(f_str(f, TAG_REASON, "reason", NULL, NULL));
    return err(ML_WIRE_DECLINED, NULL, reason);
}

struct ml_wire_error ml_wire_frame_length(const uint8_t prefix[4], size_t *len)
{
    uint32_t n = (uint32_t)prefix[0] | ((uint32_t)prefix[1] << 8) | ((uint32_t)prefix[2] << 16) |
                 ((uint32_t)prefix[3] << 24);
    *len = n;
    if (n > ML_WIRE_MAX_FRAME)
        return err(ML_WIRE_OVERSIZE, NULL, n);
    if (n < 2)
        return err(ML_WIRE_TRUNCATED, NULL, 0);
    return ok();
}

struct ml_wire_error ml_wire_decode_verdict(const uint8_t *body, size_t len, struct ml_verdict *out)
{
    struct fields f;
    memset(out, 0, sizeof *out);
    if (len > ML_WIRE_MAX_FRAME)
        return err(ML_WIRE_OVERSIZE, NULL, len);
    if (len < 1)
        return err(ML_WIRE_TRUNCATED, NULL, 0);
    if (body[0] != ML_WIRE_PROTOCOL)
        return err(ML_WIRE_VERSION, NULL, body[0]);
    if (len < 2)
        return err(ML_WIRE_TRUNCATED, NULL, 0);
    uint8_t kind = body[1];
    if (kind != ML_WIRE_KIND_VERDICT && kind != KIND_DECLINED)
        return err(ML_WIRE_NOT_VERDICT, NULL, kind);
    TRY(fields_parse(&f, body + 2, len - 2));
    if (kind == KIND_DECLINED)
        return decode_declined_fields(&f);
    struct ml_verdict v;
    TRY(decode_verdict_fields(&f, &v));
    *out = v;
    return ok();
}

/* ------------------------------------------------------------ encoding -- */

/* wire.rs Body: a frame under construction, never longer than `limit`. */
struct body {
    uint8_t *buf;
    size_t len;
    size_t limit; /* min(cap, MAX_FRAME + PREFIX) */
};

static void body_start(struct body *b, uint8_t *buf, size_t cap, uint8_t kind)
{
    b->buf = buf;
    b->limit = cap < ML_WIRE_MAX_FRAME + ML_WIRE_PREFIX ? cap : ML_WIRE_MAX_FRAME + ML_WIRE_PREFIX;
    memset(buf, 0, ML_WIRE_PREFIX);
    buf[4] = ML_WIRE_PROTOCOL;
    buf[5] = kind;
    b->len = 6;
}

static size_t body_room(const struct body *b)
{
    return b->limit > b->len + 3 ? b->limit - (b->len + 3) : 0;
}

static void body_field(struct body *b, uint8_t tag, const uint8_t *value, size_t len)
{
    size_t room = body_room(b);
    if (room == 0)
        return;
    if (len > room)
        len = room;
    if (len > 0xFFFF)
        len = 0xFFFF;
    b->buf[b->len] = tag;
    b->buf[b->len + 1] = (uint8_t)(len & 0xFF);
    b->buf[b->len + 2] = (uint8_t)(len >> 8);
    memcpy(b->buf + b->len + 3, value, len);
    b->len += 3 + len;
}

/* Body::str: cut at a character boundary to fit (invalid UTF-8 is cut at the
 * first bad byte: Rust strings cannot hold it). */
static void body_str(struct body *b, uint8_t tag, const char *s)
{
    const uint8_t *p = (const uint8_t *)s;
    size_t n = ml_utf8_valid_prefix(p, strlen(s));
    size_t room = body_room(b);
    size_t end = n;
    if (end > room)
        end = room;
    if (end > 0xFFFF)
        end = 0xFFFF;
    while (end > 0 && end < n && (p[end] & 0xC0) == 0x80)
        end--;
    body_field(b, tag, p, end);
}

static void body_u64(struct body *b, uint8_t tag, uint64_t v)
{
    uint8_t le[8];
    for (int i = 0; i < 8; i++)
        le[i] = (uint8_t)(v >> (8 * i));
    body_field(b, tag, le, 8);
}

static void body_u8(struct body *b, uint8_t tag, uint8_t v)
{
    body_field(b, tag, &v, 1);
}

static size_t body_finish(struct body *b)
{
    uint32_t n = (uint32_t)(b->len - ML_WIRE_PREFIX);
    for (int i = 0; i < 4; i++)
        b->buf[i] = (uint8_t)(n >> (8 * i));
    return b->len;
}

size_t ml_wire_encode_check_in(uint8_t *buf, size_t cap, const char *shim_version,
                               const char *arch, const char *claimed)
{
    return ml_wire_encode_check_in_job(buf, cap, shim_version, arch, claimed, NULL);
}

size_t ml_wire_encode_check_in_job(uint8_t *buf, size_t cap, const char *shim_version,
                                   const char *arch, const char *claimed, const char *job)
{
    struct body b;
    body_start(&b, buf, cap, ML_WIRE_KIND_CHECK_IN);
    body_str(&b, TAG_SHIM_VERSION, shim_version);
    body_str(&b, TAG_ARCH, arch);
    if (claimed)
        body_str(&b, TAG_CLAIMED_EXE, claimed);
    if (job && job[0] != '\0')
        body_str(&b, TAG_JOB, job);
    return body_finish(&b);
}

size_t ml_wire_encode_outcome(uint8_t *buf, size_t cap, const struct ml_outcome *o)
{
    struct body b;
    body_start(&b, buf, cap, ML_WIRE_KIND_OUTCOME);
    body_u64(&b, TAG_DECISION_ID, o->decision_id);
    body_u8(&b, TAG_RESULT, o->result);
    body_str(&b, TAG_REASON, o->reason ? o->reason : "");
    body_str(&b, TAG_DEVICE_CLASS, o->device_class ? o->device_class : "");
    body_u64(&b, TAG_STOCK_FAMILIES, o->stock.families);
    body_u64(&b, TAG_STOCK_TG, o->stock.threadgroup_memory);
    body_u64(&b, TAG_STOCK_WS, o->stock.working_set);
    body_u64(&b, TAG_EFF_FAMILIES, o->effective.families);
    body_u64(&b, TAG_EFF_TG, o->effective.threadgroup_memory);
    body_u64(&b, TAG_EFF_WS, o->effective.working_set);
    if (o->other.image != NULL) {
        body_str(&b, TAG_OTHER_SHIM_IMAGE, o->other.image);
        body_str(&b, TAG_OTHER_SHIM_METHODS, o->other.methods ? o->other.methods : "");
        body_u8(&b, TAG_OTHER_SHIM_PATCHED, o->other.patched);
    }
    return body_finish(&b);
}

/* ------------------------------------------------------- capabilities -- */

bool ml_caps_supports_family(const struct ml_verdict *v, int64_t family, bool stock)
{
    return stock || (family > 1000 && family <= 1000 + (int64_t)v->family_max);
}

struct ml_answers ml_expected_answers(const struct ml_verdict *v, struct ml_answers stock)
{
    struct ml_answers out = stock;
    out.families = 0;
    for (unsigned i = 0; i < ML_KNOWN_FAMILIES; i++) {
        bool was = (stock.families >> i) & 1u;
        if (ml_caps_supports_family(v, known_families[i].value, was))
            out.families |= 1u << i;
    }
    if (v->tg_memory > out.threadgroup_memory)
        out.threadgroup_memory = v->tg_memory;
    if (v->has_ws && v->working_set > out.working_set)
        out.working_set = v->working_set;
    return out;
}
