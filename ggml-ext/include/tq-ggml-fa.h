/*
 * tq-ggml-fa.h - tiled flash-attention decode over turbo K and turbo V (CPU).
 *
 * ggml's CPU flash-attention kernel walks the keys of one query row one at a time:
 * a vec_dot call for the score, an online-softmax update, a V accumulation call. For a
 * turbo cache each of those calls decodes 64 values, and the per-call overhead (function
 * pointer, horizontal sum, table setup) is a large share of the per-key cost. Here the
 * keys are taken in tiles of up to TQ_FA_TILE consecutive unmasked keys: one
 * tq_ggml_dot_rows_* call scores the tile, the running maximum M and the accumulator are
 * rescaled once per tile, and one tq_ggml_mad_rows_* call adds the tile's weighted V rows.
 *
 * It leaves exactly what the upstream loop leaves for the code after it: M (the largest
 * score seen, -INF if none), S (sum of expf(s - M)) and VKQ (sum of expf(s - M) * v, f32),
 * so sinks and the split-KV reduction work unchanged. Keys whose mask is -INF are skipped,
 * as upstream skips them; results differ from the per-key loop only in float rounding.
 *
 * Used from ggml-cpu/ops.cpp (the patch adds the call), after ggml-cpu's vec.h and
 * simd-mappings.h, whose fp16 conversion and vectorized exp it then uses (without them it
 * falls back to ggml_fp16_to_fp32 and expf). TQ_FA_TILE=0 in the environment,
 * or tq_ggml_set_fa_tile(0), turns it off.
 */
#ifndef TQ_GGML_FA_H
#define TQ_GGML_FA_H

#include "tq-ggml.h"

#include <math.h>

/* Keys per tile: scores, weights and mask values of one tile live on the stack. */
#define TQ_FA_TILE 32

#ifdef GGML_CPU_FP16_TO_FP32
#define TQ_FA_FP16_TO_FP32(x) GGML_CPU_FP16_TO_FP32(x)
#else
#define TQ_FA_FP16_TO_FP32(x) ggml_fp16_to_fp32(x)
#endif

typedef void (*tq_ggml_dot_rows_t)(const void *x, size_t stride, int64_t nrows, const float *q, int64_t k,
                                   float *scores);
typedef void (*tq_ggml_mad_rows_t)(const void *x, size_t stride, int64_t nrows, const float *w, float *y,
                                   int64_t k);

/* The tile kernels for a K/V type pair; both NULL when the tiled path does not apply
   (K or V not turbo, or turned off). The query must be f32 (turbo K's vec_dot_type). */
typedef struct {
    tq_ggml_dot_rows_t dot;
    tq_ggml_mad_rows_t mad;
} tq_ggml_fa_t;

static inline tq_ggml_fa_t tq_ggml_fa_kernels(enum ggml_type k_type, enum ggml_type v_type) {
    tq_ggml_fa_t fa = { NULL, NULL };
    if (!tq_ggml_fa_tile()) return fa;
    switch (tq_ggml_codec_type(k_type)) {
        case TQ_TURBO2: fa.dot = tq_ggml_dot_rows_turbo2; break;
        case TQ_TURBO3: fa.dot = tq_ggml_dot_rows_turbo3; break;
        case TQ_TURBO4: fa.dot = tq_ggml_dot_rows_turbo4; break;
        default:        return fa;
    }
    switch (tq_ggml_codec_type(v_type)) {
        case TQ_TURBO2: fa.mad = tq_ggml_mad_rows_turbo2; break;
        case TQ_TURBO3: fa.mad = tq_ggml_mad_rows_turbo3; break;
        case TQ_TURBO4: fa.mad = tq_ggml_mad_rows_turbo4; break;
        default:        fa.dot = NULL; break;
    }
    return fa;
}

/* One query row q (f32, DK values) over keys [ic0, ic1): k/v point at key/value row 0 of
   this head, rows nbk1/nbv1 bytes apart. mp: the query's f16 mask row (or NULL), scaled by
   slope (ALiBi). scale: the KQ scale (already divided by softcap when softcap != 0).
   Updates *M, *S and VKQ (DV floats) as the per-key online softmax does. */
static inline void tq_ggml_fa_row(const tq_ggml_fa_t *fa, const char *k, size_t nbk1, const char *v,
                                  size_t nbv1, const float *q, int64_t DK, int64_t DV,
                                  const ggml_fp16_t *mp, float slope, float scale, float softcap, int64_t ic0,
                                  int64_t ic1, float *VKQ, float *M, float *S) {
    float s[TQ_FA_TILE], mv[TQ_FA_TILE];
    int64_t ic = ic0;
    while (ic < ic1) {
        /* the next run of up to TQ_FA_TILE keys the mask does not exclude */
        int n = 0;
        int64_t start = ic;
        for (; ic < ic1 && n < TQ_FA_TILE; ++ic) {
            const float m = mp ? slope * TQ_FA_FP16_TO_FP32(mp[ic]) : 0.0f;
            if (m == -INFINITY) {
                if (n > 0) break;
                start = ic + 1;
                continue;
            }
            mv[n++] = m;
        }
        if (n == 0) break;

        fa->dot(k + start * nbk1, nbk1, n, q, DK, s);
        float tile_max = -INFINITY;
        for (int i = 0; i < n; ++i) {
            float x = s[i] * scale;
            if (softcap != 0.0f) x = softcap * tanhf(x);
            x += mv[i];
            s[i] = x;
            tile_max = x > tile_max ? x : tile_max;
        }
        /* a new maximum rescales the sum and the accumulator once per tile */
        float ms = 1.0f;
        if (tile_max > *M) {
            ms = expf(*M - tile_max);
            *M = tile_max;
            for (int64_t d = 0; d < DV; ++d) VKQ[d] *= ms;
        }
        /* s[i] becomes the weight of key i, expf(s[i] - M) */
#ifdef GGML_VEC_MAD_UNROLL
        /* inside ggml-cpu (vec.h is included): its vectorized exp, as ggml's softmax uses */
        const float sum = (float) ggml_vec_soft_max_f32(n, s, s, *M);
#else
        float sum = 0.0f;
        for (int i = 0; i < n; ++i) {
            s[i] = expf(s[i] - *M);
            sum += s[i];
        }
#endif
        *S = *S * ms + sum;
        fa->mad(v + start * nbv1, nbv1, n, s, VKQ, DV);
    }
}

#endif /* TQ_GGML_FA_H */
