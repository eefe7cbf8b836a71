// tq-fattn.cuh - turbo K and V inside ggml-cuda's flash-attention vector (decode) kernel.
//
// Included by the patched fattn-common.cuh; get_vec_dot_KQ / get_dequantize_V hand these out
// for turbo types. The cache lives in the rotated domain (llama rotates Q, K and V with the
// same seeded orthogonal map), so a key is decoded as scale x codebook[index]: no rotation per
// key, no dequantized copy of the cache.
//
// K.Q: the kernel gives a turbo K the f16 path's layout (patched nthreads_KQ): 8 threads per
// key row, Q kept in f32 registers (never rounded to q8_1), thread t holding Q values
// 8t..8t+7 of every 64-value block, which is exactly one turbo block per step.
// Codebook lookups go through a warp shuffle (lane l holds codebook[l mod levels]): a gather
// from registers, no memory access. Every lane of the warp calls both functions (the kernel's
// loops are warp-uniform), as __shfl_sync with a full mask requires.
#pragma once

#include "tq-ggml.h"
#include "tq-cuda.cuh"
#include "tq-tcq-fattn.cuh" // the trellis types

template <ggml_type type> constexpr __host__ __device__ int tq_fattn_bits() {
    return type == GGML_TYPE_TURBO2 ? 2 : type == GGML_TYPE_TURBO3 ? 3 : 4;
}

template <int bits> static __device__ __forceinline__ float tq_fattn_codebook_lane() {
    return tq_cuda_codebook<bits>()[threadIdx.x % (1 << bits)];
}

template <int D, int nthreads, int bits>
static __device__ __forceinline__ float tq_vec_dot_KQ(
    const char * __restrict__ K_c, const void * __restrict__ Q_v, const int * __restrict__ Q_q8, const void * __restrict__ Q_ds) {
    GGML_UNUSED(Q_q8);
    GGML_UNUSED(Q_ds);
    // 8 threads per row is the f16 Q layout from Volta on; older archs are refused at
    // configure time (ggml-ext/cmake/turboquant-cuda-archs.cmake).
    static_assert(nthreads == 8 && D % TQ_BLOCK_VALUES == 0, "turbo K needs the f16 Q layout of Volta (sm_70) or newer: 8 threads, 8 values each per block");
    typedef typename tq_cuda_type<bits>::block block;

    const block * K = (const block *) K_c;
    const int t = threadIdx.x % nthreads;
    const float cb = tq_fattn_codebook_lane<bits>();

    float sum = 0.0f;
#pragma unroll
    for (int b = 0; b < D/TQ_BLOCK_VALUES; ++b) {
        const uint32_t idx = tq_cuda_indices<bits, 8>(K[b].qs, 8*t);
        float part = 0.0f;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
#ifdef V_DOT2_F32_F16_AVAILABLE
            const float2 q = __half22float2(((const half2 *) Q_v)[4*b + m]);
#else
            const float2 q = ((const float2 *) Q_v)[4*b + m];
#endif // V_DOT2_F32_F16_AVAILABLE
            part += q.x * __shfl_sync(0xFFFFFFFF, cb, (idx >> (8*m))     & 15, WARP_SIZE);
            part += q.y * __shfl_sync(0xFFFFFFFF, cb, (idx >> (8*m + 4)) & 15, WARP_SIZE);
        }
        sum += tq_cuda_scale(K[b].d) * part;
    }
    return sum;
}

template <typename T, int ne, int bits>
static __device__ __forceinline__ void tq_dequantize_V(const void * __restrict__ vx, void * __restrict__ dst, const int64_t i0) {
    static_assert(ne == 4 || ne == 8, "bad ne");
    typedef typename tq_cuda_type<bits>::block block;

    const block * x = (const block *) vx + i0/TQ_BLOCK_VALUES;
    const float cb = tq_fattn_codebook_lane<bits>();
    const float d = tq_cuda_scale(x->d);
    const uint32_t idx = tq_cuda_indices<bits, ne>(x->qs, i0 % TQ_BLOCK_VALUES);

#pragma unroll
    for (int l = 0; l < ne/2; ++l) {
        const float a = d * __shfl_sync(0xFFFFFFFF, cb, (idx >> (8*l))     & 15, WARP_SIZE);
        const float c = d * __shfl_sync(0xFFFFFFFF, cb, (idx >> (8*l + 4)) & 15, WARP_SIZE);
        if constexpr (std::is_same_v<T, half>) {
            ((half2 *) dst)[l] = make_half2(a, c);
        } else {
            static_assert(std::is_same_v<T, float>, "half or float");
            ((float2 *) dst)[l] = make_float2(a, c);
        }
    }
}

template <ggml_type type_K, int D, int nthreads>
constexpr __device__ vec_dot_KQ_t tq_get_vec_dot_KQ() {
    if constexpr (TQ_GGML_IS_TCQ(type_K)) {
        return tq_tcq_vec_dot_KQ<D, nthreads, tq_tcq_fattn_k<type_K>()>;
    } else {
        return tq_vec_dot_KQ<D, nthreads, tq_fattn_bits<type_K>()>;
    }
}

template <ggml_type type_V, typename T, int ne>
constexpr __device__ dequantize_V_t tq_get_dequantize_V() {
    if constexpr (TQ_GGML_IS_TCQ(type_V)) {
        return tq_tcq_dequantize_V<T, ne, tq_tcq_fattn_k<type_V>()>;
    } else {
        return tq_dequantize_V<T, ne, tq_fattn_bits<type_V>()>;
    }
}

// Called by the patched vector kernel before its main loop: the trellis types' tables into
// shared memory (tq-tcq-fattn.cuh); nothing for other types.
template <ggml_type type_K, ggml_type type_V>
static __device__ __forceinline__ void tq_fattn_vec_prologue() {
    tq_tcq_fattn_prologue<type_K, type_V>();
}

// The K/V pairs we compile vector kernels for (ggml-ext/ggml-cuda/turboquant-cuda.cmake generates
// one instance file per pair): every pair of {turbo2, turbo3, turbo4, q8_0, f16} with at
// least one turbo side, at head sizes 64, 128 and 256.
#define TQ_FATTN_FOR_EACH_PAIR(X)                                                               \
    X(TURBO2, TURBO2) X(TURBO2, TURBO3) X(TURBO2, TURBO4) X(TURBO2, Q8_0) X(TURBO2, F16)         \
    X(TURBO3, TURBO2) X(TURBO3, TURBO3) X(TURBO3, TURBO4) X(TURBO3, Q8_0) X(TURBO3, F16)         \
    X(TURBO4, TURBO2) X(TURBO4, TURBO3) X(TURBO4, TURBO4) X(TURBO4, Q8_0) X(TURBO4, F16)         \
    X(Q8_0,   TURBO2) X(Q8_0,   TURBO3) X(Q8_0,   TURBO4)                                       \
    X(F16,    TURBO2) X(F16,    TURBO3) X(F16,    TURBO4)

// The GQA decode kernel (tq-fattn-gqa.cuh), instantiated per pair in its own generated files.
template <int D, ggml_type type_K, ggml_type type_V>
void tq_fattn_gqa_case(ggml_backend_cuda_context & ctx, ggml_tensor * dst);

#define TQ_FATTN_EXTERN_DECL_PAIR(K, V)                                                         \
    extern DECL_FATTN_VEC_CASE( 64, GGML_TYPE_##K, GGML_TYPE_##V);                              \
    extern DECL_FATTN_VEC_CASE(128, GGML_TYPE_##K, GGML_TYPE_##V);                              \
    extern DECL_FATTN_VEC_CASE(256, GGML_TYPE_##K, GGML_TYPE_##V);                              \
    extern template void tq_fattn_gqa_case< 64, GGML_TYPE_##K, GGML_TYPE_##V>(ggml_backend_cuda_context &, ggml_tensor *); \
    extern template void tq_fattn_gqa_case<128, GGML_TYPE_##K, GGML_TYPE_##V>(ggml_backend_cuda_context &, ggml_tensor *); \
    extern template void tq_fattn_gqa_case<256, GGML_TYPE_##K, GGML_TYPE_##V>(ggml_backend_cuda_context &, ggml_tensor *);

// The trellis pairs have vector-kernel instances only (no GQA kernel for them yet).
#define TQ_FATTN_EXTERN_DECL_VEC_PAIR(K, V)                                                     \
    extern DECL_FATTN_VEC_CASE( 64, GGML_TYPE_##K, GGML_TYPE_##V);                              \
    extern DECL_FATTN_VEC_CASE(128, GGML_TYPE_##K, GGML_TYPE_##V);                              \
    extern DECL_FATTN_VEC_CASE(256, GGML_TYPE_##K, GGML_TYPE_##V);

// For the end of fattn-vec.cuh: the instances live in the generated files, not in fattn.cu.
#define TQ_FATTN_EXTERN_DECL_CASES TQ_FATTN_FOR_EACH_PAIR(TQ_FATTN_EXTERN_DECL_PAIR) TQ_TCQ_FATTN_FOR_EACH_PAIR(TQ_FATTN_EXTERN_DECL_VEC_PAIR)

// Head sizes compiled (TQ_CUDA_FA_HEAD_SIZES in turboquant-cuda.cmake); for an instance left
// out the lookup returns nothing and upstream converts K/V to f16 instead. `if constexpr`
// keeps the missing instance from being referenced.
#ifndef TQ_CUDA_FA_D64
#define TQ_CUDA_FA_D64 1
#endif
#ifndef TQ_CUDA_FA_D128
#define TQ_CUDA_FA_D128 1
#endif
#ifndef TQ_CUDA_FA_D256
#define TQ_CUDA_FA_D256 1
#endif

// Which decode kernel the turbo pairs get: TQ_CUDA_FA=gqa (default: tq-fattn-gqa.cuh, each
// K/V row decoded once for all the Q heads sharing it) or TQ_CUDA_FA=vec (upstream's vector
// kernel with the hooks above, one Q head per block), for A/B. A row of tq-switches.def, read
// once per process by the table's parser (tq_switch_get), at the first lookup of a turbo pair,
// and logged once; any other value stops the process with the table's message, so a typo
// never measures the wrong kernel.
enum tq_cuda_fa_kernel { TQ_CUDA_FA_GQA = 0, TQ_CUDA_FA_VEC = 1 }; // the row's value indices

inline tq_cuda_fa_kernel tq_cuda_fa_selected() {
    static const tq_cuda_fa_kernel kernel = [] {
        const tq_cuda_fa_kernel k = (tq_cuda_fa_kernel) tq_switch_get(TQ_SW_CUDA_FA);
        const char * s = getenv(tq_switch_info(TQ_SW_CUDA_FA)->env);
        GGML_LOG_INFO("turboquant: CUDA flash-attention decode kernel for turbo K/V: %s (%s)\n",
                      k == TQ_CUDA_FA_GQA ? "gqa" : "vec", s && *s ? "TQ_CUDA_FA" : "default; TQ_CUDA_FA=vec|gqa");
        return k;
    }();
    return kernel;
}

// Whether the GQA kernel has an instance for this pair and head size (an f32 K or V arrives
// as the f16 instance, as in the lookup below).
static inline bool tq_cuda_fa_gqa_has(ggml_type k, ggml_type v, const int64_t D) {
    k = k == GGML_TYPE_F32 ? GGML_TYPE_F16 : k;
    v = v == GGML_TYPE_F32 ? GGML_TYPE_F16 : v;
    bool pair = false;
#define TQ_FATTN_GQA_HAS(K, V) pair = pair || (k == GGML_TYPE_##K && v == GGML_TYPE_##V);
    TQ_FATTN_FOR_EACH_PAIR(TQ_FATTN_GQA_HAS)
#undef TQ_FATTN_GQA_HAS
    return pair && ((D == 64 && TQ_CUDA_FA_D64) || (D == 128 && TQ_CUDA_FA_D128) || (D == 256 && TQ_CUDA_FA_D256));
}

// Most queries per KV head that a decode without a mask per head keeps on the GQA kernel
// (llama-server's unified cache decodes one query per busy slot in one op). Past it
// upstream's tensor-core kernel, which decodes the whole K/V view to f16 first. The GQA kernel
// reads the cache once per 2 queries, the f16 path once to convert and once more at f16's 16
// bits per value: 8 queries (4 reads of 3-4.25 bits) is about break-even, by bytes read, not
// yet timed on a GPU.
#define TQ_CUDA_FA_GQA_MAX_QUERIES 8

// Where flash attention over a turbo pair goes: ggml_cuda_get_best_fattn_kernel asks this (one
// patch line) after its head-size and type checks, before its refusal of a mask per head.
// -1: not a turbo pair, upstream decides; 0: refused; 1: the decode kernels
// (BEST_FATTN_KERNEL_VEC, whose lookup hands turbo pairs to tq_fattn_turbo_case).
// A mask per head (mask->ne[2] > 1: the lowered turbo K terms, docs/KV-CACHE.md) is read by the
// GQA kernel only, at any number of queries; more than 2 queries without one stay on it up to
// TQ_CUDA_FA_GQA_MAX_QUERIES (with TQ_CUDA_FA=gqa, the default; =vec leaves them to upstream).
static inline int tq_cuda_fa_route(const ggml_tensor * Q, const ggml_tensor * K, const ggml_tensor * V, const ggml_tensor * mask) {
    if (!TQ_GGML_IS_TURBO(K->type) && !TQ_GGML_IS_TURBO(V->type)) {
        return -1;
    }
    const bool head_mask = mask && mask->ne[2] != 1;
    const bool gqa = tq_cuda_fa_gqa_has(K->type, V->type, Q->ne[0]) && Q->ne[0] == K->ne[0] && K->ne[0] == V->ne[0] &&
                     K->ne[1] % FATTN_KQ_STRIDE == 0 && (!mask || mask->type == GGML_TYPE_F16);
    if (head_mask) {
        return gqa && mask->ne[2] > 0 && Q->ne[2] % mask->ne[2] == 0 ? 1 : 0;
    }
    return gqa && Q->ne[1] > 2 && Q->ne[1] <= TQ_CUDA_FA_GQA_MAX_QUERIES && tq_cuda_fa_selected() == TQ_CUDA_FA_GQA ? 1 : -1;
}

// Whether an op routed to the decode kernels needs the GQA kernel whatever TQ_CUDA_FA says:
// upstream's vector kernel reads no mask per head and takes queries two at a time per head.
static inline bool tq_cuda_fa_needs_gqa(const ggml_tensor * dst) {
    const ggml_tensor * mask = dst->src[3];
    return (mask && mask->ne[2] != 1) || dst->src[0]->ne[1] > 2;
}

template <int D, ggml_type type_K, ggml_type type_V>
void ggml_cuda_flash_attn_ext_vec_case(ggml_backend_cuda_context & ctx, ggml_tensor * dst); // fattn-vec.cuh

// What the lookup hands out for a scalar turbo pair: the kernel TQ_CUDA_FA selects, or the GQA
// kernel where only it reads the op (logged once when that overrides TQ_CUDA_FA=vec).
template <int D, ggml_type type_K, ggml_type type_V>
static void tq_fattn_turbo_case(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    if (tq_cuda_fa_selected() == TQ_CUDA_FA_GQA) {
        tq_fattn_gqa_case<D, type_K, type_V>(ctx, dst);
    } else if (!tq_cuda_fa_needs_gqa(dst)) {
        ggml_cuda_flash_attn_ext_vec_case<D, type_K, type_V>(ctx, dst);
    } else {
        static bool logged = false;
        if (!logged) {
            logged = true;
            GGML_LOG_INFO("turboquant: TQ_CUDA_FA=vec, but a mask per head or more than 2 queries per head takes the gqa kernel "
                          "(the vector kernel reads neither)\n");
        }
        tq_fattn_gqa_case<D, type_K, type_V>(ctx, dst);
    }
}

#define TQ_FATTN_VEC_CASE_D(D, K, V)                                                            \
    if constexpr (TQ_CUDA_FA_D##D) {                                                            \
        if (head_size == (D) &&                                                                 \
            (type_K == GGML_TYPE_##K || (type_K == GGML_TYPE_F32 && GGML_TYPE_##K == GGML_TYPE_F16)) && \
            (type_V == GGML_TYPE_##V || (type_V == GGML_TYPE_F32 && GGML_TYPE_##V == GGML_TYPE_F16))) { \
            return tq_fattn_turbo_case<D, GGML_TYPE_##K, GGML_TYPE_##V>;                        \
        }                                                                                       \
    }
#define TQ_FATTN_VEC_CASE(K, V) TQ_FATTN_VEC_CASE_D(64, K, V) TQ_FATTN_VEC_CASE_D(128, K, V) TQ_FATTN_VEC_CASE_D(256, K, V)
// trellis pairs: upstream's vector kernel whatever TQ_CUDA_FA says
#define TQ_FATTN_VEC_ONLY_CASE_D(D, K, V)                                                       \
    if constexpr (TQ_CUDA_FA_D##D) {                                                            \
        if (head_size == (D) &&                                                                 \
            (type_K == GGML_TYPE_##K || (type_K == GGML_TYPE_F32 && GGML_TYPE_##K == GGML_TYPE_F16)) && \
            (type_V == GGML_TYPE_##V || (type_V == GGML_TYPE_F32 && GGML_TYPE_##V == GGML_TYPE_F16))) { \
            return ggml_cuda_flash_attn_ext_vec_case<D, GGML_TYPE_##K, GGML_TYPE_##V>;          \
        }                                                                                       \
    }
#define TQ_FATTN_VEC_ONLY_CASE(K, V) TQ_FATTN_VEC_ONLY_CASE_D(64, K, V) TQ_FATTN_VEC_ONLY_CASE_D(128, K, V) TQ_FATTN_VEC_ONLY_CASE_D(256, K, V)

// For ggml_cuda_get_fattn_vec_case in fattn.cu.
#define TQ_FATTN_VEC_CASES TQ_FATTN_FOR_EACH_PAIR(TQ_FATTN_VEC_CASE) TQ_TCQ_FATTN_FOR_EACH_PAIR(TQ_FATTN_VEC_ONLY_CASE)
