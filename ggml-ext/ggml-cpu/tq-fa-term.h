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
 *
 * Two more sources let a tile skip T's rows (hd floats per key, more bytes than a turbo key
 * and value together): src[3] = P, i32 [n_kv * ns], each cell's position, and src[4] = U,
 * f32 [hd, TQ_FA_TERM_STEPS], the table's columns for positions 0, 1, ... By angle addition
 * a key at p0 + j has T_(p0+j) . A = U_j . A', A' = A turned by the first key's position
 * (a_i' = a_i c_i + b_i s_i, b_i' = b_i c_i - a_i s_i with c, s from T_p0), so a tile whose
 * cells hold consecutive positions (one sequence's cells, the usual case) reads T once and
 * the small U, which stays in L1. Other tiles read T's rows.
 *
 * Three more, optional: src[5], src[6] = the exact first keys' slots (tq-sink.h), f32 rows
 * and their copy in K's type, and src[7] = S, i32 [n_kv * ns], each cell's slot (-1: none);
 * a decoded cell whose bytes match its slot's takes the slot's row instead.
 */
#ifndef TQ_FA_TERM_H
#define TQ_FA_TERM_H

#include "ggml.h"
#include "tq-sink.h"

#define TQ_FA_TERM_MAGIC 0x54525154 /* "TQRT" */
#define TQ_FA_TERM_SLOT (GGML_MAX_OP_PARAMS / sizeof(int32_t) - 1)
/* U's columns: positions 0 .. TQ_FA_TERM_STEPS - 1 after a tile's first key (at least a tile) */
#define TQ_FA_TERM_STEPS 32

/* The term's tables of an FA mask: marked 0 when it carries none; marked 1 and T = NULL when
   it is marked but its tables do not have the layout above (a bug on the llama side, which
   the kernel refuses rather than attend without the term). */
typedef struct {
    int marked;
    const float *T; /* row j: hd floats for cell j */
    const float *A; /* row (token * n_head + head): hd floats */
    const int32_t *P; /* cell j's position, or NULL (then every tile reads T's rows) */
    const float *U;   /* row r: hd floats for position r; NULL with P */
    tq_sink_t sink;   /* the exact first keys (n_slots 0: none) */
    const int32_t *S; /* cell j's slot of them (-1: none), with sink */
    int64_t hd, n_cells, n_head, n_tokens;
} tq_fa_term_t;

static inline tq_fa_term_t tq_fa_term_of(const struct ggml_tensor *mask) {
    tq_fa_term_t t = { 0, NULL, NULL, NULL, NULL, { NULL, NULL, 0, 0, 0 }, NULL, 0, 0, 0, 0 };
    if (!mask || mask->op != GGML_OP_VIEW || mask->op_params[TQ_FA_TERM_SLOT] != TQ_FA_TERM_MAGIC) return t;
    t.marked = 1;
    const struct ggml_tensor *T = mask->src[1], *A = mask->src[2];
    if (!T || !A || T->type != GGML_TYPE_F32 || A->type != GGML_TYPE_F32 || !ggml_is_contiguous(T) ||
        !ggml_is_contiguous(A) || T->ne[0] != A->ne[0] || T->ne[2] != 1 || A->ne[3] != 1) {
        return t;
    }
    const struct ggml_tensor *P = mask->src[3], *U = mask->src[4];
    if (P || U) {
        if (!P || !U || P->type != GGML_TYPE_I32 || U->type != GGML_TYPE_F32 || !ggml_is_contiguous(P) ||
            !ggml_is_contiguous(U) || ggml_nelements(P) != T->ne[1] || U->ne[0] != T->ne[0] ||
            U->ne[1] != TQ_FA_TERM_STEPS || U->ne[2] != 1 || U->ne[3] != 1) {
            return t;
        }
        t.P = (const int32_t *) P->data;
        t.U = (const float *) U->data;
    }
    if (mask->src[5] || mask->src[6] || mask->src[7]) {
        const struct ggml_tensor *S = mask->src[7];
        t.sink = tq_sink_of(mask->src[5], mask->src[6]);
        if (t.sink.n_slots == 0 || t.sink.row_f % T->ne[0] != 0 || !S || S->type != GGML_TYPE_I32 ||
            !ggml_is_contiguous(S) || ggml_nelements(S) != T->ne[1]) {
            return t;
        }
        t.S = (const int32_t *) S->data;
    }
    t.T = (const float *) T->data;
    t.A = (const float *) A->data;
    t.hd = T->ne[0];
    t.n_cells = T->ne[1];
    t.n_head = A->ne[1];
    t.n_tokens = A->ne[2];
    return t;
}

/* One K stream's view of the term: its cells' rows of T and P (P, U NULL: T's rows only),
   and for KV head `head` (head_bytes per stored key) the exact first keys (NULL: none) with
   the cells' slots S. */
typedef struct {
    const float *T;
    const int32_t *P;
    const float *U;
    const tq_sink_t *sink;
    const int32_t *S;
    int64_t head;
    size_t head_bytes;
} tq_fa_term_cells_t;

/* The exact row of cell c (stored key kb) where the sink rule gives one (tq-sink.h), or NULL. */
static inline const float *tq_fa_term_sink(const tq_fa_term_cells_t *tc, int64_t c, const void *kb, int64_t DK) {
    if (!tc || !tc->sink || !tc->S || tc->S[c] < 0) return NULL;
    return tq_sink_find(tc->sink, tc->S[c], kb, tc->head_bytes, tc->head, DK);
}

/* Whether cells [start, start + n) hold consecutive positions, so that U can stand in for
   their rows of T (not for one key: that reads its row of T either way). */
static inline int tq_fa_term_steps(const tq_fa_term_cells_t *tc, int64_t start, int n) {
    if (!tc->U || n < 2 || n > TQ_FA_TERM_STEPS) return 0;
    const int32_t p0 = tc->P[start];
    for (int j = 1; j < n; ++j) {
        if (tc->P[start + j] != p0 + j) return 0;
    }
    return 1;
}

/* a' = a turned by the position of table row t0 (hd floats each; see above). */
static inline void tq_fa_term_turn(const float *t0, const float *a, int64_t hd, float *ap) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; ++i) {
        const float c = t0[i], s = t0[half + i];
        ap[i] = a[i] * c + a[half + i] * s;
        ap[half + i] = a[half + i] * c - a[i] * s;
    }
}

#endif /* TQ_FA_TERM_H */
