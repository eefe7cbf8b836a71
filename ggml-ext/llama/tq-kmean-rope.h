/*
 * tq-kmean-rope.h - the K mean kept in RoPE's frame: graph pieces (C++, llama.cpp side).
 * tq-kmean.h has the fitted mean this replaces where it can run, and the modes and state
 * both share; the host side is in tq-llama-kv-cache.cpp.
 *
 * Why: a common pre-RoPE component mu of the keys shows up in the key at position p as
 * R_p mu (R_p: RoPE's rotation of every channel pair by p * w_i). A fixed vector m can only
 * follow the part of it that barely turns over the cache's positions (tq-kmean.h's fitted
 * mean); on the pairs RoPE spins, the component stays in every key and so in the codec's
 * error. Storing s*(k_p - R_p mu) instead takes it out at every position. The logit of
 * query q then misses q.R_p mu, which is not the same for every key, so it is added back
 * exactly, per key:
 *
 *   q.R_p mu = sum_i alpha_i cos(p w_i) + beta_i sin(p w_i),
 *   alpha_i = q_a mu_a + q_b mu_b,  beta_i = q_b mu_a - q_a mu_b   (pair i = channels a, b)
 *
 * i.e. one dot product of a per-query coefficient vector A = [alpha; beta] with a per-cell
 * table T = [cos(p w); sin(p w)] of the cell's position. Balancing's s is equal on the two
 * channels of a pair, so it commutes with R_p: (q/s).R_p(s mu) = q.R_p mu, and the stored
 * mean is mu' = s mu.
 *
 * Where the term goes (attention stays exact either way):
 *   - a ubatch of few queries (decode) over turbo K and V with flash attention: A and T
 *     become sources of the flash attention (the turbo K terms, ggml-ext/ggml/tq-fa-contract.h),
 *     which adds A.T to each key's score next to q.k, on a device that runs them (the CPU,
 *     RPC, Vulkan; tq_kmean_rope_masked says which do not, tq_kmean_rope_dev_terms which
 *     run them from pieces built by their own ops);
 *   - other decodes, and every decode on a device that does not run the terms: added to the
 *     attention mask, which becomes per head ([n_kv, n_tokens, n_head]); flash attention and
 *     soft_max take a per-head mask (the lowered form, with tq-sink.h's first-key corrections);
 *   - a larger ubatch (prefill): K is decoded to f32 and R_p mu' (rotated like K) added back
 *     to every cell, so attention runs on the plain keys and no per-head mask of
 *     n_kv x n_tokens x n_head is materialised.
 * K shift (context shift) re-ropes stored keys: rope_d(R_p(s k~ - mu')) = R_{p+d}(s k~ - mu'),
 * which is what a key at p + d stores, so the shift needs no correction (tq_kmean_unshift
 * leaves a marked tensor alone). Saved state has its own tags (the m it carries means mu').
 *
 * Layout: the per-cell table of a set of RoPE frequencies is f32 [hd, n]: rows 0..hd/2 the
 * cosines, hd/2..hd the sines, of cell (or token) j's position times w_i.
 */
#ifndef TQ_KMEAN_ROPE_H
#define TQ_KMEAN_ROPE_H

#include "ggml.h"
#include "tq-fa-contract.h"
#include "tq-rf-keep.h"
#include "tq-sink.h"

/* k_mean tensors of a cache that keeps the mean in RoPE's frame carry this mark in the last
   int32 of their op_params (a cache tensor, GGML_OP_NONE: no op reads them). */
#define TQ_KMEAN_ROPE_MAGIC 0x46525154 /* "TQRF" */
#define TQ_KMEAN_ROPE_SLOT (GGML_MAX_OP_PARAMS / sizeof(int32_t) - 1)
static inline void tq_kmean_rope_mark(ggml_tensor * k_mean) {
    k_mean->op_params[TQ_KMEAN_ROPE_SLOT] = TQ_KMEAN_ROPE_MAGIC;
}
static inline bool tq_kmean_rope_is(const ggml_tensor * k_mean) {
    return k_mean && k_mean->op == GGML_OP_NONE && k_mean->op_params[TQ_KMEAN_ROPE_SLOT] == TQ_KMEAN_ROPE_MAGIC;
}

/* The pairs (tq_rf_pairs, tq_rf_ch) and the row helpers are the fused node's
   (ggml-ext/ggml/tq-rf-keep.h), which every backend that runs it reads. */

/* Channel a (which = 0) or b (1) of every RoPE pair of x [hd, n1, n2] as a contiguous
   [hd/2, n1, n2]: the halves for neox, the even/odd channels otherwise; for neox with partial
   RoPE the roped part's half followed by the rest's (tq_rf_ch). */
static inline ggml_tensor * tq_rf_half(ggml_context * ctx, ggml_tensor * x, tq_rf_pairs pr, int which) {
    const int64_t hd = x->ne[0], half = hd / 2, n1 = x->ne[1], n2 = x->ne[2];
    if (!ggml_is_contiguous(x)) {
        x = ggml_cont(ctx, x);
    }
    if (!tq_rf_plain(pr, hd)) {
        const int64_t r = tq_rf_nrot(pr, hd), h1 = r / 2, h2 = (hd - r) / 2;
        auto seg = [&](int64_t off, int64_t len) {
            return ggml_cont(ctx, ggml_view_3d(ctx, x, len, n1, n2, x->nb[1], x->nb[2], (size_t) off * x->nb[0]));
        };
        return ggml_concat(ctx, seg(which * h1, h1), seg(r + which * h2, h2), 0);
    }
    const bool neox = pr.neox;
    ggml_tensor * v = neox ? ggml_view_3d(ctx, x, half, n1, n2, x->nb[1], x->nb[2], (size_t) which * half * x->nb[0])
                           : ggml_view_3d(ctx, x, 1, half, n1 * n2, 2 * x->nb[0], x->nb[1], (size_t) which * x->nb[0]);
    return ggml_reshape_3d(ctx, ggml_cont(ctx, v), half, n1, n2);
}

/* The inverse of tq_rf_half: channels a and b [hd/2, n1, n2] -> x [hd, n1, n2]. */
static inline ggml_tensor * tq_rf_join(ggml_context * ctx, ggml_tensor * a, ggml_tensor * b, tq_rf_pairs pr) {
    const int64_t half = a->ne[0], n1 = a->ne[1], n2 = a->ne[2];
    if (!tq_rf_plain(pr, 2 * half)) {
        const int64_t h1 = tq_rf_nrot(pr, 2 * half) / 2, h2 = half - h1;
        auto seg = [&](ggml_tensor * x, int64_t off, int64_t len) {
            return ggml_cont(ctx, ggml_view_3d(ctx, x, len, n1, n2, x->nb[1], x->nb[2], (size_t) off * x->nb[0]));
        };
        ggml_tensor * roped = ggml_concat(ctx, seg(a, 0, h1), seg(b, 0, h1), 0);
        ggml_tensor * rest = ggml_concat(ctx, seg(a, h1, h2), seg(b, h1, h2), 0);
        return ggml_concat(ctx, roped, rest, 0);
    }
    if (pr.neox) {
        return ggml_concat(ctx, a, b, 0);
    }
    ggml_tensor * a4 = ggml_reshape_4d(ctx, a, 1, half, n1, n2);
    ggml_tensor * b4 = ggml_reshape_4d(ctx, b, 1, half, n1, n2);
    return ggml_reshape_3d(ctx, ggml_concat(ctx, a4, b4, 0), 2 * half, n1, n2);
}

/* Cosines (which = 0) or sines (1) of a position table T [hd, n] as [hd/2, 1, n]. */
static inline ggml_tensor * tq_rf_trig(ggml_context * ctx, ggml_tensor * T, int which) {
    const int64_t half = T->ne[0] / 2;
    return ggml_view_3d(ctx, T, half, 1, T->ne[1], T->nb[1], T->nb[1], (size_t) which * half * T->nb[0]);
}

/* The layer's own rope, applied again where the terms are lowered (tq_kmean_rope_masked).
   Where the layer's K is the output of ggml's rope over the whole head with NORM or NEOX
   pairs, that node's parameters (frequencies, scaling, frequency factors) turn the mean with
   the keys (s k - mu' before the rope instead of s R_p k - R_p mu' after it: the node that
   the chain of halves and products took, with the keys' own positions) and give the cells'
   table as cos/sin of the same angles (tq_rf_rope_table). So what a key stores and what its
   logit gets back are turned by one arithmetic, the rope's, on whatever backend runs it, in a
   few nodes instead of about fifteen, and the cells' table is built on the device from their
   positions instead of uploaded every step (hd floats a cell). Any other K (partial or
   multi-section RoPE, an offset, an in-place rope, a K built after its rope) gets NULL and
   the host's tables. The host's table is exact in double precision, ggml's rope is f32: the
   two differ by rounding, so a layer takes one or the other on both sides. */
static inline const ggml_tensor * tq_rf_rope_of(const ggml_tensor * k, tq_rf_pairs pr) {
    if (!k || k->op != GGML_OP_ROPE || k->view_src || k->type != GGML_TYPE_F32 || !k->src[0] ||
        k->src[0]->type != GGML_TYPE_F32 || k->ne[3] != 1) {
        return nullptr;
    }
    const int32_t * p = k->op_params;
    const int64_t hd = k->ne[0];
    const ggml_tensor * pos = k->src[1];
    if (p[2] != (pr.neox ? GGML_ROPE_TYPE_NEOX : GGML_ROPE_TYPE_NORMAL) || p[1] != hd || p[15] != 0 ||
        tq_rf_nrot(pr, hd) != hd || !pos || pos->type != GGML_TYPE_I32 || pos->ne[0] != k->ne[2]) {
        return nullptr;
    }
    return k;
}

/* x [hd, n1, n] turned as `rope` (tq_rf_rope_of) turns its input, at positions pos (i32 [n]),
   with rope's pairing or another (mode). */
static inline ggml_tensor * tq_rf_rope_apply(ggml_context * ctx, ggml_tensor * x, ggml_tensor * pos, const ggml_tensor * rope,
                                             int mode) {
    const int32_t * p = rope->op_params;
    float f[6]; // freq_base, freq_scale, ext_factor, attn_factor, beta_fast, beta_slow
    memcpy(f, p + 5, sizeof(f));
    return ggml_rope_ext(ctx, x, pos, rope->src[2], p[1], mode, p[4], f[0], f[1], f[2], f[3], f[4], f[5]);
}

/* The table [hd, n] (rows i < hd/2 cos, hd/2 + i sin of pair i's angle) of positions pos
   (i32 [n]) under `rope`: NEOX pairs (i, i + hd/2) turn e = [1 .. 1, 0 .. 0] (f32 [hd, 1, 1])
   into [cos | sin], the layout of tq_rf_trig whatever the model's pairing (both pairings
   take pair i's angle from the same formula). YaRN's attention factor scales these as it
   scales the keys, on both sides alike. */
static inline ggml_tensor * tq_rf_rope_table(ggml_context * ctx, ggml_tensor * e, ggml_tensor * pos, const ggml_tensor * rope) {
    const int64_t hd = e->ne[0], n = pos->ne[0];
    ggml_tensor * x = ggml_repeat_4d(ctx, e, hd, 1, n, 1);
    return ggml_reshape_2d(ctx, tq_rf_rope_apply(ctx, x, pos, rope, GGML_ROPE_TYPE_NEOX), hd, n);
}

/* R_p mu for the cells: mu [hd, nh, ns] (contiguous; stream s's mean) at positions pos (i32
   [n ns], stream after stream) under `rope` -> [hd, nh, n ns]. */
static inline ggml_tensor * tq_rf_rope_mean(ggml_context * ctx, ggml_tensor * mu, ggml_tensor * pos, const ggml_tensor * rope) {
    const int64_t hd = mu->ne[0], nh = mu->ne[1], ns = mu->ne[2], n = pos->ne[0] / ns;
    GGML_ASSERT(ggml_is_contiguous(mu) && n * ns == pos->ne[0]);
    ggml_tensor * r = ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, mu, hd, nh, 1, ns), hd, nh, n, ns);
    return tq_rf_rope_apply(ctx, ggml_reshape_3d(ctx, r, hd, nh, n * ns), pos, rope, rope->op_params[2]);
}

/* R_p mu and the coefficients are CPU ops of their own (ggml_custom_4d: tq_rf_rotate_mean, and
   the coefficients inside tq_rf_keep) where the layer's K is on a device that runs the turbo K
   terms (the CPU, RPC's client side): as a chain of halves, products and joins each is about
   fifteen graph nodes per layer, and on a CPU decode step every node costs a thread barrier.
   Rows are split across threads. On a device that takes the terms lowered
   (tq_kmean_rope_masked) the chains run instead (tq_rf_rotate_mean_ops, tq_rf_coeffs_ops):
   there a host op would split the graph; a device that runs tq_rf_keep's node itself
   (Vulkan: tq_kmean_rope_dev_keep) takes that node for a ubatch's K side all the same. */
static inline void tq_rf_rotate_mean_op(ggml_tensor * dst, int ith, int nth, void * userdata) {
    const tq_rf_pairs pr = tq_rf_pairs_of(userdata);
    const ggml_tensor * mu = dst->src[0], * T = dst->src[1];
    const int64_t hd = dst->ne[0], nh = dst->ne[1], n = dst->ne[2], per = n / mu->ne[2];
    for (int64_t r = ith; r < nh * n; r += nth) {
        const int64_t h = r % nh, p = r / nh;
        const float * m = (const float *) ((const char *) mu->data + h * mu->nb[1] + (p / per) * mu->nb[2]);
        const float * t = (const float *) ((const char *) T->data + p * T->nb[1]);
        float * o = (float *) ((char *) dst->data + h * dst->nb[1] + p * dst->nb[2]);
        tq_rf_rotate_row(pr, hd, t, m, o);
    }
}

/* R_p mu for every column p of the table T [hd, n]: mu [hd, nh, nb] (channel frame, rows
   contiguous; nb blocks of T's columns, block b taking mean b: the streams of a ubatch or of a
   view of the cache) -> [hd, nh, n]. */
static inline ggml_tensor * tq_rf_rotate_mean(ggml_context * ctx, ggml_tensor * mu, ggml_tensor * T, tq_rf_pairs pr) {
    GGML_ASSERT(mu->type == GGML_TYPE_F32 && T->type == GGML_TYPE_F32 && mu->ne[0] == T->ne[0] && mu->nb[0] == sizeof(float) &&
                T->nb[0] == sizeof(float) && T->ne[1] % mu->ne[2] == 0 && mu->ne[3] == 1 && T->ne[2] == 1);
    ggml_tensor * args[2] = { mu, T };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, mu->ne[0], mu->ne[1], T->ne[1], 1, args, 2, tq_rf_rotate_mean_op,
                          GGML_N_TASKS_MAX, (void *) tq_rf_pairs_bits(pr, mu->ne[0]));
}

/* The same products from ops every backend has, for a device that would run a host op only
   through a round trip to the CPU (tq_kmean_rope_masked: the graph is split there, twice a
   layer): about fifteen nodes each, none of them on the host. The values are the host ops'
   up to rounding. R_p mu: mu [hd, nh, nb] (contiguous; blocks as tq_rf_rotate_mean's),
   T [hd, n] -> [hd, nh, n]. */
static inline ggml_tensor * tq_rf_rotate_mean_ops(ggml_context * ctx, ggml_tensor * mu, ggml_tensor * T, tq_rf_pairs pr) {
    const int64_t hd = mu->ne[0], nh = mu->ne[1], nb = mu->ne[2], n = T->ne[1], half = hd / 2, per = n / nb;
    GGML_ASSERT(mu->type == GGML_TYPE_F32 && T->type == GGML_TYPE_F32 && T->ne[0] == hd && ggml_is_contiguous(mu) &&
                n % nb == 0 && mu->ne[3] == 1);
    ggml_tensor * m3 = ggml_reshape_3d(ctx, mu, hd, nh, nb);
    ggml_tensor * ma = ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, tq_rf_half(ctx, m3, pr, 0), half, nh, 1, nb), half, nh, per, nb);
    ggml_tensor * mb = ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, tq_rf_half(ctx, m3, pr, 1), half, nh, 1, nb), half, nh, per, nb);
    ggml_tensor * c = ggml_reshape_4d(ctx, ggml_cont(ctx, tq_rf_trig(ctx, T, 0)), half, 1, per, nb); // [half, 1, per, nb]
    ggml_tensor * sn = ggml_reshape_4d(ctx, ggml_cont(ctx, tq_rf_trig(ctx, T, 1)), half, 1, per, nb);
    ggml_tensor * a = ggml_sub(ctx, ggml_mul(ctx, ma, c), ggml_mul(ctx, mb, sn));
    ggml_tensor * b = ggml_add(ctx, ggml_mul(ctx, ma, sn), ggml_mul(ctx, mb, c));
    return tq_rf_join(ctx, ggml_reshape_3d(ctx, a, half, nh, n), ggml_reshape_3d(ctx, b, half, nh, n), pr);
}

/* Per-block values x [hd, nkv, nb] (contiguous; block b: tokens b nt/nb ..) shaped to broadcast
   against [hd, g, nkv, nt] (the query heads of each KV head, per token): [hd, 1, nkv, nb] as
   they are where one block or one token per block lets ggml's broadcast match them (it repeats
   cyclically), else repeated to [hd, 1, nkv, nt]. */
static inline ggml_tensor * tq_rf_by_token(ggml_context * ctx, ggml_tensor * x, int64_t nt) {
    const int64_t hd = x->ne[0], nkv = x->ne[1], nb = x->ne[2], per = nt / nb;
    if (nb == 1 || per == 1) {
        return ggml_reshape_4d(ctx, x, hd, 1, nkv, nb);
    }
    return ggml_reshape_4d(ctx, ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, x, hd, nkv, 1, nb), hd, nkv, per, nb), hd, 1, nkv, nt);
}

/* The coefficients A = [alpha; beta] of q [hd, nq, nt] against mu [hd, nkv, nb] (nb blocks of
   the tokens, block b against mean b) from ops every backend has (tq_rf_coeffs_row's
   arithmetic): [hd, nq, nt]. */
static inline ggml_tensor * tq_rf_coeffs_ops(ggml_context * ctx, ggml_tensor * q, ggml_tensor * mu, tq_rf_pairs pr) {
    const int64_t hd = q->ne[0], half = hd / 2, nq = q->ne[1], nt = q->ne[2], nkv = mu->ne[1], g = nq / nkv;
    const int64_t nb = mu->ne[2], per = nt / nb;
    GGML_ASSERT(q->type == GGML_TYPE_F32 && mu->type == GGML_TYPE_F32 && mu->ne[0] == hd && nq % nkv == 0 &&
                ggml_is_contiguous(mu) && nt % nb == 0 && mu->ne[3] == 1);
    if (tq_rf_plain(pr, hd)) {
        // the pairs are views and the means broadcast over the g query heads (and, one per block
        // or per token, over the tokens), so six nodes: P = q m (channel-wise), P' = q m~ (m~:
        // each pair's channels swapped), alpha = P_a + P_b, beta = P'_b - P'_a, A = [alpha; beta].
        // The products and sums of the chain below, in its order.
        const size_t f = sizeof(float);
        ggml_tensor * q4 = ggml_reshape_4d(ctx, tq_packed(ctx, q), hd, g, nkv, nt);
        ggml_tensor * m4 = tq_rf_by_token(ctx, mu, nt);
        // channel a (which 0) or b (1) of every pair of x [hd, n1, n2, n3] (contiguous): [half, n1 n2 n3] for
        // neox, [1, half, n1 n2 n3] with a stride of two channels otherwise
        auto ch = [&](ggml_tensor * x, int which) {
            const int64_t n = x->ne[1] * x->ne[2] * x->ne[3];
            return pr.neox ? ggml_view_2d(ctx, x, half, n, hd * f, (size_t) which * half * f)
                           : ggml_view_3d(ctx, x, 1, half, n, 2 * f, hd * f, (size_t) which * f);
        };
        ggml_tensor * msw = ggml_reshape_4d(ctx, ggml_concat(ctx, ch(m4, 1), ch(m4, 0), 0), hd, 1, nkv, m4->ne[3]);
        ggml_tensor * p1 = ggml_mul(ctx, q4, m4), * p2 = ggml_mul(ctx, q4, msw);
        ggml_tensor * alpha = ggml_reshape_3d(ctx, ggml_add(ctx, ch(p1, 0), ch(p1, 1)), half, nq, nt);
        ggml_tensor * beta = ggml_reshape_3d(ctx, ggml_sub(ctx, ch(p2, 1), ch(p2, 0)), half, nq, nt);
        return ggml_concat(ctx, alpha, beta, 0);
    }
    // neox with partial RoPE: a pair's channels are not one strided view (tq_rf_ch)
    // the mean per query head (the g heads of a KV head share it), per block
    ggml_tensor * mq = ggml_repeat_4d(ctx, ggml_reshape_4d(ctx, mu, hd, 1, nkv, nb), hd, g, nkv, nb);
    mq = ggml_reshape_3d(ctx, mq, hd, nq, nb);
    ggml_tensor * qa = ggml_reshape_4d(ctx, tq_rf_half(ctx, q, pr, 0), half, nq, per, nb);
    ggml_tensor * qb = ggml_reshape_4d(ctx, tq_rf_half(ctx, q, pr, 1), half, nq, per, nb);
    ggml_tensor * ma = ggml_reshape_4d(ctx, tq_rf_half(ctx, mq, pr, 0), half, nq, 1, nb);
    ggml_tensor * mb = ggml_reshape_4d(ctx, tq_rf_half(ctx, mq, pr, 1), half, nq, 1, nb);
    ggml_tensor * alpha = ggml_add(ctx, ggml_mul(ctx, qa, ma), ggml_mul(ctx, qb, mb));
    ggml_tensor * beta = ggml_sub(ctx, ggml_mul(ctx, qb, ma), ggml_mul(ctx, qa, mb));
    return ggml_reshape_3d(ctx, ggml_concat(ctx, alpha, beta, 0), hd, nq, nt);
}

/* The pre-RoPE mean of the keys k [hd, nh, nt] at the positions of T [hd, nt]: the weighted
   mean of R_p^-1 k_p over each of nb blocks of the tokens, as [hd, nh, nb]. per_tok: the
   weights [1, nt / nb, nb] (1 / (nt / nb) each: tq_kbal_const, or tq_kmean_stat_weights'). */
static inline ggml_tensor * tq_rf_unrope_mean(ggml_context * ctx, ggml_tensor * k, ggml_tensor * T, ggml_tensor * per_tok,
                                              tq_rf_pairs pr) {
    const int64_t hd = k->ne[0], nh = k->ne[1], nt = k->ne[2], half = hd / 2, nb = per_tok->ne[2], per = per_tok->ne[1];
    GGML_ASSERT(per * nb == nt);
    ggml_tensor * ka = tq_rf_half(ctx, k, pr, 0), * kb = tq_rf_half(ctx, k, pr, 1);
    ggml_tensor * c = tq_rf_trig(ctx, T, 0), * s = tq_rf_trig(ctx, T, 1);
    ggml_tensor * ua = ggml_add(ctx, ggml_mul(ctx, ka, c), ggml_mul(ctx, kb, s));
    ggml_tensor * ub = ggml_sub(ctx, ggml_mul(ctx, kb, c), ggml_mul(ctx, ka, s));
    ggml_tensor * ma = ggml_reshape_3d(ctx, ggml_out_prod(ctx, ggml_reshape_3d(ctx, ua, half * nh, per, nb), per_tok), half, nh, nb);
    ggml_tensor * mb = ggml_reshape_3d(ctx, ggml_out_prod(ctx, ggml_reshape_3d(ctx, ub, half * nh, per, nb), per_tok), half, nh, nb);
    return tq_rf_join(ctx, ma, mb, pr);
}

/* A KEEP ubatch's whole K side as one node (ggml-ext/ggml/tq-rf-keep.h): from q [hd, nq, nt]
   and k [hd, nkv, nt] (channel frame), the means [mu' | s - 1] (tq-kmean.h's layout; s - 1
   only with balancing) as columns [F, nb], token t taking column t / (nt / nb) (the ubatch's
   streams, in blocks), and the ubatch's table T [hd, nt]: returns k' = s k - R_p mu' (k
   roped), or with no T k' = s k - mu' (k before its rope, which the caller applies), sets
   *q_cur to q' = q / s and *coeffs to the coefficients A of q' against mu' (views of one
   output, each contiguous). As separate nodes these were six a layer on the CPU (s, q / s,
   s k, A, R_p mu', the subtraction) and about ten from plain ops on a device, each a thread
   barrier or a dispatch on a decode step. */
static inline ggml_tensor * tq_rf_keep(ggml_context * ctx, ggml_tensor ** q_cur, ggml_tensor * k, ggml_tensor * k_mean,
                                       ggml_tensor * T, bool bal, tq_rf_pairs pr, ggml_tensor ** coeffs) {
    ggml_tensor * q = *q_cur;
    const int64_t hd = k->ne[0], nkv = k->ne[1], nt = k->ne[2], nq = q->ne[1];
    ggml_tensor * out = tq_rf_keep_node(ctx, q, k, k_mean, T, tq_rf_pairs_bits(pr, hd) | (bal ? TQ_RF_KEEP_BAL : 0u));
    const size_t f = sizeof(float);
    *q_cur = ggml_view_3d(ctx, out, hd, nq, nt, hd * f, hd * nq * f, (size_t) hd * nkv * nt * f);
    *coeffs = ggml_view_3d(ctx, out, hd, nq, nt, hd * f, hd * nq * f, (size_t) hd * (nkv + nq) * nt * f);
    return ggml_view_3d(ctx, out, hd, nkv, nt, hd * f, hd * nkv * f, 0);
}

/* Decode: the mask [n_kv, nt, 1, ns] plus kq_scale * q.R_p mu' per head, from the coefficients
   A [hd, nq, nt ns] and the cells' table T [hd, n_kv ns]: [n_kv, nt, nq, ns] in the mask's type. */
static inline ggml_tensor * tq_rf_mask(ggml_context * ctx, ggml_tensor * mask, ggml_tensor * A, ggml_tensor * T,
                                       float kq_scale, ggml_tensor * extra = nullptr, ggml_tensor * mask_f32 = nullptr) {
    // ns streams in view: the mask is [n_kv, n_tps, 1, ns], T's columns and A's tokens come in
    // ns blocks, and each block's tokens see only that block's cells
    const int64_t ns = mask->ne[3], n_kv = mask->ne[0], n_tps = mask->ne[1], nq = A->ne[1], hd = A->ne[0];
    GGML_ASSERT(T->ne[1] == n_kv * ns && A->ne[2] == n_tps * ns && mask->ne[2] == 1);
    ggml_tensor * b = ggml_mul_mat(ctx, ggml_reshape_4d(ctx, T, hd, n_kv, 1, ns),
                                   ggml_reshape_4d(ctx, A, hd, nq * n_tps, 1, ns));        // [n_kv, nq n_tps, 1, ns]
    b = tq_packed(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, b, n_kv, nq, n_tps, ns), 0, 2, 1, 3)); // [n_kv, n_tps, nq, ns]
    if (extra) {
        b = ggml_add(ctx, b, extra); // more raw-logit terms of the same layout (tq_sink_mask_delta)
    }
    // mask_f32: the mask as f32 where the caller keeps one for every layer
    ggml_tensor * m = mask->type == GGML_TYPE_F32 ? mask : mask_f32 ? mask_f32 : ggml_cast(ctx, mask, GGML_TYPE_F32);
    GGML_ASSERT(ggml_are_same_shape(m, mask));
    b = ggml_add(ctx, ggml_scale(ctx, b, kq_scale), m);
    return mask->type == GGML_TYPE_F32 ? b : ggml_cast(ctx, b, mask->type);
}

/* Prefill: the cache's keys k [hd, nkv, n_kv, ns] (the cache's type, rotated) as f32 with
   R_p mu' added back per cell (rotated by rot, the cache's rotation, when there is one).
   With the exact first keys' slots (tq-sink.h; S each cell's slot) a matching cell's decoded
   rows are its slot's. rm: R_p mu' of the cells where the caller has it (tq_rf_rope_mean;
   T is then not read), else computed from T. */
static inline ggml_tensor * tq_rf_keys(ggml_context * ctx, ggml_tensor * k, ggml_tensor * mu, ggml_tensor * T,
                                       ggml_tensor * rot, tq_rf_pairs pr,
                                       ggml_tensor * (*rotate)(ggml_context *, ggml_tensor *, ggml_tensor *),
                                       ggml_tensor * S = nullptr, ggml_tensor * sink_rows = nullptr,
                                       ggml_tensor * sink_q = nullptr, ggml_tensor * k_extra = nullptr,
                                       bool host_ops = true, ggml_tensor * rm = nullptr) {
    GGML_ASSERT(rm ? rm->ne[2] == k->ne[2] * k->ne[3] : k->ne[2] * k->ne[3] == T->ne[1]); // ne[3]: the view's streams
    if (!rm) {
        rm = host_ops ? tq_rf_rotate_mean(ctx, mu, T, pr) : tq_rf_rotate_mean_ops(ctx, mu, T, pr); // [hd, nkv, n_kv ns]
    }
    if (rot) {
        rm = rotate(ctx, rm, rot);
    }
    ggml_tensor * k32 = ggml_cast(ctx, k, GGML_TYPE_F32);
    if (S && sink_rows && sink_q) {
        k32 = tq_sink_keys(ctx, k32, k, S, sink_rows, sink_q);
    }
    if (k_extra) {
        k32 = ggml_add(ctx, k32, k_extra); // the lowered first keys (tq_sink_keys_delta)
    }
    return ggml_add(ctx, k32, ggml_reshape_4d(ctx, rm, k->ne[0], k->ne[1], k->ne[2], k->ne[3]));
}

#endif /* TQ_KMEAN_ROPE_H */
