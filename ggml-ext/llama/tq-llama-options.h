// tq-llama-options.h - turboquant's options in libllama: from llama_context_params (and the
// environment) to the KV cache, the start-up log lines and the saved-state message. C++
// (llama.cpp's src/). The options themselves are rows of tq-options.def; docs/OPTIONS.md.
//
// Fields: each option with a flag has a 2-bit field of llama_context_params (tq_k_mean,
// tq_k_balance, tq_k_sink, tq_k_mean_frame): 0 the default, 1 + i the option's value i
// (for on/off: 1 off, 2 on; k_mean_frame: 1 rope, 2 fitted). The patch puts them, as
// bit-fields, in the padding after the struct's last bool, so sizeof(llama_context_params)
// and every offset stay upstream's: bindings that mirror the struct (llama-cpp-python's
// ctypes, an older bindgen) keep working and pass 0, the default.
//
// Command line (common/arg.cpp, every llama.cpp tool that uses common): one flag per row
// with a field (tq-common-arg.h); it sets the field. A field left at 0 (no flag; llama-bench,
// library users) takes the row's environment variable when it is set and not empty, else
// the row's default. So the flag wins over the environment.
//
// When: every switch is resolved once per context creation, in tq_llama_options_scope,
// which llama_context's constructor opens around create_memory (one patch line). A value no
// row knows, in a field or in the environment (also the environment-only switches that
// ggml reads later, once per process), makes the context fail to be created with the table's
// message ("turboquant: TQ_X=v: unknown value; valid: a, b"), which llama_init_from_model
// logs before it returns NULL. Each switch's value and where it came from is logged, one line
// per row: "llama_context: turboquant option k_sink = off (env TQ_K_SINK)".
//
// Every llama_kv_cache constructed inside the scope reads the options of that scope in
// tq_kmean_init, whatever the memory layout (plain, iSWA, hybrid), without a new parameter
// on each of llama's cache constructors. A cache made outside a context (none today) gets
// the environment, else the defaults.
#pragma once

#include "llama.h"
#include "llama-impl.h"
#include "tq-options.h"

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

// The fields sit in padding: samplers (the member after them) is where it would be
// without them, so the struct's size and layout are upstream's.
static_assert(offsetof(llama_context_params, samplers) ==
                  (offsetof(llama_context_params, kv_unified) + 1 + alignof(void *) - 1) / alignof(void *) * alignof(void *),
              "turboquant's option fields no longer fit in llama_context_params' padding");

// The table's rules (tq-options.def), checked here where every row is compiled.
namespace tq_opt_cx {
constexpr int n_values(const char * v) {
    int n = 1;
    for (; *v; ++v) {
        n += *v == '|';
    }
    return n;
}
// whether s is one of the spellings in values ("a=x|b|c")
constexpr bool has_value(const char * values, const char * s) {
    const char * p = values;
    while (true) {
        const char * q = s;
        while (*q && *p == *q) {
            ++p;
            ++q;
        }
        if (!*q && (*p == '\0' || *p == '|' || *p == '=')) {
            return true;
        }
        while (*p && *p != '|' && *p != '=') {
            ++p;
        }
        if (!*p) {
            return false;
        }
        ++p;
    }
}
} // namespace tq_opt_cx

#define TQ_FIELD(f) true
#define TQ_NO_FIELD false
#define TQ_OPTION(id, name, flag, env, field, values, def, results, state, read, help)                                \
    static_assert((results) != TQ_CHANGES_YES || (field),                                                            \
                  "turboquant option " name ": it changes results, so it needs a flag and a context field");         \
    static_assert(!(state) || (field), "turboquant option " name ": it changes saved state, so it needs a field");   \
    static_assert((field) == ((flag) != nullptr), "turboquant option " name ": a flag exactly where there is a field"); \
    static_assert(!(field) || tq_opt_cx::n_values(values) <= 3, "turboquant option " name ": a 2-bit field: 3 values"); \
    static_assert(tq_opt_cx::has_value(values, def), "turboquant option " name ": the default is not one of its values");
#include "tq-options.def"
#undef TQ_OPTION
#undef TQ_NO_FIELD
#undef TQ_FIELD

enum tq_llama_switch : int8_t { TQ_LLAMA_DEFAULT = 0, TQ_LLAMA_OFF = 1, TQ_LLAMA_ON = 2 };

enum tq_llama_source : int8_t { TQ_SRC_DEFAULT = 0, TQ_SRC_ENV = 1, TQ_SRC_FIELD = 2 };

// An option's field in p (0 where the option has none).
static inline int tq_llama_field(const llama_context_params & p, tq_opt id) {
    switch (id) {
#define TQ_FIELD(f) return (int) p.f;
#define TQ_NO_FIELD return 0;
#define TQ_OPTION(id, name, flag, env, field, ...) \
    case TQ_OPT_##id:                              \
        field
#include "tq-options.def"
#undef TQ_OPTION
#undef TQ_NO_FIELD
#undef TQ_FIELD
        default:
            return 0;
    }
}

struct tq_llama_options {
    // the fields as the context was given them (0 default, 1 off, 2 on), for
    // tq_llama_switch_resolve in tq-llama-kv-cache.inc
    int8_t k_mean    = TQ_LLAMA_DEFAULT;
    int8_t k_balance = TQ_LLAMA_DEFAULT;
    int8_t k_sink    = TQ_LLAMA_DEFAULT;
    // every option: the index of its value and what decided it
    int8_t value[TQ_OPT_COUNT];
    int8_t source[TQ_OPT_COUNT];

    tq_llama_options() {
        for (int i = 0; i < TQ_OPT_COUNT; ++i) {
            value[i]  = (int8_t) tq_opt_default((tq_opt) i);
            source[i] = TQ_SRC_DEFAULT;
        }
    }
};

// An environment variable's value as a switch field would say it (TQ_LLAMA_DEFAULT when unset
// or empty, TQ_LLAMA_OFF, TQ_LLAMA_ON); a value the row does not know throws its message.
static inline int tq_llama_env_field(tq_opt id) {
    const char * raw = nullptr;
    const int    e   = tq_opt_env(id, &raw);
    if (e == -1) {
        throw std::runtime_error(tq_opt_unknown_str(id, tq_opt_info(id)->env, raw));
    }
    return e == TQ_OPT_UNSET ? TQ_LLAMA_DEFAULT : e + 1;
}

// Every option of a context being created: its field, else its environment variable, else
// its default. A value no row knows throws the table's message.
static inline tq_llama_options tq_llama_options_resolve(const llama_context_params & p) {
    tq_llama_options o;
    o.k_mean    = (int8_t) p.tq_k_mean;
    o.k_balance = (int8_t) p.tq_k_balance;
    o.k_sink    = (int8_t) p.tq_k_sink;
    for (int i = 0; i < TQ_OPT_COUNT; ++i) {
        const tq_opt             id = (tq_opt) i;
        const struct tq_opt_row * r = tq_opt_info(id);
        const int                f  = tq_llama_field(p, id);
        if (f > tq_opt_n_values(id)) {
            std::string valid = "0 (default)";
            for (int v = 0; v < tq_opt_n_values(id); ++v) {
                valid += ", " + std::to_string(v + 1) + " (" + tq_opt_name(id, v) + ")";
            }
            throw std::runtime_error(std::string("turboquant: llama_context_params.") + r->field + "=" +
                                     std::to_string(f) + ": unknown value; valid: " + valid);
        }
        if (f > 0) {
            o.value[i]  = (int8_t) (f - 1);
            o.source[i] = TQ_SRC_FIELD;
            continue;
        }
        const int e = tq_llama_env_field(id);
        if (e != TQ_LLAMA_DEFAULT) {
            o.value[i]  = (int8_t) (e - 1);
            o.source[i] = TQ_SRC_ENV;
        }
    }
    return o;
}

// One line per option: its value and what decided it (default, env <VAR>, flag <--flag>;
// "flag" is the context field, which the flag sets).
static inline void tq_llama_options_log(const tq_llama_options & o) {
    for (int i = 0; i < TQ_OPT_COUNT; ++i) {
        const tq_opt              id  = (tq_opt) i;
        const struct tq_opt_row * r   = tq_opt_info(id);
        const std::string         val = tq_opt_name(id, o.value[i]);
        const std::string         src = o.source[i] == TQ_SRC_FIELD ? std::string("flag ") + r->flag
                                      : o.source[i] == TQ_SRC_ENV   ? std::string("env ") + r->env
                                                                    : std::string("default");
        LLAMA_LOG_INFO("%s: turboquant option %s = %s (%s)\n", "llama_context", r->name, val.c_str(), src.c_str());
    }
}

// The options of the context whose memory is being created on this thread (see the top).
// inline (not static): one variable for all of libllama's translation units
inline tq_llama_options *& tq_llama_options_current() {
    static thread_local tq_llama_options * cur = nullptr;
    return cur;
}

struct tq_llama_options_scope {
    tq_llama_options   opts;
    tq_llama_options * prev;
    explicit tq_llama_options_scope(const llama_context_params & p) :
        opts(tq_llama_options_resolve(p)),
        prev(tq_llama_options_current()) {
        tq_llama_options_log(opts);
        tq_llama_options_current() = &opts;
    }
    ~tq_llama_options_scope() { tq_llama_options_current() = prev; }
    tq_llama_options_scope(const tq_llama_options_scope &)             = delete;
    tq_llama_options_scope & operator=(const tq_llama_options_scope &) = delete;
};

static inline tq_llama_options tq_llama_options_get() {
    const tq_llama_options * cur = tq_llama_options_current();
    return cur ? *cur : tq_llama_options{};
}

// The environment aliases of the on/off switches (TQ_LLAMA_DEFAULT when unset).
inline int tq_llama_env_k_mean() {
    return tq_llama_env_field(TQ_OPT_K_MEAN);
}
inline int tq_llama_env_k_balance() {
    return tq_llama_env_field(TQ_OPT_K_BALANCE);
}
inline int tq_llama_env_k_sink() {
    return tq_llama_env_field(TQ_OPT_K_SINK);
}

// A switch as a cache applies it: the context's field, else the environment alias, else on.
// why: set to what decided it, for the log.
static inline bool tq_llama_switch_resolve(int8_t opt, int env, const char * env_name, const char * option,
                                           const char ** why) {
    if (opt == TQ_LLAMA_ON || opt == TQ_LLAMA_OFF) {
        *why = option;
        return opt == TQ_LLAMA_ON;
    }
    if (opt != TQ_LLAMA_DEFAULT || env < 0) {
        // tq_llama_options_resolve and tq_llama_env_field refuse these first
        throw std::runtime_error(std::string("turboquant: ") + option + " / " + env_name + ": unknown value");
    }
    if (env != TQ_LLAMA_DEFAULT) {
        *why = env_name;
        return env == TQ_LLAMA_ON;
    }
    *why = "default";
    return true;
}

// k_mean_frame as tq-llama-kv-cache.inc takes it: "rope" or "fitted" where the field
// (--tq-k-mean-frame) or TQ_K_MEAN_FRAME chose one, NULL for the default.
static inline const char * tq_llama_k_mean_frame() {
    static const std::string names[2] = { tq_opt_name(TQ_OPT_K_MEAN_FRAME, 0), tq_opt_name(TQ_OPT_K_MEAN_FRAME, 1) };
    const tq_llama_options * cur = tq_llama_options_current();
    int                      v   = -1;
    if (cur) {
        v = cur->source[TQ_OPT_K_MEAN_FRAME] == TQ_SRC_DEFAULT ? -1 : cur->value[TQ_OPT_K_MEAN_FRAME];
    } else {
        v = tq_llama_env_field(TQ_OPT_K_MEAN_FRAME) - 1;
    }
    return v < 0 ? nullptr : names[v].c_str();
}

// The flags of the options a saved state depends on ("--tq-k-mean, --tq-k-balance, ..."),
// for the message of a restore that a cache refuses.
static inline const char * tq_llama_state_options() {
    static const std::string s = [] {
        std::string r;
        for (int i = 0; i < TQ_OPT_COUNT; ++i) {
            const struct tq_opt_row * row = tq_opt_info((tq_opt) i);
            if (row->state) {
                r += (r.empty() ? "" : ", ") + std::string(row->flag);
            }
        }
        return r;
    }();
    return s.c_str();
}
