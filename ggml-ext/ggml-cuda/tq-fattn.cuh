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

#define TQ_FATTN_VEC_CASE_D(D, K, V)                                                            \
    if constexpr (TQ_CUDA_FA_D##D) {                                                            \
        if (head_size == (D) &&                                                                 \
            (type_K == GGML_TYPE_##K || (type_K == GGML_TYPE_F32 && GGML_TYPE_##K == GGML_TYPE_F16)) && \
            (type_V == GGML_TYPE_##V || (type_V == GGML_TYPE_F32 && GGML_TYPE_##V == GGML_TYPE_F16))) { \
            return tq_cuda_fa_selected() == TQ_CUDA_FA_GQA                                      \
                ? tq_fattn_gqa_case<D, GGML_TYPE_##K, GGML_TYPE_##V>                            \
                : ggml_cuda_flash_attn_ext_vec_case<D, GGML_TYPE_##K, GGML_TYPE_##V>;           \
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
