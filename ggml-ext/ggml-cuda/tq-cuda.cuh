// tq-cuda.cuh - the turbo codec on the GPU: the bit-exact CUDA port of the Rust encoder and
// decoder (crates/codec/src/kernels/scalar.rs, rules in turboquant.h). Self-contained (CUDA headers and
// our C headers only), so the parity test can use it without ggml.
//
// Bit-exactness under ggml's `-use_fast_math` (which contracts a*b+c into FMA, flushes f32
// subnormals and relaxes f32 division and square root): every step of the encoder that
// decides bytes is written with explicitly rounded double intrinsics (__dmul_rn, __dadd_rn,
// __ddiv_rn, __dsqrt_rn), which the compiler never fuses or relaxes, and the f32 -> f64
// widening of a subnormal input is done by hand so no flush can touch it. The decoder is one
// f32 multiply (__fmul_rn) of two normal numbers.
//
// The codec functions are __host__ __device__: compiled for the host (with
// -ffp-contract=off), the same source runs on a machine without a GPU, which is how CI checks
// it against the Rust codec (ggml-ext/ggml-cuda/tq-parity.cu --host). The TQ_* shims below map each
// exactly rounded operation to its intrinsic on the device and to plain IEEE arithmetic on the
// host.
#pragma once

#include <cuda_fp16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "turboquant.h"

#ifdef TURBOQUANT_TABLES_H
#error "include tq-cuda.cuh before turboquant_tables.h: it places one copy of the tables on each side"
#endif
// The generated tables, once for the host (namespace tq_host) and once in device memory.
namespace tq_host {
#define TQ_TABLE_ATTR
#include "turboquant_tables.h"
#undef TQ_TABLE_ATTR
}
#undef TURBOQUANT_TABLES_H
#define TQ_TABLE_ATTR __device__
#include "turboquant_tables.h"

#define TQ_HD __host__ __device__ __forceinline__

// Loop unrolling for the device pass only: the host compiler does not know the pragma.
#ifdef __CUDA_ARCH__
#define TQ_UNROLL      _Pragma("unroll")
#define TQ_UNROLL_8    _Pragma("unroll 8")
#else
#define TQ_UNROLL
#define TQ_UNROLL_8
#endif

#ifdef __CUDA_ARCH__
#define TQ_TABLE(name) (name)
static __device__ __forceinline__ double   tq_dmul(double a, double b) { return __dmul_rn(a, b); }
static __device__ __forceinline__ double   tq_dadd(double a, double b) { return __dadd_rn(a, b); }
static __device__ __forceinline__ double   tq_ddiv(double a, double b) { return __ddiv_rn(a, b); }
static __device__ __forceinline__ double   tq_dsqrt(double a)          { return __dsqrt_rn(a); }
static __device__ __forceinline__ float    tq_fmul(float a, float b)   { return __fmul_rn(a, b); }
static __device__ __forceinline__ float    tq_d2f(double a)            { return __double2float_rn(a); }
static __device__ __forceinline__ uint32_t tq_f2u(float a)             { return __float_as_uint(a); }
static __device__ __forceinline__ float    tq_fsub(float a, float b)   { return __fsub_rn(a, b); }
static __device__ __forceinline__ float    tq_fadd(float a, float b)   { return __fadd_rn(a, b); }
static __device__ __forceinline__ float    tq_fdiv(float a, float b)   { return __fdiv_rn(a, b); }
#else
#define TQ_TABLE(name) (tq_host::name)
static inline double   tq_dmul(double a, double b) { return a * b; }
static inline double   tq_dadd(double a, double b) { return a + b; }
static inline double   tq_ddiv(double a, double b) { return a / b; }
static inline double   tq_dsqrt(double a)          { return sqrt(a); }
static inline float    tq_fmul(float a, float b)   { return a * b; }
static inline float    tq_d2f(double a)            { return (float) a; }
static inline uint32_t tq_f2u(float a)             { uint32_t u; memcpy(&u, &a, sizeof(u)); return u; }
static inline float    tq_fsub(float a, float b)   { return a - b; }
static inline float    tq_fadd(float a, float b)   { return a + b; }
static inline float    tq_fdiv(float a, float b)   { return a / b; }
#endif

template <int bits> struct tq_cuda_type;
template <> struct tq_cuda_type<2> { typedef tq_block_turbo2 block; };
template <> struct tq_cuda_type<3> { typedef tq_block_turbo3 block; };
template <> struct tq_cuda_type<4> { typedef tq_block_turbo4 block; };

template <int bits> static TQ_HD const float * tq_cuda_codebook() {
    if constexpr (bits == 2) { return TQ_TABLE(TQ_CODEBOOK_2BIT); }
    else if constexpr (bits == 3) { return TQ_TABLE(TQ_CODEBOOK_3BIT); }
    else { static_assert(bits == 4, "turbo2..4"); return TQ_TABLE(TQ_CODEBOOK_4BIT); }
}

template <int bits> static TQ_HD const float * tq_cuda_thresholds() {
    if constexpr (bits == 2) { return TQ_TABLE(TQ_THRESHOLDS_2BIT); }
    else if constexpr (bits == 3) { return TQ_TABLE(TQ_THRESHOLDS_3BIT); }
    else { static_assert(bits == 4, "turbo2..4"); return TQ_TABLE(TQ_THRESHOLDS_4BIT); }
}

// The stored fp16 scale as the decoder reads it (decode_scale in crates/codec/src/block.rs): NaN, infinite
// or negative non-zero (never written by the encoder) decodes as 0, so a corrupt block can
// never produce NaN; -0 stays -0, as on the CPU.
static TQ_HD float tq_cuda_scale(const uint16_t bits) {
    return ((bits & 0x7c00u) == 0x7c00u || bits > 0x8000u) ? 0.0f : __half2float(__ushort_as_half(bits));
}

// Index of value j (0..63) of a block, from its packed bytes qs (layouts in turboquant.h).
template <int bits> static TQ_HD int tq_cuda_index(const uint8_t * qs, const int j) {
    if constexpr (bits == 4) {
        return (qs[j & 31] >> (4*(j >> 5))) & 15;
    } else {
        const int lo = (qs[j & 15] >> (2*(j >> 4))) & 3;
        if constexpr (bits == 2) {
            return lo;
        } else {
            return lo | (((qs[16 + (j >> 3)] >> (j & 7)) & 1) << 2);
        }
    }
}

// Indices of the n (4 or 8) consecutive values j0 .. j0+n-1 (j0 a multiple of n), 4 bits
// each, value j0+i in bits 4i..4i+3. Reads whole 16-bit words: blocks are 2-byte aligned.
template <int bits, int n> static TQ_HD uint32_t tq_cuda_indices(const uint8_t * qs, const int j0) {
    static_assert(n == 4 || n == 8, "4 or 8 values");
    constexpr int span = bits == 4 ? 32 : 16;          // values whose low bits share a byte row
    constexpr int step = bits == 4 ? 4  : 2;           // bit shift between those rows
    constexpr uint32_t mask = bits == 4 ? 15u : 3u;
    const uint16_t * w = (const uint16_t *) (qs + (j0 % span));
    const int shift = step*(j0 / span);
    uint32_t out = 0;
TQ_UNROLL
    for (int k = 0; k < n/2; ++k) {
        const uint32_t two = w[k];
        out |= ((two        >> shift) & mask) << (8*k);
        out |= ((two >> 8   >> shift) & mask) << (8*k + 4);
    }
    if constexpr (bits == 3) {
        const uint32_t hi = qs[16 + j0/8] >> (j0 % 8);
TQ_UNROLL
        for (int i = 0; i < n; ++i) {
            out |= ((hi >> i) & 1u) << (4*i + 2);
        }
    }
    return out;
}

// ggml's dequantize_kernel_t convention with qk = 64, qr = 2: values iqs and iqs + 32.
template <int bits>
static TQ_HD void tq_cuda_dequantize(const void * vx, const int64_t ib, const int iqs, float2 & v) {
    const typename tq_cuda_type<bits>::block * x = (const typename tq_cuda_type<bits>::block *) vx + ib;
    const float * cb = tq_cuda_codebook<bits>();
    const float d = tq_cuda_scale(x->d);
    v.x = tq_fmul(d, cb[tq_cuda_index<bits>(x->qs, iqs)]);
    v.y = tq_fmul(d, cb[tq_cuda_index<bits>(x->qs, iqs + TQ_BLOCK_VALUES/2)]);
}

// Sanitize (NaN -> 0, +-Inf -> +-65504) and widen to double exactly, subnormals included.
static TQ_HD double tq_cuda_widen(const float v) {
    const uint32_t b = tq_f2u(v);
    const uint32_t e = b & 0x7f800000u;
    if (e == 0x7f800000u) {
        if (b & 0x007fffffu) {
            return 0.0;
        }
        return (b & 0x80000000u) ? -65504.0 : 65504.0;
    }
    if (e == 0) {
        const double r = tq_dmul((double) (int) (b & 0x007fffffu), 0x1p-149);
        return (b & 0x80000000u) ? -r : r;
    }
    return (double) v;
}

// The f32 fast path of the classification u = x / n (below) is used for blocks whose norm
// lies in [2^-120, 2^120], where 1/n is a normal f32; other blocks classify in double.
#define TQ_CUDA_F32_NORM_MIN 0x1p-120
#define TQ_CUDA_F32_NORM_MAX 0x1p+120

// The decision thresholds of one gain-search candidate g (crates/codec/src/gain.rs):
// T[t] * f with f = g * TQ_GAIN_STEP, as the exactly rounded double of the rule and as its
// f32 rounding for the fast path.
template <int bits> struct tq_cuda_thr {
    double d[(1 << bits) - 1];
    float  f[(1 << bits) - 1];
};

template <int bits>
static TQ_HD void tq_cuda_scaled_thresholds(const int gain, tq_cuda_thr<bits> & th) {
    const float * thr = tq_cuda_thresholds<bits>();
    const double f = tq_dmul((double) gain, TQ_GAIN_STEP);
TQ_UNROLL
    for (int t = 0; t < (1 << bits) - 1; ++t) {
        th.d[t] = tq_dmul((double) thr[t], f);
        th.f[t] = tq_d2f(th.d[t]);
    }
}

// Index of value v (the raw input) in a block of norm n against the thresholds th:
// #{t : x/n > th.d[t]} with x = sanitize(v), the quotient rounded to double (the rule of
// turboquant.h). rf = f32(1/n), 0 for a block outside the f32 range. FP64 is slow on most
// GPUs (1/64 of the f32 rate on consumer cards), so the decision is made in f32 and redone
// in double only when the f32 quotient lies within a relative 2^-20 of a threshold. Why
// that margin is safe: f32(1/n) (from the exactly rounded double 1/n) and the product x*rf
// each add at most a relative 2^-24, so |uf - x/n| <= ~2^-23 |uf|, and the f32 threshold
// th.f is within 2^-24 of th.d; where the two orders could differ, |uf - th.f| is below
// ~2^-22 |uf|, inside the margin. Ties (u == th.d exactly, which go to the lower
// centroid) always fall inside it. Near 0 the only threshold is 0 itself (0 * f = 0): a
// nonzero uf has the sign of x and of x/n, an exact zero input gives u = +-0 on both
// paths, and an f32 product that underflowed (or a subnormal input flushed by
// -use_fast_math) gives uf = 0, which is inside the margin of 0 and so goes to the double
// path, where subnormals are exact.
// *slow reports the fallback (the parity test counts them).
template <int bits>
static TQ_HD int tq_cuda_classify(const float v, const double n, const float rf, const tq_cuda_thr<bits> & th, bool & slow) {
    constexpr int levels = 1 << bits;
    if (rf != 0.0f) {
        const uint32_t b = tq_f2u(v);
        float x = v;
        // exactly zero after sanitizing (tested on the bits: under -use_fast_math a float
        // compare would take a subnormal for 0): u is +-0, which f32 compares exactly
        bool zero = (b & 0x7fffffffu) == 0;
        if ((b & 0x7f800000u) == 0x7f800000u) {
            zero = (b & 0x007fffffu) != 0;
            x = zero ? 0.0f : (b & 0x80000000u) ? -65504.0f : 65504.0f;
        }
        const float uf = tq_fmul(x, rf);
        const float mu = tq_fmul(fabsf(uf), 0x1p-20f);
        int k = 0;
        bool near = false;
TQ_UNROLL
        for (int t = 0; t < levels - 1; ++t) {
            k += uf > th.f[t];
            near |= fabsf(tq_fsub(uf, th.f[t])) <= mu;
        }
        if (!near || zero) {
            slow = false;
            return k;
        }
    }
    slow = true;
    const double u = tq_ddiv(tq_cuda_widen(v), n);
    int k = 0;
TQ_UNROLL
    for (int t = 0; t < levels - 1; ++t) {
        k += u > th.d[t];
    }
    return k;
}

// f32(1/n) for tq_cuda_classify, 0 when n is outside the f32 fast path's range.
static TQ_HD float tq_cuda_recip_f32(const double n) {
    return n >= TQ_CUDA_F32_NORM_MIN && n <= TQ_CUDA_F32_NORM_MAX ? tq_d2f(tq_ddiv(1.0, n)) : 0.0f;
}

// ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7)), as pairwise8 in the Rust encoder.
static TQ_HD double tq_cuda_pairwise8(const double * a) {
    return tq_dadd(tq_dadd(tq_dadd(a[0], a[1]), tq_dadd(a[2], a[3])),
                   tq_dadd(tq_dadd(a[4], a[5]), tq_dadd(a[6], a[7])));
}

// One gain-search candidate: its codes k[], Σ C[k_j]² and its score (Σ x_j C[k_j])² / Σ C[k_j]²,
// each sum in double as eight partial sums over j = l mod 8 combined pairwise, as in the
// Rust encoder.
template <int bits>
static TQ_HD double tq_cuda_candidate(const float * __restrict__ x, const double n, const float rf, const int gain,
                                      uint8_t * k, double & cs) {
    const float * cb = tq_cuda_codebook<bits>();
    tq_cuda_thr<bits> th;
    tq_cuda_scaled_thresholds<bits>(gain, th);
    double cs8[8], sx8[8];
TQ_UNROLL
    for (int l = 0; l < 8; ++l) {
        cs8[l] = 0.0;
        sx8[l] = 0.0;
    }
TQ_UNROLL_8
    for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
        bool slow;
        const int kj = tq_cuda_classify<bits>(x[j], n, rf, th, slow);
        k[j] = (uint8_t) kj;
        const double c = (double) cb[kj];
        cs8[j & 7] = tq_dadd(cs8[j & 7], tq_dmul(c, c));
        sx8[j & 7] = tq_dadd(sx8[j & 7], tq_dmul(tq_cuda_widen(x[j]), c));
    }
    cs = tq_cuda_pairwise8(cs8);
    const double sxc = tq_cuda_pairwise8(sx8);
    return tq_ddiv(tq_dmul(sxc, sxc), cs);
}

// The best candidate so far of the gain search.
struct tq_cuda_best {
    uint8_t k[TQ_BLOCK_VALUES];
    double  cs;
    double  score;
    int     gain;
};

// Tries gain g: it replaces the best only on a strictly larger score (ties keep the earlier).
template <int bits>
static TQ_HD void tq_cuda_try_gain(const float * __restrict__ x, const double n, const float rf, const int gain,
                                   tq_cuda_best & best) {
    uint8_t k[TQ_BLOCK_VALUES];
    double cs;
    const double score = tq_cuda_candidate<bits>(x, n, rf, gain, k, cs);
    if (score > best.score) {
        best.score = score;
        best.cs = cs;
        best.gain = gain;
        for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
            best.k[j] = k[j];
        }
    }
}

// Encodes one block of 64 values: the rule of turboquant.h, step for step, in one thread.
// The norm and the scale stay in double (they decide the stored scale's bits through
// sequential sums); the per-value classification is the f32 fast path above. The gain
// search (TQ_GAIN_*) tries 9 candidates and keeps the first with the largest score.
template <int bits>
static __host__ __device__ void tq_cuda_quantize_block(const float * __restrict__ x, typename tq_cuda_type<bits>::block * __restrict__ y) {
    constexpr int levels = 1 << bits;
    constexpr int nqs = (int) sizeof(y->qs);

    double ss = 0.0;
TQ_UNROLL_8
    for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
        const double v = tq_cuda_widen(x[j]);
        ss = tq_dadd(ss, tq_dmul(v, v));
    }
    const double n = tq_dsqrt(ss);

    tq_cuda_best best;
    uint16_t d = 0;
    const bool empty = n == 0.0 || !isfinite(n);
    if (empty) {
        for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
            best.k[j] = (uint8_t) (levels/2);
        }
    } else {
        const float rf = tq_cuda_recip_f32(n);
        best.score = tq_cuda_candidate<bits>(x, n, rf, TQ_GAIN_PLAIN, best.k, best.cs);
        best.gain = TQ_GAIN_PLAIN;
        const int coarse[TQ_GAIN_N_COARSE] = TQ_GAIN_COARSE;
        const int refine[TQ_GAIN_N_REFINE] = TQ_GAIN_REFINE;
        for (int i = 0; i < TQ_GAIN_N_COARSE; ++i) {
            tq_cuda_try_gain<bits>(x, n, rf, coarse[i], best);
        }
        for (int i = 0; i < TQ_GAIN_N_REFINE; ++i) {
            const int centre = best.gain; // the best after the previous step
            tq_cuda_try_gain<bits>(x, n, rf, centre - refine[i], best);
            tq_cuda_try_gain<bits>(x, n, rf, centre + refine[i], best);
        }
        const float r = tq_d2f(tq_ddiv(n, tq_dsqrt(best.cs)));
        d = __half_as_ushort(__float2half_rn(r));
        if ((d & 0x7fffu) == 0x7c00u) {
            d = 0x7bffu; // overflow to infinity: the largest finite fp16
        }
    }

    uint8_t q[nqs];
TQ_UNROLL
    for (int i = 0; i < nqs; ++i) {
        q[i] = 0;
    }
TQ_UNROLL
    for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
        const int kj = best.k[j];
        if constexpr (bits == 4) {
            q[j & 31] |= kj << (4*(j >> 5));
        } else {
            q[j & 15] |= (kj & 3) << (2*(j >> 4));
            if constexpr (bits == 3) {
                q[16 + (j >> 3)] |= (kj >> 2) << (j & 7);
            }
        }
    }
    y->d = d;
TQ_UNROLL
    for (int i = 0; i < nqs; ++i) {
        y->qs[i] = q[i];
    }
}
