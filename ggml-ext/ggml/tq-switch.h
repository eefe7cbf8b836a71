/* tq-switch.h - the one parser of every turboquant switch, and the switches ggml reads
 * (tq-switches.def). C, C++ and CUDA, at ggml's level: it includes no llama header; llama's
 * options (ggml-ext/llama/tq-options.h) are rows of the same format and go through the same
 * functions.
 *
 *   tq_row_parse(row, s)         the index of value s (its name or an alias), or -1
 *   tq_row_unknown(row, what, s, buf, n)
 *                                "turboquant: <what>=<s>: unknown value; valid: a, b, c",
 *                                what being the flag, the environment variable or the field
 *   tq_switch_get(id)            a ggml switch's value: the index of its environment
 *                                variable's value, the default where it is unset or empty.
 *                                ggml's readers have no way to return an error, so a value
 *                                the row does not know stops the process with the message
 *                                (GGML_ABORT, ggml's error style), rather than compute with
 *                                another value. Under llama, context creation refuses it
 *                                first, with the same message.
 */
#ifndef TQ_SWITCH_H
#define TQ_SWITCH_H

#include "ggml.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

enum tq_changes { TQ_CHANGES_NO = 0, TQ_CHANGES_ROUNDING = 1, TQ_CHANGES_YES = 2 };
enum tq_read { TQ_READ_CONTEXT = 0, TQ_READ_PROCESS = 1 };

/* One row of tq-switches.def or tq-options.def (the columns are documented there). */
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

/* The spelling `alias` (0: the value's name, 1..: its aliases) of value `index`, as a pointer
   into the row and a length; NULL when there is none. */
static inline const char * tq_row_spelling(const struct tq_opt_row * r, int index, int alias, size_t * len) {
    const char * p = r->values;
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

static inline int tq_row_n_values(const struct tq_opt_row * r) {
    size_t len;
    int n = 0;
    while (tq_row_spelling(r, n, 0, &len)) ++n;
    return n;
}

/* The index of value s (its name or an alias: exact strings), or -1. */
static inline int tq_row_parse(const struct tq_opt_row * r, const char * s) {
    const size_t n = s ? strlen(s) : 0;
    for (int i = 0;; ++i) {
        size_t len;
        if (!tq_row_spelling(r, i, 0, &len)) return -1;
        for (int a = 0;; ++a) {
            const char * p = tq_row_spelling(r, i, a, &len);
            if (!p) break;
            if (s && len == n && memcmp(p, s, n) == 0) return i;
        }
    }
}

#define TQ_OPT_UNSET (-2)

/* The row's environment variable: the index of its value, TQ_OPT_UNSET where it is unset or
   empty, or -1 where it names no value (*raw: what it says, NULL when unset). */
static inline int tq_row_env(const struct tq_opt_row * r, const char ** raw) {
    const char * e = getenv(r->env);
    if (raw) *raw = e;
    if (!e || !*e) return TQ_OPT_UNSET;
    return tq_row_parse(r, e);
}

/* "a, b, c": every spelling, the values' names first, then their aliases in turn. */
static inline void tq_row_valid(const struct tq_opt_row * r, char * buf, size_t n) {
    size_t at = 0;
    if (n) buf[0] = '\0';
    for (int a = 0;; ++a) {
        int any = 0;
        for (int i = 0;; ++i) {
            size_t len;
            if (!tq_row_spelling(r, i, 0, &len)) break;
            const char * p = tq_row_spelling(r, i, a, &len);
            if (!p) continue;
            any = 1;
            if (at < n) {
                at += (size_t) snprintf(buf + at, n - at, "%s%.*s", at ? ", " : "", (int) len, p);
            }
        }
        if (!any) break;
    }
}

/* The one message for a value no parser knows: `what` is the flag, the environment variable
   or the context field that said it. */
static inline void tq_row_unknown(const struct tq_opt_row * r, const char * what, const char * value, char * buf,
                                  size_t n) {
    char valid[256];
    tq_row_valid(r, valid, sizeof valid);
    snprintf(buf, n, "turboquant: %s=%s: unknown value; valid: %s", what, value ? value : "", valid);
}

/* ggml's switches. */
enum tq_switch {
#define TQ_OPTION(id, ...) TQ_SW_##id,
#include "tq-switches.def"
#undef TQ_OPTION
    TQ_SW_COUNT
};

static inline const struct tq_opt_row * tq_switch_info(enum tq_switch id) {
    static const struct tq_opt_row rows[TQ_SW_COUNT + 1] = {
#define TQ_NO_FIELD NULL
#define TQ_OPTION(id, name, flag, env, field, values, def, results, state, read, help) \
    { name, flag, env, field, values, def, results, state, read, help },
#include "tq-switches.def"
#undef TQ_OPTION
#undef TQ_NO_FIELD
        { NULL, NULL, NULL, NULL, "", "", 0, 0, 0, NULL },
    };
    return &rows[(unsigned) id < TQ_SW_COUNT ? (int) id : TQ_SW_COUNT];
}

/* A ggml switch's value index (see the top); not cached: each reader keeps what it read. */
static inline int tq_switch_get(enum tq_switch id) {
    const struct tq_opt_row * r = tq_switch_info(id);
    const char * raw = NULL;
    const int v = tq_row_env(r, &raw);
    if (v == TQ_OPT_UNSET) return tq_row_parse(r, r->def);
    if (v < 0) {
        char msg[512];
        tq_row_unknown(r, r->env, raw, msg, sizeof msg);
        GGML_ABORT("%s", msg);
    }
    return v;
}

#ifdef __cplusplus
}
#endif

#endif /* TQ_SWITCH_H */
