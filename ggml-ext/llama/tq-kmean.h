/*
 * tq-kmean.h - K mean removal and K/Q channel balancing for turbo K caches: graph pieces
 * (C++, llama.cpp side). Host side: tq-llama-kv-cache.cpp.
 *
 * Why: attention only sees q.k through a softmax over keys, and softmax ignores a constant
 * added to every logit. Storing k - m instead of k (m: one vector per layer and KV head,
 * the same for every cell) shifts every logit of a query by -q.m, so attention is exactly
 * unchanged. Keys share a large common component; the codec's error is proportional to
 * |k|, so taking that component out before quantizing cuts the error on the part of k that
 * softmax actually sees (docs/JOURNAL.md has the measurements).
 *
 * Which m: keys are stored after RoPE, which turns channel pair i of the key at position p
 * by p * w_i. A common pre-RoPE component mu therefore shows up at position p as
 * e^{i p w_i} mu_i (pairs as complex numbers), and the best single m for keys at
 * positions 0..N-1 (N: the positions the cache holds) is a_N mu, a_N = mean_p e^{i p w_i}:
 * the full mean on pairs that barely turn over the context, a shrunk one on pairs that
 * turn part way, nothing on pairs that spin. A mean taken over the first ubatch alone is
 * right for that ubatch's positions and can double the offset of mid-frequency pairs at
 * later positions. The first ubatch's mean kbar estimates a_B mu (a_B: the same average
 * over its positions), so m = F kbar with F = a_N conj(a_B) / max(|a_B|^2, |a_N| |a_B|):
 * a_N / a_B where the ubatch pins mu down, a pure phase where it cannot (|F| <= 1, so noise
 * is never amplified), exactly 1 when the ubatch covers the cache's positions. In expected
 * residual energy this is never worse than no mean. F is a per-pair 2x2 block (a scaled
 * rotation) that the host computes from the RoPE frequencies (tq-llama-kv-cache.cpp) and
 * stores as a [head_dim x head_dim] matrix M beside m. Any m keeps attention exact; F
 * only decides how much quantization error it removes.
 *
 * Where the model runs on the CPU the default goes further (tq-kmean-rope.h): key p stores
 * s*(k_p - R_p mu), the pre-RoPE mean turned to the key's own position, and attention adds
 * the per-key term q.R_p mu back; that follows the spinning pairs too. This file's fitted m
 * is the fallback (a GPU device; TQ_K_MEAN_FRAME=fitted).
 *
 * Invariant: every key in the cache was stored with the same m and s. So they are chosen
 * only when the cache holds no cell at all (the first ubatch after it became empty) and
 * never change while a key stored with them exists:
 *   - SET:  the cache is empty and the ubatch has >= TQ_KMEAN_MIN_TOKENS tokens: statistics
 *           from this ubatch (below that, the first token - an attention sink in most
 *           models - would dominate the estimate). Where the first keys are kept exact
 *           (tq-sink.h) the tokens at position 0 are left out of the statistics, as their
 *           keys are never quantized, and TQ_KMEAN_MIN_TOKENS_SKIP other tokens suffice;
 *   - ZERO: the cache is empty and the ubatch is small: m = 0, s = 1 (plain behaviour);
 *   - KEEP: otherwise the stored ones.
 * The mode is part of the graph's shape: only a SET graph computes statistics, and a KEEP
 * graph (every decode step) costs a multiply and a subtraction per side. The host decides
 * the mode before the graph is built or reused (tq-llama-kv-cache.cpp), and M reaches a SET
 * graph as an input tensor, so nothing is written to a backend buffer outside the graph
 * (on a GPU such a write could land while the previous ubatch still computes).
 * Layout of a layer's k_mean tensor (f32): [m (n) | s - 1 (n, balancing only)],
 * n = head_dim * n_head_kv; m and s live in the model's channel frame (before the cache's
 * rotation), which is where RoPE pairs are channel pairs. It is all saved state carries.
 *
 * Where softmax invariance does not hold, this fitted mean is off: logit soft-capping (tanh
 * before softmax) and attention sinks (an extra logit that is not shifted) keep only the mean
 * in RoPE's frame, which is exact there. MLA has none (V is a view of K's latent part, so a
 * K mean would shift V). Partial RoPE works in both frames: the map M turns only the roped
 * pairs (llama's, i and i + n_rot/2 with neox) and is the identity past n_rot, balancing ties
 * s on the same pairs (tq_rf_pairs), so s still commutes with RoPE and the K shift holds.
 * TQ_K_MEAN=0 turns it off.
 * K shift (context shift, seq_add) re-ropes stored keys: s*rope(k) - m is recovered as
 * rope_d(stored + m) - m in the channel frame, see tq_kmean_unshift/tq_kmean_reshift.
 * Saved state carries m and s per layer; see tq-llama-kv-cache.cpp.
 */
#ifndef TQ_KMEAN_H
#define TQ_KMEAN_H

#include "ggml.h"
#include "tq-kmean-rope.h"

#include <algorithm>
#include <complex>


#define TQ_KMEAN_MIN_TOKENS 32
/* The same with the first keys kept exact, counting the tokens not at position 0 (the sink
   that needed the 32 is left out): measured on two models, statistics from this few tokens
   still beat none by far (docs/JOURNAL.md). */
#define TQ_KMEAN_MIN_TOKENS_SKIP 2

/* The weights of a SET ubatch's tokens in its statistics (the mean, the query energy and the
   keys' attention of balancing), dst[0..n): 1 / n' each, where n' tokens count. With the
   first keys kept exact (tq-sink.h: skip_first) a token at position 0 counts 0: its key is
   not quantized, so its error costs nothing, and being the attention sink it would otherwise
   draw the mean and the balancing towards its own channel profile, which the quantized keys
   do not share (docs/JOURNAL.md). If no token counts, all do. */
static inline void tq_kmean_stat_weights(const int32_t * pos, int64_t n, bool skip_first, float * dst) {
    int64_t used = 0;
    for (int64_t j = 0; j < n; ++j) {
        used += !(skip_first && pos[j] == 0);
    }
    for (int64_t j = 0; j < n; ++j) {
        dst[j] = used == 0 ? 1.0f / (float) n : (skip_first && pos[j] == 0) ? 0.0f : 1.0f / (float) used;
    }
}

/* Graph tensors K mean removal and K/Q balancing may add per layer on a prefill ubatch,
   added to llama's graph budget (llama_context::graph_max_nodes). */
#define TQ_KMEAN_GRAPH_NODES_PER_LAYER 384u

enum tq_kmean_mode { TQ_KMEAN_ZERO = 0, TQ_KMEAN_SET = 1, TQ_KMEAN_KEEP = 2,
                     TQ_KMEAN_INHERIT = 3 /* a block's: the shared column (tq_kmean_rf_streams) */ };

/* Floats of a layer's k_mean tensor: m, and s - 1 with balancing. */
static inline int64_t tq_kmean_floats(int64_t head_dim, int64_t n_head_kv, bool balance) {
    return (balance ? 2 : 1) * head_dim * n_head_kv;
}

/* The stored mean of a layer as [head_dim, n_head_kv]. */
static inline ggml_tensor * tq_kmean_view(ggml_context * ctx, ggml_tensor * k_mean, int64_t head_dim, int64_t n_head) {
    return ggml_view_2d(ctx, k_mean, head_dim, n_head, head_dim * sizeof(float), 0);
}

/* The position map M (row-major [hd x hd], written to M): per RoPE pair i (channels 2i, 2i+1,
   or i, i + half with neox) of angular frequency w[i] the scaled rotation
   F = a_N conj(a_B) / max(|a_B|^2, |a_N| |a_B|), a_N = mean of e^{i p w} over p = 0..n_pos-1,
   a_B over the ubatch's positions pos[0..n_tok-1]; the identity on channels past 2 * half. */
static inline void tq_kmean_map(const double * w, int64_t half, int64_t hd, bool neox, const int32_t * pos,
                                int64_t n_tok, uint32_t n_pos, float * M) {
    std::fill(M, M + hd * hd, 0.0f);
    for (int64_t i = 0; i < hd; ++i) {
        M[i * hd + i] = 1.0f;
    }
    for (int64_t i = 0; i < half && n_tok > 0 && n_pos > 0; ++i) {
        std::complex<double> aB = 0.0;
        for (int64_t j = 0; j < n_tok; ++j) {
            aB += std::polar(1.0, w[i] * pos[j]);
        }
        aB /= (double) n_tok;
        // mean of e^{ipw} over p < N: (1 - e^{iNw}) / (N (1 - e^{iw})), or 1 as w -> 0 (mod 2 pi)
        const std::complex<double> z = std::polar(1.0, w[i]);
        const std::complex<double> aN = std::abs(1.0 - z) < 1e-12 ? std::complex<double>(1.0)
                                      : (1.0 - std::polar(1.0, w[i] * n_pos)) / ((double) n_pos * (1.0 - z));
        const double den = std::max(std::norm(aB), std::abs(aN) * std::abs(aB));
        const std::complex<double> F = den > 0.0 ? aN * std::conj(aB) / den : 0.0;
        const int64_t a = neox ? i : 2 * i, b = neox ? i + half : 2 * i + 1;
        M[a * hd + a] = (float) F.real();
        M[a * hd + b] = (float) -F.imag();
        M[b * hd + a] = (float) F.imag();
        M[b * hd + b] = (float) F.real();
    }
}

/*
 * K/Q channel balancing (with K mean removal, on by default; TQ_K_BALANCE=0 turns it off).
 *
 * Why: q.k = (q / s).(s * k) for any per-channel s > 0, so storing s * k and attending with
 * q / s leaves every logit exactly unchanged. The codec's error on a rotated key j is spread
 * evenly over the channels with energy ~ |s * x_j|^2 (x_j = k_j - m), and reaches the logit
 * through q / s. What the softmax output feels is that error weighted by the attention p_j
 * the key gets, so the cost is ~ E|q / s|^2 * sum_j p_j |s * x_j|^2, smallest (Cauchy-
 * Schwarz) at s_c^4 = E[q_c^2] / sum_j p_j x_jc^2: the channels the queries weigh most get
 * the finest quantization, judged on the keys they actually attend to. Nothing is fitted to
 * a corpus; s is this formula on the first ubatch (its own causal attention, kq_scale).
 * Weighting by p matters: SmolLM2's sink keys have another channel profile than the rest.
 *
 * The key energy is the one the stored keys will have at every position the cache holds,
 * not only at the first ubatch's: per RoPE pair, E_p |e^{ipw} u_j - m|^2 averaged over the
 * cache's positions is |k_j|^2 - 2 Re(conj(m) a_N u_j) + |m|^2, and a_N u_j averaged with
 * the weights p_j is estimated as F kbar_w (kbar_w: the p-weighted key mean), the same map
 * that gives m = F kbar. Summed over a pair this is >= 0 because |F| <= 1.
 *
 * - Chosen with m (same SET/KEEP/ZERO modes, same ubatch); E[q_c^2] is over the ubatch's
 *   tokens and the query heads sharing the KV head.
 * - s is equal on the two channels of every RoPE pair (adjacent for LLAMA_ROPE_TYPE_NORM,
 *   halves otherwise), so s commutes with RoPE and with M, and the K shift needs no change.
 * - Normalised per KV head so that the weighted |s * x|^2 keeps its energy (the fp16 block
 *   scales stay in range), then clamped to [1/64, 64] so q / s stays far from overflow in the
 *   f16 query of the tensor-core path (|q / s| <= 64 |q|). The range is what a model with K
 *   channels 100x the rest needs: the normalisation puts the other channels' s near the top,
 *   the massive ones' near the bottom, and [1/8, 8] (until 2026-12-07) clipped both, which
 *   left turbo3's KLD there twice the unscaled model's (docs/FAMILIES.md). A model without
 *   such channels never reaches either bound (its logits are the same bits under both).
 * - Stored as s - 1 after m: a cleared buffer (ZERO mode) reads as s = 1. The stored m is
 *   the mean of the balanced keys, s * F kbar.
 */
#define TQ_KBAL_MAX 64.0f
#define TQ_KBAL_QUERIES 64

/* x [hd, nh] contiguous -> each RoPE pair (tq_rf_pairs) replaced by the mean of its two channels. */
static inline ggml_tensor * tq_kbal_tie_pairs(ggml_context * ctx, ggml_tensor * x, tq_rf_pairs pr) {
    const int64_t hd = x->ne[0], nh = x->ne[1];
    if (!tq_rf_plain(pr, hd)) {
        // neox with partial RoPE: the pairs' two channels as halves (tq_rf_half), averaged
        ggml_tensor * x3 = ggml_reshape_3d(ctx, x, hd, nh, 1);
        ggml_tensor * m = ggml_scale(ctx, ggml_add(ctx, tq_rf_half(ctx, x3, pr, 0), tq_rf_half(ctx, x3, pr, 1)), 0.5f);
        return ggml_reshape_2d(ctx, tq_rf_join(ctx, m, m, pr), hd, nh);
    }
    if (!pr.neox) {
        ggml_tensor * p = ggml_reshape_2d(ctx, x, 2, hd / 2 * nh);
        return ggml_reshape_2d(ctx, ggml_repeat(ctx, ggml_mean(ctx, p), p), hd, nh);
    }
    ggml_tensor * p = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, x, hd / 2, 2, nh), 1, 0, 2, 3)); // [2, hd/2, nh]
    ggml_tensor * r = ggml_repeat(ctx, ggml_mean(ctx, p), p);
    return ggml_reshape_2d(ctx, ggml_cont(ctx, ggml_permute(ctx, r, 1, 0, 2, 3)), hd, nh);
}

/* A [1, n, nb] f32 tensor of the constant c: the weights of a sum over ne[1] by ggml_out_prod.
   `like` (contiguous f32, >= n * nb elements) only gives the graph a tensor to shape it by;
   its values are never read. */
static inline ggml_tensor * tq_kbal_const(ggml_context * ctx, ggml_tensor * like, int64_t n, int64_t nb, float c) {
    GGML_ASSERT(like->type == GGML_TYPE_F32 && ggml_is_contiguous(like) && ggml_nelements(like) >= n * nb);
    return ggml_fill(ctx, ggml_view_3d(ctx, like, 1, n, nb, sizeof(float), (size_t) n * sizeof(float), 0), c);
}

/* x [r, n, nb] -> the weighted sum over ne[1], sum_j w[0, j, b] x[:, j, b], as [r, nb]. The
   sums run over the rows llama's tensors already have in memory (ggml_out_prod contracts
   ne[1] of both), so nothing is transposed into a copy first. */
static inline ggml_tensor * tq_kbal_wsum(ggml_context * ctx, ggml_tensor * x, ggml_tensor * w) {
    return ggml_reshape_2d(ctx, ggml_out_prod(ctx, x, w), x->ne[0], x->ne[2]);
}

/* s from this ubatch (SET statistics): k_cur [hd, nkv, nt] keys, q [hd, nq, nt] (both
   contiguous), M the position map, m_b = M kbar, per_tok the weights of the key mean
   [1, nt / nb, nb] (1 / (nt / nb) each, or tq_kmean_stat_weights'), nb the blocks of the
   ubatch's tokens whose statistics are taken apart (its streams, tq_kmean_rf_streams; the
   fitted mean has one). With the mean in RoPE's frame (tq-kmean-rope.h) map and m_b are NULL
   and resid [hd, nkv, nt] is what the keys store, k - R_p mu: per pair its energy does not
   depend on the position, so this ubatch's is the cache's. key_w (NULL: all keys count) is
   per_tok's weights applied to the keys' attention: a key of weight 0 is kept exact, so its
   error costs nothing, while the attention it takes still leaves the others less (no
   renormalisation). Returns s [hd, nkv nb], block b's heads at nkv b.
   A block and a KV head are one axis of "heads" here (nkv nb of them): every product, softmax
   and sum below runs per head, so a block's s is the same operations on the same values
   whether its stream came alone or with others. */
static inline ggml_tensor * tq_kbal_scale(ggml_context * ctx, ggml_tensor * k_cur, ggml_tensor * q,
                                          ggml_tensor * map, ggml_tensor * m_b, ggml_tensor * per_tok,
                                          float kq_scale, tq_rf_pairs pr, ggml_tensor * resid,
                                          ggml_tensor * key_w = nullptr) {
    const int64_t hd = k_cur->ne[0], nkv = k_cur->ne[1], nt = k_cur->ne[2];
    const int64_t nq = q->ne[1], g = nq / nkv, nb = per_tok->ne[2], per = per_tok->ne[1], H = nkv * nb;
    GGML_ASSERT(per * nb == nt && (resid || nb == 1));
    // Which keys' errors matter: those the queries attend to. w_j = attention to key j
    // within this ubatch's block (causal, the model's kq_scale), averaged over its last
    // queries (they see every key; TQ_KBAL_QUERIES of them bound the cost to a fraction of the
    // ubatch's own attention) and the g query heads of each KV head.
    const int64_t nql = std::min<int64_t>(per, TQ_KBAL_QUERIES);
    // [hd, per, nkv, nb] -> heads h + nkv b
    auto by_head = [&](ggml_tensor * x) {
        return ggml_reshape_3d(ctx, ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, x, hd, nkv, per, nb), 0, 2, 1, 3)), hd, per, H);
    };
    ggml_tensor * kp = by_head(k_cur);                                                                // [hd, per, H]
    ggml_tensor * q4 = ggml_reshape_4d(ctx, q, hd, nq, per, nb);
    ggml_tensor * ql = ggml_view_4d(ctx, q4, hd, nq, nql, nb, q4->nb[1], q4->nb[2], q4->nb[3], (size_t) (per - nql) * q4->nb[2]);
    ggml_tensor * qp = ggml_reshape_3d(ctx, ggml_cont(ctx, ggml_permute(ctx, ql, 0, 2, 1, 3)), hd, nql, nq * nb); // query head j + nq b
    // query head j + nq b reads KV head (j + nq b) / g = j / g + nkv b: its own block's
    ggml_tensor * p  = ggml_soft_max(ctx, ggml_diag_mask_inf(ctx, ggml_scale(ctx, ggml_mul_mat(ctx, kp, qp), kq_scale), (int) (per - nql))); // [per, nql, nq nb]
    // the g query heads of a KV head are adjacent, so (query, head in group) is one axis
    ggml_tensor * w  = tq_kbal_wsum(ctx, ggml_reshape_3d(ctx, p, per, nql * g, H),
                                    tq_kbal_const(ctx, kp, nql * g, H, 1.0f / (float) (nql * g)));      // [per, H]
    if (key_w) {
        // a common factor of w cancels in s's normalisation below, so per_tok's 1 / n serves
        GGML_ASSERT(key_w->ne[1] == per && key_w->ne[2] == nb);
        w = ggml_reshape_2d(ctx, ggml_mul(ctx, ggml_reshape_3d(ctx, w, per, nkv, nb), ggml_reshape_3d(ctx, key_w, per, 1, nb)), per, H);
    }
    ggml_tensor * wb = ggml_reshape_3d(ctx, w, 1, per, H);
    ggml_tensor * rk;
    if (resid) {
        rk = tq_kbal_wsum(ctx, ggml_sqr(ctx, by_head(resid)), wb);
    } else {
        // the key energy left after m at the cache's positions: sum_j w_j k_j^2 - 2 m (M kbar_w) + m^2
        ggml_tensor * e2 = tq_kbal_wsum(ctx, ggml_sqr(ctx, kp), wb);                                 // [hd, nkv]
        ggml_tensor * kw = tq_kbal_wsum(ctx, kp, wb);
        ggml_tensor * mw = ggml_mul_mat(ctx, map, kw);
        rk = ggml_add(ctx, ggml_sub(ctx, e2, ggml_scale(ctx, ggml_mul(ctx, m_b, mw), 2.0f)), ggml_sqr(ctx, m_b));
    }
    rk = ggml_clamp(ctx, tq_kbal_tie_pairs(ctx, rk, pr), 1e-20f, 1e20f);
    // query energy per channel over each block's tokens and the g query heads of each KV head
    ggml_tensor * q2 = tq_kbal_wsum(ctx, ggml_sqr(ctx, ggml_reshape_3d(ctx, q, hd * nq, per, nb)), per_tok); // [hd nq, nb]
    ggml_tensor * rq = tq_kbal_wsum(ctx, ggml_reshape_3d(ctx, q2, hd, g, H), tq_kbal_const(ctx, kp, g, H, 1.0f / (float) g));
    rq = ggml_clamp(ctx, rq, 1e-20f, 1e20f);
    rq = tq_kbal_tie_pairs(ctx, rq, pr);

    // s = (rq / rk)^(1/4), the ratio bounded so that nothing below overflows
    ggml_tensor * s = ggml_sqrt(ctx, ggml_sqrt(ctx, ggml_clamp(ctx, ggml_div(ctx, rq, rk), 1e-12f, 1e12f)));
    // keep |s x|^2 = |x|^2 per KV head
    ggml_tensor * e0 = ggml_sum_rows(ctx, rk);
    ggml_tensor * e1 = ggml_sum_rows(ctx, ggml_mul(ctx, ggml_sqr(ctx, s), rk));
    s = ggml_mul(ctx, s, ggml_sqrt(ctx, ggml_div(ctx, e0, e1)));
    return ggml_clamp(ctx, s, 1.0f / TQ_KBAL_MAX, TQ_KBAL_MAX);
}

/* A SET's s written to d_st as s - 1 (the layout of k_mean), and returned as KEEP will read it
   back, 1 + (s - 1): outside [1/2, 2] that is not always s to the bit, and the SET ubatch's
   own tokens must get the same q / s and s * k as the same tokens in a later KEEP ubatch (a
   prompt restored from llama-server's host cache re-runs its last token as KEEP). */
static inline ggml_tensor * tq_kbal_store(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * s, ggml_tensor * d_st) {
    ggml_tensor * d = ggml_scale_bias(ctx, s, 1.0f, -1.0f);
    ggml_build_forward_expand(gf, ggml_cpy(ctx, d, d_st));
    return ggml_scale_bias(ctx, d, 1.0f, 1.0f);
}

/* In RoPE's frame (tq-kmean-rope.h), a SET's statistics of each of nb blocks of the ubatch's
   tokens: from k [hd, nkv, nt] and q [hd, nq, nt] (roped, channel frame, contiguous), the
   ubatch's table tab [hd, nt] and the tokens' weights w [1, nt / nb, nb] (per block
   tq_kmean_stat_weights', or NULL: equal), the stored layout [mu' | s - 1] of each block as
   columns [F, nb] (s - 1 only with balancing). s - 1 is what KEEP will read back, 1 + (s - 1),
   which outside [1/2, 2] is not always s to the bit; mu' = s mu is made with that value, so
   a SET ubatch's own tokens, taken through tq_kmean_rf_use with these columns, get the same
   q / s and s * k as the same tokens in a later KEEP ubatch. host_ops false: no host (custom)
   op, for a device that would run one only through a round trip (tq_kmean_rope_masked). */
static inline ggml_tensor * tq_kmean_rf_stats(ggml_context * ctx, ggml_tensor * q, ggml_tensor * k, ggml_tensor * tab,
                                              ggml_tensor * w, int64_t nb, bool bal, float kq_scale, tq_rf_pairs pr,
                                              bool host_ops) {
    const int64_t hd = k->ne[0], nkv = k->ne[1], nt = k->ne[2], n = hd * nkv;
    GGML_ASSERT(nt % nb == 0 && ggml_is_contiguous(k) && ggml_is_contiguous(q) && (!w || (w->ne[1] * nb == nt && w->ne[2] == nb)));
    ggml_tensor * per_tok = w ? w : tq_kbal_const(ctx, k, nt / nb, nb, 1.0f / (float) (nt / nb));
    ggml_tensor * mu = tq_rf_unrope_mean(ctx, k, tab, per_tok, pr);                                  // [hd, nkv, nb]
    if (!bal) {
        return ggml_reshape_2d(ctx, ggml_cont(ctx, mu), n, nb);
    }
    mu = ggml_cont(ctx, mu);
    ggml_tensor * resid = ggml_sub(ctx, k, host_ops ? tq_rf_rotate_mean(ctx, mu, tab, pr) : tq_rf_rotate_mean_ops(ctx, mu, tab, pr));
    ggml_tensor * s = tq_kbal_scale(ctx, k, q, nullptr, nullptr, per_tok, kq_scale, pr, resid, w);  // [hd, nkv nb]
    ggml_tensor * d = ggml_scale_bias(ctx, s, 1.0f, -1.0f);
    ggml_tensor * m = ggml_mul(ctx, ggml_reshape_2d(ctx, mu, n, nb), ggml_reshape_2d(ctx, ggml_scale_bias(ctx, d, 1.0f, 1.0f), n, nb));
    return ggml_concat(ctx, m, ggml_reshape_2d(ctx, d, n, nb), 0);                                     // [2 n, nb]
}

/* In RoPE's frame, what every ubatch does with the means it runs on, cols [F, nb] (the stored
   layout, one column per block of the tokens): k [hd, nkv, nt] -> s * k - R_p mu' (returned),
   *q_cur -> q / s, *coeffs the per-key term's coefficients A of q / s against mu'. On the CPU
   (host_ops) one fused node (tq_rf_keep); on a device that runs that node (dev_keep) the same,
   before k's own rope where rope (tq_rf_rope_of) is given (R_p (s k~ - mu') = s k - R_p mu');
   elsewhere ops every backend has, per block by broadcasting, with R_p mu' by k's own rope
   where rope is given. */
static inline ggml_tensor * tq_kmean_rf_use(ggml_context * ctx, ggml_tensor ** q_cur, ggml_tensor * k, ggml_tensor * cols,
                                            ggml_tensor * tab, bool bal, tq_rf_pairs pr, bool host_ops, ggml_tensor ** coeffs,
                                            const ggml_tensor * rope = nullptr, bool dev_keep = false) {
    // the fused node: over the roped k and the table, or over the rope's input (then roped)
    ggml_tensor * kin = rope ? rope->src[0] : k, * T = rope ? nullptr : tab;
    if (host_ops || (dev_keep && tq_rf_keep_layout_ok(*q_cur, kin, cols, T, bal))) {
        ggml_tensor * x = tq_rf_keep(ctx, q_cur, kin, cols, T, bal, pr, coeffs);
        return rope ? tq_rf_rope_apply(ctx, x, rope->src[1], rope, rope->op_params[2]) : x;
    }
    ggml_tensor * q = ggml_is_contiguous(*q_cur) ? *q_cur : ggml_cont(ctx, *q_cur);
    k = ggml_is_contiguous(k) ? k : ggml_cont(ctx, k);
    const int64_t hd = k->ne[0], nkv = k->ne[1], nt = k->ne[2], nq = q->ne[1], g = nq / nkv, nb = cols->ne[1], per = nt / nb;
    GGML_ASSERT(cols->ne[0] == (bal ? 2 : 1) * hd * nkv && nt % nb == 0 && nq % nkv == 0);
    // m and s - 1 of each block: no copy for one block, where the column is packed already
    auto part = [&](size_t off) {
        return tq_packed(ctx, ggml_view_3d(ctx, cols, hd, nkv, nb, hd * sizeof(float), cols->nb[1], off));
    };
    ggml_tensor * m = part(0);
    ggml_tensor * s4 = nullptr; // s per block [hd, nkv, 1, nb]
    if (bal) {
        ggml_tensor * d = part((size_t) hd * nkv * sizeof(float));
        ggml_tensor * s = ggml_scale_bias(ctx, d, 1.0f, 1.0f);                                          // [hd, nkv, nb]
        q = ggml_reshape_3d(ctx, ggml_div(ctx, ggml_reshape_4d(ctx, q, hd, g, nkv, nt), tq_rf_by_token(ctx, s, nt)), hd, nq, nt);
        s4 = ggml_reshape_4d(ctx, s, hd, nkv, 1, nb);
        if (!rope) {
            k = ggml_reshape_3d(ctx, ggml_mul(ctx, ggml_reshape_4d(ctx, k, hd, nkv, per, nb), s4), hd, nkv, nt);
        }
    }
    *q_cur = q;
    *coeffs = tq_rf_coeffs_ops(ctx, q, m, pr);
    if (rope) {
        // s k - R_p mu' = R_p (s k~ - mu'), k~ the rope's input (s is equal on a pair's channels)
        ggml_tensor * kp = rope->src[0];
        ggml_tensor * x = ggml_view_4d(ctx, kp, hd, nkv, per, nb, kp->nb[1], kp->nb[2], kp->nb[2] * per, 0);
        if (s4) {
            x = ggml_mul(ctx, x, s4);
        }
        x = ggml_sub(ctx, x, ggml_reshape_4d(ctx, m, hd, nkv, 1, nb));
        return tq_rf_rope_apply(ctx, ggml_reshape_3d(ctx, x, hd, nkv, nt), rope->src[1], rope, rope->op_params[2]);
    }
    return ggml_sub(ctx, k, tq_rf_rotate_mean_ops(ctx, m, tab, pr));
}

/* Statistics per stream, in RoPE's frame (the fitted mean keeps one for the cache): a layer's
   k_mean is [F, n_stream + 1], column s the means stream s's keys were stored with, the last
   the cache's shared one. A ubatch's tokens come in nb blocks, one per stream (llama's
   split_equal; one block for a unified cache), and each block's column is chosen by the host
   (tq_kmean_prepare, one entry of sel per block and one for the shared column, indices into
   [the stored columns of streams[0..nb] | this ubatch's SET statistics per block | zeros]):
     KEEP     the stream's stored column;
     SET      (the cache empty, the block large enough) the block's own statistics: so a
              sequence that starts a cache's life gets the statistics of its own tokens, the
              same alone or batched with others (their tokens are other blocks);
     ZERO     (the cache empty, the block too small) m = 0, s = 1: the plain cache;
     INHERIT  (a stream that starts while the cache holds others) the shared column, which
              the cache's first SET ubatch set; so a sequence that joins a busy cache
              (llama-server's slots) runs on the same statistics however its prompt was cut.
   kind TQ_KMEAN_KEEP (every block KEEP): no write, no statistics; otherwise the chosen columns
   go back to k_mean (set_rows on streams), and kind TQ_KMEAN_SET computes the statistics.
   streams, sel: i32 [nb + 1] (the last of streams is n_stream, the shared column's row).
   Returns k' as tq_kmean_rf_use, and the columns the ubatch's blocks run on in *cols. rope
   (without host ops only): k's rope node (tq_rf_rope_of), which then turns the mean; dev_keep:
   the layer's device runs tq_rf_keep's node (tq_kmean_rope_dev_keep). */
static inline ggml_tensor * tq_kmean_rf_streams(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor ** q_cur, ggml_tensor * k,
                                                ggml_tensor * k_mean, int kind, ggml_tensor * streams, ggml_tensor * sel,
                                                ggml_tensor * tab, ggml_tensor * stat_w, float kq_scale, tq_rf_pairs pr,
                                                bool host_ops, ggml_tensor ** coeffs, ggml_tensor ** cols,
                                                const ggml_tensor * rope = nullptr, bool dev_keep = false) {
    const int64_t hd = k->ne[0], nkv = k->ne[1], nb = streams->ne[0] - 1, F = k_mean->ne[0];
    const bool bal = F == tq_kmean_floats(hd, nkv, true);
    GGML_ASSERT(bal || F == tq_kmean_floats(hd, nkv, false));
    GGML_ASSERT(nb >= 1 && k->ne[2] % nb == 0 && streams->type == GGML_TYPE_I32 && k_mean->ne[1] >= nb + 1);
    // one stream (a unified cache, one sequence): its column is a view, and a decode step has
    // no gather node (each node of a CPU decode costs a thread barrier)
    ggml_tensor * stored = k_mean->ne[1] == 2 && kind == TQ_KMEAN_KEEP ? k_mean : ggml_get_rows(ctx, k_mean, streams); // [F, nb + 1]
    ggml_tensor * use = stored;
    if (kind != TQ_KMEAN_KEEP) {
        GGML_ASSERT(sel && sel->type == GGML_TYPE_I32 && sel->ne[0] == nb + 1);
        ggml_tensor * q = ggml_is_contiguous(*q_cur) ? *q_cur : ggml_cont(ctx, *q_cur);
        if (!ggml_is_contiguous(k)) {
            k = ggml_cont(ctx, k);
        }
        *q_cur = q;
        ggml_tensor * parts = stored;
        if (kind == TQ_KMEAN_SET) {
            parts = ggml_concat(ctx, parts, tq_kmean_rf_stats(ctx, q, k, tab, stat_w, nb, bal, kq_scale, pr, host_ops), 1);
        }
        // a zero column (never a product with stored values: a NaN there would survive * 0)
        parts = ggml_concat(ctx, parts, ggml_fill(ctx, ggml_view_2d(ctx, stored, F, 1, stored->nb[1], 0), 0.0f), 1);
        use = ggml_get_rows(ctx, parts, sel);                                                           // [F, nb + 1]
        ggml_build_forward_expand(gf, ggml_set_rows(ctx, k_mean, use, streams));
    }
    *cols = ggml_view_2d(ctx, use, F, nb, use->nb[1], 0);
    return tq_kmean_rf_use(ctx, q_cur, k, *cols, tab, bal, pr, host_ops, coeffs, rope, dev_keep);
}

/* Before the cache's rotation: k_cur [hd, n_head_kv, n_tokens] (roped) -> s * k - m and
   q_cur [hd, n_head, n_tokens] -> q / s (balancing only), as the mode says (SET needs the
   position map `map` [hd, hd] and >= TQ_KMEAN_MIN_TOKENS tokens, and writes m and s back into
   k_mean; ZERO writes m = 0, s = 1). Returns k_cur unchanged when k_mean is NULL. The fitted
   mean keeps one column for the whole cache: column 0 of k_mean.
   A k_mean marked for RoPE's frame (tq-kmean-rope.h) of one column (a test's; llama's graph
   takes tq_kmean_rf_streams) needs the ubatch's position table tab [hd, n_tokens] instead of
   map, stores s * k - R_p mu' and returns the per-key term's coefficients in *coeffs; its SET
   statistics weigh the tokens by stat_w [1, n_tokens, 1] (tq_kmean_stat_weights) where given,
   else equally. host_ops false: no host (custom) op (tq_kmean_rf_use). */
static inline ggml_tensor * tq_kmean_apply(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor ** q_cur, ggml_tensor * k_cur,
                                           ggml_tensor * k_mean, int mode, ggml_tensor * map, float kq_scale, tq_rf_pairs pr,
                                           ggml_tensor * tab = nullptr, ggml_tensor ** coeffs = nullptr,
                                           ggml_tensor * stat_w = nullptr, bool host_ops = true) {
    if (!k_cur || !k_mean) {
        return k_cur;
    }
    const bool rf = tq_kmean_rope_is(k_mean);
    GGML_ASSERT(!rf || mode == TQ_KMEAN_ZERO || (tab && coeffs && tab->ne[1] == k_cur->ne[2]));
    const int64_t hd = k_cur->ne[0], nkv = k_cur->ne[1], nt = k_cur->ne[2], n = hd * nkv;
    const bool bal = k_mean->ne[0] == tq_kmean_floats(hd, nkv, true);
    GGML_ASSERT(bal || k_mean->ne[0] == tq_kmean_floats(hd, nkv, false));
    // SET: enough tokens, or in RoPE's frame the weights of those that count (the host's rule)
    GGML_ASSERT(mode != TQ_KMEAN_SET || (map && nt >= TQ_KMEAN_MIN_TOKENS) || (rf && (stat_w || nt >= TQ_KMEAN_MIN_TOKENS)));
    ggml_tensor * m_st = tq_kmean_view(ctx, k_mean, hd, nkv);
    ggml_tensor * d_st = bal ? ggml_view_2d(ctx, k_mean, hd, nkv, hd * sizeof(float), (size_t) n * sizeof(float)) : nullptr; // s - 1
    if (mode == TQ_KMEAN_ZERO) {
        // the plain cache; what KEEP ubatches will read is m = 0, s = 1 (the stored values are
        // finite, so scaling by 0 clears them)
        ggml_build_forward_expand(gf, ggml_cpy(ctx, ggml_scale(ctx, k_mean, 0.0f), k_mean));
        return k_cur;
    }
    ggml_tensor * q = *q_cur;
    GGML_ASSERT(q->ne[0] == hd && q->ne[1] % nkv == 0 && q->ne[2] == nt && hd % 2 == 0);
    if (!ggml_is_contiguous(q)) {
        q = ggml_cont(ctx, q);
    }
    if (!ggml_is_contiguous(k_cur)) {
        k_cur = ggml_cont(ctx, k_cur);
    }
    if (rf) {
        GGML_ASSERT(ggml_nelements(k_mean) == k_mean->ne[0]);
        ggml_tensor * cols = ggml_reshape_2d(ctx, k_mean, k_mean->ne[0], 1);
        if (mode == TQ_KMEAN_SET) {
            cols = tq_kmean_rf_stats(ctx, q, k_cur, tab, stat_w, 1, bal, kq_scale, pr, host_ops);
            ggml_build_forward_expand(gf, ggml_cpy(ctx, cols, k_mean));
        }
        *q_cur = q;
        return tq_kmean_rf_use(ctx, q_cur, k_cur, cols, tab, bal, pr, host_ops, coeffs);
    }
    ggml_tensor * m_use = m_st;
    ggml_tensor * s_use = bal ? ggml_scale_bias(ctx, d_st, 1.0f, 1.0f) : nullptr;
    if (mode == TQ_KMEAN_SET) {
        ggml_tensor * per_tok = tq_kbal_const(ctx, k_cur, nt, 1, 1.0f / (float) nt);
        ggml_tensor * kbar = ggml_reshape_2d(ctx, tq_kbal_wsum(ctx, ggml_reshape_3d(ctx, k_cur, n, nt, 1), per_tok), hd, nkv);
        m_use = ggml_mul_mat(ctx, map, kbar);                                                            // F kbar
        if (bal) {
            s_use = tq_kbal_store(ctx, gf, tq_kbal_scale(ctx, k_cur, q, map, m_use, per_tok, kq_scale, pr, nullptr), d_st);
            m_use = ggml_mul(ctx, m_use, s_use);
        }
        ggml_build_forward_expand(gf, ggml_cpy(ctx, m_use, m_st));
    }
    if (bal) {
        const int64_t nq = q->ne[1], g = nq / nkv;
        ggml_tensor * q4 = ggml_reshape_4d(ctx, q, hd, g, nkv, nt);
        *q_cur = ggml_reshape_3d(ctx, ggml_div(ctx, q4, ggml_reshape_4d(ctx, s_use, hd, 1, nkv, 1)), hd, nq, nt);
        k_cur = ggml_mul(ctx, k_cur, ggml_reshape_3d(ctx, s_use, hd, nkv, 1));
    }
    return ggml_sub(ctx, k_cur, ggml_reshape_3d(ctx, m_use, hd, nkv, 1));
}

/* K shift, in the channel frame (after rotating stored cells back, before rotating them
   forward again): stored s*rope(k) - m -> add m, re-rope, subtract m. cur: f32 [hd, nh, cells].
   A mean in RoPE's frame needs neither (tq-kmean-rope.h). */
static inline ggml_tensor * tq_kmean_unshift(ggml_context * ctx, ggml_tensor * cur, ggml_tensor * k_mean) {
    return k_mean && !tq_kmean_rope_is(k_mean) ? ggml_add(ctx, cur, tq_kmean_view(ctx, k_mean, cur->ne[0], cur->ne[1])) : cur;
}
static inline ggml_tensor * tq_kmean_reshift(ggml_context * ctx, ggml_tensor * cur, ggml_tensor * k_mean) {
    return k_mean && !tq_kmean_rope_is(k_mean) ? ggml_sub(ctx, cur, tq_kmean_view(ctx, k_mean, cur->ne[0], cur->ne[1])) : cur;
}

#endif /* TQ_KMEAN_H */
