// tq-common-params.h - turboquant's options in common_params (common.h includes this): the
// field each flag of tq-common-arg.h sets, one per row of tq-options.def, and their copy into
// llama_context_params (common_context_params_to_llama calls tq_common_options_apply).
#pragma once

#include "llama.h"
#include "tq-options.h"

#include <cstdint>

struct tq_common_options {
    // per option: 0 not given (the context takes the environment, else the default),
    // 1 + i its value i (tq-llama-options.h)
    int8_t field[TQ_OPT_COUNT] = {};
};

static inline void tq_common_options_apply(const tq_common_options & o, llama_context_params & p) {
#define TQ_FIELD(f) p.f = (uint8_t) o.field[tq_i];
#define TQ_NO_FIELD (void) tq_i;
#define TQ_OPTION(id, name, flag, env, field, ...) \
    {                                              \
        const int tq_i = TQ_OPT_##id;              \
        field                                      \
    }
#include "tq-options.def"
#undef TQ_OPTION
#undef TQ_NO_FIELD
#undef TQ_FIELD
}
