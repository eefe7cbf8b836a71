/*
 * tq-sink.h - the key at position 0 (the attention sink) kept exact beside the cache (C for
 * the match rule both sides use; C++ graph pieces for llama under __cplusplus).
 *
 * Why: most models put a large share of every query's attention on the first token. Its
 * key's quantization error moves that one logit, and through the softmax every other
 * weight with it; on real SmolLM2 keys, storing that single key without error takes about
 * a third of the attention error of turbo2 and turbo3 at 8192 tokens (docs/BENCHMARKS.md,
 * scripts/kmean_long_sim.py's /sink1), more keys add next to nothing.
 *
 * What is kept: per layer, slot rows of the K the cache is given (after the K mean and
 * balancing, rotated: what the cache quantizes), f32 [n_embd_k_gqa, n_seq_max + 1], and the
 * same rows quantized to K's type. A ubatch's token at position 0 writes the slot of its
 * (lowest) sequence s (ggml_set_rows, the op llama stores K with, so the quantized copy is
 * byte for byte the cell's); every other token writes the last row, which is never read.
 * seq_cp copies a slot with the first key it copies, and a restore writes the saved exact
 * key into the slot of the sequence it restores (tq-llama-kv-cache.inc).
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

#include <stdint.h>
#include <string.h>

/* The slots of one layer as a kernel reads them. */
typedef struct {
    const float *rows; /* slot j, head h: rows + j * row_f + h * DK */
    const char *q;     /* the same in K's type: q + j * row_q + h * (bytes of DK values) */
    int64_t n_slots;   /* the readable slots (not the write-only last row) */
    int64_t row_f;     /* floats per slot row */
    size_t row_q;      /* bytes per quantized slot row */
} tq_sink_t;

/* The slots of f32 rows `rows` [n, n_slots + 1] and their copy `q` [n, n_slots + 1] in the
   type of K; n_slots = 0 (none) when either is NULL or their layout is not this one. */
static inline tq_sink_t tq_sink_of(const struct ggml_tensor *rows, const struct ggml_tensor *q) {
    tq_sink_t s = { NULL, NULL, 0, 0, 0 };
    if (!rows || !q || rows->type != GGML_TYPE_F32 || !ggml_is_contiguous(rows) || !ggml_is_contiguous(q) ||
        rows->ne[0] != q->ne[0] || rows->ne[1] != q->ne[1] || rows->ne[1] < 2 || rows->ne[2] != 1 || q->ne[2] != 1) {
        return s;
    }
    s.rows = (const float *) rows->data;
    s.q = (const char *) q->data;
    s.n_slots = rows->ne[1] - 1;
    s.row_f = rows->ne[0];
    s.row_q = q->nb[1];
    return s;
}

/* The exact row (DK floats) of KV head h of a cell whose slot is j (the cells' slots: see
   above; j < 0 or past the slots: none) when its stored bytes kb (head_bytes of them) equal
   the slot's, or NULL. */
static inline const float *tq_sink_find(const tq_sink_t *s, int64_t j, const void *kb, size_t head_bytes, int64_t h,
                                        int64_t DK) {
    if (!s || j < 0 || j >= s->n_slots || memcmp(s->q + j * s->row_q + h * head_bytes, kb, head_bytes) != 0) return NULL;
    return s->rows + j * s->row_f + h * DK;
}

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
    // src[0]: K as f32 [hd, nkv, n_kv, ns] (dst is its view), src[1]: K in the cache's type,
    // the same shape; src[2]: the cells' slots i32 [n_kv ns] (-1: none); src[3], src[4]: the slots
    const ggml_tensor * kq = dst->src[1], * S = dst->src[2];
    const tq_sink_t s = tq_sink_of(dst->src[3], dst->src[4]);
    const int64_t hd = dst->ne[0], nkv = dst->ne[1], n_kv = dst->ne[2], ns = dst->ne[3];
    const size_t head_bytes = ggml_row_size(kq->type, hd);
    const int32_t * slot = (const int32_t *) S->data;
    for (int64_t r = ith; r < n_kv * ns; r += nth) {
        if (slot[r] < 0) continue;
        const int64_t c = r % n_kv, st = r / n_kv;
        for (int64_t h = 0; h < nkv; ++h) {
            const char * kb = (const char *) kq->data + h * kq->nb[1] + c * kq->nb[2] + st * kq->nb[3];
            const float * x = tq_sink_find(&s, slot[r], kb, head_bytes, h, hd);
            if (x) memcpy((char *) dst->data + h * dst->nb[1] + c * dst->nb[2] + st * dst->nb[3], x, hd * sizeof(float));
        }
    }
}

/* Prefill: k32 (the cache's keys k decoded to f32, contiguous) with every matching cell's
   rows replaced by its slot's (the rule above). S: the cells' slots [n_kv ns]. */
static inline ggml_tensor * tq_sink_keys(ggml_context * ctx, ggml_tensor * k32, ggml_tensor * k, ggml_tensor * S,
                                         ggml_tensor * rows, ggml_tensor * q) {
    GGML_ASSERT(k32->type == GGML_TYPE_F32 && ggml_is_contiguous(k32) && ggml_are_same_shape(k32, k) &&
                S->type == GGML_TYPE_I32 && ggml_nelements(S) == k->ne[2] * k->ne[3] && k->nb[0] == ggml_type_size(k->type));
    ggml_tensor * args[4] = { k, S, rows, q };
    return ggml_custom_inplace(ctx, k32, args, 4, tq_sink_keys_op, GGML_N_TASKS_MAX, nullptr);
}

#endif /* __cplusplus */

#endif /* TQ_SINK_H */
