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

enum tq_kmean_mode { TQ_KMEAN_ZERO = 0, TQ_KMEAN_SET = 1, TQ_KMEAN_KEEP = 2 };

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
    GGML_ASSERT(k_mean->ne[0] == n + 2);

    // mean over the ubatch's tokens: tokens to dim 0, then a row mean
    ggml_tensor * kt = ggml_cont(ctx, ggml_permute(ctx, k_cur, 1, 2, 0, 3)); // [n_tokens, hd, nh]
    ggml_tensor * batch_mean = ggml_reshape_2d(ctx, ggml_mean(ctx, kt), hd, nh);

    ggml_tensor * stored = tq_kmean_view(ctx, k_mean, hd, nh);
    ggml_tensor * w_set  = ggml_view_1d(ctx, k_mean, 1, (size_t) n * sizeof(float));
    ggml_tensor * w_keep = ggml_view_1d(ctx, k_mean, 1, (size_t) (n + 1) * sizeof(float));

    ggml_tensor * m = ggml_add(ctx, ggml_mul(ctx, batch_mean, w_set), ggml_mul(ctx, stored, w_keep));
    ggml_build_forward_expand(gf, ggml_cpy(ctx, m, stored));

    return ggml_sub(ctx, k_cur, ggml_reshape_3d(ctx, m, hd, nh, 1));
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
