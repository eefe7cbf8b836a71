/*
 * tq-vulkan.h - the turbo types and ggml's Vulkan backend (ggml-vulkan).
 *
 * There are no turbo shaders yet, so the Vulkan device refuses every op that reads or writes
 * a turbo type: its destination, any source, and so flash attention whose K or V is turbo,
 * SET_ROWS into a turbo cache, GET_ROWS/CPY/MUL_MAT from one, and the views of such a cache.
 * ggml's scheduler then runs those ops on a backend that has them (the CPU), and llama's KV
 * cache keeps turbo layers in host memory when the layer's device refuses them
 * (tq_kv_keep_host, ggml-ext/llama/tq-llama-kv-cache.inc). Nothing else is ever computed in their place.
 *
 * One upstream line calls this, at the top of ggml_backend_vk_device_supports_op (patch
 * 0106-ggml-vulkan.patch).
 */
#ifndef TQ_VULKAN_H
#define TQ_VULKAN_H

#include "tq-ggml.h"

/* True when `op` involves a turbo type, which the Vulkan device must not accept. */
static inline bool tq_vulkan_refuses_op(const struct ggml_tensor * op) {
    if (TQ_GGML_IS_TURBO(op->type)) {
        return true;
    }
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        if (op->src[i] && TQ_GGML_IS_TURBO(op->src[i]->type)) {
            return true;
        }
    }
    return false;
}

#endif /* TQ_VULKAN_H */
