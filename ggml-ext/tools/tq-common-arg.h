// tq-common-arg.h - turboquant's command-line options for llama.cpp's common argument parser
// (common/arg.cpp adds them to every tool's options with one call): one flag per row of
// tq-options.def that has one. A flag sets common_params' field (tq-common-params.h), which
// reaches llama_context_params; a value the row does not know is the tool's argument error,
// with the table's message. The environment alias is not read here but where the context is
// created (tq-llama-options.h), so the log can say which of the two decided and a flag wins.
#pragma once

#include "arg.h"
#include "common.h"
#include "tq-options.h"

#include <stdexcept>
#include <string>
#include <vector>

template <int ID> static void tq_common_arg_set(common_params & params, const std::string & value) {
    const tq_opt id = (tq_opt) ID;
    const int    v  = tq_opt_parse(id, value.c_str());
    if (v < 0) {
        throw std::invalid_argument(tq_opt_unknown_str(id, tq_opt_info(id)->flag, value.c_str()));
    }
    params.tq_options.field[ID] = (int8_t) (v + 1);
}

// "on|off": the values' names (common keeps the pointer)
template <int ID> static const char * tq_common_arg_hint() {
    static const std::string s = [] {
        std::string r;
        for (int i = 0; i < tq_opt_n_values((tq_opt) ID); ++i) {
            r += (i ? "|" : "") + tq_opt_name((tq_opt) ID, i);
        }
        return r;
    }();
    return s.c_str();
}

static inline std::string tq_common_arg_help(tq_opt id) {
    const struct tq_opt_row * r = tq_opt_info(id);
    std::string h = std::string(r->help) + "\n(default: " + r->def + "; env: " + r->env;
    if (r->state) {
        h += "; changes the saved-state format";
    }
    return h + ")";
}

static inline std::vector<common_arg> tq_common_args() {
    std::vector<common_arg> v;
#define TQ_FIELD(f) true
#define TQ_NO_FIELD false
#define TQ_OPTION(id, name, flag, env, field, ...)                                                              \
    if (field) {                                                                                                \
        v.push_back(common_arg({ flag }, tq_common_arg_hint<TQ_OPT_##id>(),                                     \
                               tq_common_arg_help(TQ_OPT_##id), tq_common_arg_set<TQ_OPT_##id>));              \
    }
#include "tq-options.def"
#undef TQ_OPTION
#undef TQ_NO_FIELD
#undef TQ_FIELD
    return v;
}
