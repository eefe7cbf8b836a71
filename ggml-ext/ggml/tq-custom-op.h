/*
 * tq-custom-op.h - how a backend tells one of our GGML_OP_CUSTOM nodes from any other (C++,
 * ggml level): by the address of its function, which ggml-base defines once
 * (tq-rf-keep.cpp, tq-rot-node.cpp). ggml keeps the function pointer first in the op's
 * parameters and the userdata after the task count; tq-rf-keep.cpp asserts both offsets.
 */
#ifndef TQ_CUSTOM_OP_H
#define TQ_CUSTOM_OP_H

#include "ggml.h"

#include <stdint.h>
#include <string.h>

/* Whether `op` is a GGML_OP_CUSTOM whose function is `fun`. */
static inline bool tq_custom_op_is(const struct ggml_tensor * op, ggml_custom_op_t fun) {
    if (!op || op->op != GGML_OP_CUSTOM) {
        return false;
    }
    ggml_custom_op_t f;
    memcpy(&f, op->op_params, sizeof(f));
    return f == fun;
}

/* The userdata of a GGML_OP_CUSTOM node. */
static inline uintptr_t tq_custom_op_userdata(const struct ggml_tensor * op) {
    void * userdata;
    memcpy(&userdata, (const char *) op->op_params + sizeof(ggml_custom_op_t) + sizeof(void *), sizeof(userdata));
    return (uintptr_t) userdata;
}

#endif /* TQ_CUSTOM_OP_H */
