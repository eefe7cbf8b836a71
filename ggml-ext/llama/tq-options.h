/* tq-options.h - turboquant's options table (tq-options.def, which ends with ggml's own
 * switches, ggml-ext/ggml/tq-switches.def) as C: the row of each switch, and the one parser
 * of its values and the one message for a value it does not know, which are ggml's
 * (tq-switch.h): every switch, llama's and ggml's, goes through the same functions. C and
 * C++ (libllama, common).
 *
 *   tq_opt_parse(id, s)        the index of value s (aliases included), or -1
 *   tq_opt_env(id, &s)         the environment alias: an index, TQ_OPT_UNSET (unset or
 *                              empty) or -1 (s is then the unknown value)
 *   tq_opt_unknown(id, what, s, buf, n)
 *                              "turboquant: <what>=<s>: unknown value; valid: a, b, c",
 *                              what being the flag or the environment variable
 */
#pragma once

#include "tq-switch.h"

#ifdef __cplusplus
extern "C" {
#endif

enum tq_opt {
#define TQ_OPTION(id, ...) TQ_OPT_##id,
#include "tq-options.def"
#undef TQ_OPTION
    TQ_OPT_COUNT
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

static inline const char * tq_opt_spelling(enum tq_opt id, int index, int alias, size_t * len) {
    return tq_row_spelling(tq_opt_info(id), index, alias, len);
}

static inline int tq_opt_n_values(enum tq_opt id) { return tq_row_n_values(tq_opt_info(id)); }

/* The index of value s (its name or an alias), or -1. */
static inline int tq_opt_parse(enum tq_opt id, const char * s) { return tq_row_parse(tq_opt_info(id), s); }

static inline int tq_opt_default(enum tq_opt id) { return tq_opt_parse(id, tq_opt_info(id)->def); }

/* The environment alias: the index of its value, TQ_OPT_UNSET where it is unset or empty,
   or -1 where it names no value (*raw: what it says, NULL when unset). */
static inline int tq_opt_env(enum tq_opt id, const char ** raw) { return tq_row_env(tq_opt_info(id), raw); }

/* The one message for a value no parser knows (tq_row_unknown). */
static inline void tq_opt_unknown(enum tq_opt id, const char * what, const char * value, char * buf, size_t n) {
    tq_row_unknown(tq_opt_info(id), what, value, buf, n);
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
