/*
 * tq-fa-term.h - a per-key logit term that CPU flash attention adds (C; llama side and
 * ggml-cpu side).
 *
 * The K mean kept in RoPE's frame (tq-kmean-rope.h) leaves every logit short by a term of
 * its own, q.R_p mu' = A_q . T_p: a per-query coefficient vector A (hd floats) against a
 * per-cell vector T (the cosines and sines of the cell's position). On a decode ubatch the
 * turbo flash-attention tiles (tq-ggml-fa.h) add it to each key's raw score, next to the
 * q.k they compute anyway: one more dot of hd floats per key and head, on rows already in
 * the tile, instead of a per-head mask built in the graph (a matrix product over every cell
 * and a few copies per layer, a quarter of the decode time on SmolLM2 at depth 4096).
 *
 * How it reaches the kernel without a new op or a new FA argument: the FA's mask is a
 * GGML_OP_VIEW of the real mask (same data, so every other reader sees the plain mask) with
 * src[1] = T, f32 [hd, n_kv * ns] (column s * n_kv + j for cell j of the FA's K stream s),
 * src[2] = A, f32 [hd, n_head, n_tokens * ns] (row (s * n_tokens + t) * n_head + h for query
 * token t of stream s, head h), and this mark in its last op_params slot. Only the CPU turbo
 * kernels read it, so llama attaches it only where they run (K and V turbo, flash attention
 * on, a CPU-only model); everywhere else the per-head mask does the same job.
 */
#ifndef TQ_FA_TERM_H
#define TQ_FA_TERM_H

#include "ggml.h"

#define TQ_FA_TERM_MAGIC 0x54525154 /* "TQRT" */
#define TQ_FA_TERM_SLOT (GGML_MAX_OP_PARAMS / sizeof(int32_t) - 1)

/* The term's tables of an FA mask: marked 0 when it carries none; marked 1 and T = NULL when
   it is marked but its tables do not have the layout above (a bug on the llama side, which
   the kernel refuses rather than attend without the term). */
typedef struct {
    int marked;
    const float *T; /* row j: hd floats for cell j */
    const float *A; /* row (token * n_head + head): hd floats */
    int64_t hd, n_cells, n_head, n_tokens;
} tq_fa_term_t;

static inline tq_fa_term_t tq_fa_term_of(const struct ggml_tensor *mask) {
    tq_fa_term_t t = { 0, NULL, NULL, 0, 0, 0, 0 };
    if (!mask || mask->op != GGML_OP_VIEW || mask->op_params[TQ_FA_TERM_SLOT] != TQ_FA_TERM_MAGIC) return t;
    t.marked = 1;
    const struct ggml_tensor *T = mask->src[1], *A = mask->src[2];
    if (!T || !A || T->type != GGML_TYPE_F32 || A->type != GGML_TYPE_F32 || !ggml_is_contiguous(T) ||
        !ggml_is_contiguous(A) || T->ne[0] != A->ne[0] || T->ne[2] != 1 || A->ne[3] != 1) {
        return t;
    }
    t.T = (const float *) T->data;
    t.A = (const float *) A->data;
    t.hd = T->ne[0];
    t.n_cells = T->ne[1];
    t.n_head = A->ne[1];
    t.n_tokens = A->ne[2];
    return t;
}

#endif /* TQ_FA_TERM_H */
