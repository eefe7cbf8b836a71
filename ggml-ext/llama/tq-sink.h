/*
 * tq-sink.h - the key at position 0 (the attention sink) kept exact beside the cache (C for
 * the match rule both sides use; C++ graph pieces for llama under __cplusplus).
 *
 * Why: most models put a large share of every query's attention on the first token. Its
 * key's quantization error moves that one logit, and through the softmax every other
 * weight with it; on real SmolLM2 keys, storing that single key without error takes about
 * a third of the attention error of turbo2 and turbo3 at 8192 tokens (docs/JOURNAL.md,
 * `tq kmean-sim`'s /sink1), more keys add next to nothing.
 *
 * What is kept: per layer, slot rows of the K the cache is given (after the K mean and
 * balancing, rotated: what the cache quantizes), f32 [n_embd_k_gqa, n_seq_max + 1], and the
 * same rows quantized to K's type. A ubatch's token at position 0 writes the slot of its
 * (lowest) sequence s (ggml_set_rows, the op llama stores K with, so the quantized copy is
 * byte for byte the cell's); every other token writes the last row, which is never read.
 * seq_cp copies a slot with the first key it copies, and a restore writes the saved exact
 * key into the slot of the sequence it restores (tq-llama-kv-cache.cpp).
 *
 * Which cells use it (the match rule): the host gives each cell in view its slot, that of
 * its lowest sequence where the cell is at position 0, else none (-1); a cell whose stored
 * bytes of KV head h equal its slot's bytes of head h takes that slot's exact f32 row for the
 * head, and otherwise its decoded key, which is what attention used before. The bytes guard
 * against what the bookkeeping does not follow: a cell emptied and refilled, moved by a K
 * shift (re-quantized: other bytes), or a slot since taken by a new first token. Only the own
 * slot counts: the first keys of different prompts can quantize to the same bytes (on
 * SmolLM2 they do in one layer of 30, where the first token's state hardly depends on the
 * token) and still differ, so taking any slot with those bytes would make one sequence's
 * attention depend on another's.
 *
 * Where it applies: the mean in RoPE's frame (tq-kmean-rope.h) with flash attention over a
 * turbo K, whatever V is: on a device that runs the turbo K terms (the CPU, RPC) with a turbo
 * V its decode tiles (tq-ggml-fa.h), Vulkan's decode (the slots as sources of its flash
 * attention, tq_fa_terms.comp), on the CPU the prefill path that decodes K to f32
 * (tq_rf_keys, tq_sink_keys), and everywhere else (a device that takes the terms as a mask,
 * tq_kmean_rope_masked: CUDA, a Vulkan prefill; a CPU decode over a V that is not turbo) the lowered
 * form below, q.(R_j - k_c) in the per-head mask of a decode and R_j - k_c added to a
 * prefill's decoded keys. Without flash attention, and with the fitted mean, every path keeps
 * the decoded key, so that a sequence gets the same keys however its tokens were batched. For the same reason a first ubatch too
 * small to give the statistics (fewer than TQ_KMEAN_MIN_TOKENS_SKIP tokens past position 0)
 * runs as KEEP over m = 0, s = 1 while the slots are on (tq_kmean_prepare): the ZERO graph
 * would neither write nor read them. The statistics leave the tokens at position 0 out
 * (tq_kmean_stat_weights): their keys are not the ones quantized.
 */
#ifndef TQ_SINK_H
#define TQ_SINK_H

#include "ggml.h"
#include "tq-fa-contract.h" /* the match rule, tq_sink_t */

#include <stdint.h>
#include <string.h>

#ifdef __cplusplus

/* x as a packed tensor: a reshape where its bytes already lie in that order (a view or a
   permute that only moves dimensions of size 1: one query, one selected cell, one block), a
   copy node only where they do not. */
static inline ggml_tensor * tq_packed(ggml_context * ctx, ggml_tensor * x) {
    return ggml_is_contiguous(x) ? ggml_reshape_4d(ctx, x, x->ne[0], x->ne[1], x->ne[2], x->ne[3]) : ggml_cont(ctx, x);
}

/* The slot of each token of a ubatch: its sequence's at position 0, else the last row. */
static inline int64_t tq_sink_slot(int32_t pos, int32_t seq, int64_t n_slots) {
    return pos == 0 && seq >= 0 && seq < n_slots ? seq : n_slots;
}

/* The ubatch's K as the cache gets it, k_cur [hd, nkv, nt] (f32, rows of one token
   contiguous), into both kinds of slot rows; idx: i64 [nt] (tq_sink_slot). Returns the
   written tensors (views of the slots, so that readers come after the writes). */
static inline void tq_sink_write(ggml_context * ctx, ggml_tensor * k_cur, ggml_tensor * idx, ggml_tensor * rows,
                                 ggml_tensor * q, ggml_tensor ** rows_w, ggml_tensor ** q_w) {
    GGML_ASSERT(k_cur->type == GGML_TYPE_F32 && k_cur->nb[1] == k_cur->ne[0] * sizeof(float));
    GGML_ASSERT(rows->ne[0] == k_cur->ne[0] * k_cur->ne[1] && idx->ne[0] == k_cur->ne[2]);
    ggml_tensor * k2 = ggml_view_2d(ctx, k_cur, rows->ne[0], k_cur->ne[2], k_cur->nb[2], 0);
    *rows_w = ggml_set_rows(ctx, rows, k2, idx);
    *q_w = ggml_set_rows(ctx, q, k2, idx);
}

static inline void tq_sink_keys_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    (void) userdata;
    // src[0]: K as f32 [hd, nkv, n_kv, ns], contiguous like dst; src[1]: K in the cache's type,
    // the same shape; src[2]: the cells' slots i32 [n_kv ns] (-1: none); src[3], src[4]: the slots
    const ggml_tensor * k32 = dst->src[0], * kq = dst->src[1], * S = dst->src[2];
    const tq_sink_t s = tq_sink_of(dst->src[3], dst->src[4]);
    const int64_t hd = dst->ne[0], nkv = dst->ne[1], n_kv = dst->ne[2], ns = dst->ne[3];
    const size_t head_bytes = ggml_row_size(kq->type, hd);
    const int32_t * slot = (const int32_t *) S->data;
    for (int64_t r = ith; r < n_kv * ns; r += nth) {
        const int64_t c = r % n_kv, st = r / n_kv;
        memcpy((char *) dst->data + c * dst->nb[2] + st * dst->nb[3], (const char *) k32->data + c * k32->nb[2] + st * k32->nb[3],
               (size_t) dst->nb[2]);
        if (slot[r] < 0) continue;
        for (int64_t h = 0; h < nkv; ++h) {
            const char * kb = (const char *) kq->data + h * kq->nb[1] + c * kq->nb[2] + st * kq->nb[3];
            const float * x = tq_sink_find(&s, slot[r], kb, head_bytes, h, hd);
            if (x) memcpy((char *) dst->data + h * dst->nb[1] + c * dst->nb[2] + st * dst->nb[3], x, hd * sizeof(float));
        }
    }
}

/* Prefill: k32 (the cache's keys k decoded to f32, contiguous) with every matching cell's
   rows replaced by its slot's (the rule above), as a new tensor: a host op (it runs on the
   CPU wherever k32 lives), so it must not write into k32 in place. S: the cells' slots [n_kv ns]. */
static inline ggml_tensor * tq_sink_keys(ggml_context * ctx, ggml_tensor * k32, ggml_tensor * k, ggml_tensor * S,
                                         ggml_tensor * rows, ggml_tensor * q) {
    GGML_ASSERT(k32->type == GGML_TYPE_F32 && ggml_is_contiguous(k32) && ggml_are_same_shape(k32, k) &&
                S->type == GGML_TYPE_I32 && ggml_nelements(S) == k->ne[2] * k->ne[3] && k->nb[0] == ggml_type_size(k->type));
    ggml_tensor * args[5] = { k32, k, S, rows, q };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, k32->ne[0], k32->ne[1], k32->ne[2], k32->ne[3], args, 5, tq_sink_keys_op,
                          GGML_N_TASKS_MAX, nullptr);
}

/* The lowered first keys, for a device whose flash attention does not take the turbo K terms
   (tq_kmean_rope_masked): from ops every backend has, the correction D = R_j - k_c for each
   selected cell c (one that has a slot j, tq_sink_fill_select) and KV head whose decoded key
   equals its slot's quantized copy decoded, 0 for every other. The match rule on decoded
   values is the bytes rule: different bytes decode to different floats except in a block of
   scale 0, where the cell and the slot both hold the zero key. A decode adds q.D to the
   selected cells' logits (tq_sink_mask_delta), a prefill adds D to the decoded keys
   (tq_sink_keys_delta).
   k: the cache's K view [hd, nkv, n_kv, ns] (heads of a cell contiguous); cell_idx i32
   [n_sel, ns], slot_idx i32 [n_sel ns]; rows, q: the slots. Returns D f32 [hd, nkv, n_sel, ns]. */
static inline ggml_tensor * tq_sink_delta(ggml_context * ctx, ggml_tensor * k, ggml_tensor * cell_idx,
                                          ggml_tensor * slot_idx, ggml_tensor * rows, ggml_tensor * q) {
    const int64_t hd = k->ne[0], nkv = k->ne[1], n_kv = k->ne[2], ns = k->ne[3], n_sel = cell_idx->ne[0];
    GGML_ASSERT(k->nb[1] == ggml_row_size(k->type, hd) && cell_idx->ne[1] == ns && ggml_nelements(slot_idx) == n_sel * ns &&
                rows->ne[0] == hd * nkv && q->ne[0] == hd * nkv);
    ggml_tensor * kr = ggml_view_3d(ctx, k, hd * nkv, n_kv, ns, k->nb[2], k->nb[3], 0);
    ggml_tensor * kc = ggml_reshape_3d(ctx, ggml_get_rows(ctx, kr, cell_idx), hd, nkv, n_sel * ns);
    ggml_tensor * rr = ggml_reshape_3d(ctx, ggml_get_rows(ctx, rows, slot_idx), hd, nkv, n_sel * ns);
    ggml_tensor * rq = ggml_reshape_3d(ctx, ggml_get_rows(ctx, q, slot_idx), hd, nkv, n_sel * ns);
    ggml_tensor * differ = ggml_step(ctx, ggml_sum_rows(ctx, ggml_sqr(ctx, ggml_sub(ctx, rq, kc)))); // [1, nkv, n]
    ggml_tensor * same = ggml_scale_bias(ctx, differ, -1.0f, 1.0f);
    ggml_tensor * d = ggml_mul(ctx, ggml_sub(ctx, rr, kc), same);
    return ggml_reshape_4d(ctx, d, hd, nkv, n_sel, ns);
}

/* A decode's logit corrections q.D at the selected cells: q [hd, nq, n_tps ns] (the queries
   flash attention gets, rotated), d from tq_sink_delta, onehot f32 [n_sel, n_kv, 1, ns] (entry
   -> cell). Returns f32 [n_kv, n_tps, nq, ns], the layout of tq_rf_mask's per-head term. */
static inline ggml_tensor * tq_sink_mask_delta(ggml_context * ctx, ggml_tensor * q, ggml_tensor * d,
                                               ggml_tensor * onehot) {
    const int64_t hd = d->ne[0], n_sel = d->ne[2], ns = d->ne[3], nq = q->ne[1], n_kv = onehot->ne[1];
    const int64_t n_tps = q->ne[2] / ns;
    GGML_ASSERT(q->ne[0] == hd && q->ne[2] == n_tps * ns && onehot->ne[0] == n_sel && onehot->ne[3] == ns);
    ggml_tensor * dp = tq_packed(ctx, ggml_permute(ctx, d, 0, 2, 1, 3));                           // [hd, n_sel, nkv, ns]
    ggml_tensor * qp = tq_packed(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, q, hd, nq, n_tps, ns), 0, 2, 1, 3)); // [hd, n_tps, nq, ns]
    ggml_tensor * qd = ggml_mul_mat(ctx, dp, qp); // [n_sel, n_tps, nq, ns]; head h reads KV head h / (nq / nkv)
    ggml_tensor * c = ggml_mul_mat(ctx, onehot, ggml_reshape_4d(ctx, qd, n_sel, n_tps * nq, 1, ns)); // [n_kv, n_tps nq, 1, ns]
    return ggml_reshape_4d(ctx, c, n_kv, n_tps, nq, ns);
}

/* A prefill's key corrections: D placed at the selected cells, f32 [hd, nkv, n_kv, ns]. */
static inline ggml_tensor * tq_sink_keys_delta(ggml_context * ctx, ggml_tensor * d, ggml_tensor * onehot) {
    const int64_t hd = d->ne[0], nkv = d->ne[1], n_sel = d->ne[2], ns = d->ne[3], n_kv = onehot->ne[1];
    ggml_tensor * dt = ggml_cont(ctx, ggml_transpose(ctx, ggml_reshape_3d(ctx, d, hd * nkv, n_sel, ns))); // [n_sel, hd nkv, ns]
    ggml_tensor * c = ggml_mul_mat(ctx, dt, ggml_reshape_3d(ctx, onehot, n_sel, n_kv, ns));              // [hd nkv, n_kv, ns]
    return ggml_reshape_4d(ctx, c, hd, nkv, n_kv, ns);
}

#endif /* __cplusplus */

#endif /* TQ_SINK_H */
