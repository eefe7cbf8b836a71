// tq-tcq-fattn.cuh - trellis K and V (turbo3_tcq / turbo2_tcq) inside ggml-cuda's
// flash-attention vector (decode) kernel. Included by tq-fattn.cuh, whose dispatch hands
// these out for the trellis types.
//
// K.Q: the layout of the scalar turbo K (tq-fattn.cuh): 8 threads per key row, Q in f32 (or
// half2) registers, thread t holding values 8t .. 8t+7 of every 64-value block - exactly one
// trellis group, whose eight states are one 32-bit window of the payload (docs/TCQ.md,
// "States without a serial loop"): four byte loads and eight shifts, no serial recursion.
// The 256-entry table (1 KB per type) is copied into shared memory once per CUDA block by
// tq_tcq_fattn_prologue, which the patched kernel calls before its main loop, and read
// there by data-dependent index.
#pragma once

#include "tq-tcq.cuh"

template <ggml_type type> constexpr __host__ __device__ int tq_tcq_fattn_k() {
    return type == GGML_TYPE_TURBO3_TCQ ? 3 : 2;
}

// The shared-memory copy of the table of k (one per kernel and type).
template <int K> static __device__ __forceinline__ float * tq_tcq_fattn_table() {
    __shared__ float table[256];
    return table;
}

template <int K> static __device__ __forceinline__ void tq_tcq_fattn_fill() {
    float * dst = tq_tcq_fattn_table<K>();
    const float * src = tq_tcq_type<K>::table();
    const int nthr = blockDim.x * blockDim.y;
    for (int i = threadIdx.y * blockDim.x + threadIdx.x; i < 256; i += nthr) {
        dst[i] = src[i];
    }
}

// Called by every thread of the CUDA block before the first K/V access (a __syncthreads for
// trellis K or V; nothing otherwise).
template <ggml_type type_K, ggml_type type_V>
static __device__ __forceinline__ void tq_tcq_fattn_prologue() {
    if constexpr (TQ_GGML_IS_TCQ(type_K) || TQ_GGML_IS_TCQ(type_V)) {
        if constexpr (TQ_GGML_IS_TCQ(type_K)) {
            tq_tcq_fattn_fill<tq_tcq_fattn_k<type_K>()>();
        }
        if constexpr (TQ_GGML_IS_TCQ(type_V) && type_V != type_K) {
            tq_tcq_fattn_fill<tq_tcq_fattn_k<type_V>()>();
        }
        __syncthreads();
    }
}

template <int D, int nthreads, int K>
static __device__ __forceinline__ float tq_tcq_vec_dot_KQ(
    const char * __restrict__ K_c, const void * __restrict__ Q_v, const int * __restrict__ Q_q8, const void * __restrict__ Q_ds) {
    GGML_UNUSED(Q_q8);
    GGML_UNUSED(Q_ds);
    static_assert(nthreads == 8 && D % TQ_BLOCK_VALUES == 0, "trellis K needs the f16 Q layout of Volta (sm_70) or newer: 8 threads, 8 values each per block");
    typedef typename tq_tcq_type<K>::block block;

    const block * Kb = (const block *) K_c;
    const int t = threadIdx.x % nthreads;
    const float * table = tq_tcq_fattn_table<K>();

    float sum = 0.0f;
#pragma unroll
    for (int b = 0; b < D/TQ_BLOCK_VALUES; ++b) {
        const uint32_t w = tq_tcq_window<K>(Kb[b].qs, t);
        float part = 0.0f;
#pragma unroll
        for (int m = 0; m < 4; ++m) {
#ifdef V_DOT2_F32_F16_AVAILABLE
            const float2 q = __half22float2(((const half2 *) Q_v)[4*b + m]);
#else
            const float2 q = ((const float2 *) Q_v)[4*b + m];
#endif // V_DOT2_F32_F16_AVAILABLE
            part += q.x * table[tq_tcq_window_state<K>(w, 2*m)];
            part += q.y * table[tq_tcq_window_state<K>(w, 2*m + 1)];
        }
        sum += tq_cuda_scale(Kb[b].d) * part;
    }
    return sum;
}

// Values i0 .. i0+ne-1 (i0 a multiple of ne, ne = 4 or 8: within one group) of a V row.
template <typename T, int ne, int K>
static __device__ __forceinline__ void tq_tcq_dequantize_V(const void * __restrict__ vx, void * __restrict__ dst, const int64_t i0) {
    static_assert(ne == 4 || ne == 8, "bad ne");
    typedef typename tq_tcq_type<K>::block block;

    const block * x = (const block *) vx + i0/TQ_BLOCK_VALUES;
    const int j0 = (int) (i0 % TQ_BLOCK_VALUES);
    const float * table = tq_tcq_fattn_table<K>();
    const float d = tq_cuda_scale(x->d);
    const uint32_t w = tq_tcq_window<K>(x->qs, j0 / 8);

#pragma unroll
    for (int l = 0; l < ne/2; ++l) {
        const float a = d * table[tq_tcq_window_state<K>(w, j0 % 8 + 2*l)];
        const float c = d * table[tq_tcq_window_state<K>(w, j0 % 8 + 2*l + 1)];
        if constexpr (std::is_same_v<T, half>) {
            ((half2 *) dst)[l] = make_half2(a, c);
        } else {
            static_assert(std::is_same_v<T, float>, "half or float");
            ((float2 *) dst)[l] = make_float2(a, c);
        }
    }
}

// The trellis K/V pairs with vector-kernel instances (turboquant-cuda.cmake generates one
// file per pair, from the same list): a trellis K with a trellis, q8_0 or f16 V, and q8_0 or
// f16 K with a trellis V. Other pairs with a trellis side (with a scalar turbo type) run
// through upstream's conversion of K/V to f16.
#define TQ_TCQ_FATTN_FOR_EACH_PAIR(X)                                                           \
    X(TURBO3_TCQ, TURBO3_TCQ) X(TURBO3_TCQ, TURBO2_TCQ) X(TURBO3_TCQ, Q8_0) X(TURBO3_TCQ, F16)  \
    X(TURBO2_TCQ, TURBO3_TCQ) X(TURBO2_TCQ, TURBO2_TCQ) X(TURBO2_TCQ, Q8_0) X(TURBO2_TCQ, F16)  \
    X(Q8_0, TURBO3_TCQ) X(Q8_0, TURBO2_TCQ)                                                     \
    X(F16,  TURBO3_TCQ) X(F16,  TURBO2_TCQ)
