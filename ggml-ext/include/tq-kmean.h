/*
 * tq-kmean.h - K mean removal for turbo K caches: graph pieces (C++, llama.cpp side).
 *
 * Why: attention only sees q.k through a softmax over keys, and softmax ignores a constant
 * added to every logit. Storing k - m instead of k (m: one vector per layer and KV head,
 * the same for every cell) shifts every logit of a query by -q.m, so attention is exactly
 * unchanged. In small models keys share a large common component; the codec's error is
 * proportional to |k|, so taking that component out before quantizing cuts the error on
 * the part of k that softmax actually sees. Measured on SmolLM2-135M (docs/BENCHMARKS.md):
 * turbo3 KLD 0.264 -> 0.147, turbo4 0.062 -> 0.037.
 *
 * Invariant: every key in the cache was stored with the same m. So m is chosen only when
 * the cache holds no cell at all (the first ubatch after it became empty) and never changes
 * while a key stored with it exists:
 *   - SET:  the cache is empty and the ubatch has >= TQ_KMEAN_MIN_TOKENS tokens: m = the
 *           mean of this ubatch's keys (below that, the first token - an attention sink in
 *           most models - would dominate the estimate);
 *   - ZERO: the cache is empty and the ubatch is small: m = 0 (plain behaviour);
 *   - KEEP: otherwise m = the stored one.
 * Any m keeps attention exact; the choice only moves quantization error. The mode lives in
 * the layer's k_mean tensor itself ([m | w_set, w_keep], f32), written by the host only when
 * it changes, so the graph has the same shape in every mode and llama's graph reuse is safe.
 *
 * Where softmax invariance does not hold it is off: logit soft-capping (tanh before
 * softmax), attention sinks (an extra logit that is not shifted), MLA and partial RoPE
 * (the K shift below assumes the whole head is roped). TQ_K_MEAN=0 turns it off.
 * K shift (context shift, seq_add) re-ropes stored keys: rope(k) - m is recovered as
 * rope_d(stored + m) - m, see tq_kmean_unshift/tq_kmean_reshift.
 * Saved state carries m per layer; see tq-llama-kv-cache.inc.
 */
#ifndef TQ_KMEAN_H
#define TQ_KMEAN_H

#include "ggml.h"


#define TQ_KMEAN_MIN_TOKENS 32

/* Graph tensors K mean removal and K/Q balancing may add per layer (about 12 + 70 on a
   prefill ubatch), added to llama's graph budget (llama_context::graph_max_nodes). */
#define TQ_KMEAN_GRAPH_NODES_PER_LAYER 128u

enum tq_kmean_mode { TQ_KMEAN_ZERO = 0, TQ_KMEAN_SET = 1, TQ_KMEAN_KEEP = 2 };

/* Layout of a layer's k_mean tensor (f32): [m (n) | s - 1 (n, only with balancing) | w_set, w_keep],
   n = head_dim * n_head_kv. */
static inline ggml_tensor * tq_kmean_weight(ggml_context * ctx, ggml_tensor * k_mean, int i) {
    return ggml_view_1d(ctx, k_mean, 1, (size_t) (k_mean->ne[0] - 2 + i) * sizeof(float));
}

/* The stored mean of a layer as [head_dim, n_head_kv]. */
static inline ggml_tensor * tq_kmean_view(ggml_context * ctx, ggml_tensor * k_mean, int64_t head_dim, int64_t n_head) {
    return ggml_view_2d(ctx, k_mean, head_dim, n_head, head_dim * sizeof(float), 0);
}

/* k_cur [head_dim, n_head_kv, n_tokens] (already rotated) -> k_cur - m, and m written back
   into k_mean. Returns k_cur unchanged when k_mean is NULL. */
static inline ggml_tensor * tq_kmean_apply(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor * k_cur, ggml_tensor * k_mean) {
    if (!k_mean) {
        return k_cur;
    }
    const int64_t hd = k_cur->ne[0], nh = k_cur->ne[1], n = hd * nh;
    GGML_ASSERT(k_mean->ne[0] == n + 2 || k_mean->ne[0] == 2 * n + 2);

    // mean over the ubatch's tokens: tokens to dim 0, then a row mean
    ggml_tensor * kt = ggml_cont(ctx, ggml_permute(ctx, k_cur, 1, 2, 0, 3)); // [n_tokens, hd, nh]
    ggml_tensor * batch_mean = ggml_reshape_2d(ctx, ggml_mean(ctx, kt), hd, nh);

    ggml_tensor * stored = tq_kmean_view(ctx, k_mean, hd, nh);
    ggml_tensor * w_set  = tq_kmean_weight(ctx, k_mean, 0);
    ggml_tensor * w_keep = tq_kmean_weight(ctx, k_mean, 1);

    ggml_tensor * m = ggml_add(ctx, ggml_mul(ctx, batch_mean, w_set), ggml_mul(ctx, stored, w_keep));
    ggml_build_forward_expand(gf, ggml_cpy(ctx, m, stored));

    return ggml_sub(ctx, k_cur, ggml_reshape_3d(ctx, m, hd, nh, 1));
}

/*
 * K/Q channel balancing (with K mean removal, on by default; TQ_K_BALANCE=0 turns it off).
 *
 * Why: q.k = (q / s).(s * k) for any per-channel s > 0, so storing s * k and attending with
 * q / s leaves every logit exactly unchanged. The codec's error on a rotated key j is spread
 * evenly over the channels with energy ~ |s * x_j|^2 (x_j = k_j - mean), and reaches the
 * logit through q / s. What the softmax output feels is that error weighted by the attention
 * p_j the key gets, so the cost is ~ E|q / s|^2 * sum_j p_j |s * x_j|^2, smallest (Cauchy-
 * Schwarz) at s_c^4 = E[q_c^2] / sum_j p_j x_jc^2: the channels the queries weigh most get
 * the finest quantization, judged on the keys they actually attend to. Nothing is fitted to
 * a corpus; s is this formula on the first ubatch (its own causal attention, kq_scale).
 * Weighting by p matters: with a plain mean over keys, SmolLM2's turbo4 KLD got 13% worse
 * (its sink keys have another channel profile). With p, measured KLD: Gemma 3 2-3x lower,
 * SmolLM2 between -6% and +12% by pair (docs/BENCHMARKS.md).
 *
 * - Chosen with m (same SET/KEEP/ZERO modes, same ubatch); E[q_c^2] is over the ubatch's
 *   tokens and the query heads sharing the KV head.
 * - s is equal on the two channels of every RoPE pair (adjacent for LLAMA_ROPE_TYPE_NORM,
 *   halves otherwise), so s commutes with RoPE and the K shift needs no change.
 * - Normalised per KV head so that the weighted |s * x|^2 keeps its energy (the fp16 block
 *   scales stay in range), then clamped to [1/8, 8] so q / s stays far from overflow in the
 *   f16 query of the tensor-core path.
 * - Stored as s - 1 in k_mean after m ([m | s - 1 | w_set, w_keep]): a cleared buffer (ZERO
 *   mode) reads as s = 1.
 * Applied before the rotation (channels are the model's own there), m after it.
 */
#define TQ_KBAL_MAX 8.0f

static inline bool tq_kbal_on(const ggml_tensor * k_mean, int64_t n) {
    return k_mean && k_mean->ne[0] == 2 * n + 2;
}

/* x [hd, nh] contiguous -> each RoPE pair replaced by the mean of its two channels. */
static inline ggml_tensor * tq_kbal_tie_pairs(ggml_context * ctx, ggml_tensor * x, bool neox) {
    const int64_t hd = x->ne[0], nh = x->ne[1];
    if (!neox) {
        ggml_tensor * p = ggml_reshape_2d(ctx, x, 2, hd / 2 * nh);
        return ggml_reshape_2d(ctx, ggml_repeat(ctx, ggml_mean(ctx, p), p), hd, nh);
    }
    ggml_tensor * p = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, x, hd / 2, 2, nh), 1, 0, 2, 3)); // [2, hd/2, nh]
    ggml_tensor * r = ggml_repeat(ctx, ggml_mean(ctx, p), p);
    return ggml_reshape_2d(ctx, ggml_cont(ctx, ggml_permute(ctx, r, 1, 0, 2, 3)), hd, nh);
}

/* Before the rotation: q_cur [hd, n_head, n_tokens] -> q / s, k_cur [hd, n_head_kv, n_tokens]
   -> s * k, and s written back into k_mean. No-op unless k_mean carries balancing. */
static inline ggml_tensor * tq_kbal_apply(ggml_context * ctx, ggml_cgraph * gf, ggml_tensor ** q_cur,
                                          ggml_tensor * k_cur, ggml_tensor * k_mean, float kq_scale, bool neox) {
    if (!k_cur || !tq_kbal_on(k_mean, k_cur->ne[0] * k_cur->ne[1])) {
        return k_cur;
    }
    ggml_tensor * q = *q_cur;
    const int64_t hd = k_cur->ne[0], nkv = k_cur->ne[1], nt = k_cur->ne[2], n = hd * nkv;
    const int64_t nq = q->ne[1], g = nq / nkv;
    GGML_ASSERT(q->ne[0] == hd && nq % nkv == 0 && q->ne[2] == nt && hd % 2 == 0);
    if (!ggml_is_contiguous(q)) {
        q = ggml_cont(ctx, q);
    }
    if (!ggml_is_contiguous(k_cur)) {
        k_cur = ggml_cont(ctx, k_cur);
    }

    ggml_tensor * stored = ggml_view_2d(ctx, k_mean, hd, nkv, hd * sizeof(float), (size_t) n * sizeof(float));
    ggml_tensor * d; // s - 1
    if (nt < TQ_KMEAN_MIN_TOKENS) {
        // SET needs a ubatch this large, so the mode is KEEP or ZERO: no statistics (decode
        // stays a single multiply per side)
        d = ggml_mul(ctx, stored, tq_kmean_weight(ctx, k_mean, 1));
    } else {
        // Which keys' errors matter: those the queries attend to. w_j = attention to key j
        // within this ubatch (causal, the model's kq_scale), averaged over its queries and the
        // g query heads of each KV head.
        ggml_tensor * kp = ggml_cont(ctx, ggml_permute(ctx, k_cur, 0, 2, 1, 3));                         // [hd, nt, nkv]
        ggml_tensor * qp = ggml_cont(ctx, ggml_permute(ctx, q, 0, 2, 1, 3));                             // [hd, nt, nq]
        ggml_tensor * p  = ggml_soft_max(ctx, ggml_diag_mask_inf(ctx, ggml_scale(ctx, ggml_mul_mat(ctx, kp, qp), kq_scale), 0)); // [nt_k, nt_q, nq]
        ggml_tensor * w  = ggml_mean(ctx, ggml_cont(ctx, ggml_permute(ctx, p, 1, 0, 2, 3)));             // [1, nt_k, nq]
        w = ggml_mean(ctx, ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_3d(ctx, w, nt, g, nkv), 1, 0, 2, 3))); // [1, nt, nkv]
        // attention-weighted centred key energy per channel: sum_j w_j (k_j - E[k])^2
        ggml_tensor * kt = ggml_cont(ctx, ggml_permute(ctx, k_cur, 1, 2, 0, 3));                         // [nt, hd, nkv]
        ggml_tensor * kc = ggml_sub(ctx, kt, ggml_mean(ctx, kt));
        ggml_tensor * rk = ggml_mul_mat(ctx, ggml_sqr(ctx, kc), ggml_reshape_3d(ctx, w, nt, 1, nkv));     // [hd, 1, nkv]
        rk = ggml_clamp(ctx, ggml_reshape_2d(ctx, rk, hd, nkv), 1e-20f, 1e20f);
        // query energy per channel over tokens and the g query heads of each KV head
        ggml_tensor * qt = ggml_cont(ctx, ggml_permute(ctx, ggml_reshape_4d(ctx, q, hd, g, nkv, nt), 2, 0, 3, 1)); // [g, nt, hd, nkv]
        ggml_tensor * rq = ggml_mean(ctx, ggml_sqr(ctx, ggml_reshape_3d(ctx, qt, g * nt, hd, nkv)));
        rq = ggml_clamp(ctx, ggml_reshape_2d(ctx, rq, hd, nkv), 1e-20f, 1e20f);
        rk = tq_kbal_tie_pairs(ctx, rk, neox);
        rq = tq_kbal_tie_pairs(ctx, rq, neox);

        // s = (rq / rk)^(1/4), the ratio bounded so that nothing below overflows
        ggml_tensor * s = ggml_sqrt(ctx, ggml_sqrt(ctx, ggml_clamp(ctx, ggml_div(ctx, rq, rk), 1e-12f, 1e12f)));
        // keep |s k|^2 = |k|^2 per KV head
        ggml_tensor * e0 = ggml_sum_rows(ctx, rk);
        ggml_tensor * e1 = ggml_sum_rows(ctx, ggml_mul(ctx, ggml_sqr(ctx, s), rk));
        s = ggml_mul(ctx, s, ggml_sqrt(ctx, ggml_div(ctx, e0, e1)));
        s = ggml_clamp(ctx, s, 1.0f / TQ_KBAL_MAX, TQ_KBAL_MAX);

        // s - 1 = w_set (s_batch - 1) + w_keep (s_stored - 1)
        d = ggml_add(ctx, ggml_mul(ctx, ggml_scale_bias(ctx, s, 1.0f, -1.0f), tq_kmean_weight(ctx, k_mean, 0)),
                     ggml_mul(ctx, stored, tq_kmean_weight(ctx, k_mean, 1)));
        ggml_build_forward_expand(gf, ggml_cpy(ctx, d, stored));
    }
    ggml_tensor * s_use = ggml_scale_bias(ctx, d, 1.0f, 1.0f);

    ggml_tensor * q4 = ggml_reshape_4d(ctx, q, hd, g, nkv, nt);
    *q_cur = ggml_reshape_3d(ctx, ggml_div(ctx, q4, ggml_reshape_4d(ctx, s_use, hd, 1, nkv, 1)), hd, nq, nt);
    return ggml_mul(ctx, k_cur, ggml_reshape_3d(ctx, s_use, hd, nkv, 1));
}

/* K shift: stored cells s = R rope(k) - m (R the rotation). Before rotating back and
   re-roping, add m; after rotating forward again, subtract it. cur: f32 [hd, nh, cells]. */
static inline ggml_tensor * tq_kmean_unshift(ggml_context * ctx, ggml_tensor * cur, ggml_tensor * k_mean) {
    return k_mean ? ggml_add(ctx, cur, tq_kmean_view(ctx, k_mean, cur->ne[0], cur->ne[1])) : cur;
}
static inline ggml_tensor * tq_kmean_reshift(ggml_context * ctx, ggml_tensor * cur, ggml_tensor * k_mean) {
    return k_mean ? ggml_sub(ctx, cur, tq_kmean_view(ctx, k_mean, cur->ne[0], cur->ne[1])) : cur;
}

#endif /* TQ_KMEAN_H */
