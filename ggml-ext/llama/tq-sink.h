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
 * Where it applies: the paths that see decoded keys next to the cells' positions, i.e. the
 * mean in RoPE's frame (tq-kmean-rope.h) with CPU flash attention over turbo K and V: the
 * decode tiles (tq-ggml-fa.h) and, for the same configuration, the prefill path that decodes
 * K to f32 (tq_rf_keys); a decode through a per-head mask (flash attention off) and the
 * fitted mean keep the decoded key, and so does a prefill beside them, so that a sequence
 * gets the same keys however its tokens were batched. For the same reason a first ubatch too
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

#endif /* __cplusplus */

#endif /* TQ_SINK_H */
