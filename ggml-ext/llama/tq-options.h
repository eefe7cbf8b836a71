/* tq-options.h - turboquant's options table (tq-options.def) as C: the row of each switch,
 * the one parser of its values and the one message for a value it does not know. C and
 * C++ (libllama, common, and ggml's C code can read a switch through it too).
 *
 *   tq_opt_parse(id, s)        the index of value s (aliases included), or -1
 *   tq_opt_env(id, &s)         the environment alias: an index, TQ_OPT_UNSET (unset or
 *                              empty) or -1 (s is then the unknown value)
 *   tq_opt_unknown(id, what, s, buf, n)
 *                              "turboquant: <what>=<s>: unknown value; valid: a, b, c",
 *                              what being the flag or the environment variable
 */
#pragma once

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

enum tq_changes { TQ_CHANGES_NO = 0, TQ_CHANGES_ROUNDING = 1, TQ_CHANGES_YES = 2 };
enum tq_read { TQ_READ_CONTEXT = 0, TQ_READ_PROCESS = 1 };

enum tq_opt {
#define TQ_OPTION(id, ...) TQ_OPT_##id,
#include "tq-options.def"
#undef TQ_OPTION
    TQ_OPT_COUNT
};

#define TQ_OPT_UNSET (-2)

struct tq_opt_row {
    const char * name;
    const char * flag;   /* NULL: environment only */
    const char * env;
    const char * field;  /* llama_context_params member, or NULL */
    const char * values; /* "a=alias|b|c" */
    const char * def;
    int results;         /* enum tq_changes */
    int state;
    int read;            /* enum tq_read */
    const char * help;
};

static inline const struct tq_opt_row * tq_opt_info(enum tq_opt id) {
    static const struct tq_opt_row rows[TQ_OPT_COUNT + 1] = {
#define TQ_FIELD(f) #f
#define TQ_NO_FIELD NULL
#define TQ_OPTION(id, name, flag, env, field, values, def, results, state, read, help) \
    { name, flag, env, field, values, def, results, state, read, help },
#include "tq-options.def"
#undef TQ_OPTION
#undef TQ_NO_FIELD
#undef TQ_FIELD
        { NULL, NULL, NULL, NULL, "", "", 0, 0, 0, NULL },
    };
    return &rows[(unsigned) id < TQ_OPT_COUNT ? (int) id : TQ_OPT_COUNT];
}

/* The spelling `alias` (0: the value's name, 1..: its aliases) of value `index`, as a pointer
   into the table and a length; NULL when there is none. */
static inline const char * tq_opt_spelling(enum tq_opt id, int index, int alias, size_t * len) {
    const char * p = tq_opt_info(id)->values;
    for (int i = 0; i < index; ++i) {
        p = strchr(p, '|');
        if (!p) return NULL;
        ++p;
    }
    const size_t seg = strcspn(p, "|");
    const char * end = p + seg;
    for (int a = 0; a < alias; ++a) {
        const char * q = (const char *) memchr(p, '=', (size_t) (end - p));
        if (!q) return NULL;
        p = q + 1;
    }
    *len = strcspn(p, "=|");
    return p;
}

static inline int tq_opt_n_values(enum tq_opt id) {
    size_t len;
    int n = 0;
    while (tq_opt_spelling(id, n, 0, &len)) ++n;
    return n;
}

/* The index of value s (its name or an alias), or -1. */
static inline int tq_opt_parse(enum tq_opt id, const char * s) {
    const size_t n = s ? strlen(s) : 0;
    for (int i = 0;; ++i) {
        size_t len;
        if (!tq_opt_spelling(id, i, 0, &len)) return -1;
        for (int a = 0;; ++a) {
            const char * p = tq_opt_spelling(id, i, a, &len);
            if (!p) break;
            if (s && len == n && memcmp(p, s, n) == 0) return i;
        }
    }
}

static inline int tq_opt_default(enum tq_opt id) { return tq_opt_parse(id, tq_opt_info(id)->def); }

/* The environment alias: the index of its value, TQ_OPT_UNSET where it is unset or empty,
   or -1 where it names no value (*raw: what it says, NULL when unset). */
static inline int tq_opt_env(enum tq_opt id, const char ** raw) {
    const char * e = getenv(tq_opt_info(id)->env);
    if (raw) *raw = e;
    if (!e || !*e) return TQ_OPT_UNSET;
    return tq_opt_parse(id, e);
}

/* "a, b, c": every spelling, the values' names first, then their aliases in turn. */
static inline void tq_opt_valid(enum tq_opt id, char * buf, size_t n) {
    size_t at = 0;
    if (n) buf[0] = '\0';
    for (int a = 0;; ++a) {
        int any = 0;
        for (int i = 0;; ++i) {
            size_t len;
            if (!tq_opt_spelling(id, i, 0, &len)) break;
            const char * p = tq_opt_spelling(id, i, a, &len);
            if (!p) continue;
            any = 1;
            if (at < n) {
                at += (size_t) snprintf(buf + at, n - at, "%s%.*s", at ? ", " : "", (int) len, p);
            }
        }
        if (!any) break;
    }
}

/* The one message for a value no parser knows: what is the flag, the environment variable
   or the context field that said it. */
static inline void tq_opt_unknown(enum tq_opt id, const char * what, const char * value, char * buf, size_t n) {
    char valid[256];
    tq_opt_valid(id, valid, sizeof valid);
    snprintf(buf, n, "turboquant: %s=%s: unknown value; valid: %s", what, value ? value : "", valid);
}

#ifdef __cplusplus
}

#include <string>

// tq_opt_unknown as a std::string (for an exception)
static inline std::string tq_opt_unknown_str(enum tq_opt id, const char * what, const char * value) {
    char buf[512];
    tq_opt_unknown(id, what, value, buf, sizeof buf);
    return buf;
}

// value `index`'s name (empty when there is no such value)
static inline std::string tq_opt_name(enum tq_opt id, int index) {
    size_t len = 0;
    const char * p = tq_opt_spelling(id, index, 0, &len);
    return p ? std::string(p, len) : std::string();
}
#endif
