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
 * With GQA, the query heads of one K/V head take each tile together and decode it once
 * (tq_ggml_fa_rows_shared; TQ_FA_TILE=1 or tq_ggml_set_fa_tile(1) keeps tiles per head),
 * and score it and add its values up to TQ_FA_HEAD_BLOCK heads per pass over its rows.
 * A head alone runs the same decoded tiles, bit for bit what it gets in its group, so a
 * row's result does not depend on how the rows were split into chunks (batch invariance);
 * the fused decode-and-dot kernels are left for what the decoded tiles do not take.
 *
 * Used from ggml-cpu/ops.cpp (the patch adds two calls, tq_ggml_fa_one_chunk and
 * tq_ggml_fa_split_heads at the end of this file), after ggml-cpu's vec.h and
 * simd-mappings.h, whose fp16 conversion and vectorized exp it then uses (without them it
 * falls back to ggml_fp16_to_fp32 and expf). TQ_FA_TILE=0 in the environment,
 * or tq_ggml_set_fa_tile(0), turns it off.
 */
#ifndef TQ_GGML_FA_H
#define TQ_GGML_FA_H

#include "tq-ggml.h"
#include "tq-fa-term.h"

#include <math.h>
#include <string.h>

/* Keys per tile: scores, weights and mask values of one tile live on the stack. */
#define TQ_FA_TILE 32
#if TQ_FA_TILE > TQ_FA_TERM_STEPS
#error "a tile's per-key term steps past U's columns (tq-fa-term.h)"
#endif

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
    switch (k_type) {
#define TQ_FA_DOT_CASE(name, STEM, bits, bytes, trellis) case GGML_TYPE_##STEM: fa.dot = tq_ggml_dot_rows_##name; break;
        TQ_FOR_EACH_TYPE(TQ_FA_DOT_CASE)
#undef TQ_FA_DOT_CASE
        default: return fa;
    }
    switch (v_type) {
#define TQ_FA_MAD_CASE(name, STEM, bits, bytes, trellis) case GGML_TYPE_##STEM: fa.mad = tq_ggml_mad_rows_##name; break;
        TQ_FOR_EACH_TYPE(TQ_FA_MAD_CASE)
#undef TQ_FA_MAD_CASE
        default: fa.dot = NULL; break;
    }
    return fa;
}

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define TQ_FA_AVX2 1
#endif

#if defined(TQ_FA_AVX2) && defined(__AVX512F__)
/* The upper 8 lanes of an AVX-512 register. */
static inline __m256 tq_fa_hi256(__m512 a) {
    return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(a), 1));
}
/* s[0..4) = the horizontal sums of a0..a3. */
static inline void tq_fa_hsum4_512(__m512 a0, __m512 a1, __m512 a2, __m512 a3, float *s) {
    const __m256 b0 = _mm256_add_ps(_mm512_castps512_ps256(a0), tq_fa_hi256(a0));
    const __m256 b1 = _mm256_add_ps(_mm512_castps512_ps256(a1), tq_fa_hi256(a1));
    const __m256 b2 = _mm256_add_ps(_mm512_castps512_ps256(a2), tq_fa_hi256(a2));
    const __m256 b3 = _mm256_add_ps(_mm512_castps512_ps256(a3), tq_fa_hi256(a3));
    const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(b0, b1), _mm256_hadd_ps(b2, b3));
    _mm_storeu_ps(s, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
}
#endif

#if defined(TQ_FA_AVX2) && defined(__AVX512F__)
/* Rows [0, n - n % 4) of the two kernels below (AVX-512, DK a multiple of 16): s[i] =
   dot(row i of kf, q), plus dot(row i of t, a) when a is not NULL (the per-key term,
   tq-fa-term.h, summed into the same accumulators). Returns the rows done. */
static inline int tq_fa_dots4_512(const float *kf, const float *t, int n, int64_t DK, const float *q, const float *a,
                                  float *s) {
    if (DK % 16 != 0) return 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float *r = kf + (int64_t) i * DK, *u = a ? t + (int64_t) i * DK : NULL;
        __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
        for (int64_t d = 0; d < DK; d += 16) {
            const __m512 qv = _mm512_loadu_ps(q + d);
            a0 = _mm512_fmadd_ps(_mm512_loadu_ps(r + d), qv, a0);
            a1 = _mm512_fmadd_ps(_mm512_loadu_ps(r + DK + d), qv, a1);
            a2 = _mm512_fmadd_ps(_mm512_loadu_ps(r + 2 * DK + d), qv, a2);
            a3 = _mm512_fmadd_ps(_mm512_loadu_ps(r + 3 * DK + d), qv, a3);
            if (u) {
                const __m512 av = _mm512_loadu_ps(a + d);
                a0 = _mm512_fmadd_ps(_mm512_loadu_ps(u + d), av, a0);
                a1 = _mm512_fmadd_ps(_mm512_loadu_ps(u + DK + d), av, a1);
                a2 = _mm512_fmadd_ps(_mm512_loadu_ps(u + 2 * DK + d), av, a2);
                a3 = _mm512_fmadd_ps(_mm512_loadu_ps(u + 3 * DK + d), av, a3);
            }
        }
        tq_fa_hsum4_512(a0, a1, a2, a3, s + i);
    }
    return i;
}
#endif

/* s[i] = dot(row i of kf, q) for the tile's n rows of DK floats: four rows per pass with the
   query loaded once per pass and the four horizontal sums done together (AVX-512 for DK a
   multiple of 16, AVX2 for a multiple of 8), else one row at a time. */
static inline void tq_ggml_fa_tile_dots(const float *kf, int n, int64_t DK, const float *q, float *s) {
    int i = 0;
#if defined(TQ_FA_AVX2) && defined(__AVX512F__)
    i = tq_fa_dots4_512(kf, NULL, n, DK, q, NULL, s);
#endif
#ifdef TQ_FA_AVX2
    if (DK % 8 == 0) {
        for (; i + 4 <= n; i += 4) {
            const float *r = kf + (int64_t) i * DK;
            __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
            for (int64_t d = 0; d < DK; d += 8) {
                const __m256 qv = _mm256_loadu_ps(q + d);
                a0 = _mm256_fmadd_ps(_mm256_loadu_ps(r + d), qv, a0);
                a1 = _mm256_fmadd_ps(_mm256_loadu_ps(r + DK + d), qv, a1);
                a2 = _mm256_fmadd_ps(_mm256_loadu_ps(r + 2 * DK + d), qv, a2);
                a3 = _mm256_fmadd_ps(_mm256_loadu_ps(r + 3 * DK + d), qv, a3);
            }
            const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
            _mm_storeu_ps(s + i, _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1)));
        }
    }
#endif
    for (; i < n; ++i) {
        float x = 0.0f;
        for (int64_t d = 0; d < DK; ++d) x += kf[(int64_t) i * DK + d] * q[d];
        s[i] = x;
    }
}

/* s[i] += the per-key term t_i . a of the tile's n keys (t: their table rows, tq-fa-term.h);
   a NULL: none. */
static inline void tq_ggml_fa_add_term(const float *t_rows, int n, int64_t DK, const float *a, float *s) {
    if (!a) return;
    float t[TQ_FA_TILE];
    tq_ggml_fa_tile_dots(t_rows, n, DK, a, t);
    for (int i = 0; i < n; ++i) s[i] += t[i];
}

/* s[i] = dot(row i of kf, q) + dot(row i of t, a) (a NULL: the first alone): the shared
   tiles' score with the per-key term in one pass where AVX-512 is there (one set of
   horizontal sums), else two. */
static inline void tq_ggml_fa_tile_dots2(const float *kf, const float *t, int n, int64_t DK, const float *q,
                                         const float *a, float *s) {
    int i = 0;
#if defined(TQ_FA_AVX2) && defined(__AVX512F__)
    i = tq_fa_dots4_512(kf, t, n, DK, q, a, s);
#endif
    if (i < n) {
        tq_ggml_fa_tile_dots(kf + (int64_t) i * DK, n - i, DK, q, s + i);
        tq_ggml_fa_add_term(t + (int64_t) i * DK, n - i, DK, a, s + i);
    }
}

/* The heads of a GQA group score a tile together: up to TQ_FA_HEAD_BLOCK heads per pass, so
   each decoded row (and table row) is loaded once for all of them instead of once per head.
   Every (head, key) accumulator still takes the same operations in the same order as
   tq_fa_dots4_512 gives it, so a head's scores do not depend on which heads share its pass
   (a head alone, g = 1, gets its group's bits). */
#define TQ_FA_HEAD_BLOCK 3

#if defined(TQ_FA_AVX2) && defined(__AVX512F__)
/* Keeps a loaded vector in its register: GCC otherwise loads the same row again for every
   head as a memory operand of each FMA, and a Zen 4 core loads one 512-bit vector per cycle
   against one FMA, so the head loops below waited on loads (changes no arithmetic). */
#if defined(__GNUC__)
#define TQ_FA_KEEP(x) __asm__("" : "+v"(x))
#else
#define TQ_FA_KEEP(x) ((void) 0)
#endif

/* acc[h][j] += (row j of rows)[d, d + 16) * v[h][d, d + 16) for rows 0..3 of DK floats, heads h < gb. */
static inline __attribute__((always_inline)) void tq_fa_fma4_heads(const float *rows, int64_t DK, int64_t d,
                                                                   const float *const *v, int gb,
                                                                   __m512 acc[][4]) {
    __m512 r0 = _mm512_loadu_ps(rows + d), r1 = _mm512_loadu_ps(rows + DK + d);
    __m512 r2 = _mm512_loadu_ps(rows + 2 * DK + d), r3 = _mm512_loadu_ps(rows + 3 * DK + d);
    TQ_FA_KEEP(r0);
    TQ_FA_KEEP(r1);
    TQ_FA_KEEP(r2);
    TQ_FA_KEEP(r3);
    for (int h = 0; h < gb; ++h) {
        __m512 x = _mm512_loadu_ps(v[h] + d);
        TQ_FA_KEEP(x);
        acc[h][0] = _mm512_fmadd_ps(r0, x, acc[h][0]);
        acc[h][1] = _mm512_fmadd_ps(r1, x, acc[h][1]);
        acc[h][2] = _mm512_fmadd_ps(r2, x, acc[h][2]);
        acc[h][3] = _mm512_fmadd_ps(r3, x, acc[h][3]);
    }
}

/* Rows [0, n - n % 4) for heads [0, gb) (gb <= TQ_FA_HEAD_BLOCK, a constant where inlined):
   s[h * TQ_FA_TILE + i] = dot(row i of kf, q[h]) + dot(row i of t, a[h]) (t NULL: the first
   alone). Returns the rows done. */
static inline __attribute__((always_inline)) int tq_fa_dots4_heads_512(const float *kf, const float *t, int n,
                                                                       int64_t DK, const float *const *q,
                                                                       const float *const *a, int gb, float *s) {
    if (DK % 16 != 0) return 0;
    int i = 0;
    for (; i + 4 <= n; i += 4) {
        const float *r = kf + (int64_t) i * DK, *u = t ? t + (int64_t) i * DK : NULL;
        __m512 acc[TQ_FA_HEAD_BLOCK][4];
        for (int h = 0; h < gb; ++h)
            for (int j = 0; j < 4; ++j) acc[h][j] = _mm512_setzero_ps();
        for (int64_t d = 0; d < DK; d += 16) {
            tq_fa_fma4_heads(r, DK, d, q, gb, acc);
            if (u) tq_fa_fma4_heads(u, DK, d, a, gb, acc);
        }
        for (int h = 0; h < gb; ++h) tq_fa_hsum4_512(acc[h][0], acc[h][1], acc[h][2], acc[h][3], s + h * TQ_FA_TILE + i);
    }
    return i;
}
#endif

/* s[h * TQ_FA_TILE + i] = tq_ggml_fa_tile_dots2's score of row i for head h < g (q[h], a[h];
   t NULL or every a[h] NULL: no term). */
static inline void tq_ggml_fa_tile_dots_heads(const float *kf, const float *t, int n, int64_t DK,
                                              const float *const *q, const float *const *a, int g, float *s) {
    for (int h0 = 0; h0 < g; h0 += TQ_FA_HEAD_BLOCK) {
        const int gb = g - h0 < TQ_FA_HEAD_BLOCK ? g - h0 : TQ_FA_HEAD_BLOCK;
        float *sh = s + h0 * TQ_FA_TILE;
        int done = 0;
#if defined(TQ_FA_AVX2) && defined(__AVX512F__)
        const float *tu = t && a[h0] ? t : NULL;
        done = gb == 3   ? tq_fa_dots4_heads_512(kf, tu, n, DK, q + h0, a + h0, 3, sh)
               : gb == 2 ? tq_fa_dots4_heads_512(kf, tu, n, DK, q + h0, a + h0, 2, sh)
                         : tq_fa_dots4_heads_512(kf, tu, n, DK, q + h0, a + h0, 1, sh);
#endif
        if (done < n) {
            for (int h = 0; h < gb; ++h) {
                const float *ah = t ? a[h0 + h] : NULL;
                tq_ggml_fa_tile_dots2(kf + (int64_t) done * DK, ah ? t + (int64_t) done * DK : NULL, n - done, DK,
                                      q[h0 + h], ah, sh + h * TQ_FA_TILE + done);
            }
        }
    }
}

/* The next run of up to TQ_FA_TILE keys from *ic (before ic1) that the mask row mp does not
   exclude: their mask values times slope go to mv, the run starts at *start, *ic moves past
   it. Returns the run's length, 0 when no key is left. */
static inline int tq_ggml_fa_next_run(const ggml_fp16_t *mp, float slope, int64_t *ic, int64_t ic1, int64_t *start,
                                      float *mv) {
#if defined(TQ_FA_AVX2) && defined(__AVX512F__) && defined(__AVX512BW__) && defined(__GNUC__) && TQ_FA_TILE == 32
    /* 32 mask values at a time where 32 keys are left and the slope is 1 (the shared tiles'
       case): a value is -INF exactly when its f16 bits are 0xFC00, and the conversion is
       exact, so this returns what the loop below returns (a prefill's rows each scan the mask
       for their tiles, and the scalar scan was a tenth of the kernel) */
    if (slope == 1.0f) {
        while (*ic + 32 <= ic1) {
            if (!mp) {
                *start = *ic;
                *ic += 32;
                memset(mv, 0, 32 * sizeof(float));
                return 32;
            }
            const __m512i h = _mm512_loadu_si512((const void *) (mp + *ic));
            const uint32_t inf = (uint32_t) _mm512_cmpeq_epi16_mask(h, _mm512_set1_epi16((short) 0xFC00));
            if (inf & 1u) { /* skip the leading excluded keys */
                *ic += inf == 0xFFFFFFFFu ? 32 : __builtin_ctz(~inf);
                continue;
            }
            const int n = inf ? __builtin_ctz(inf) : 32;
            _mm512_storeu_ps(mv, _mm512_cvtph_ps(_mm512_castsi512_si256(h)));
            _mm512_storeu_ps(mv + 16, _mm512_cvtph_ps(_mm512_extracti64x4_epi64(h, 1)));
            *start = *ic;
            *ic += n;
            return n;
        }
    }
#endif
    int n = 0;
    *start = *ic;
    for (; *ic < ic1 && n < TQ_FA_TILE; ++*ic) {
        const float m = mp ? slope * TQ_FA_FP16_TO_FP32(mp[*ic]) : 0.0f;
        if (m == -INFINITY) {
            if (n > 0) break;
            *start = *ic + 1;
            continue;
        }
        mv[n++] = m;
    }
    return n;
}

/* One query row q (f32, DK values) over keys [ic0, ic1): k/v point at key/value row 0 of
   this head, rows nbk1/nbv1 bytes apart. mp: the query's f16 mask row (or NULL), scaled by
   slope (ALiBi). scale: the KQ scale (already divided by softcap when softcap != 0). tt, ta:
   the per-key term's cell rows and this query's coefficients (tq-fa-term.h), ta NULL for none;
   tc: its cells, for the exact first keys (tq-sink.h; NULL: none), whose scores are taken
   from their exact rows. Updates *M, *S and VKQ (DV floats) as the per-key online softmax does. */
static inline void tq_ggml_fa_row(const tq_ggml_fa_t *fa, const char *k, size_t nbk1, const char *v,
                                  size_t nbv1, const float *q, int64_t DK, int64_t DV,
                                  const ggml_fp16_t *mp, float slope, float scale, float softcap, int64_t ic0,
                                  int64_t ic1, const float *tt, const float *ta, const tq_fa_term_cells_t *tc,
                                  float *VKQ, float *M, float *S) {
    float s[TQ_FA_TILE], mv[TQ_FA_TILE];
    int64_t ic = ic0, start;
    int n;
    while ((n = tq_ggml_fa_next_run(mp, slope, &ic, ic1, &start, mv)) > 0) {

        fa->dot(k + start * nbk1, nbk1, n, q, DK, s);
        for (int i = 0; tc && tc->sink && i < n; ++i) {
            const float *x = tq_fa_term_sink(tc, start + i, k + (start + i) * nbk1, DK);
            if (x) tq_ggml_fa_tile_dots(x, 1, DK, q, s + i);
        }
        tq_ggml_fa_add_term(ta ? tt + start * DK : NULL, n, DK, ta, s);
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


/* GQA: the query heads that share one K/V head (up to TQ_FA_GQA_MAX of them, head sizes up
   to TQ_FA_GQA_DMAX) take each tile together. The tile's K and V rows are decoded to f32
   once, and every head then scores the decoded keys and adds its weighted values (the tile
   loops above), so a
   group of g heads decodes each row once instead of g times (the decode, not the dot
   product, is most of a turbo key's cost, and nearly all of a trellis key's). */
#define TQ_FA_GQA_MAX 8
#define TQ_FA_GQA_DMAX TQ_GGML_CPU_TILES_DMAX /* tq-ggml.h: llama's graph reads it too */

/* VKQ[0..DV) += sum_i w[i] * (row i of vf) over the tile's n rows: 64 outputs at a time
   stay in registers across the rows (AVX2), so the accumulator is read and written once per
   tile instead of once per row. */
static inline void tq_ggml_fa_tile_mads(float *VKQ, const float *vf, const float *w, int n, int64_t DV) {
    int64_t d0 = 0;
#ifdef TQ_FA_AVX2
    for (; d0 + 64 <= DV; d0 += 64) {
        __m256 a[8];
        for (int j = 0; j < 8; ++j) a[j] = _mm256_loadu_ps(VKQ + d0 + 8 * j);
        for (int i = 0; i < n; ++i) {
            const __m256 wi = _mm256_broadcast_ss(w + i);
            const float *x = vf + (int64_t) i * DV + d0;
            for (int j = 0; j < 8; ++j) a[j] = _mm256_fmadd_ps(wi, _mm256_loadu_ps(x + 8 * j), a[j]);
        }
        for (int j = 0; j < 8; ++j) _mm256_storeu_ps(VKQ + d0 + 8 * j, a[j]);
    }
#endif
    for (; d0 < DV; ++d0) {
        float acc = VKQ[d0];
        for (int i = 0; i < n; ++i) acc += w[i] * vf[(int64_t) i * DV + d0];
        VKQ[d0] = acc;
    }
}

#if defined(TQ_FA_AVX2) && defined(__AVX512F__)
/* acc[h][0..DV) += sum_i w[h][i] * (row i of vf) for heads h < gb (DV a multiple of 64): 64
   outputs per head in registers across the tile's rows, each row's 64 values loaded once
   for the gb heads; every output takes its multiply-adds in the order of i. */
static inline __attribute__((always_inline)) void tq_fa_mads_block_512(float *const *acc, const float *const *w,
                                                                       const float *vf, int n, int64_t DV, int gb) {
    for (int64_t d0 = 0; d0 < DV; d0 += 64) {
        __m512 a[TQ_FA_HEAD_BLOCK][4];
        for (int h = 0; h < gb; ++h)
            for (int j = 0; j < 4; ++j) a[h][j] = _mm512_loadu_ps(acc[h] + d0 + 16 * j);
        for (int i = 0; i < n; ++i) {
            const float *x = vf + (int64_t) i * DV + d0;
            __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
            __m512 x2 = _mm512_loadu_ps(x + 32), x3 = _mm512_loadu_ps(x + 48);
            TQ_FA_KEEP(x0);
            TQ_FA_KEEP(x1);
            TQ_FA_KEEP(x2);
            TQ_FA_KEEP(x3);
            for (int h = 0; h < gb; ++h) {
                const __m512 wi = _mm512_set1_ps(w[h][i]);
                a[h][0] = _mm512_fmadd_ps(wi, x0, a[h][0]);
                a[h][1] = _mm512_fmadd_ps(wi, x1, a[h][1]);
                a[h][2] = _mm512_fmadd_ps(wi, x2, a[h][2]);
                a[h][3] = _mm512_fmadd_ps(wi, x3, a[h][3]);
            }
        }
        for (int h = 0; h < gb; ++h)
            for (int j = 0; j < 4; ++j) _mm512_storeu_ps(acc[h] + d0 + 16 * j, a[h][j]);
    }
}
#endif

/* VKQ_h[0..DV) += sum_i w_h[i] * (row i of vf) for heads h < g (w_h = w + h * TQ_FA_TILE; a
   head with live[h] == 0 is left alone): each row of vf is loaded once per pass of up to
   TQ_FA_HEAD_BLOCK heads, 16 outputs to a register (AVX-512), else tq_ggml_fa_tile_mads per
   head. Each output takes the same multiply-adds in the same order either way. */
static inline void tq_ggml_fa_tile_mads_heads(float *const *VKQ, const int *live, const float *vf, const float *w, int n,
                                              int64_t DV, int g) {
#if defined(TQ_FA_AVX2) && defined(__AVX512F__)
    if (DV % 64 == 0) {
        int hs[TQ_FA_GQA_MAX], nl = 0;
        for (int h = 0; h < g; ++h)
            if (live[h]) hs[nl++] = h;
        for (int b = 0; b < nl; b += TQ_FA_HEAD_BLOCK) {
            const int gb = nl - b < TQ_FA_HEAD_BLOCK ? nl - b : TQ_FA_HEAD_BLOCK;
            float *acc[TQ_FA_HEAD_BLOCK];
            const float *wh[TQ_FA_HEAD_BLOCK];
            for (int h = 0; h < gb; ++h) {
                acc[h] = VKQ[hs[b + h]];
                wh[h] = w + hs[b + h] * TQ_FA_TILE;
            }
            /* a constant block size, so that the accumulators stay in registers */
            if (gb == 3) {
                tq_fa_mads_block_512(acc, wh, vf, n, DV, 3);
            } else if (gb == 2) {
                tq_fa_mads_block_512(acc, wh, vf, n, DV, 2);
            } else {
                tq_fa_mads_block_512(acc, wh, vf, n, DV, 1);
            }
        }
        return;
    }
#endif
    for (int h = 0; h < g; ++h) {
        if (live[h]) tq_ggml_fa_tile_mads(VKQ[h], vf, w + h * TQ_FA_TILE, n, DV);
    }
}

/* The heads' state: query (f32, DK), the per-key term's coefficients (or NULL), ALiBi slope,
   its mask row (f16, or NULL), running maximum, sum and accumulator. */
typedef struct {
    const float *q, *ta;
    const ggml_fp16_t *mp;
    float slope, M, S;
    float *VKQ;
} tq_ggml_fa_head_t;

/* One tile for heads *hd[0..g): keys [start, start + n), decoded (or a sink slot's exact
   row) in kf and vf, rows of DK and DV floats. mv: the tile's mask values read from the mask
   row mp with slope 1 (the row the tiles follow); a head whose own mask row is not mp (a
   per-head mask, as the K mean in RoPE's frame adds: the same -INF cells, other finite
   values) reads its values from its own row, and a key it alone excludes weighs 0. Per head
   the arithmetic is tq_ggml_fa_row's with the decode done apart from the dot product and the
   accumulation, and it depends only on the head's own state, its query and the tile: never
   on which other heads (or query rows, tq-fa-window.h) share the call. tc: the per-key
   term's cells (NULL: no term); a tile of consecutive positions takes its rows from U
   (tq-fa-term.h), a choice made from the tile alone. */
static inline void tq_ggml_fa_heads_tile(tq_ggml_fa_head_t *const *hd, int g, const float *kf, const float *vf,
                                         int64_t start, int n, const ggml_fp16_t *mp, const float *mv, int64_t DK,
                                         int64_t DV, float scale, float softcap, const tq_fa_term_cells_t *tc) {
    float s[TQ_FA_GQA_MAX * TQ_FA_TILE], mh[TQ_FA_TILE];
    float a_turned[TQ_FA_GQA_MAX * TQ_FA_GQA_DMAX];
    const int steps = tc && tq_fa_term_steps(tc, start, n);
    const float *t_rows = tc ? (steps ? tc->U : tc->T + start * DK) : NULL;
    const float *qs[TQ_FA_GQA_MAX], *as[TQ_FA_GQA_MAX];
    float *accs[TQ_FA_GQA_MAX];
    int live[TQ_FA_GQA_MAX];
    for (int h = 0; h < g; ++h) {
        qs[h] = hd[h]->q;
        as[h] = hd[h]->ta;
        accs[h] = hd[h]->VKQ;
        if (as[h] && steps) {
            tq_fa_term_turn(tc->T + start * DK, as[h], DK, a_turned + h * TQ_FA_GQA_DMAX);
            as[h] = a_turned + h * TQ_FA_GQA_DMAX;
        }
    }
    tq_ggml_fa_tile_dots_heads(kf, t_rows, n, DK, qs, as, g, s);
    for (int h = 0; h < g; ++h) {
        tq_ggml_fa_head_t *H = hd[h];
        float *sh = s + h * TQ_FA_TILE;
        const float *m = mv;
        int i0 = 0;
        if (H->mp != mp) {
#if defined(TQ_FA_AVX2) && defined(__AVX512F__)
            for (; i0 + 16 <= n; i0 += 16) { /* f16 to f32 is exact either way */
                _mm512_storeu_ps(mh + i0, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *) (H->mp + start + i0))));
            }
#endif
            for (int i = i0; i < n; ++i) mh[i] = TQ_FA_FP16_TO_FP32(H->mp[start + i]);
            m = mh;
        }
        float tile_max = -INFINITY;
        int i = 0;
        if (softcap == 0.0f) {
            /* x = fma(s, scale, slope * m): one rounding of s * scale + (slope * m), in
               vectors where 16 keys are left and one at a time after them */
#if defined(TQ_FA_AVX2) && defined(__AVX512F__)
            const __m512 vs = _mm512_set1_ps(scale), vsl = _mm512_set1_ps(H->slope);
            __m512 vmax = _mm512_set1_ps(-INFINITY);
            for (; i + 16 <= n; i += 16) {
                const __m512 x = _mm512_fmadd_ps(_mm512_loadu_ps(sh + i), vs, _mm512_mul_ps(vsl, _mm512_loadu_ps(m + i)));
                _mm512_storeu_ps(sh + i, x);
                vmax = _mm512_max_ps(vmax, x);
            }
            if (i > 0) tile_max = _mm512_reduce_max_ps(vmax);
#endif
            for (; i < n; ++i) {
                const float x = fmaf(sh[i], scale, H->slope * m[i]);
                sh[i] = x;
                tile_max = x > tile_max ? x : tile_max;
            }
        }
        for (; i < n; ++i) {
            float x = sh[i] * scale;
            if (softcap != 0.0f) x = softcap * tanhf(x);
            x += H->slope * m[i];
            sh[i] = x;
            tile_max = x > tile_max ? x : tile_max;
        }
        live[h] = tile_max != -INFINITY; /* 0: every key of the tile excluded for this head */
        if (!live[h]) continue;
        float ms = 1.0f;
        if (tile_max > H->M) {
            ms = expf(H->M - tile_max);
            H->M = tile_max;
            for (int64_t d = 0; d < DV; ++d) H->VKQ[d] *= ms;
        }
#ifdef GGML_VEC_MAD_UNROLL
        const float sum = (float) ggml_vec_soft_max_f32(n, sh, sh, H->M);
#else
        float sum = 0.0f;
        for (int i = 0; i < n; ++i) {
            sh[i] = expf(sh[i] - H->M);
            sum += sh[i];
        }
#endif
        H->S = H->S * ms + sum;
    }
    tq_ggml_fa_tile_mads_heads(accs, live, vf, s, n, DV, g);
}

/* Key c's rows decoded into kf and vf (DK and DV floats): K from its sink slot's exact row
   where the sink rule matches (tq-sink.h), else decoded like V. */
static inline void tq_ggml_fa_decode_key(ggml_to_float_t k_dec, ggml_to_float_t v_dec, const char *k, size_t nbk1,
                                         const char *v, size_t nbv1, int64_t c, int64_t DK, int64_t DV,
                                         const tq_fa_term_cells_t *tc, float *kf, float *vf) {
    const float *x = tq_fa_term_sink(tc, c, k + c * nbk1, DK);
    if (x) {
        memcpy(kf, x, DK * sizeof(float));
    } else {
        k_dec(k + c * nbk1, kf, DK);
    }
    v_dec(v + c * nbv1, vf, DV);
}

/* Heads hd[0..g) over keys [ic0, ic1) (g = 1: a head alone, the same arithmetic bit for bit).
   The tiles are the runs of keys that the mask row mp (the GQA group's first head's) does not
   exclude; each is decoded once for all g heads and then taken by tq_ggml_fa_heads_tile. */
static inline void tq_ggml_fa_rows_shared(ggml_to_float_t k_dec, ggml_to_float_t v_dec, const char *k, size_t nbk1,
                                          const char *v, size_t nbv1, tq_ggml_fa_head_t *hd, int g, int64_t DK,
                                          int64_t DV, const ggml_fp16_t *mp, float scale, float softcap, int64_t ic0,
                                          int64_t ic1, const tq_fa_term_cells_t *tc) {
    float kf[TQ_FA_TILE * TQ_FA_GQA_DMAX], vf[TQ_FA_TILE * TQ_FA_GQA_DMAX], mv[TQ_FA_TILE];
    tq_ggml_fa_head_t *hp[TQ_FA_GQA_MAX];
    for (int h = 0; h < g; ++h) hp[h] = hd + h;
    int64_t ic = ic0, start;
    int n;
    while ((n = tq_ggml_fa_next_run(mp, 1.0f, &ic, ic1, &start, mv)) > 0) {
        for (int i = 0; i < n; ++i) {
            tq_ggml_fa_decode_key(k_dec, v_dec, k, nbk1, v, nbv1, start + i, DK, DV, tc, kf + i * DK, vf + i * DV);
        }
        tq_ggml_fa_heads_tile(hp, g, kf, vf, start, n, mp, mv, DK, DV, scale, softcap, tc);
    }
}

#include "tq-fa-window.h"

#ifdef __cplusplus
/* The patch's hook at the top of ggml-cpu/ops.cpp's
   ggml_compute_forward_flash_attn_ext_f16_one_chunk (so only inside ggml-cpu, where
   ggml_compute_params, the CPU type traits and vec.h are known). For a turbo V it computes
   the chunk's rows [ir0, ir1) over keys [ic_start, ic_end) and returns 1; otherwise 0, and
   upstream's loop runs. It is upstream's per-row loop with two changes: when K is turbo too
   the keys go in decoded tiles (tq_ggml_fa_rows_shared; the fused tq_ggml_fa_row only for
   heads above TQ_FA_GQA_DMAX), and otherwise each V row is added with the fused
   decode-and-add tq_ggml_mad_* instead of a decode into a buffer and a second pass.
   Everything around the key loop (ALiBi slope, sinks, split-KV partials, the final
   normalisation and the permuted store) is upstream's, line for line. Not under use_ref
   (test-backend-ops' reference): that keeps upstream's own loop. */
/* What the upstream loop does after a row's keys: the sinks (first kv-chunk only), then the
   split-KV partial [M, S, VKQ] or the normalised, permuted output row. */
static inline void tq_ggml_fa_store(struct ggml_tensor *dst, const struct ggml_tensor *sinks, int ir, int iq1, int iq2,
                                    int iq3, int64_t DV, int64_t ic_start, float M, float S, float *VKQ32,
                                    float *partials, int64_t partial_stride) {
    if (sinks && ic_start == 0) {
        const float s = ((float *) ((char *) sinks->data))[iq2];
        float ms = 1.0f, vs = 1.0f;
        if (s > M) {
            ms = expf(M - s);
            M = s;
            ggml_vec_scale_f32(DV, VKQ32, ms);
        } else {
            vs = expf(s - M);
        }
        S = S * ms + vs;
    }
    if (partials) {
        float *partial = partials + ir * partial_stride; /* [M, S, VKQ[DV]] */
        partial[0] = M;
        partial[1] = S;
        memcpy(partial + 2, VKQ32, DV * sizeof(float));
    } else {
        const float S_inv = S == 0.0f ? 0.0f : 1.0f / S;
        ggml_vec_scale_f32(DV, VKQ32, S_inv);
        /* permute(0, 2, 1, 3) */
        memcpy((char *) dst->data + (iq3 * dst->ne[2] * dst->ne[1] + iq2 + iq1 * dst->ne[1]) * dst->nb[1], VKQ32, dst->nb[1]);
    }
}

/* The CPU runs the turbo K terms (tq-fa-contract.h) only in the tiles below, over turbo K
   and V: a flash attention that carries them otherwise stops here with the reason, rather
   than run upstream's kernels, which would leave them out. The scheduler never sends one
   (ggml_backend_dev_supports_op asks tq_fa_k_terms_supported first); this guards callers
   that compute a graph directly. */
static inline void tq_ggml_fa_check_k_terms(const struct ggml_tensor *dst) {
    if (!tq_fa_has_k_terms(dst)) return;
    if (!tq_fa_k_terms_cpu_runs(dst)) {
        GGML_ABORT("%s: flash attention with turbo K terms over K %s, V %s, Q %s: the CPU runs them only over turbo K and V "
                   "with f32 Q and the layout of tq-fa-contract.h", dst->name, ggml_type_name(dst->src[1]->type),
                   ggml_type_name(dst->src[2]->type), ggml_type_name(dst->src[0]->type));
    }
}

/* The windows' scratch, kept per thread across calls: a malloc per chunk went to mmap at
   this size, and with two threads each munmap stopped the other for a TLB shootdown. */
static inline void *tq_fa_win_scratch(size_t bytes) {
    struct scratch {
        void *p = nullptr;
        size_t n = 0;
        ~scratch() { free(p); }
    };
    static thread_local scratch s;
    if (s.n < bytes) {
        free(s.p);
        s.p = malloc(bytes);
        s.n = s.p ? bytes : 0;
    }
    GGML_ASSERT(s.p && "flash attention: no memory for the decoded window");
    return s.p;
}

static inline int tq_ggml_fa_one_chunk(const struct ggml_compute_params *params, struct ggml_tensor *dst, int ir0,
                                       int ir1, int64_t ic_start, int64_t ic_end, float *partials,
                                       int64_t partial_stride) {
    const struct ggml_tensor *q = dst->src[0], *k = dst->src[1], *v = dst->src[2];
    const struct ggml_tensor *mask = dst->src[3], *sinks = dst->src[4];
    const tq_ggml_mad_t v_mad = tq_ggml_mad_fn(v->type);
    /* the turbo K terms (tq-fa-contract.h) run only here: the CPU takes them only over a turbo V */
    const tq_fa_term_t term = tq_fa_term_of(dst);
    GGML_ASSERT(!term.marked || (v_mad && term.T && term.hd == k->ne[0] && term.n_head == q->ne[2] &&
                                 term.n_tokens == q->ne[1] * q->ne[3] && term.n_cells == k->ne[1] * k->ne[3]));
    /* the exact first keys' slots hold whole cache rows of K's type, head after head */
    const size_t head_bytes = ggml_row_size(k->type, k->ne[0]);
    GGML_ASSERT(term.sink.n_slots == 0 || (term.sink.row_f == k->ne[0] * k->ne[2] && (size_t) k->nb[2] == head_bytes &&
                                           term.sink.row_q == head_bytes * (size_t) k->ne[2]));
    if (!v_mad || (params->use_ref && !term.marked)) return 0;
    const tq_ggml_fa_t fa = tq_ggml_fa_kernels(k->type, v->type);

    const int64_t DK = k->ne[0], DV = v->ne[0];
    const int64_t neq1 = q->ne[1], neq2 = q->ne[2];
    const int64_t rk2 = q->ne[2] / k->ne[2], rk3 = q->ne[3] / k->ne[3];
    const int64_t rv2 = q->ne[2] / v->ne[2], rv3 = q->ne[3] / v->ne[3];

    float scale = 1.0f, max_bias = 0.0f, logit_softcap = 0.0f;
    memcpy(&scale, (float *) dst->op_params + 0, sizeof(float));
    memcpy(&max_bias, (float *) dst->op_params + 1, sizeof(float));
    memcpy(&logit_softcap, (float *) dst->op_params + 2, sizeof(float));
    if (logit_softcap != 0) scale /= logit_softcap;

    const uint32_t n_head = neq2;
    const uint32_t n_head_log2 = 1u << (uint32_t) floor(log2(n_head));
    const float m0 = powf(2.0f, -(max_bias) / n_head_log2);
    const float m1 = powf(2.0f, -(max_bias / 2.0f) / n_head_log2);

    const enum ggml_type k_vec_dot_type = ggml_get_type_traits_cpu(k->type)->vec_dot_type;
    const ggml_from_float_t q_to_vec_dot = ggml_get_type_traits_cpu(k_vec_dot_type)->from_float;
    const ggml_vec_dot_t kq_vec_dot = ggml_get_type_traits_cpu(k->type)->vec_dot;
    GGML_ASSERT(q_to_vec_dot && "fattn: unsupported K-type");

    /* GQA groups (tq_ggml_fa_rows_shared): the rk2 heads of one K/V head, for one query token,
       rows ir, ir + neq1, ... when all of them are in this chunk and share the mask row */
    const ggml_to_float_t k_dec = ggml_get_type_traits(k->type)->to_float, v_dec = ggml_get_type_traits(v->type)->to_float;
    /* decoded tiles (tq_ggml_fa_rows_shared) for every row where they apply, a group of g
       heads or one head alone, so that a row's result never depends on whether its group
       fell into one chunk: the chunks follow the ubatch's size and the thread count, and a
       path chosen per chunk would make a sequence's logits depend on what else is batched
       with it (quantizing the next layers' K and V then turns that rounding into whole code
       steps; tests/reliability_server.rs compares batched and lone answers) */
    const int64_t g = rk2;
    const int decoded = fa.dot && DK <= TQ_FA_GQA_DMAX && DV <= TQ_FA_GQA_DMAX && k_dec && v_dec &&
                        k_vec_dot_type == GGML_TYPE_F32 && q->type == GGML_TYPE_F32;
    const int shared = decoded && tq_ggml_fa_tile() >= 2 && g > 1 && g <= TQ_FA_GQA_MAX && rv2 == rk2 && rv3 == rk3;
    /* a prefill's chunk: every row over keys decoded once per window (tq-fa-window.h); a
       decode's rows (one query token: its heads) share no more than a group's tiles */
    if (decoded && tq_ggml_fa_tile() >= 2 && rv2 == rk2 && rv3 == rk3 && neq1 > 1 && ir1 - ir0 >= TQ_FA_WIN_MIN_ROWS) {
        const int nr = ir1 - ir0;
        const int64_t W = tq_fa_win_keys(DK, DV);
        const size_t floats = (size_t) nr * DV + (size_t) W * (DK + DV);
        char *mem = (char *) tq_fa_win_scratch(floats * sizeof(float) + (size_t) nr * sizeof(tq_fa_win_row_t) + (size_t) W);
        tq_fa_win_row_t *rows = (tq_fa_win_row_t *) mem;
        float *acc = (float *) (rows + nr), *kf = acc + (size_t) nr * DV, *vf = kf + (size_t) W * DK;
        unsigned char *have = (unsigned char *) (vf + (size_t) W * DV);
        for (int set0 = ir0; set0 < ir1;) {
            /* rows [set0, set1): consecutive rows of one K/V head */
            int set1 = set0;
            int ik2 = 0, ik3 = 0;
            for (; set1 < ir1; ++set1) {
                const int iq3 = set1 / (neq2 * neq1);
                const int iq2 = (set1 - iq3 * neq2 * neq1) / neq1;
                const int iq1 = set1 - iq3 * neq2 * neq1 - iq2 * neq1;
                if (set1 > set0 && (iq2 / rk2 != ik2 || iq3 / rk3 != ik3)) break;
                ik2 = iq2 / rk2;
                ik3 = iq3 / rk3;
                const uint32_t h = iq2;
                tq_fa_win_row_t *r = &rows[set1 - ir0];
                const ggml_fp16_t *mp =
                    mask ? (const ggml_fp16_t *) ((char *) mask->data + iq1 * mask->nb[1] + (iq2 % mask->ne[2]) * mask->nb[2] +
                                                  (iq3 % mask->ne[3]) * mask->nb[3])
                         : NULL;
                r->h.q = (const float *) ((char *) q->data + (iq1 * q->nb[1] + iq2 * q->nb[2] + iq3 * q->nb[3]));
                r->h.ta = term.A ? term.A + ((iq3 * neq1 + iq1) * neq2 + iq2) * DK : NULL;
                r->h.mp = mp;
                r->h.slope = (max_bias > 0.0f) ? h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2 * (h - n_head_log2) + 1) : 1.0f;
                r->h.M = -INFINITY;
                r->h.S = 0.0f;
                r->h.VKQ = acc + (size_t) (set1 - ir0) * DV;
                memset(r->h.VKQ, 0, DV * sizeof(float));
                /* as below: the tiles follow the mask row of the group's first head */
                r->runs = mask ? (const ggml_fp16_t *) ((const char *) mp + (((iq2 - iq2 % g) % mask->ne[2]) -
                                                                             (iq2 % mask->ne[2])) * (int64_t) mask->nb[2])
                               : NULL;
            }
            const char *k_head = (const char *) k->data + ik2 * k->nb[2] + ik3 * k->nb[3];
            const char *v_head = (const char *) v->data + ik2 * v->nb[2] + ik3 * v->nb[3];
            const tq_fa_term_cells_t tc = tq_fa_term_cells_of(&term, ik2, ik3, k->ne[1], DK, head_bytes);
            const float *tt = tc.T;
            tq_ggml_fa_window_rows(k_dec, v_dec, k_head, k->nb[1], v_head, v->nb[1], rows + (set0 - ir0), set1 - set0, DK,
                                   DV, scale, logit_softcap, ic_start, ic_end, tt ? &tc : NULL, kf, vf, have, W);
            for (int ir = set0; ir < set1; ++ir) {
                const int jq3 = ir / (neq2 * neq1);
                const int jq2 = (ir - jq3 * neq2 * neq1) / neq1;
                const int jq1 = ir - jq3 * neq2 * neq1 - jq2 * neq1;
                const tq_fa_win_row_t *r = &rows[ir - ir0];
                tq_ggml_fa_store(dst, sinks, ir, jq1, jq2, jq3, DV, ic_start, r->h.M, r->h.S, r->h.VKQ, partials,
                                 partial_stride);
            }
            set0 = set1;
        }
        return 1;
    }

    for (int ir = ir0; ir < ir1; ++ir) {
        const int iq3 = ir / (neq2 * neq1);
        const int iq2 = (ir - iq3 * neq2 * neq1) / neq1;
        const int iq1 = (ir - iq3 * neq2 * neq1 - iq2 * neq1);
        const uint32_t h = iq2;
        const ggml_fp16_t *mp = mask ? (ggml_fp16_t *) ((char *) mask->data + iq1 * mask->nb[1] + (iq2 % mask->ne[2]) * mask->nb[2] +
                                                        (iq3 % mask->ne[3]) * mask->nb[3])
                                     : NULL;
        const int ik3 = iq3 / rk3, ik2 = iq2 / rk2;
        const int iv3 = iq3 / rv3, iv2 = iq2 / rv2;
        const char *k_head = (const char *) k->data + ik2 * k->nb[2] + ik3 * k->nb[3];
        const char *v_head = (const char *) v->data + iv2 * v->nb[2] + iv3 * v->nb[3];
        /* the per-key term's rows for this K stream's cells, and this query's coefficients */
        const tq_fa_term_cells_t tc = tq_fa_term_cells_of(&term, ik2, ik3, k->ne[1], DK, head_bytes);
        const float *tt = tc.T;

        if (decoded) {
            const int64_t lead = ir - (int64_t) (iq2 % g) * neq1;
            const int group = shared && lead >= ir0 && lead + (g - 1) * neq1 < ir1;
            if (group && lead != ir) continue; /* done with its group's first head */
            const int n_h = group ? (int) g : 1;
            float acc[TQ_FA_GQA_MAX * TQ_FA_GQA_DMAX];
            tq_ggml_fa_head_t hd[TQ_FA_GQA_MAX];
            for (int j = 0; j < n_h; ++j) {
                const uint32_t hj = iq2 + j;
                hd[j].q = (const float *) ((char *) q->data + (iq1 * q->nb[1] + hj * q->nb[2] + iq3 * q->nb[3]));
                hd[j].ta = term.A ? term.A + ((iq3 * neq1 + iq1) * neq2 + hj) * DK : NULL;
                hd[j].mp = mask ? (const ggml_fp16_t *) ((const char *) mp + (((iq2 + j) % mask->ne[2]) -
                                                                          (iq2 % mask->ne[2])) * (int64_t) mask->nb[2])
                                : NULL;
                hd[j].slope = (max_bias > 0.0f) ? hj < n_head_log2 ? powf(m0, hj + 1) : powf(m1, 2 * (hj - n_head_log2) + 1) : 1.0f;
                hd[j].M = -INFINITY;
                hd[j].S = 0.0f;
                hd[j].VKQ = acc + j * DV;
                memset(hd[j].VKQ, 0, DV * sizeof(float));
            }
            /* the tiles follow the mask row of the group's first head, in the group or not */
            const ggml_fp16_t *runs = mask ? (const ggml_fp16_t *) ((const char *) mp + (((iq2 - iq2 % g) % mask->ne[2]) -
                                                                                    (iq2 % mask->ne[2])) * (int64_t) mask->nb[2])
                                           : NULL;
            tq_ggml_fa_rows_shared(k_dec, v_dec, k_head, k->nb[1], v_head, v->nb[1], hd, n_h, DK, DV, runs, scale,
                                   logit_softcap, ic_start, ic_end, tt ? &tc : NULL);
            for (int j = 0; j < n_h; ++j) {
                tq_ggml_fa_store(dst, sinks, ir + j * (int) neq1, iq1, iq2 + j, iq3, DV, ic_start, hd[j].M, hd[j].S,
                                 hd[j].VKQ, partials, partial_stride);
            }
            continue;
        }

        const float slope = (max_bias > 0.0f) ? h < n_head_log2 ? powf(m0, h + 1) : powf(m1, 2 * (h - n_head_log2) + 1) : 1.0f;
        float S = 0.0f, M = -INFINITY;
        float *VKQ32 = (float *) params->wdata + params->ith * (1 * DK + 2 * DV + CACHE_LINE_SIZE_F32);
        void *Q_q = VKQ32 + 2 * DV;
        memset(VKQ32, 0, DV * sizeof(float));

        const float *pq = (const float *) ((char *) q->data + (iq1 * q->nb[1] + iq2 * q->nb[2] + iq3 * q->nb[3]));
        q_to_vec_dot(pq, Q_q, DK);

        const float *ta = term.A ? term.A + ((iq3 * neq1 + iq1) * neq2 + iq2) * DK : NULL;
        if (fa.dot) {
            tq_ggml_fa_row(&fa, k_head, k->nb[1], v_head, v->nb[1], (const float *) Q_q, DK, DV, mp, slope, scale,
                           logit_softcap, ic_start, ic_end, tt, ta, tt ? &tc : NULL, VKQ32, &M, &S);
        } else {
            for (int64_t ic = ic_start; ic < ic_end; ++ic) {
                const float mv = mp ? slope * TQ_FA_FP16_TO_FP32(mp[ic]) : 0.0f;
                if (mv == -INFINITY) continue;
                float s;
                const float *x = tt ? tq_fa_term_sink(&tc, ic, k_head + ic * k->nb[1], DK) : NULL;
                if (x) {
                    tq_ggml_fa_tile_dots(x, 1, DK, (const float *) Q_q, &s);
                } else {
                    kq_vec_dot(DK, &s, 0, k_head + ic * k->nb[1], 0, Q_q, 0, 1);
                }
                if (ta) {
                    for (int64_t d = 0; d < DK; ++d) s += tt[ic * DK + d] * ta[d];
                }
                s = s * scale;
                if (logit_softcap != 0.0f) s = logit_softcap * tanhf(s);
                s += mv;
                const float Mold = M;
                float ms = 1.0f, vs = 1.0f;
                if (s > M) {
                    M = s;
                    ms = expf(Mold - M);
                    ggml_vec_scale_f32(DV, VKQ32, ms);
                } else {
                    vs = expf(s - M);
                }
                v_mad(v_head + ic * v->nb[1], VKQ32, DV, vs);
                S = S * ms + vs;
            }
        }
        tq_ggml_fa_store(dst, sinks, ir, iq1, iq2, iq3, DV, ic_start, M, S, VKQ32, partials, partial_stride);
    }
    return 1;
}

/* The patch's hook in the split-KV path of ggml_compute_forward_flash_attn_ext_f16, which
   calls the chunk function once per query head: all heads [0, n_head) over this thread's
   keys [ic_start, ic_end) in one call, so the heads of a GQA group meet in one call and
   share its tiles. Returns 0 (upstream's per-head loop runs) where tq_ggml_fa_one_chunk
   does not apply. */
static inline int tq_ggml_fa_split_heads(const struct ggml_compute_params *params, struct ggml_tensor *dst,
                                         int64_t n_head, int64_t ic_start, int64_t ic_end, float *partials,
                                         int64_t partial_stride) {
    return tq_ggml_fa_one_chunk(params, dst, 0, (int) n_head, ic_start, ic_end, partials, partial_stride);
}
#endif /* __cplusplus */

#endif /* TQ_GGML_FA_H */
