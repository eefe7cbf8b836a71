/*
 * tq-ggml-graph.h - the choices llama's graph makes for a turbo cache: when a prefill decodes
 * K and V to f32 first, and how the seeded rotation is multiplied in.
 *
 * No backend reads these: they live apart from tq-ggml.h, which every ggml, CPU, CUDA and
 * Vulkan object includes, so that a change here rebuilds llama's objects and not the
 * backends' (CI's CUDA check recompiles its 60 objects whenever tq-ggml.h changes,
 * docs/CI.md).
 */
#ifndef TQ_GGML_GRAPH_H
#define TQ_GGML_GRAPH_H

#include "tq-ggml.h"
#include "tq-rot-node.h"

/* CPU prefill. Flash attention's tiled (GEMM-like) CPU kernel takes only f32/f16 K and V;
   any other type is dotted one query row at a time, which makes a 512-token prompt over a
   long cache several times slower than f16. Over turbo K and turbo V (heads up to
   TQ_GGML_CPU_TILES_DMAX) a prefill takes the turbo tiles of a decode instead (ggml-cpu's
   tq-ggml-fa.h and tq-fa-window.h: the keys decoded once per window for every query row,
   as fast as the tiled kernel), so that a query row gets the same bits whatever ubatch it
   comes in: a prompt cut into other ubatches otherwise gave other logits, which a quantized
   cache amplifies (docs/RELIABILITY.md, "Statistics and batching"). For any other pair
   with a turbo side, and for every pair with TQ_PREFILL_DECODE=1 (tq-switches.def), a
   batch of at least TQ_PREFILL_DECODE_MIN_TOKENS queries over a host-resident turbo cache
   has llama's graph decode K and V to f32 once per layer (a transient compute buffer of
   n_kv x heads x head_dim x 8 bytes) and run the tiled kernel. One-token decode never pays
   it. The switch is read once (the first graph built), not per layer or per graph. A cache
   behind RPC takes the same choice: the server runs the same ops (CPY to f32 and flash
   attention, or flash attention over the turbo blocks), so a model gives the same logits
   there as on this machine's CPU. Other devices keep their own kernels. */
#define TQ_PREFILL_DECODE_MIN_TOKENS 64
static inline int tq_ggml_prefill_decode_enabled(void) {
    static int on = -1; /* benign race: every thread reads the same environment */
    if (on < 0) {
        on = tq_switch_get(TQ_SW_PREFILL_DECODE); /* "0|1" */
    }
    return on;
}
static inline int tq_ggml_decode_for_prefill(const struct ggml_tensor *k, const struct ggml_tensor *v,
                                             int64_t n_tokens) {
    const struct ggml_tensor *root = k->view_src ? k->view_src : k;
    if (n_tokens < TQ_PREFILL_DECODE_MIN_TOKENS) return 0;
    if (!TQ_GGML_IS_TURBO(k->type) && !TQ_GGML_IS_TURBO(v->type)) return 0;
    if (!TQ_GGML_IS_TURBO(k->type) && k->type != GGML_TYPE_F16 && k->type != GGML_TYPE_F32) return 0;
    if (!TQ_GGML_IS_TURBO(v->type) && v->type != GGML_TYPE_F16 && v->type != GGML_TYPE_F32) return 0;
    if (!tq_ggml_prefill_decode_enabled() && TQ_GGML_IS_TURBO(k->type) && TQ_GGML_IS_TURBO(v->type) &&
        k->ne[0] <= TQ_GGML_CPU_TILES_DMAX && v->ne[0] <= TQ_GGML_CPU_TILES_DMAX) {
        return 0; /* the turbo tiles */
    }
    if (root->buffer == NULL) return 0;
    return ggml_backend_buffer_is_host(root->buffer) ||
           strncmp(ggml_backend_buft_name(ggml_backend_buffer_get_type(root->buffer)), "RPC", 3) == 0;
}

/* The rotation input tensor of a turbo cache holds our seeded matrix instead of the plain
   Walsh-Hadamard one, and llama_mul_mat_hadamard must then not ask the backend for the
   (unsigned) fast Walsh-Hadamard transform. The cache marks the tensor in the last int32 of
   its op_params: it is a graph input (GGML_OP_NONE), whose op_params no op reads. */
#define TQ_ROT_SEEDED_MAGIC 0x53525154 /* "TQRS" */
#define TQ_ROT_SEEDED_SLOT (GGML_MAX_OP_PARAMS / sizeof(int32_t) - 1)
static inline void tq_rot_mark_seeded(struct ggml_tensor *rot) {
    rot->op_params[TQ_ROT_SEEDED_SLOT] = TQ_ROT_SEEDED_MAGIC;
}
static inline int tq_rot_is_seeded(const struct ggml_tensor *rot) {
    return rot->op != GGML_OP_NONE ? 0 : rot->op_params[TQ_ROT_SEEDED_SLOT] == TQ_ROT_SEEDED_MAGIC;
}
/* A second mark, in the slot before: every layer's cache sits on a device that runs the
   rotation as one node (tq-rot-node.h), so a decode's rows take that node (tq_mul_mat_rot). */
#define TQ_ROT_NODE_SLOT (TQ_ROT_SEEDED_SLOT - 1)
static inline void tq_rot_mark_node(struct ggml_tensor *rot) {
    rot->op_params[TQ_ROT_NODE_SLOT] = TQ_ROT_SEEDED_MAGIC;
}
static inline int tq_rot_takes_node(const struct ggml_tensor *rot) {
    return tq_rot_is_seeded(rot) && rot->op_params[TQ_ROT_NODE_SLOT] == TQ_ROT_SEEDED_MAGIC;
}

/* llama_mul_mat_hadamard with the seeded rotation (the patch's call there): Q, K, V and the
   attention output times the rotation, as one mat-vec per row of n values. Shaped [n, 1, rows]
   instead of upstream's [n, rows], every backend takes its mat-vec kernel whatever the row
   count, so a token gets the same bits alone and inside a small batch, such as a speculative
   draft's verification. As [n, rows] ggml-vulkan takes its mat-vec for up to 8 rows and a
   tiled matmul above, which sums in another order (ggml-cuda's f32 mat-vec takes at most 3
   rows on an Ampere or newer GPU, 4 on Turing): with SmolLM2's 3 KV heads a lone token's K
   took the first and a 4-token batch's the second (`tq batch-check`, docs/SPECULATIVE.md),
   and a turbo cache turned that rounding into other codes. A batch of
   TQ_PREFILL_DECODE_MIN_TOKENS tokens or more (a prefill) keeps the matmul, which is faster
   there; below it the rows (tokens x heads) stay within CUDA's grid (ggml-cuda's mat-vec puts
   them on gridDim.y, at most 65535). Where the rotation is marked for its node
   (tq_rot_takes_node: a GPU-class device that claims it), those rows take the node instead: one
   dispatch whatever the row count, and each row's sums in one order by construction. cur is
   [n, heads, tokens, s] (Q, K, V; a K shift's [n, heads, cells]) or [n * heads, tokens] (the
   attention output). */
static inline struct ggml_tensor * tq_mul_mat_rot(struct ggml_context *ctx, struct ggml_tensor *cur,
                                                  struct ggml_tensor *rot) {
    const int64_t n = rot->ne[0];
    const int64_t rows = ggml_nelements(cur) / n;
    const int64_t per_token = cur->ne[0] == n ? cur->ne[1] : cur->ne[0] / n;
    struct ggml_tensor *res = ggml_is_contiguous(cur) ? cur : ggml_cont(ctx, cur);
    const int small = per_token > 0 && rows / per_token < TQ_PREFILL_DECODE_MIN_TOKENS;
    if (small && tq_rot_takes_node(rot)) {
        res = tq_rot_node(ctx, rot, ggml_reshape_2d(ctx, res, n, rows));
        return ggml_reshape_4d(ctx, res, cur->ne[0], cur->ne[1], cur->ne[2], cur->ne[3]);
    }
    res = small ? ggml_reshape_3d(ctx, res, n, 1, rows) : ggml_reshape_2d(ctx, res, n, rows);
    /* no GGML_HINT_SRC0_IS_HADAMARD: the backends' fast Walsh-Hadamard has no random signs */
    res = ggml_mul_mat(ctx, rot, res);
    return ggml_reshape_4d(ctx, res, cur->ne[0], cur->ne[1], cur->ne[2], cur->ne[3]);
}

#endif /* TQ_GGML_GRAPH_H */
