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
 *                FLASH_ATTN_EXT that carries the turbo K terms (tq-fa-contract.h: the K mean in
 *                RoPE's frame and the exact first keys) over a turbo K: shaders/tq_fa_terms.comp
 *                turns them and the op's mask into a mask per head, in a scratch buffer of the
 *                context, and upstream's flash attention runs with that mask (tq_vk_flash_attn).
 *   (any type)   two GGML_OP_CUSTOM nodes of ours, told apart by their function's address: the
 *                fused K side of the K mean in RoPE's frame (ggml-ext/ggml/tq-rf-keep.h,
 *                shaders/tq_rf_keep.comp) and the seeded rotation of a decode's rows
 *                (ggml-ext/ggml/tq-rot-node.h, shaders/tq_rot.comp), both run by
 *                tq_vk_custom; every other custom op stays upstream's to refuse.
 *   refused      MUL_MAT with a turbo B or an f16 B, MUL_MAT_ID, and flash attention with the
 *                terms under a soft-cap or ALiBi (they would scale a term that belongs before
 *                them) or in a layout the shader does not read (tq_vk_fa_terms_ok); llama then
 *                lowers the terms to a mask per head built from ops (docs/VULKAN.md).
 *
 * Our encode/decode pipelines take the slots of upstream's per-type pipeline tables
 * (pipeline_set_rows_*, pipeline_cpy_*, pipeline_get_rows*) with upstream's bindings, push
 * constants and dispatch shape, so ggml-vulkan's op code runs them like its own; the turbo -> f16
 * CPY that tq_vk_mul_mat dispatches has no such slot (tq_vk_device_pipelines).
 *
 * Patch 0106-ggml-vulkan.patch calls, one line each: tq_vk_supports_op at the top of
 * ggml_backend_vk_device_supports_op, tq_vk_mul_mat at the top of ggml_vk_mul_mat (before it
 * picks mul_mat_vec, which has no turbo shader), tq_vk_flash_attn before the graph's call of
 * ggml_vk_flash_attn, tq_vk_cleanup in ggml_vk_cleanup, tq_vk_load_shaders at the end of
 * ggml_vk_load_shaders, TQ_VK_TYPE_CASES in supports_op's list of flash attention K/V types and in the two CPY
 * pipeline switches of ggml_vk_get_cpy_pipeline, tq_vk_fa_path where get_fa_tuning_params picks
 * the shader family, tq_vk_fa_small_batch after ggml_vk_flash_attn's tuning, and tq_vk_custom
 * as ggml_vk_build_graph's case for GGML_OP_CUSTOM.
 */
#ifndef TQ_VULKAN_H
#define TQ_VULKAN_H

#include "tq-ggml.h"
#include "tq-fa-contract.h"
#include "tq-rf-keep.h"
#include "tq-rot-node.h"
#include "tq-vulkan-shaders.h"
#include "shaders/tq_fa_terms.h"

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

/* Whether tq_fa_terms.comp reads the terms of flash attention `op` (tq-fa-contract.h's layout):
 * a turbo K whose views start and step in whole blocks, an f16 mask of one head (or none), no
 * soft-cap or ALiBi (both would act on the term, which belongs before them), and a grid the
 * device dispatches (rows and heads within the y and z limits). */
static bool tq_vk_fa_terms_ok(const struct ggml_tensor * op) {
    const struct ggml_tensor * q = op->src[0], * k = op->src[1], * mask = op->src[3];
    if (!tq_fa_k_terms_valid(op) || !tq_vk_has_shaders(k->type) || q->type != GGML_TYPE_F32 || q->nb[0] != sizeof(float)) {
        return false;
    }
    float max_bias = 0.0f, softcap = 0.0f;
    memcpy(&max_bias, (const float *) op->op_params + 1, sizeof(float));
    memcpy(&softcap, (const float *) op->op_params + 2, sizeof(float));
    const size_t blk = ggml_type_size(k->type);
    const int64_t n_rows = mask ? mask->ne[1] : q->ne[1];
    if (max_bias != 0.0f || softcap != 0.0f || k->ne[0] % ggml_blck_size(k->type) != 0 || k->nb[1] % blk != 0 ||
        k->nb[2] % blk != 0 || k->nb[3] % blk != 0 || k->view_offs % blk != 0 || q->ne[3] != k->ne[3] ||
        n_rows > 65535 || q->ne[2] * q->ne[3] > 65535 || q->ne[1] > n_rows) {
        return false;
    }
    if (mask && (mask->type != GGML_TYPE_F16 || mask->ne[0] != k->ne[1] || mask->ne[2] != 1 ||
                 (mask->ne[3] != 1 && mask->ne[3] != k->ne[3]) || mask->nb[0] != sizeof(ggml_fp16_t))) {
        return false;
    }
    return true;
}

static bool tq_vk_rf_keep_ok(const vk_device & device, const struct ggml_tensor * op);
static bool tq_vk_rot_ok(const vk_device & device, const struct ggml_tensor * op);

/* -1: no turbo type in `op`, upstream decides. 0/1: refused/accepted here, or (flash attention)
 * 1 only after upstream's own checks, which TQ_VK_TYPE_CASES lets through for turbo K/V; the
 * fused K side's and the rotation's custom ops (tq_rf_keep_is, tq_rot_is): 1 where their shader
 * reads the layout. */
static int tq_vk_supports_op(const vk_device & device, const struct ggml_tensor * op) {
    if (tq_rf_keep_is(op)) {
        return tq_vk_rf_keep_ok(device, op) ? 1 : 0;
    }
    if (tq_rot_is(op)) {
        return tq_vk_rot_ok(device, op) ? 1 : 0;
    }
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
            /* with the turbo K terms: where tq_fa_terms.comp reads them, then upstream's checks */
            return tq_fa_has_k_terms(op) && !tq_vk_fa_terms_ok(op) ? 0 : -1;
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

/* Flash attention with the turbo K terms gives a query row the same bits alone and among up to
 * TQ_VK_FA_SAME_ROWS rows, such as a speculative draft's verification batch (docs/VULKAN.md,
 * "Batch invariance"). Upstream tunes its shader by the row count: one row takes the scalar
 * shader with 64 keys per block, two to eight take 32 per block (or coopmat1 where the device
 * has it), and a row's online softmax then sums its keys in another order; `tq batch-check`
 * showed a token's attention output differ alone and in a batch of 4 on lavapipe. Here such a
 * batch takes the one-row tuning (`one_row`: scalar, its keys per block, threads and row split)
 * with block_rows raised to cover every row: each row runs the one-row arithmetic, the rows
 * still share one tile (K and V read and decoded once for all of them) and, as one tile, the
 * same split of the keys across workgroups as a lone row (ggml_vk_flash_attn's split_k follows
 * the tiles). Only for the op with the K terms (tq_vk_flash_attn's per-head mask, which keeps
 * upstream's kernel out of its GQA form, where the split follows the token count and no tuning
 * makes it invariant): the turbo K's default path, and the fewest new pipelines for a device to
 * compile (lavapipe takes minutes each). False where it does not apply or where the taller tile
 * does not fit the device's shared memory: upstream's tuning then stands. Called by
 * ggml_vk_flash_attn after its tuning (one patch line). */
#define TQ_VK_FA_SAME_ROWS 8
static inline bool tq_vk_fa_small_batch(const vk_device & device, vk_fa_tuning_params & params,
                                        const vk_fa_tuning_params & one_row, const struct ggml_tensor * dst,
                                        uint32_t n_rows, uint32_t gqa_ratio, uint32_t hsk, uint32_t hsv, bool f32acc) {
    if (n_rows <= 1 || n_rows > TQ_VK_FA_SAME_ROWS || gqa_ratio != 1 || !tq_fa_has_k_terms(dst)) {
        return false;
    }
    vk_fa_tuning_params p = one_row;
    p.block_rows = 1;
    while (p.block_rows < n_rows) {
        p.block_rows *= 2;
    }
    if (p.block_rows % p.row_split != 0 ||
        !ggml_vk_flash_attn_scalar_shmem_support(device, p, hsk, hsv, f32acc, dst->src[1]->type, dst->src[2]->type)) {
        return false;
    }
    params = p;
    return true;
}

/* Our pipelines that have no slot in upstream's tables: turbo -> f16 with the CPY interface
 * (strided source, contiguous destination; tq_vk_mul_mat), one per device and type. Keyed by
 * the device's address: ggml-vulkan keeps a device for the whole process (vk_instance.devices). */
struct tq_vk_pipelines {
    vk_pipeline cpy_f16[GGML_TYPE_COUNT];
    vk_pipeline fa_terms[GGML_TYPE_COUNT]; /* tq_fa_terms.comp, by K's type */
    vk_pipeline rf_keep;                   /* tq_rf_keep.comp */
    vk_pipeline rot;                       /* tq_rot.comp */
};

/* tq_fa_terms.comp's push constants, in its order. */
struct tq_vk_fa_terms_pc {
    uint32_t n_kv, n_rows, n_tok, nq, g, hd;
    uint32_t q_off, q_nb1, q_nb2, q_nb3;
    uint32_t k_off, k_nb1, k_nb2, k_nb3;
    uint32_t m_off, m_nb1, m_nb3;
    uint32_t a_off, t_off, c_off;
    uint32_t n_cells, n_slots, r_off, r_row, rq_off, rq_row;
    float scale;
};
static_assert(sizeof(tq_vk_fa_terms_pc) <= 128, "Vulkan guarantees 128 bytes of push constants");

/* tq_rf_keep.comp's push constants, in its order (offsets and strides in floats). */
struct tq_vk_rf_keep_pc {
    uint32_t hd, nkv, nt, nq, per;
    uint32_t q_off, q_nb1, q_nb2;
    uint32_t k_off, k_nb1, k_nb2;
    uint32_t m_off, m_nb1;
    uint32_t t_off, t_nb1;
    uint32_t d_off;
    uint32_t flags;
};
static_assert(sizeof(tq_vk_rf_keep_pc) <= 128, "Vulkan guarantees 128 bytes of push constants");

/* tq_rot.comp's push constants, in its order (offsets and strides in floats). */
struct tq_vk_rot_pc {
    uint32_t n;
    uint32_t r_off;
    uint32_t x_off, x_nb1;
    uint32_t y_off, y_nb1;
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
    create(device, tq_vk_device_pipelines(device).fa_terms[GGML_TYPE_##T], "tq_fa_terms_" #t,                \
           TQ_VK_SPV(fa_terms_##t), "main", 9, sizeof(tq_vk_fa_terms_pc), {64, 1, 1}, {}, 1);                  \
    create(device, device->pipeline_get_rows[GGML_TYPE_##T], "tq_get_rows_" #t,                                \
           TQ_VK_SPV(get_rows_##t), "main", 3, sizeof(vk_op_binary_push_constants), {512, 1, 1}, {}, 1);        \
    create(device, device->pipeline_get_rows_f32[GGML_TYPE_##T], "tq_get_rows_" #t "_f32",                     \
           TQ_VK_SPV(get_rows_##t##_f32), "main", 3, sizeof(vk_op_binary_push_constants), {512, 1, 1}, {}, 1);
    TQ_VK_TYPE(turbo2, TURBO2)
    TQ_VK_TYPE(turbo3, TURBO3)
    TQ_VK_TYPE(turbo4, TURBO4)
    TQ_VK_TYPE(turbo3_tcq, TURBO3_TCQ) /* tq_tcq_encode.comp: same dispatch shape, 32 blocks a group */
    TQ_VK_TYPE(turbo2_tcq, TURBO2_TCQ)
    /* one workgroup of 64 per (KV head, token): the dispatch counts groups */
    create(device, tq_vk_device_pipelines(device).rf_keep, "tq_rf_keep", TQ_VK_SPV(rf_keep), "main", 5,
           sizeof(tq_vk_rf_keep_pc), {1, 1, 1}, {}, 1);
    /* one workgroup of 64 per row */
    create(device, tq_vk_device_pipelines(device).rot, "tq_rot", TQ_VK_SPV(rot), "main", 3, sizeof(tq_vk_rot_pc),
           {1, 1, 1}, {}, 1);
#undef TQ_VK_TYPE
#undef TQ_VK_SPV
}

/* A contiguous tensor of `like`'s shape and type `type` whose device memory is `buf` from offset
 * 0, for one call of upstream's op code that reads it as a source (ggml_vk_tensor_subbuffer finds
 * the buffer through the tensor's buffer context). The buffer stays its owner's: the borrowed
 * context lets go of it when this goes out of scope. */
struct tq_vk_borrowed_tensor {
    std::string name;
    ggml_backend_vk_buffer_context buf_ctx;
    ggml_backend_buffer buf;
    ggml_tensor t;

    tq_vk_borrowed_tensor(ggml_backend_vk_context * ctx, const vk_buffer & b, const ggml_tensor * like, ggml_type type,
                          const char * label)
        : name(label), buf_ctx(ctx->device, vk_buffer(b), name), buf(*like->buffer), t(*like) {
        buf.context = &buf_ctx;
        t.type = type;
        t.op = GGML_OP_NONE;
        for (ggml_tensor *& s : t.src) {
            s = nullptr;
        }
        t.buffer = &buf;
        t.view_src = nullptr;
        t.view_offs = 0;
        t.data = vk_ptr_base;
        t.nb[0] = ggml_type_size(type);
        for (int i = 1; i < GGML_MAX_DIMS; ++i) {
            t.nb[i] = t.nb[i - 1] * t.ne[i - 1];
        }
    }
    ~tq_vk_borrowed_tensor() { buf_ctx.dev_buffer = nullptr; }
    tq_vk_borrowed_tensor(const tq_vk_borrowed_tensor &) = delete;
    tq_vk_borrowed_tensor & operator=(const tq_vk_borrowed_tensor &) = delete;
};

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

    /* rounded up as mul_mat_vec binds an A read in place. The K view grows with the cache's
     * used cells, and each growth here submits and waits in the middle of the graph: doubling
     * makes that a few times per context, not once per ubatch. */
    const size_t x_alloc = ggml_vk_align_size(x_sz, ctx->device->properties.limits.minStorageBufferOffsetAlignment);
    if (ctx->prealloc_size_x < x_alloc) {
        const size_t range = ctx->device->properties.limits.maxStorageBufferRange;
        ctx->prealloc_size_x = std::max(x_alloc, std::min(2 * ctx->prealloc_size_x, range));
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
    tq_vk_borrowed_tensor x(ctx, ctx->prealloc_x, src0, x_type, "tq_decoded_a");
    dst->src[0] = &x.t;
    ggml_vk_mul_mat(ctx, subctx, cgraph, node_idx);
    dst->src[0] = src0;
    GGML_ASSERT(x.buf_ctx.dev_buffer == ctx->prealloc_x); /* nothing resized it under the call */
    ctx->prealloc_x_need_sync = true;
    return true;
}

/* The per-head masks of flash attention with the turbo K terms (tq_vk_flash_attn): one scratch
 * buffer per context, the last of its list. It grows without a submit and wait in the middle
 * of the graph (unlike ggml_vk_preallocate_buffers): a larger buffer, at least twice the size,
 * takes over and the smaller ones stay alive for the commands that may still read them, at
 * most the size of the last one in all. Keyed by the context's address, under a lock (contexts
 * may compute on different threads); tq_vk_cleanup lets go after ggml_vk_cleanup's wait. */
struct tq_vk_fa_masks {
    std::mutex mutex;
    std::map<const ggml_backend_vk_context *, std::vector<vk_buffer>> by_ctx;
};

static tq_vk_fa_masks & tq_vk_fa_masks_of_process() {
    static tq_vk_fa_masks masks;
    return masks;
}

static vk_buffer tq_vk_fa_mask_buffer(ggml_backend_vk_context * ctx, size_t bytes) {
    tq_vk_fa_masks & m = tq_vk_fa_masks_of_process();
    std::lock_guard<std::mutex> lock(m.mutex);
    std::vector<vk_buffer> & all = m.by_ctx[ctx];
    if (all.empty() || all.back()->size < bytes) {
        const size_t grown = all.empty() ? bytes : std::max(bytes, 2 * all.back()->size);
        all.push_back(ggml_vk_create_buffer_device(ctx->device, grown));
    }
    return all.back();
}

static void tq_vk_cleanup(ggml_backend_vk_context * ctx) {
    tq_vk_fa_masks & m = tq_vk_fa_masks_of_process();
    std::lock_guard<std::mutex> lock(m.mutex);
    m.by_ctx.erase(ctx);
}

/* FLASH_ATTN_EXT with the turbo K terms (tq-fa-contract.h): tq_fa_terms.comp writes the op's
 * mask plus scale * (A.T + the first keys' corrections) per head into the context's scratch,
 * and upstream's flash attention runs with that mask: the same arithmetic as llama's lowered
 * form (tq_rf_mask, tq_sink_mask_delta), in one dispatch instead of about 17 nodes a layer.
 * Called where ggml_vk_build_graph runs a flash attention (one patch line); false: not ours. */
static bool tq_vk_flash_attn(ggml_backend_vk_context * ctx, vk_context & subctx, ggml_tensor * dst) {
    if (!tq_fa_has_k_terms(dst)) {
        return false;
    }
    GGML_ASSERT(tq_vk_fa_terms_ok(dst) && "turbo K terms: supports_op accepted a layout tq_fa_terms.comp does not read");
    const ggml_tensor * q = dst->src[0], * k = dst->src[1], * mask = dst->src[3];
    const ggml_tensor * A = dst->src[TQ_FA_SRC_A], * T = dst->src[TQ_FA_SRC_T], * C = dst->src[TQ_FA_SRC_CELLS];
    const ggml_tensor * R = dst->src[TQ_FA_SRC_SINK_ROWS], * RQ = dst->src[TQ_FA_SRC_SINK_Q];
    const int64_t hd = k->ne[0], n_kv = k->ne[1], nkv = k->ne[2], ns = k->ne[3], nq = q->ne[2];
    const int64_t n_rows = mask ? mask->ne[1] : q->ne[1];
    const size_t out_bytes = (size_t) (n_kv * n_rows * nq * ns) * sizeof(ggml_fp16_t);

    vk_buffer out = tq_vk_fa_mask_buffer(ctx, out_bytes);
    vk_pipeline pipeline = tq_vk_device_pipelines(ctx->device).fa_terms[k->type];
    GGML_ASSERT(pipeline != nullptr);
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);

    float scale = 1.0f;
    memcpy(&scale, (const float *) dst->op_params + 0, sizeof(float));
    const tq_sink_t sink = tq_sink_of(R, RQ);
    const size_t blk = ggml_type_size(k->type), f = sizeof(float), h = sizeof(ggml_fp16_t);
    vk_subbuffer q_buf = ggml_vk_tensor_subbuffer(ctx, q, true), k_buf = ggml_vk_tensor_subbuffer(ctx, k, true);
    vk_subbuffer m_buf = mask ? ggml_vk_tensor_subbuffer(ctx, mask, true) : q_buf;
    vk_subbuffer a_buf = ggml_vk_tensor_subbuffer(ctx, A, true), t_buf = ggml_vk_tensor_subbuffer(ctx, T, true);
    vk_subbuffer c_buf = ggml_vk_tensor_subbuffer(ctx, C, true);
    vk_subbuffer r_buf = sink.n_slots ? ggml_vk_tensor_subbuffer(ctx, R, true) : a_buf;
    vk_subbuffer rq_buf = sink.n_slots ? ggml_vk_tensor_subbuffer(ctx, RQ, true) : k_buf;
    tq_vk_fa_terms_pc pc = {};
    pc.n_kv = (uint32_t) n_kv;
    pc.n_rows = (uint32_t) n_rows;
    pc.n_tok = (uint32_t) q->ne[1];
    pc.nq = (uint32_t) nq;
    pc.g = (uint32_t) (nq / nkv);
    pc.hd = (uint32_t) hd;
    pc.q_off = (uint32_t) (get_misalign_bytes(ctx, q) / f);
    pc.q_nb1 = (uint32_t) (q->nb[1] / f);
    pc.q_nb2 = (uint32_t) (q->nb[2] / f);
    pc.q_nb3 = (uint32_t) (q->nb[3] / f);
    pc.k_off = (uint32_t) (get_misalign_bytes(ctx, k) / blk);
    pc.k_nb1 = (uint32_t) (k->nb[1] / blk);
    pc.k_nb2 = (uint32_t) (k->nb[2] / blk);
    pc.k_nb3 = (uint32_t) (k->nb[3] / blk);
    pc.m_off = mask ? (uint32_t) (get_misalign_bytes(ctx, mask) / h) : 0xffffffffu;
    pc.m_nb1 = mask ? (uint32_t) (mask->nb[1] / h) : 0;
    pc.m_nb3 = mask && mask->ne[3] > 1 ? (uint32_t) (mask->nb[3] / h) : 0;
    pc.a_off = (uint32_t) (get_misalign_bytes(ctx, A) / f);
    pc.t_off = (uint32_t) (get_misalign_bytes(ctx, T) / f);
    pc.c_off = (uint32_t) (get_misalign_bytes(ctx, C) / sizeof(int32_t));
    pc.n_cells = (uint32_t) C->ne[0];
    pc.n_slots = (uint32_t) sink.n_slots;
    pc.r_off = sink.n_slots ? (uint32_t) (get_misalign_bytes(ctx, R) / f) : 0;
    pc.r_row = (uint32_t) sink.row_f;
    pc.rq_off = sink.n_slots ? (uint32_t) (get_misalign_bytes(ctx, RQ) / blk) : 0;
    pc.rq_row = (uint32_t) (sink.row_q / blk);
    pc.scale = scale;

    ggml_vk_sync_buffers(ctx, subctx); /* the previous layer's flash attention read the scratch */
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline,
                              { q_buf, k_buf, m_buf, a_buf, t_buf, c_buf, r_buf, rq_buf, vk_subbuffer{ out, 0, out_bytes } },
                              pc, { (uint32_t) n_kv, (uint32_t) n_rows, (uint32_t) (CEIL_DIV(nq, (int64_t) TQ_FA_TERMS_HEADS) * ns) });
    ggml_vk_sync_buffers(ctx, subctx);

    ggml_tensor shape = *q;
    shape.ne[0] = n_kv;
    shape.ne[1] = n_rows;
    shape.ne[2] = nq;
    shape.ne[3] = ns;
    tq_vk_borrowed_tensor m(ctx, out, &shape, GGML_TYPE_F16, "tq_fa_terms_mask");
    ggml_vk_flash_attn(ctx, subctx, q, k, dst->src[2], &m.t, dst->src[4], dst);
    return true;
}

/* Whether tq_rf_keep.comp runs `op` (tq_rf_keep_is): its layout (tq_rf_keep_valid), one
 * workgroup per (KV head, token) within the device's grid, and every source's and the output's
 * extent addressable by the shader's 32-bit float offsets within one binding. */
static bool tq_vk_rf_keep_ok(const vk_device & device, const struct ggml_tensor * op) {
    if (!tq_rf_keep_valid(op)) {
        return false;
    }
    const uint64_t range = device->properties.limits.maxStorageBufferRange;
    const ggml_tensor * all[5] = { op->src[0], op->src[1], op->src[2], op->src[3], op };
    for (const ggml_tensor * t : all) {
        if (t && (ggml_nbytes(t) + device->properties.limits.minStorageBufferOffsetAlignment > range ||
                  t->nb[1] % sizeof(float) != 0 || t->nb[2] % sizeof(float) != 0)) {
            return false;
        }
    }
    const struct ggml_tensor * k = op->src[1];
    return (uint64_t) k->ne[1] <= device->properties.limits.maxComputeWorkGroupCount[0] &&
           (uint64_t) k->ne[2] <= device->properties.limits.maxComputeWorkGroupCount[1];
}

/* The fused K side (tq-rf-keep.h) by shaders/tq_rf_keep.comp. */
static void tq_vk_rf_keep(ggml_backend_vk_context * ctx, vk_context & subctx, ggml_tensor * dst) {
    GGML_ASSERT(tq_vk_rf_keep_ok(ctx->device, dst) && "tq_rf_keep: supports_op accepted a layout tq_rf_keep.comp does not read");
    const ggml_tensor * q = dst->src[0], * k = dst->src[1], * cols = dst->src[2], * T = dst->src[3];
    vk_pipeline pipeline = tq_vk_device_pipelines(ctx->device).rf_keep;
    GGML_ASSERT(pipeline != nullptr);
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    const size_t f = sizeof(float);
    vk_subbuffer q_buf = ggml_vk_tensor_subbuffer(ctx, q, true), k_buf = ggml_vk_tensor_subbuffer(ctx, k, true);
    vk_subbuffer m_buf = ggml_vk_tensor_subbuffer(ctx, cols, true), d_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    vk_subbuffer t_buf = T ? ggml_vk_tensor_subbuffer(ctx, T, true) : m_buf;
    tq_vk_rf_keep_pc pc = {};
    pc.hd = (uint32_t) k->ne[0];
    pc.nkv = (uint32_t) k->ne[1];
    pc.nt = (uint32_t) k->ne[2];
    pc.nq = (uint32_t) q->ne[1];
    pc.per = (uint32_t) (k->ne[2] / cols->ne[1]);
    pc.q_off = (uint32_t) (get_misalign_bytes(ctx, q) / f);
    pc.q_nb1 = (uint32_t) (q->nb[1] / f);
    pc.q_nb2 = (uint32_t) (q->nb[2] / f);
    pc.k_off = (uint32_t) (get_misalign_bytes(ctx, k) / f);
    pc.k_nb1 = (uint32_t) (k->nb[1] / f);
    pc.k_nb2 = (uint32_t) (k->nb[2] / f);
    pc.m_off = (uint32_t) (get_misalign_bytes(ctx, cols) / f);
    pc.m_nb1 = (uint32_t) (cols->nb[1] / f);
    pc.t_off = T ? (uint32_t) (get_misalign_bytes(ctx, T) / f) : 0xffffffffu;
    pc.t_nb1 = T ? (uint32_t) (T->nb[1] / f) : 0;
    pc.d_off = (uint32_t) (get_misalign_bytes(ctx, dst) / f);
    pc.flags = (uint32_t) tq_rf_keep_flags(dst);
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { q_buf, k_buf, m_buf, t_buf, d_buf }, pc,
                              { (uint32_t) k->ne[1], (uint32_t) k->ne[2], 1 });
}

/* Whether tq_rot.comp runs `op` (tq_rot_is): its layout (tq_rot_valid), one workgroup per row
 * within the device's grid, every tensor addressable by 32-bit float offsets in one binding. */
static bool tq_vk_rot_ok(const vk_device & device, const struct ggml_tensor * op) {
    if (!tq_rot_valid(op)) {
        return false;
    }
    const uint64_t range = device->properties.limits.maxStorageBufferRange;
    const ggml_tensor * all[3] = { op->src[0], op->src[1], op };
    for (const ggml_tensor * t : all) {
        if (ggml_nbytes(t) + device->properties.limits.minStorageBufferOffsetAlignment > range) {
            return false;
        }
    }
    return (uint64_t) op->ne[1] <= device->properties.limits.maxComputeWorkGroupCount[0];
}

/* The rotation (tq-rot-node.h) by shaders/tq_rot.comp. */
static void tq_vk_rot(ggml_backend_vk_context * ctx, vk_context & subctx, ggml_tensor * dst) {
    GGML_ASSERT(tq_vk_rot_ok(ctx->device, dst) && "tq_rot: supports_op accepted a layout tq_rot.comp does not read");
    const ggml_tensor * rot = dst->src[0], * x = dst->src[1];
    vk_pipeline pipeline = tq_vk_device_pipelines(ctx->device).rot;
    GGML_ASSERT(pipeline != nullptr);
    ggml_pipeline_request_descriptor_sets(ctx, pipeline, 1);
    const size_t f = sizeof(float);
    vk_subbuffer r_buf = ggml_vk_tensor_subbuffer(ctx, rot, true), x_buf = ggml_vk_tensor_subbuffer(ctx, x, true);
    vk_subbuffer y_buf = ggml_vk_tensor_subbuffer(ctx, dst, true);
    tq_vk_rot_pc pc = {};
    pc.n = (uint32_t) rot->ne[0];
    pc.r_off = (uint32_t) (get_misalign_bytes(ctx, rot) / f);
    pc.x_off = (uint32_t) (get_misalign_bytes(ctx, x) / f);
    pc.x_nb1 = (uint32_t) (x->nb[1] / f);
    pc.y_off = (uint32_t) (get_misalign_bytes(ctx, dst) / f);
    pc.y_nb1 = (uint32_t) (dst->nb[1] / f);
    ggml_vk_dispatch_pipeline(ctx, subctx, pipeline, { r_buf, x_buf, y_buf }, pc, { (uint32_t) dst->ne[1], 1, 1 });
}

/* ggml_vk_build_graph's case for GGML_OP_CUSTOM (one patch line): our two nodes; false: not
 * ours (upstream then has no kernel for it). */
static bool tq_vk_custom(ggml_backend_vk_context * ctx, vk_context & subctx, ggml_tensor * dst) {
    if (tq_rf_keep_is(dst)) {
        tq_vk_rf_keep(ctx, subctx, dst);
        return true;
    }
    if (tq_rot_is(dst)) {
        tq_vk_rot(ctx, subctx, dst);
        return true;
    }
    return false;
}

#endif /* TQ_VULKAN_H */
