/*
 * tq-fa-term.h - the CPU flash-attention tiles' view of the turbo-K terms (C; ggml-cpu).
 *
 * The terms are sources of the flash attention itself (ggml-ext/ggml/tq-fa-contract.h says
 * what each holds and why): the per-key logit term A_q . T_p of the K mean kept in RoPE's
 * frame, and the exact first keys. On a decode ubatch the turbo tiles (tq-ggml-fa.h) add the
 * term to each key's raw score, next to the q.k they compute anyway: one more dot of hd floats
 * per key and head, on rows already in the tile.
 *
 * T's rows are hd floats per key, more bytes than a turbo key and value together; a tile
 * whose cells hold consecutive positions (one sequence's cells, the usual case) skips them:
 * by angle addition a key at p0 + j has T_(p0+j) . A = U_j . A', with U T's step columns
 * (positions 0, 1, ...) and A' = A turned by the first key's position (a_i' = a_i c_i + b_i s_i,
 * b_i' = b_i c_i - a_i s_i with c, s from T_p0). U stays in L1. Other tiles read T's rows.
 */
#ifndef TQ_FA_TERM_H
#define TQ_FA_TERM_H

#include "ggml.h"
#include "tq-fa-contract.h"

/* The terms of a flash attention: marked 0 when it carries none; marked 1 and T = NULL when
   their layout is not the contract's (a caller's bug, which the kernel refuses rather than
   attend without them). */
typedef struct {
    int marked;
    const float *T; /* row j: hd floats for cell j */
    const float *A; /* row (token * n_head + head): hd floats */
    const int32_t *P; /* cell j's position */
    const float *U;   /* row r: hd floats for position r */
    tq_sink_t sink;   /* the exact first keys (n_slots 0: none) */
    const int32_t *S; /* cell j's slot of them (-1: none), with sink */
    int64_t hd, n_cells, n_head, n_tokens;
} tq_fa_term_t;

static inline tq_fa_term_t tq_fa_term_of(const struct ggml_tensor *fa) {
    tq_fa_term_t t = { 0, NULL, NULL, NULL, NULL, { NULL, NULL, 0, 0, 0 }, NULL, 0, 0, 0, 0 };
    if (!tq_fa_has_k_terms(fa)) return t;
    t.marked = 1;
    if (!tq_fa_k_terms_valid(fa)) return t;
    const struct ggml_tensor *A = fa->src[TQ_FA_SRC_A], *T = fa->src[TQ_FA_SRC_T], *C = fa->src[TQ_FA_SRC_CELLS];
    t.hd = A->ne[0];
    t.n_cells = C->ne[0];
    t.n_head = A->ne[1];
    t.n_tokens = A->ne[2];
    t.T = (const float *) T->data;
    t.U = t.T + t.n_cells * t.hd;
    t.A = (const float *) A->data;
    t.P = (const int32_t *) C->data;
    t.sink = tq_sink_of(fa->src[TQ_FA_SRC_SINK_ROWS], fa->src[TQ_FA_SRC_SINK_Q]);
    t.S = t.sink.n_slots > 0 ? t.P + t.n_cells : NULL;
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

/* K stream ik3's view (n_kv cells per stream) for KV head ik2: what the decode's rows and a
   prefill's windows both hand their tiles. */
static inline tq_fa_term_cells_t tq_fa_term_cells_of(const tq_fa_term_t *t, int64_t ik2, int64_t ik3, int64_t n_kv,
                                                     int64_t DK, size_t head_bytes) {
    tq_fa_term_cells_t tc = { t->T ? t->T + ik3 * n_kv * DK : NULL, t->P ? t->P + ik3 * n_kv : NULL, t->U,
                              t->sink.n_slots ? &t->sink : NULL, t->S ? t->S + ik3 * n_kv : NULL, ik2, head_bytes };
    return tc;
}

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
