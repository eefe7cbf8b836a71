// tq-rf-keep.cpp - tq_rf_keep_op, the one definition of the fused K side's function
// (tq-rf-keep.h), built into ggml-base so that llama's graph and every backend see one address.

#include "tq-rf-keep.h"

#include "ggml-impl.h"

#include <cstddef>

// tq-custom-op.h reads every custom op's parameters by these offsets
static_assert(offsetof(ggml_custom_op_params, fun) == 0, "ggml_custom_op_params: fun is no longer first");
static_assert(offsetof(ggml_custom_op_params, userdata) == sizeof(ggml_custom_op_t) + sizeof(void *),
              "ggml_custom_op_params: userdata moved");

void tq_rf_keep_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    GGML_ASSERT((uintptr_t) userdata == tq_rf_keep_flags(dst));
    tq_rf_keep_rows(tq_rf_keep_args_of(dst), ith, nth);
}
