/*
 * xpc_dict.c — the check-in protocol's messages on an XPC dictionary: the C
 * twin of xpc/src/dict.rs (its key table is the reference), as wire.c is the
 * twin of policy/src/wire.rs. The shim crate's tests run this file on Linux
 * against an in-memory stand-in for libxpc's dictionary functions and compare
 * every answer with dict.rs (shim/tests/xpc_cross.rs).
 *
 * Encoding cuts strings to the protocol's shared string budget (MAX_FRAME
 * bytes, at a character boundary) as dict.rs's Writer does; decoding is as
 * strict as dict.rs's decode: a wrong value type, a bad enum word, an unlock
 * without capabilities, too many string bytes, or a string that is not UTF-8
 * is refused with the same WireError variant and field name.
 */
#include "metalift_shim.h"

#if defined(__APPLE__) || defined(ML_XPC_FAKE)

/* ------------------------------------------------------------ encode -- */

struct writer {
    xpc_object_t dict;
    size_t budget; /* string bytes still allowed in this message */
};

static void put_str(struct writer *w, const char *key, const char *value)
{
    char cut[ML_WIRE_MAX_FRAME + 1];
    size_t len = strlen(value);
    if (len > w->budget)
        len = w->budget;
    len = ml_utf8_valid_prefix((const uint8_t *)value, len);
    memcpy(cut, value, len);
    cut[len] = '\0';
    w->budget -= len;
    xpc_dictionary_set_string(w->dict, key, cut);
}

static struct writer start(xpc_object_t dict, const char *kind)
{
    struct writer w = {dict, ML_WIRE_MAX_FRAME};
    xpc_dictionary_set_uint64(dict, "metalift.version", ML_WIRE_PROTOCOL);
    put_str(&w, "kind", kind);
    return w;
}

void ml_xpc_encode_check_in(xpc_object_t dict, const char *shim_version, const char *arch)
{
    struct writer w = start(dict, "check_in");
    put_str(&w, "shim_version", shim_version);
    put_str(&w, "arch", arch);
}

void ml_xpc_encode_job(xpc_object_t dict, const char *job)
{
    if (job != NULL && job[0] != '\0')
        xpc_dictionary_set_string(dict, "job", job); /* job.c bounds it below the frame */
}

void ml_xpc_encode_outcome(xpc_object_t dict, const struct ml_outcome *o)
{
    static const char *const results[] = {"applied", "stock", "failed"};
    struct writer w = start(dict, "outcome");
    xpc_dictionary_set_uint64(dict, "decision_id", o->decision_id);
    put_str(&w, "result", results[o->result <= ML_RESULT_FAILED ? o->result : ML_RESULT_FAILED]);
    put_str(&w, "reason", o->reason);
    put_str(&w, "device_class", o->device_class);
    xpc_dictionary_set_uint64(dict, "stock_families", o->stock.families);
    xpc_dictionary_set_uint64(dict, "stock_threadgroup_memory", o->stock.threadgroup_memory);
    xpc_dictionary_set_uint64(dict, "stock_working_set", o->stock.working_set);
    xpc_dictionary_set_uint64(dict, "effective_families", o->effective.families);
    xpc_dictionary_set_uint64(dict, "effective_threadgroup_memory",
                              o->effective.threadgroup_memory);
    xpc_dictionary_set_uint64(dict, "effective_working_set", o->effective.working_set);
    if (o->other.image != NULL) {
        put_str(&w, "other_shim_image", o->other.image);
        put_str(&w, "other_shim_methods", o->other.methods ? o->other.methods : "");
        put_str(&w, "other_shim_patched", o->other.patched == ML_OTHER_AFTER ? "after" : "before");
    }
}

/* ------------------------------------------------------------ decode -- */

struct reader {
    xpc_object_t dict;
    size_t budget;
};

static struct ml_wire_error ok(void)
{
    return (struct ml_wire_error){ML_WIRE_OK, NULL, 0};
}

static struct ml_wire_error fail(enum ml_wire_status status, const char *field, uint64_t value)
{
    return (struct ml_wire_error){status, field, value};
}

/* dict.rs Reader::u64: absent -> *has = 0; another type -> BadField. */
static struct ml_wire_error get_u64(struct reader *r, const char *key, bool *has, uint64_t *out)
{
    xpc_object_t v = xpc_dictionary_get_value(r->dict, key);
    *has = false;
    if (v == NULL)
        return ok();
    if (xpc_get_type(v) != &_xpc_type_uint64)
        return fail(ML_WIRE_BAD_FIELD, key, 0);
    *has = true;
    *out = xpc_uint64_get_value(v);
    return ok();
}

static struct ml_wire_error get_bool(struct reader *r, const char *key, bool *has, bool *out)
{
    xpc_object_t v = xpc_dictionary_get_value(r->dict, key);
    *has = false;
    if (v == NULL)
        return ok();
    if (xpc_get_type(v) != &_xpc_type_bool)
        return fail(ML_WIRE_BAD_FIELD, key, 0);
    *has = true;
    *out = xpc_bool_get_value(v);
    return ok();
}

/* dict.rs Reader::str: charged to the shared budget; a string longer than
 * MAX_FRAME is Oversize(its length), one over the rest of the budget is
 * Oversize(bytes so far + its length); not UTF-8 is BadField. */
static struct ml_wire_error get_str(struct reader *r, const char *key, const char **out,
                                    size_t *len)
{
    xpc_object_t v = xpc_dictionary_get_value(r->dict, key);
    *out = NULL;
    *len = 0;
    if (v == NULL)
        return ok();
    if (xpc_get_type(v) != &_xpc_type_string)
        return fail(ML_WIRE_BAD_FIELD, key, 0);
    size_t n = xpc_string_get_length(v);
    if (n > ML_WIRE_MAX_FRAME)
        return fail(ML_WIRE_OVERSIZE, NULL, n);
    if (n > r->budget)
        return fail(ML_WIRE_OVERSIZE, NULL, ML_WIRE_MAX_FRAME - r->budget + n);
    r->budget -= n;
    const char *s = xpc_string_get_string_ptr(v);
    if (s == NULL || ml_utf8_valid_prefix((const uint8_t *)s, n) != n)
        return fail(ML_WIRE_BAD_FIELD, key, 0);
    *out = s;
    *len = n;
    return ok();
}

static bool is(const char *s, size_t len, const char *word)
{
    return s != NULL && len == strlen(word) && memcmp(s, word, len) == 0;
}

#define TRY(call)                                                                                  \
    do {                                                                                           \
        struct ml_wire_error e_ = (call);                                                          \
        if (e_.status != ML_WIRE_OK)                                                               \
            return e_;                                                                             \
    } while (0)

/* The message kinds dict.rs knows, with their wire kind byte. */
static const struct {
    const char *word;
    uint8_t kind;
} kinds[] = {
    {"check_in", ML_WIRE_KIND_CHECK_IN}, {"verdict", ML_WIRE_KIND_VERDICT},
    {"outcome", ML_WIRE_KIND_OUTCOME},   {"status_request", 4},
    {"status", 5},                       {"declined", 6},
};

/* Another message than a verdict: what decode would say of it, or NOT_VERDICT.
 * (Only the strictness that decides Ok/Err matters: their fields are read as
 * decode reads them.) */
static struct ml_wire_error other_kind(struct reader *r, uint8_t kind)
{
    bool has;
    uint64_t n;
    const char *s;
    size_t len;
    if (kind == ML_WIRE_KIND_CHECK_IN) {
        TRY(get_str(r, "shim_version", &s, &len));
        TRY(get_str(r, "arch", &s, &len));
        TRY(get_str(r, "claimed_executable", &s, &len));
    } else if (kind == ML_WIRE_KIND_OUTCOME) {
        TRY(get_u64(r, "decision_id", &has, &n));
        if (!has)
            return fail(ML_WIRE_MISSING, "decision_id", 0);
        TRY(get_str(r, "result", &s, &len));
        if (s == NULL)
            return fail(ML_WIRE_MISSING, "result", 0);
        if (!is(s, len, "applied") && !is(s, len, "stock") && !is(s, len, "failed"))
            return fail(ML_WIRE_BAD_FIELD, "result", 0);
        TRY(get_str(r, "reason", &s, &len));
        TRY(get_str(r, "device_class", &s, &len));
        static const char *const answers[] = {
            "stock_families",     "stock_threadgroup_memory",     "stock_working_set",
            "effective_families", "effective_threadgroup_memory", "effective_working_set"};
        for (size_t i = 0; i < sizeof answers / sizeof answers[0]; i++) {
            TRY(get_u64(r, answers[i], &has, &n));
            if (has && (i == 0 || i == 3) && n > UINT32_MAX)
                return fail(ML_WIRE_BAD_FIELD, answers[i], 0);
        }
        /* dict.rs other_shim: methods, then the order word, then the image. */
        TRY(get_str(r, "other_shim_methods", &s, &len));
        TRY(get_str(r, "other_shim_patched", &s, &len));
        bool has_patched = s != NULL;
        if (s != NULL && !is(s, len, "before") && !is(s, len, "after"))
            return fail(ML_WIRE_BAD_FIELD, "other_shim_patched", 0);
        TRY(get_str(r, "other_shim_image", &s, &len));
        if (s != NULL && !has_patched)
            return fail(ML_WIRE_MISSING, "other_shim_patched", 0);
    } else if (kind == 5) {
        TRY(get_str(r, "json", &s, &len));
    } else if (kind == 6) {
        TRY(get_str(r, "decline", &s, &len));
        if (s == NULL)
            return fail(ML_WIRE_MISSING, "decline", 0);
        uint8_t reason = is(s, len, "use_socket") ? ML_DECLINED_USE_SOCKET
                         : is(s, len, "busy")     ? ML_DECLINED_BUSY
                                                  : 0;
        if (reason == 0)
            return fail(ML_WIRE_BAD_FIELD, "decline", 0);
        TRY(get_str(r, "reason", &s, &len));
        return fail(ML_WIRE_DECLINED, NULL, reason);
    }
    return fail(ML_WIRE_NOT_VERDICT, NULL, kind);
}

struct ml_wire_error ml_xpc_decode_verdict(xpc_object_t dict, struct ml_verdict *out)
{
    struct reader r = {dict, ML_WIRE_MAX_FRAME};
    bool has;
    uint64_t n;
    const char *s;
    size_t len;
    memset(out, 0, sizeof *out);
    TRY(get_u64(&r, "metalift.version", &has, &n));
    if (!has)
        return fail(ML_WIRE_MISSING, "metalift.version", 0);
    if (n != ML_WIRE_PROTOCOL)
        return fail(ML_WIRE_VERSION, NULL, n > 255 ? 255 : n);
    TRY(get_str(&r, "kind", &s, &len));
    if (s == NULL)
        return fail(ML_WIRE_MISSING, "kind", 0);
    uint8_t kind = 0;
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++)
        if (is(s, len, kinds[i].word))
            kind = kinds[i].kind;
    if (kind == 0)
        return fail(ML_WIRE_BAD_FIELD, "kind", 0);
    if (kind != ML_WIRE_KIND_VERDICT)
        return other_kind(&r, kind);

    /* dict.rs's order: action, capabilities, decision_id, profile, rule, mode,
     * would_unlock (the order decides which error a message with two gets). */
    TRY(get_str(&r, "action", &s, &len));
    if (s == NULL)
        return fail(ML_WIRE_MISSING, "action", 0);
    if (is(s, len, "unlock"))
        out->unlock = 1;
    else if (!is(s, len, "stock"))
        return fail(ML_WIRE_BAD_FIELD, "action", 0);
    TRY(get_u64(&r, "apple_family_max", &has, &n));
    if (has) {
        if (n > 255)
            return fail(ML_WIRE_BAD_FIELD, "apple_family_max", 0);
        out->has_caps = 1;
        out->family_max = (uint8_t)n;
        TRY(get_u64(&r, "max_threadgroup_memory", &has, &out->tg_memory));
        if (!has)
            return fail(ML_WIRE_MISSING, "max_threadgroup_memory", 0);
        TRY(get_u64(&r, "recommended_working_set", &has, &out->working_set));
        out->has_ws = has ? 1 : 0;
    }
    if (out->unlock && !out->has_caps)
        return fail(ML_WIRE_MISSING, "apple_family_max", 0);
    TRY(get_u64(&r, "decision_id", &has, &out->decision_id));
    if (!has)
        return fail(ML_WIRE_MISSING, "decision_id", 0);
    TRY(get_str(&r, "profile", &out->profile, &out->profile_len));
    TRY(get_str(&r, "rule", &out->rule, &out->rule_len));
    TRY(get_str(&r, "mode", &s, &len));
    if (s == NULL)
        return fail(ML_WIRE_MISSING, "mode", 0);
    if (is(s, len, "monitor"))
        out->monitor = 1;
    else if (!is(s, len, "enforce"))
        return fail(ML_WIRE_BAD_FIELD, "mode", 0);
    bool would = false;
    TRY(get_bool(&r, "would_unlock", &has, &would));
    out->would_unlock = would ? 1 : 0;
    return ok();
}

#endif /* __APPLE__ || ML_XPC_FAKE */
