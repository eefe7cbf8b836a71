/*
 * tq-vulkan.h - the turbo types in ggml's Vulkan backend (ggml-vulkan).
 *
 * What the Vulkan device runs, and what it refuses (ggml's scheduler then runs a refused op on
 * a backend that has it, and llama's KV cache keeps a layer in host memory when its device
 * refuses SET_ROWS into the cache type: tq_kv_keep_host, ggml-ext/llama/tq-llama-kv-cache.cpp):
 *
 *   turbo2/3/4,  SET_ROWS and CPY from f32 (the encoders, shaders/tq_encode.comp and, for the
 *   turbo3_tcq,  trellis types, the Viterbi search of shaders/tq_tcq_encode.comp: the bytes of
 *   turbo2_tcq   crates/codec's; they compute in f64, so a device without shaderFloat64 refuses),
 *                GET_ROWS to f32/f16 and CPY to f32 (shaders/tq_decode.comp), FLASH_ATTN_EXT with
 *                these K and/or V types decoded in upstream's scalar and coopmat1 shaders
 *                (shaders/tq_fa_dequant.glsl), MUL_MAT with such an A (any view of it, GQA
 *                broadcast) and an f32 B: KQ with flash attention off (tq_vk_mul_mat: A decoded to
 *                f16, or f32 under GGML_PREC_F32, then upstream's matmul), and the views of such
 *                a cache.
 *   refused      MUL_MAT with a turbo B or an f16 B, MUL_MAT_ID, and flash attention that carries
 *                the turbo K terms (tq-fa-contract.h: the exact first key and the mean in RoPE's
 *                frame are not in these shaders; ggml_backend_dev_supports_op refuses that op
 *                first, and llama lowers the terms to a mask per head, docs/VULKAN.md).
 *
 * Our encode/decode pipelines take the slots of upstream's per-type pipeline tables
 * (pipeline_set_rows_*, pipeline_cpy_*, pipeline_get_rows*) with upstream's bindings, push
 * constants and dispatch shape, so ggml-vulkan's op code runs them like its own; the turbo -> f16
 * CPY that tq_vk_mul_mat dispatches has no such slot (tq_vk_device_pipelines).
 *
 * Patch 0106-ggml-vulkan.patch calls, one line each: tq_vk_supports_op at the top of
 * ggml_backend_vk_device_supports_op, tq_vk_mul_mat at the top of ggml_vk_mul_mat (before it
 * picks mul_mat_vec, which has no turbo shader), tq_vk_load_shaders at the end of
 * ggml_vk_load_shaders, TQ_VK_TYPE_CASES in supports_op's list of flash attention K/V types and in the two CPY
 * pipeline switches of ggml_vk_get_cpy_pipeline, and tq_vk_fa_path where get_fa_tuning_params
 * picks the shader family.
 */
#ifndef TQ_VULKAN_H
#define TQ_VULKAN_H

#include "tq-ggml.h"
#include "tq-fa-contract.h"
#include "tq-vulkan-shaders.h"

/* The shaders read the ggml type ids from turboquant_types.h (they cannot include ggml.h). */
#define TQ_VK_ASSERT_ID(name, STEM, bits, bytes, trellis) \
    static_assert((int) GGML_TYPE_##STEM == TQ_##STEM##_GGML_TYPE, "turboquant_types.h's ggml id of " #name " differs from ggml.h");
TQ_FOR_EACH_TYPE(TQ_VK_ASSERT_ID)
#undef TQ_VK_ASSERT_ID

/* The types with Vulkan shaders: all five (every turbo type has its encoder and decoder). */
static inline bool tq_vk_has_shaders(ggml_type t) {
    return t == GGML_TYPE_TURBO2 || t == GGML_TYPE_TURBO3 || t == GGML_TYPE_TURBO4 ||
           t == GGML_TYPE_TURBO3_TCQ || t == GGML_TYPE_TURBO2_TCQ;
}

/* The encoder computes in f64. ggml-vulkan enables every feature the device reports. */
static inline bool tq_vk_has_f64(const vk_device & device) {
    return device->physical_device.getFeatures().shaderFloat64 == VK_TRUE;
}

/* -1: no turbo type in `op`, upstream decides. 0/1: refused/accepted here, or (flash attention)
 * 1 only after upstream's own checks, which TQ_VK_TYPE_CASES lets through for turbo K/V. */
static int tq_vk_supports_op(const vk_device & device, const struct ggml_tensor * op) {
    bool turbo = TQ_GGML_IS_TURBO(op->type);
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        turbo = turbo || (op->src[i] && TQ_GGML_IS_TURBO(op->src[i]->type));
    }
    if (!turbo) {
        return -1;
    }
    for (int i = 0; i < GGML_MAX_SRC; ++i) {
        if ((op->src[i] && TQ_GGML_IS_TURBO(op->src[i]->type) && !tq_vk_has_shaders(op->src[i]->type)) ||
            (TQ_GGML_IS_TURBO(op->type) && !tq_vk_has_shaders(op->type))) {
            return 0; /* a turbo type without shaders (none today) */
        }
    }
    const struct ggml_tensor * s0 = op->src[0];
    const struct ggml_tensor * s1 = op->src[1];
    switch (op->op) {
        case GGML_OP_NONE:
        case GGML_OP_VIEW:
        case GGML_OP_RESHAPE:
        case GGML_OP_PERMUTE:
        case GGML_OP_TRANSPOSE:
            return 1;
        case GGML_OP_SET_ROWS:
            return s0->type == GGML_TYPE_F32 && (s1->type == GGML_TYPE_I32 || s1->type == GGML_TYPE_I64) &&
                   tq_vk_has_f64(device);
        case GGML_OP_CPY:
        case GGML_OP_DUP:
        case GGML_OP_CONT:
            if (s0->type == GGML_TYPE_F32 && tq_vk_has_shaders(op->type)) {
                return ggml_is_contiguous(op) && tq_vk_has_f64(device);
            }
            return tq_vk_has_shaders(s0->type) && op->type == GGML_TYPE_F32 && ggml_is_contiguous(s0);
        case GGML_OP_GET_ROWS:
            return tq_vk_has_shaders(s0->type) && s1->type == GGML_TYPE_I32 &&
                   (op->type == GGML_TYPE_F32 || op->type == GGML_TYPE_F16);
        case GGML_OP_FLASH_ATTN_EXT:
            /* the turbo K terms are not in the shaders: refused (ggml_backend_dev_supports_op
             * refuses them before this, tq-fa-contract.h; this keeps the Vulkan device honest) */
            return tq_fa_has_k_terms(op) ? 0 : -1;
        case GGML_OP_MUL_MAT:
            /* tq_vk_mul_mat: a turbo A (KQ's K, any strides) decoded into prealloc_x, then
             * upstream's f16/f32 matmul with f32 B; what upstream takes for an f32 A besides */
            return tq_vk_has_shaders(s0->type) && s1->type == GGML_TYPE_F32 && op->type == GGML_TYPE_F32 &&
                   s0->ne[3] == s1->ne[3] && s1->ne[2] % s0->ne[2] == 0 &&
                   (uint64_t) ggml_nelements(s0) * sizeof(float) <= device->properties.limits.maxStorageBufferRange;
        default:
            return 0; /* MUL_MAT_ID and the rest: no turbo shader */
    }
}

/* The types with shaders, as cases of upstream's type lists: flash attention's K/V types
 * (decoded by tq_fa_dequant.glsl) and the CPY pipelines' source and destination types. */
#define TQ_VK_TYPE_CASES \
    case GGML_TYPE_TURBO2: \
    case GGML_TYPE_TURBO3: \
    case GGML_TYPE_TURBO4: \
    case GGML_TYPE_TURBO3_TCQ: \
    case GGML_TYPE_TURBO2_TCQ:

/* coopmat2's flash attention decodes through its own buffer_reference path, which has no turbo
 * types: turbo K/V take coopmat1 (which includes tq_fa_dequant.glsl, like the scalar shader). */
static inline FaCodePath tq_vk_fa_path(FaCodePath path, ggml_type k_type, ggml_type v_type) {
    if (path == FA_COOPMAT2 && (tq_vk_has_shaders(k_type) || tq_vk_has_shaders(v_type))) {
        return FA_COOPMAT1;
    }
    return path;
}

/* Our pipelines that have no slot in upstream's tables: turbo -> f16 with the CPY interface
 * (strided source, contiguous destination; tq_vk_mul_mat), one per device and type. Keyed by
 * the device's address: ggml-vulkan keeps a device for the whole process (vk_instance.devices). */
struct tq_vk_pipelines {
    vk_pipeline cpy_f16[GGML_TYPE_COUNT];
};

static tq_vk_pipelines & tq_vk_device_pipelines(const vk_device & device) {
    static std::mutex mutex;
    static std::map<const vk_device_struct *, tq_vk_pipelines> table; /* nodes are stable */
    std::lock_guard<std::mutex> lock(mutex);
    return table[device.get()];
}

/* Registers our pipelines in upstream's per-type tables (and tq_vk_device_pipelines); `create`
 * is ggml_vk_load_shaders' ggml_vk_create_pipeline. Encoders only where the device has f64. */
template <typename Create>
static void tq_vk_load_shaders(vk_device & device, const Create & create) {
#define TQ_VK_SPV(name) tq_vk_##name##_len, tq_vk_##name##_data
#define TQ_VK_TYPE(t, T)                                                                                        \
    if (tq_vk_has_f64(device)) {                                                                               \
        create(device, device->pipeline_set_rows_i32[0][GGML_TYPE_##T], "tq_set_rows_f32_" #t "_i32",           \
               TQ_VK_SPV(set_rows_f32_##t##_i32), "main", 3, sizeof(vk_op_binary_push_constants), {1, 1, 1}, {1}, 1, true); \
        create(device, device->pipeline_set_rows_i64[0][GGML_TYPE_##T], "tq_set_rows_f32_" #t "_i64",           \
               TQ_VK_SPV(set_rows_f32_##t##_i64), "main", 3, sizeof(vk_op_binary_push_constants), {1, 1, 1}, {1}, 1, true); \
        create(device, device->pipeline_cpy_f32_quant[GGML_TYPE_##T], "tq_cpy_f32_" #t,                        \
               TQ_VK_SPV(cpy_f32_##t), "main", 2, sizeof(vk_op_unary_push_constants), {32, 1, 1}, {}, 1);       \
    }                                                                                                          \
    create(device, device->pipeline_cpy_quant_f32[GGML_TYPE_##T], "tq_cpy_" #t "_f32",                         \
           TQ_VK_SPV(cpy_##t##_f32), "main", 2, sizeof(vk_op_unary_push_constants),                           \
           {(uint32_t) TQ_BLOCK_VALUES, 1, 1}, {}, 1);                                                         \
    create(device, tq_vk_device_pipelines(device).cpy_f16[GGML_TYPE_##T], "tq_cpy_" #t "_f16",                \
           TQ_VK_SPV(cpy_##t##_f16), "main", 2, sizeof(vk_op_unary_push_constants),                           \
           {(uint32_t) TQ_BLOCK_VALUES, 1, 1}, {}, 1);                                                         \
    create(device, device->pipeline_get_rows[GGML_TYPE_##T], "tq_get_rows_" #t,                                \
           TQ_VK_SPV(get_rows_##t), "main", 3, sizeof(vk_op_binary_push_constants), {512, 1, 1}, {}, 1);        \
    create(device, device->pipeline_get_rows_f32[GGML_TYPE_##T], "tq_get_rows_" #t "_f32",                     \
           TQ_VK_SPV(get_rows_##t##_f32), "main", 3, sizeof(vk_op_binary_push_constants), {512, 1, 1}, {}, 1);
    TQ_VK_TYPE(turbo2, TURBO2)
    TQ_VK_TYPE(turbo3, TURBO3)
    TQ_VK_TYPE(turbo4, TURBO4)
    TQ_VK_TYPE(turbo3_tcq, TURBO3_TCQ) /* tq_tcq_encode.comp: same dispatch shape, 32 blocks a group */
    TQ_VK_TYPE(turbo2_tcq, TURBO2_TCQ)
#undef TQ_VK_TYPE
#undef TQ_VK_SPV
}

/* MUL_MAT with a turbo A (src0): flash attention off, llama's KQ = mul_mat(K view, Q), K a
 * permuted view of the cache (heads interleaved in a cell's row), broadcast over the Q heads
 * of a KV head. No matmul shader reads turbo blocks; as ggml-cuda does, A is decoded (our CPY
 * shader, tq_decode.comp, which takes any strides in whole blocks) into a contiguous f16
 * tensor, or f32 when the op asks GGML_PREC_F32 (llama's KQ), in ctx->prealloc_x, and
 * ggml_vk_mul_mat runs again with that tensor as src[0] for the call: upstream's own choice
 * among mul_mat_vec (one column), the matmul shaders and the fused bias add, as for an
 * f16/f32 A. A coopmat2 device converts an f32 A to f16 itself, in prealloc_x: there A is
 * decoded to f16. Called first in ggml_vk_mul_mat (one patch line); false: not ours. */
static bool tq_vk_mul_mat(ggml_backend_vk_context * ctx, vk_context & subctx, const struct ggml_cgraph * cgraph, int node_idx) {
    ggml_tensor * dst = cgraph->nodes[node_idx];
    ggml_tensor * src0 = dst->src[0];
    if (!tq_vk_has_shaders(src0->type)) {
        return false;
    }
    const bool f32 = ggml_get_op_params_i32(dst, 0) == GGML_PREC_F32 && !ctx->device->coopmat2;
    const ggml_type x_type = f32 ? GGML_TYPE_F32 : GGML_TYPE_F16;
    const uint32_t ne = (uint32_t) ggml_nelements(src0);
    const size_t x_sz = (size_t) ne * ggml_type_size(x_type);

    /* rounded up as mul_mat_vec binds an A read in place */
    const size_t x_alloc = ggml_vk_align_size(x_sz, ctx->device->properties.limits.minStorageBufferOffsetAlignment);
    if (ctx->prealloc_size_x < x_alloc) {
        ctx->prealloc_size_x = x_alloc;
        ggml_vk_preallocate_buffers(ctx, subctx);
    }
    vk_pipeline pipeline = f32 ? ctx->device->pipeline_cpy_quant_f32[src0->type]
                               : tq_vk_device_pipelines(ctx->device).cpy_f16[src0->type];
    GGML_ASSERT(pipeline != nullptr);
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    if (ctx->prealloc_x_need_sync) {
        ggml_vk_sync_buffers(ctx, subctx);
    }

    /* ggml_vk_cpy_to_contiguous's dispatch, with the view's offset in blocks (the descriptor
     * starts at an aligned offset a whole number of blocks before it) */
    vk_op_unary_push_constants pc = vk_op_unary_push_constants_init(src0, src0, ne);
    pc.nb10 = 1;
    pc.nb11 = (uint32_t) src0->ne[0];
    pc.nb12 = (uint32_t) (src0->ne[0] * src0->ne[1]);
    pc.nb13 = (uint32_t) (src0->ne[0] * src0->ne[1] * src0->ne[2]);
    pc.misalign_offsets = (uint32_t) (get_misalign_bytes(ctx, src0) / ggml_type_size(src0->type)) << 16;
    init_pushconst_fastdiv(pc);
    std::array<uint32_t, 3> elements;
    if (ne > 262144) {
        elements = { 512, 512, CEIL_DIV(ne, 262144) };
    } else if (ne > 512) {
        elements = { 512, CEIL_DIV(ne, 512), 1 };
    } else {
        elements = { ne, 1, 1 };
    }
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline,
                              { ggml_vk_tensor_subbuffer(ctx, src0, true), vk_subbuffer{ ctx->prealloc_x, 0, x_sz } },
                              pc, elements);
    ggml_vk_sync_buffers(ctx, subctx);

    /* the decoded A as a tensor of a buffer whose device buffer is prealloc_x */
    std::string name = "tq_decoded_a";
    ggml_backend_vk_buffer_context x_buf_ctx(ctx->device, vk_buffer(ctx->prealloc_x), name);
    ggml_backend_buffer x_buf = *src0->buffer;
    x_buf.context = &x_buf_ctx;
    ggml_tensor x = *src0;
    x.type = x_type;
    x.op = GGML_OP_NONE;
    for (ggml_tensor *& s : x.src) {
        s = nullptr;
    }
    x.buffer = &x_buf;
    x.view_src = nullptr;
    x.view_offs = 0;
    x.data = vk_ptr_base;
    x.nb[0] = ggml_type_size(x_type);
    for (int i = 1; i < GGML_MAX_DIMS; ++i) {
        x.nb[i] = x.nb[i - 1] * x.ne[i - 1];
    }

    dst->src[0] = &x;
    ggml_vk_mul_mat(ctx, subctx, cgraph, node_idx);
    dst->src[0] = src0;
    GGML_ASSERT(x_buf_ctx.dev_buffer == ctx->prealloc_x); /* nothing resized it under the call */
    x_buf_ctx.dev_buffer = nullptr; /* prealloc_x stays ctx's */
    ctx->prealloc_x_need_sync = true;
    return true;
}

#endif /* TQ_VULKAN_H */
