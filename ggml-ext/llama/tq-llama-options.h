// tq-llama-options.h - turboquant's llama context options, from llama_context_params to the
// KV cache. C++ (llama.cpp's src/ and common/).
//
// Two switches change what a turbo K cache stores, and so its saved-state format:
//   tq_k_mean     K mean removal (tq-kmean.h)
//   tq_k_balance  K/Q channel balancing (tq-kmean.h; needs K mean removal)
// Each is an int8_t of llama_context_params: TQ_LLAMA_DEFAULT (0), TQ_LLAMA_OFF (1) or
// TQ_LLAMA_ON (2). The patch puts the two fields in the padding after the struct's last bool,
// so sizeof(llama_context_params) and every offset stay upstream's: bindings that mirror the
// struct (llama-cpp-python's ctypes, an older bindgen) keep working and pass 0, the default.
//
// Command line (common/arg.cpp, every llama.cpp tool that uses common): --tq-k-mean on|off,
// --tq-k-balance on|off, with TQ_K_MEAN / TQ_K_BALANCE as their environment aliases (as
// LLAMA_ARG_* are for upstream's options). A context whose field is TQ_LLAMA_DEFAULT (tools
// without common's parser, such as llama-bench, and library users) takes the environment
// variable if it is set, read once per process, else on. A value other than on/off (or
// 1/0, true/false, enabled/disabled) is an error: the tool's argument error, or the
// context fails to be created with that message.
//
// How the options reach the cache: llama_context's constructor opens a tq_llama_options_scope
// around create_memory (one patch line), and every llama_kv_cache constructed inside it reads
// the options of that scope in tq_kmean_init. So a cache gets the options of the context it
// is made for, on any memory layout (plain, iSWA, hybrid), without a new parameter on each of
// llama's dozen cache constructors. A cache made outside a context (none today) gets the
// defaults.
#pragma once

#include "llama.h"

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>

// The two fields sit in padding: samplers (the member after them) is where it would be
// without them, so the struct's size and layout are upstream's.
static_assert(offsetof(llama_context_params, samplers) ==
                  (offsetof(llama_context_params, kv_unified) + 1 + alignof(void *) - 1) / alignof(void *) * alignof(void *),
              "tq_k_mean/tq_k_balance no longer fit in llama_context_params' padding");

enum tq_llama_switch : int8_t { TQ_LLAMA_DEFAULT = 0, TQ_LLAMA_OFF = 1, TQ_LLAMA_ON = 2 };

// on/off and common's other spellings (common_arg_utils::is_truthy/is_falsey), or -1.
static inline int tq_llama_switch_parse(const char * s) {
    static const char * const on[]  = { "on", "1", "true", "enabled" };
    static const char * const off[] = { "off", "0", "false", "disabled" };
    for (const char * v : on) {
        if (strcmp(s, v) == 0) return TQ_LLAMA_ON;
    }
    for (const char * v : off) {
        if (strcmp(s, v) == 0) return TQ_LLAMA_OFF;
    }
    return -1;
}

// For common/arg.cpp: the option's value, or a clear error.
static inline int8_t tq_llama_switch_arg(const char * option, const std::string & value) {
    const int v = tq_llama_switch_parse(value.c_str());
    if (v < 0) {
        throw std::invalid_argument(std::string("invalid value for ") + option + ": '" + value + "' (expected on or off)");
    }
    return (int8_t) v;
}

struct tq_llama_options {
    int8_t k_mean    = TQ_LLAMA_DEFAULT;
    int8_t k_balance = TQ_LLAMA_DEFAULT;
};

// The environment alias of a switch, read once per process: TQ_LLAMA_DEFAULT when unset,
// -1 when set to something else than on/off.
static inline int tq_llama_env_switch(const char * name) {
    const char * e = getenv(name);
    return e ? tq_llama_switch_parse(e) : TQ_LLAMA_DEFAULT;
}
inline int tq_llama_env_k_mean() {
    static const int v = tq_llama_env_switch("TQ_K_MEAN");
    return v;
}
inline int tq_llama_env_k_balance() {
    static const int v = tq_llama_env_switch("TQ_K_BALANCE");
    return v;
}
// the exact first keys (tq-sink.h): an environment switch only (no context option)
inline int tq_llama_env_k_sink() {
    static const int v = tq_llama_env_switch("TQ_K_SINK");
    return v;
}

// A switch as a cache applies it: the context's choice, else the environment alias, else on.
// why: set to what decided it, for the log.
static inline bool tq_llama_switch_resolve(int8_t opt, int env, const char * env_name, const char * option,
                                           const char ** why) {
    if (opt == TQ_LLAMA_ON || opt == TQ_LLAMA_OFF) {
        *why = option;
        return opt == TQ_LLAMA_ON;
    }
    if (opt != TQ_LLAMA_DEFAULT) {
        throw std::runtime_error(std::string("llama_context_params: ") + option + " = " + std::to_string(opt) +
                                 ": expected 0 (default), 1 (off) or 2 (on)");
    }
    if (env < 0) {
        throw std::runtime_error(std::string(env_name) + "=" + getenv(env_name) + ": expected on or off (or 1/0)");
    }
    if (env != TQ_LLAMA_DEFAULT) {
        *why = env_name;
        return env == TQ_LLAMA_ON;
    }
    *why = "default";
    return true;
}

// The options of the context whose memory is being created on this thread (see the top).
// inline (not static): one variable for all of libllama's translation units
inline tq_llama_options *& tq_llama_options_current() {
    static thread_local tq_llama_options * cur = nullptr;
    return cur;
}

struct tq_llama_options_scope {
    tq_llama_options opts;
    tq_llama_options * prev;
    explicit tq_llama_options_scope(const llama_context_params & p) : prev(tq_llama_options_current()) {
        opts.k_mean    = p.tq_k_mean;
        opts.k_balance = p.tq_k_balance;
        tq_llama_options_current() = &opts;
    }
    ~tq_llama_options_scope() { tq_llama_options_current() = prev; }
    tq_llama_options_scope(const tq_llama_options_scope &) = delete;
    tq_llama_options_scope & operator=(const tq_llama_options_scope &) = delete;
};

static inline tq_llama_options tq_llama_options_get() {
    const tq_llama_options * cur = tq_llama_options_current();
    return cur ? *cur : tq_llama_options{};
}
