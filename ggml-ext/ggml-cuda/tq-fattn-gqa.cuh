// tq-fattn-gqa.cuh - a GQA-aware flash-attention decode kernel for turbo K and/or V caches
// (TQ_CUDA_FA=gqa, the default; TQ_CUDA_FA=vec selects upstream's vector kernel with the
// turbo hooks of tq-fattn.cuh, for A/B).
//
// Why: upstream's vector kernel gives every Q head its own thread block, so with GQA each K/V
// row is read and decoded once per Q head (4-8 times), and a turbo row costs about three
// times the instructions of an f16 one. Here one block takes all the Q heads that share a KV
// head (up to 8 "Q vectors" per block: heads x queries) and decodes each row once for all of
// them: the decode is amortised over the heads, the per-head work is one FMA per value.
//
// Work split (128 threads, tiles of 128 keys, launch_fattn's parallel blocks over the KV
// length and its combine kernel, as upstream's vector kernel):
//   K.Q: D/8 threads per key row, 8 values each (tq-fattn-gqa-decode.cuh); the Q values they
//        meet stay in registers for every Q vector; the NQ partial dots are reduced over the
//        row's threads with a transposing butterfly (NQ-1 + log2(D/8 / NQ) shuffles per
//        thread instead of NQ log2(D/8)).
//   softmax: one warp per Q vector, scores in shared memory.
//   V:   D/8 threads per row again, 8 output dims each, NQ accumulators per dim in registers;
//        the row groups are summed through shared memory at the end.
// The per-block scale is sanitised once per row and folded into the dot (K) or the softmax
// weight (V), so the inner loops are a shift, a shuffle (the codebook lookup) and NQ FMAs
// per value.
#pragma once

#include "common.cuh"
#include "fattn-common.cuh"
#include "tq-fattn-gqa-decode.cuh"

#define TQ_GQA_NTHREADS 128 // 4 warps
#define TQ_GQA_TILE     128 // keys per tile; FA decode runs on KV lengths that are multiples of 256
#define TQ_GQA_MAX_NQ     8 // Q vectors per block (Q heads sharing a KV head x queries)

// 2..4 for turbo2..4, 0 for the other K/V types the kernel reads (f16, q8_0).
template <ggml_type type> constexpr __host__ __device__ int tq_gqa_bits() {
    return type == GGML_TYPE_TURBO2 ? 2 : type == GGML_TYPE_TURBO3 ? 3 : type == GGML_TYPE_TURBO4 ? 4 : 0;
}
template <ggml_type type> constexpr __host__ __device__ int tq_gqa_cb_bits() { return tq_gqa_bits<type>() ? tq_gqa_bits<type>() : 2; }

// Position in its 64-value chunk of value e of slot u (the dim a thread's Q value or output
// belongs to).
template <ggml_type type> static __device__ __forceinline__ int tq_gqa_row_pos(const int u, const int e) {
    if constexpr (tq_gqa_bits<type>() != 0) {
        return tq_gqa_pos<tq_gqa_bits<type>()>(u, e);
    } else {
        return 8*u + e;
    }
}

// Slot u's 8 values of 64-value chunk c of a K/V row: value = scale * vals[e].
template <ggml_type type>
static __device__ __forceinline__ void tq_gqa_row_load(const char * GGML_CUDA_RESTRICT row, const int c, const int u,
        const tq_gqa_codebook<tq_gqa_cb_bits<type>()> & cb, float & scale, float (&vals)[8]) {
    constexpr int bits = tq_gqa_bits<type>();
    if constexpr (bits != 0) {
        tq_gqa_load_turbo<bits>((const typename tq_cuda_type<bits>::block *) row + c, u, cb, scale, vals);
    } else if constexpr (type == GGML_TYPE_F16) {
        GGML_UNUSED(cb);
        half2 h[4];
        ggml_cuda_memcpy_1<16>(h, (const half2 *) row + 32*c + 4*u);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(h[i]);
            vals[2*i] = f.x;
            vals[2*i + 1] = f.y;
        }
        scale = 1.0f;
    } else {
        static_assert(type == GGML_TYPE_Q8_0, "turbo2..4, f16 or q8_0");
        GGML_UNUSED(cb);
        const block_q8_0 * b = (const block_q8_0 *) row + 2*c + (u >> 2);
        const uint8_t * q = (const uint8_t *) b->qs + 8*(u & 3);
        const uint32_t w0 = tq_gqa_load_u32(q);
        const uint32_t w1 = tq_gqa_load_u32(q + 4);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            vals[i]     = (float) (int8_t) (w0 >> (8*i));
            vals[4 + i] = (float) (int8_t) (w1 >> (8*i));
        }
        scale = __half2float(b->d);
    }
}

// Q vector owned after tq_gqa_reduce by a lane whose position in its row group is t: the low
// log2(NQ) bits of t, reversed.
template <int NQ> static __device__ __forceinline__ int tq_gqa_owner(const int t) {
    int v = 0;
#pragma unroll
    for (int b = 1; b < NQ; b <<= 1) {
        v = 2*v + ((t & b) != 0);
    }
    return v;
}

// Sums s[0..NQ) over the TPR consecutive lanes of a row group. Each step halves the values a
// lane keeps, so afterwards s[0] holds the full sum of vector tq_gqa_owner<NQ>(t).
template <int NQ, int TPR> static __device__ __forceinline__ void tq_gqa_reduce(float (&s)[NQ]) {
    static_assert(NQ <= TPR && TPR <= WARP_SIZE, "bad row group");
#pragma unroll
    for (int off = 1; off < NQ; off <<= 1) {
        const bool upper = (threadIdx.x & off) != 0;
#pragma unroll
        for (int i = 0; i < NQ/(2*off); ++i) {
            const int half_n = NQ/(2*off);
            const float send = upper ? s[i] : s[i + half_n];
            const float keep = upper ? s[i + half_n] : s[i];
            s[i] = keep + __shfl_xor_sync(0xFFFFFFFF, send, off, WARP_SIZE);
        }
    }
#pragma unroll
    for (int off = NQ; off < TPR; off <<= 1) {
        s[0] += __shfl_xor_sync(0xFFFFFFFF, s[0], off, WARP_SIZE);
    }
}

// The kernel. Grid (launch_fattn, no stream-k): x = query tiles of ncols1 (1 or 2) queries,
// y = parallel blocks over the KV length, z = (sequence, KV head, group of NQ/ncols1 Q heads).
// Q vector v of a block is query v / G, head v % G of its group (G = NQ/ncols1).
template <int D, int NQ, ggml_type type_K, ggml_type type_V>
__launch_bounds__(TQ_GQA_NTHREADS, 1)
static __global__ void tq_flash_attn_ext_gqa(
        const char * Q_ptr,
        const char * K_ptr,
        const char * V_ptr,
        const char * mask_ptr,
        const char * sinks_ptr,
        const int  * KV_max_ptr,
        float      * dst_ptr,
        float2     * dst_meta_ptr,
        const float scale,
        const float max_bias,
        const float m0,
        const float m1,
        const uint32_t n_head_log2,
        const float logit_softcap,
        const int32_t ne00, const uint3   ne01, const int32_t ne02, const int32_t ne03,
                            const int32_t nb01, const int32_t nb02, const int32_t nb03,
        const int32_t ne10, const int32_t ne11, const int32_t ne12, const int32_t ne13,
                            const int32_t nb11, const int32_t nb12, const int64_t nb13,
                            const int32_t nb21, const int32_t nb22, const int64_t nb23,
                            const int32_t ne31, const int32_t ne32, const int32_t ne33,
                            const int32_t nb31, const int32_t nb32, const int64_t nb33) {
    ggml_cuda_pdl_lc();
#ifdef FLASH_ATTN_AVAILABLE
    // upstream's rule (common.cuh, GGML_CUDA_RESTRICT): with programmatic dependent launch on
    // Hopper the previous kernel may still be writing what these point to when this one
    // starts, so they are not __restrict__ there; the parameters never are
    const char * GGML_CUDA_RESTRICT Q        = Q_ptr;
    const char * GGML_CUDA_RESTRICT K        = K_ptr;
    const char * GGML_CUDA_RESTRICT V        = V_ptr;
    const char * GGML_CUDA_RESTRICT mask     = mask_ptr;
    const char * GGML_CUDA_RESTRICT sinks    = sinks_ptr;
    const int  * GGML_CUDA_RESTRICT KV_max   = KV_max_ptr;
    float      * GGML_CUDA_RESTRICT dst      = dst_ptr;
    float2     * GGML_CUDA_RESTRICT dst_meta = dst_meta_ptr;
    constexpr int TPR    = D/8;                     // threads per K/V row
    constexpr int P      = TQ_GQA_NTHREADS/TPR;     // rows in flight
    constexpr int T      = TQ_GQA_TILE;
    constexpr int nwarps = TQ_GQA_NTHREADS/WARP_SIZE;
    constexpr int VPW    = (NQ + nwarps - 1)/nwarps; // Q vectors per warp in the softmax
    static_assert(D % 64 == 0 && TPR <= WARP_SIZE && NQ <= TPR && T % P == 0 && T % WARP_SIZE == 0, "bad configuration");
    GGML_UNUSED_VARS(ne00, ne10, ne13, ne31);

    const int tid  = threadIdx.y*WARP_SIZE + threadIdx.x;
    const int t    = tid % TPR; // slot of the thread in its row: chunk c, slot u
    const int g    = tid / TPR; // row group
    const int c    = t / TQ_GQA_SLOTS;
    const int u    = t % TQ_GQA_SLOTS;
    const int lane = threadIdx.x;
    const int warp = threadIdx.y;

    const int n01      = int(ne01.z);
    const int ncols1   = (n01 + int(gridDim.x) - 1)/int(gridDim.x); // 1 or 2: the host launches ceil(n01/ncols1) tiles
    const int G        = NQ/ncols1;
    const int gqa      = ne02/ne12;
    const int ntiles_z = int(gridDim.z)/(ne12*ne03);
    const int zg       = blockIdx.z % ntiles_z;
    const int head_kv  = (blockIdx.z/ntiles_z) % ne12;
    const int sequence = blockIdx.z/(ntiles_z*ne12);
    const int ic0      = blockIdx.x*ncols1;

    // Q vector v: query column, head, and whether it exists (G may exceed the group's rest).
    auto vec_col   = [&](const int v) { return ic0 + v/G; };
    auto vec_head  = [&](const int v) { return head_kv*gqa + zg*G + v % G; };
    auto vec_valid = [&](const int v) { return vec_col(v) < n01 && zg*G + v % G < gqa; };

    __shared__ float KQs[NQ][T];            // scores, then softmax weights, of the tile
    __shared__ float alpha_s[NQ];           // rescale factor of the accumulators
    __shared__ float M_s[NQ], L_s[NQ];
    __shared__ float red[P][NQ][D];         // row groups' accumulators, summed at the end

    const tq_gqa_codebook<tq_gqa_cb_bits<type_K>()> cbK;
    const tq_gqa_codebook<tq_gqa_cb_bits<type_V>()> cbV;

    ggml_cuda_pdl_sync();

    // Q in registers: the 8 values of each vector that this thread's K slot meets, scaled.
    float q[NQ][8];
#pragma unroll
    for (int v = 0; v < NQ; ++v) {
        const float * Qv = (const float *) (Q + int64_t(nb03)*sequence + int64_t(nb02)*vec_head(v) + int64_t(nb01)*vec_col(v));
        const bool ok = vec_valid(v);
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            q[v][e] = ok ? scale*Qv[64*c + tq_gqa_row_pos<type_K>(u, e)] : 0.0f;
        }
    }

    // The lane that writes a score (t < NQ) writes vector my_v: its mask row and ALiBi slope. A
    // mask may differ per head (ne32 > 1, broadcast over ne02/ne32 heads as on the CPU): the
    // lowered turbo K terms (docs/KV-CACHE.md).
    const int  my_v     = tq_gqa_owner<NQ>(t);
    const bool my_valid = vec_valid(my_v);
    const half * my_mask = mask && my_valid ? (const half *) (mask + nb33*(sequence % ne33) + int64_t(nb32)*(vec_head(my_v) % ne32) +
                                                              int64_t(nb31)*vec_col(my_v)) : nullptr;
    const float my_slope = my_valid ? get_alibi_slope(max_bias, vec_head(my_v), n_head_log2, m0, m1) : 0.0f;

    float M[VPW], L[VPW];
#pragma unroll
    for (int i = 0; i < VPW; ++i) {
        M[i] = -FLT_MAX/2.0f;
        L[i] = 0.0f;
    }
    float acc[NQ][8];
#pragma unroll
    for (int v = 0; v < NQ; ++v) {
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            acc[v][e] = 0.0f;
        }
    }

    K += nb13*sequence + int64_t(nb12)*head_kv;
    V += nb23*sequence + int64_t(nb22)*head_kv;
    // launch_fattn's KV_max scans head 0's mask only: with a mask per head every key is read
    const int k_max = KV_max && ne32 <= 1 ? KV_max[sequence*gridDim.x + blockIdx.x] : ne11;

    for (int kv0 = blockIdx.y*T; kv0 < k_max; kv0 += gridDim.y*T) {
        // 1. Scores: each K row decoded once for all NQ vectors.
#pragma unroll
        for (int r0 = 0; r0 < T; r0 += P) {
            const int r = r0 + g;
            float ks, kv[8];
            tq_gqa_row_load<type_K>(K + int64_t(kv0 + r)*nb11, c, u, cbK, ks, kv);
            float s[NQ];
#pragma unroll
            for (int v = 0; v < NQ; ++v) {
                float a = 0.0f;
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    a += q[v][e]*kv[e];
                }
                s[v] = a*ks;
            }
            tq_gqa_reduce<NQ, TPR>(s);
            if (t < NQ) {
                float x = s[0];
                if (logit_softcap != 0.0f) {
                    x = logit_softcap*tanhf(x);
                }
                if (my_mask) {
                    x += my_slope*__half2float(my_mask[kv0 + r]);
                }
                KQs[my_v][r] = x;
            }
        }
        __syncthreads();

        // 2. Online softmax, one warp per Q vector.
#pragma unroll
        for (int i = 0; i < VPW; ++i) {
            const int v = warp + nwarps*i;
            if (v < NQ) {
                float x[T/WARP_SIZE];
                float mx = -FLT_MAX/2.0f;
#pragma unroll
                for (int j = 0; j < T/WARP_SIZE; ++j) {
                    x[j] = KQs[v][lane + WARP_SIZE*j];
                    mx = fmaxf(mx, x[j]);
                }
                mx = warp_reduce_max(mx);
                const float Mn = fmaxf(M[i], mx);
                const float alpha = expf(M[i] - Mn);
                float sum = 0.0f;
#pragma unroll
                for (int j = 0; j < T/WARP_SIZE; ++j) {
                    const float p = expf(x[j] - Mn);
                    KQs[v][lane + WARP_SIZE*j] = p;
                    sum += p;
                }
                sum = warp_reduce_sum(sum);
                L[i] = L[i]*alpha + sum;
                M[i] = Mn;
                if (lane == 0) {
                    alpha_s[v] = alpha;
                }
            }
        }
        __syncthreads();

        // 3. V: each row decoded once, weighted into NQ accumulators per dim.
#pragma unroll
        for (int v = 0; v < NQ; ++v) {
            const float a = alpha_s[v];
#pragma unroll
            for (int e = 0; e < 8; ++e) {
                acc[v][e] *= a;
            }
        }
#pragma unroll
        for (int r0 = 0; r0 < T; r0 += P) {
            const int r = r0 + g;
            float vs, vv[8];
            tq_gqa_row_load<type_V>(V + int64_t(kv0 + r)*nb21, c, u, cbV, vs, vv);
#pragma unroll
            for (int v = 0; v < NQ; ++v) {
                const float w = KQs[v][r]*vs;
#pragma unroll
                for (int e = 0; e < 8; ++e) {
                    acc[v][e] += w*vv[e];
                }
            }
        }
        __syncthreads(); // KQs is overwritten by the next tile
    }

    // Attention sinks (first parallel block only, as upstream), then the block's softmax state.
#pragma unroll
    for (int i = 0; i < VPW; ++i) {
        const int v = warp + nwarps*i;
        if (v < NQ) {
            float f = 1.0f;
            if (sinks && blockIdx.y == 0 && vec_valid(v)) {
                const float sink = ((const float *) sinks)[vec_head(v)];
                const float Mn = fmaxf(M[i], sink);
                f = expf(M[i] - Mn);
                L[i] = L[i]*f + expf(sink - Mn);
                M[i] = Mn;
            }
            if (lane == 0) {
                alpha_s[v] = f;
                M_s[v] = M[i];
                L_s[v] = L[i];
            }
        }
    }
    __syncthreads();

#pragma unroll
    for (int v = 0; v < NQ; ++v) {
        const float f = alpha_s[v];
#pragma unroll
        for (int e = 0; e < 8; ++e) {
            red[g][v][64*c + tq_gqa_row_pos<type_V>(u, e)] = acc[v][e]*f;
        }
    }
    __syncthreads();

    for (int o = tid; o < NQ*D; o += TQ_GQA_NTHREADS) {
        const int v = o / D;
        const int i = o % D;
        if (!vec_valid(v)) {
            continue;
        }
        float x = 0.0f;
#pragma unroll
        for (int gg = 0; gg < P; ++gg) {
            x += red[gg][v][i];
        }
        if (gridDim.y == 1) {
            x /= L_s[v];
        }
        dst[((int64_t(sequence*n01 + vec_col(v))*ne02 + vec_head(v))*gridDim.y + blockIdx.y)*D + i] = x;
    }
    if (gridDim.y != 1 && tid < NQ && vec_valid(tid)) {
        dst_meta[(int64_t(sequence*n01 + vec_col(tid))*ne02 + vec_head(tid))*gridDim.y + blockIdx.y] = make_float2(M_s[tid], L_s[tid]);
    }
#else
    GGML_UNUSED_VARS(Q_ptr, K_ptr, V_ptr, mask_ptr, sinks_ptr, KV_max_ptr, dst_ptr, dst_meta_ptr, scale,
        max_bias, m0, m1, n_head_log2, logit_softcap,
        ne00, ne01, ne02, ne03,
              nb01, nb02, nb03,
        ne10, ne11, ne12, ne13,
              nb11, nb12, nb13,
              nb21, nb22, nb23,
              ne31, ne32, ne33,
              nb31, nb32, nb33);
    NO_DEVICE_CODE;
#endif // FLASH_ATTN_AVAILABLE
}

template <int D, int NQ, ggml_type type_K, ggml_type type_V>
static void tq_fattn_gqa_launch(ggml_backend_cuda_context & ctx, ggml_tensor * dst, const int ncols1) {
    const fattn_kernel_t kernel = tq_flash_attn_ext_gqa<D, NQ, type_K, type_V>;
    // An f32 K/V arrives here as the f16 instance (as in upstream's vector-kernel lookup);
    // launch_fattn converts it to f16 first.
    const bool need_f16_K = type_K == GGML_TYPE_F16;
    const bool need_f16_V = type_V == GGML_TYPE_F16;
    constexpr int nwarps = TQ_GQA_NTHREADS/WARP_SIZE;
    if (ncols1 == 1) {
        launch_fattn<D, 1, NQ>(ctx, dst, kernel, nwarps, 0, TQ_GQA_TILE, need_f16_K, need_f16_V, false, false);
    } else if constexpr (NQ >= 2) {
        launch_fattn<D, 2, NQ/2>(ctx, dst, kernel, nwarps, 0, TQ_GQA_TILE, need_f16_K, need_f16_V, false, false);
    } else {
        GGML_ABORT("turboquant: GQA flash-attention kernel: 2 queries need at least 2 Q vectors per block");
    }
}

// The entry point, a fattn_vec_case_t: TQ_FATTN_VEC_CASES (tq-fattn.cuh) hands it out instead
// of upstream's ggml_cuda_flash_attn_ext_vec_case when TQ_CUDA_FA=gqa.
template <int D, ggml_type type_K, ggml_type type_V>
void tq_fattn_gqa_case(ggml_backend_cuda_context & ctx, ggml_tensor * dst) {
    const ggml_tensor * Q = dst->src[0];
    const ggml_tensor * K = dst->src[1];
    const ggml_tensor * V = dst->src[2];
    if (Q == nullptr || K == nullptr || V == nullptr) {
        GGML_ABORT("turboquant: GQA flash-attention kernel: missing Q, K or V");
    }
    if (Q->ne[0] != D || K->ne[0] != D || V->ne[0] != D) {
        GGML_ABORT("turboquant: GQA flash-attention kernel for head size %d called with Q/K/V head sizes %lld/%lld/%lld",
                   D, (long long) Q->ne[0], (long long) K->ne[0], (long long) V->ne[0]);
    }
    if (Q->ne[1] < 1) {
        GGML_ABORT("turboquant: GQA flash-attention kernel: no queries");
    }
    const ggml_tensor * mask = dst->src[3];
    if (mask && (mask->ne[2] <= 0 || Q->ne[2] % mask->ne[2] != 0)) {
        GGML_ABORT("turboquant: GQA flash-attention kernel: a mask of %lld heads does not broadcast over %lld Q heads",
                   (long long) mask->ne[2], (long long) Q->ne[2]);
    }
    if (K->ne[1] % TQ_GQA_TILE != 0 || K->ne[2] <= 0 || Q->ne[2] % K->ne[2] != 0 || V->ne[2] != K->ne[2]) {
        GGML_ABORT("turboquant: GQA flash-attention kernel: KV length %lld is not a multiple of %d or %lld Q heads do not group over %lld KV heads",
                   (long long) K->ne[1], TQ_GQA_TILE, (long long) Q->ne[2], (long long) K->ne[2]);
    }
    // queries in tiles of 1 or 2 (more than 2: several tiles, each reading the K/V rows once)
    const int ncols1 = Q->ne[1] == 1 ? 1 : 2;
    const int gqa    = (int) (Q->ne[2]/K->ne[2]);
    int G = 1; // Q heads per block: the group, rounded up to a power of two, within TQ_GQA_MAX_NQ vectors
    while (G < gqa && ncols1*G < TQ_GQA_MAX_NQ) {
        G *= 2;
    }
    switch (ncols1*G) {
        case 1: tq_fattn_gqa_launch<D, 1, type_K, type_V>(ctx, dst, ncols1); break;
        case 2: tq_fattn_gqa_launch<D, 2, type_K, type_V>(ctx, dst, ncols1); break;
        case 4: tq_fattn_gqa_launch<D, 4, type_K, type_V>(ctx, dst, ncols1); break;
        case 8: tq_fattn_gqa_launch<D, 8, type_K, type_V>(ctx, dst, ncols1); break;
        default: GGML_ABORT("turboquant: GQA flash-attention kernel: bad block shape");
    }
}

// For the generated instance files (ggml-ext/cmake/turboquant-cuda.cmake).
#define TQ_DECL_FATTN_GQA_CASE(D, type_K, type_V) \
    template void tq_fattn_gqa_case<D, type_K, type_V>(ggml_backend_cuda_context & ctx, ggml_tensor * dst)
