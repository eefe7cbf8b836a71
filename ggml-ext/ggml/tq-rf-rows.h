/*
 * tq-rf-rows.h - the arithmetic of the fused K side (tq-rf-keep.h) on plain rows: which
 * channels RoPE pairs, a mean turned into a position's frame, a query's coefficients against
 * the mean, and the node's whole loop over (token, KV head) rows (C++, no ggml: the CUDA
 * parity test builds it without ggml's headers).
 *
 * tq_rf_keep_rows is the CPU's function (tq_rf_keep_op calls it) and the oracle every device
 * kernel of the node is checked against: shaders/tq_rf_keep.comp through test-backend-ops,
 * the CUDA kernel (ggml-cuda/tq-cuda-rf-keep.cuh) bit for bit in tq-parity as well. The
 * integer helpers are __host__ __device__ under nvcc, so the CUDA kernel pairs channels with
 * this very code; its float expressions are its own, written with explicitly rounded
 * intrinsics because ggml-cuda builds with -use_fast_math.
 *
 * Invariant: every value of row (t, h) depends only on that row's inputs, in a fixed order,
 * so a row gets the same bits whatever batch it comes in.
 */
#ifndef TQ_RF_ROWS_H
#define TQ_RF_ROWS_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define TQ_RF_HD static inline __host__ __device__
#else
#define TQ_RF_HD static inline
#endif

/* Which channels of a head make RoPE pair i, as llama's rope (ggml_rope_ext with n_dims =
   n_rot) turns them: NORM pairs (2i, 2i+1), NEOX (i, i + n_rot/2), for i < n_rot/2. With
   partial RoPE (n_rot < hd: StableLM, Phi, GLM) the channels past n_rot are not turned; they
   are paired here too, as pairs of angular frequency 0: the host's table holds cos 1, sin 0
   for them, R_p is the identity there, so what a key stores is k - mu on them (a plain,
   position-independent mean) and the term adds q.mu back, the same machinery as the roped
   pairs. NORM pairs them (2i, 2i+1) like the rest (the layout is the full head's), NEOX as
   the halves of the rest: (n_rot + j, n_rot + j + (hd - n_rot)/2). n_rot 0 (or hd): the
   whole head is roped, the layout of every full-RoPE model. */
struct tq_rf_pairs {
    bool neox;
    int64_t n_rot;
};

/* The roped channels of a head of hd under pr: hd where the whole head is roped. */
TQ_RF_HD int64_t tq_rf_nrot(tq_rf_pairs pr, int64_t hd) {
    return pr.n_rot > 0 && pr.n_rot < hd ? pr.n_rot : hd;
}

/* Whether pr pairs the head like a full-RoPE one (the layouts tq_rf_half's views give). */
TQ_RF_HD bool tq_rf_plain(tq_rf_pairs pr, int64_t hd) {
    return !pr.neox || tq_rf_nrot(pr, hd) == hd;
}

/* Pairs as a custom op's userdata bits (bit 0 neox, bits 8.. n_rot; bit 1 is the caller's:
   TQ_RF_KEEP_BAL for tq_rf_keep_op). shaders/tq_rf_keep.comp reads the same bits. */
#define TQ_RF_KEEP_BAL 2u
static inline uintptr_t tq_rf_pairs_bits(tq_rf_pairs pr, int64_t hd) {
    return (pr.neox ? 1u : 0u) | ((uintptr_t) (tq_rf_plain(pr, hd) ? 0 : pr.n_rot) << 8);
}
TQ_RF_HD tq_rf_pairs tq_rf_pairs_of_bits(uintptr_t b) {
    return { (b & 1) != 0, (int64_t) (b >> 8) };
}
static inline tq_rf_pairs tq_rf_pairs_of(const void * userdata) {
    return tq_rf_pairs_of_bits((uintptr_t) userdata);
}

/* Pair i of channel-frame row x (hd floats): channels a and b. */
TQ_RF_HD int64_t tq_rf_ch(tq_rf_pairs pr, int64_t hd, int64_t i, int ab) {
    if (!pr.neox) {
        return 2 * i + ab;
    }
    const int64_t r = tq_rf_nrot(pr, hd);
    return i < r / 2 ? i + ab * (r / 2) : r + (i - r / 2) + ab * ((hd - r) / 2);
}

/* o = R_p m for one row (hd floats; t: the position's table column). */
static inline void tq_rf_rotate_row(tq_rf_pairs pr, int64_t hd, const float * t, const float * m, float * o) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; ++i) {
        const int64_t ca = tq_rf_ch(pr, hd, i, 0), cb = tq_rf_ch(pr, hd, i, 1);
        const float c = t[i], sn = t[half + i];
        o[ca] = c * m[ca] - sn * m[cb];
        o[cb] = sn * m[ca] + c * m[cb];
    }
}

/* o = [alpha; beta] of one query row x against the mean m (hd floats each). */
static inline void tq_rf_coeffs_row(tq_rf_pairs pr, int64_t hd, const float * x, const float * m, float * o) {
    const int64_t half = hd / 2;
    for (int64_t i = 0; i < half; ++i) {
        const int64_t ca = tq_rf_ch(pr, hd, i, 0), cb = tq_rf_ch(pr, hd, i, 1);
        o[i] = x[ca] * m[ca] + x[cb] * m[cb];        // alpha_i
        o[half + i] = x[cb] * m[ca] - x[ca] * m[cb]; // beta_i
    }
}

/* The node's inputs and output as pointers and byte strides (tq-rf-keep.h has the layout):
   q [hd, nq, nt], k [hd, nkv, nt], the means' columns m [F, nt / per] (mu' of KV head h at
   h hd, its s - 1 at (nkv + h) hd with TQ_RF_KEEP_BAL), the table tab [hd, nt] or null, and
   d: k' [hd, nkv, nt], then q' [hd, nq, nt], then A [hd, nq, nt], contiguous. */
#define TQ_RF_HD_MAX 512
struct tq_rf_keep_args {
    const float * q, * k, * m, * tab;
    float * d;
    int64_t hd, nkv, nt, nq, per;
    size_t q_nb1, q_nb2, k_nb1, k_nb2, m_nb1, t_nb1;
    uintptr_t flags; /* tq_rf_pairs_bits | TQ_RF_KEEP_BAL */
};

/* Row (t, h) = r = t nkv + h of the node, for r = ith, ith + nth, ... (the CPU's split). */
static inline void tq_rf_keep_rows(const tq_rf_keep_args & a, int64_t ith, int64_t nth) {
    const tq_rf_pairs pr = tq_rf_pairs_of_bits(a.flags);
    const bool bal = (a.flags & TQ_RF_KEEP_BAL) != 0;
    const int64_t hd = a.hd, nkv = a.nkv, nt = a.nt, nq = a.nq, g = nq / nkv;
    float * kd = a.d, * qd = kd + hd * nkv * nt, * ad = qd + hd * nq * nt;
    for (int64_t r = ith; r < nkv * nt; r += nth) {
        const int64_t h = r % nkv, t = r / nkv;
        const float * mu = (const float *) ((const char *) a.m + (t / a.per) * a.m_nb1);
        const float * m = mu + h * hd, * d = bal ? mu + hd * nkv + h * hd : nullptr;
        const float * kx = (const float *) ((const char *) a.k + h * a.k_nb1 + t * a.k_nb2);
        float * ko = kd + (t * nkv + h) * hd;
        float rm[TQ_RF_HD_MAX];
        if (a.tab) {
            tq_rf_rotate_row(pr, hd, (const float *) ((const char *) a.tab + t * a.t_nb1), m, rm);
        } else {
            memcpy(rm, m, hd * sizeof(float));
        }
        for (int64_t c = 0; c < hd; ++c) {
            ko[c] = (d ? kx[c] * (1.0f + d[c]) : kx[c]) - rm[c];
        }
        for (int64_t j = h * g; j < (h + 1) * g; ++j) {
            const float * qx = (const float *) ((const char *) a.q + j * a.q_nb1 + t * a.q_nb2);
            float * qo = qd + (t * nq + j) * hd, * ao = ad + (t * nq + j) * hd;
            for (int64_t c = 0; c < hd; ++c) {
                qo[c] = d ? qx[c] / (1.0f + d[c]) : qx[c];
            }
            tq_rf_coeffs_row(pr, hd, qo, m, ao);
        }
    }
}

#endif /* TQ_RF_ROWS_H */
