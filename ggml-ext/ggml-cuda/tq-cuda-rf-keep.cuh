// tq-cuda-rf-keep.cuh - the fused K side of the K mean in RoPE's frame on CUDA: the kernel of
// the GGML_OP_CUSTOM whose function is tq_rf_keep_op (ggml-ext/ggml/tq-rf-keep.h). Without it,
// ggml-cuda refuses that node and llama builds the same values from about ten elementwise
// ops a layer, each a kernel launch.
//
// One block per (token t, KV head h), a thread per RoPE pair i (stride 64): k' = s k - R_t mu'
// on the pair's two channels, then q' = q / s and A = [alpha; beta] for the head's g query
// heads. The channels come from tq_rf_ch itself (tq-rf-rows.h, __host__ __device__ under
// nvcc); each float expression is tq_rf_keep_rows' in its order, written with the exactly
// rounded shims of tq-cuda.cuh (no FMA contraction, IEEE division under -use_fast_math), so
// the kernel gives the CPU's bits. The pair function is __host__ __device__: tq-parity checks
// its host build, and on a GPU the kernel, against tq_rf_keep_rows bit for bit.
//
// No ggml here (tq-parity builds it without ggml's headers); ggml-cuda's glue is in
// tq-cuda-ggml.cuh.
#pragma once

#include "tq-cuda.cuh"
#include "tq-rf-rows.h"

#define TQ_CUDA_RF_KEEP_THREADS 64

static TQ_HD const float * tq_cuda_rf_at(const float * base, size_t bytes) {
    return (const float *) ((const char *) base + bytes);
}

// Pair i of row (t, h): what tq_rf_keep_rows writes for channels tq_rf_ch(i, 0) and (i, 1)
// of k', of each q' row of the head, and A's alpha_i and beta_i.
static TQ_HD void tq_cuda_rf_keep_pair(const tq_rf_keep_args & a, int64_t h, int64_t t, int64_t i) {
    const tq_rf_pairs pr = tq_rf_pairs_of_bits(a.flags);
    const bool bal = (a.flags & TQ_RF_KEEP_BAL) != 0;
    const int64_t hd = a.hd, half = hd / 2, g = a.nq / a.nkv;
    const int64_t ca = tq_rf_ch(pr, hd, i, 0), cb = tq_rf_ch(pr, hd, i, 1);
    const float * mu = tq_cuda_rf_at(a.m, (size_t) (t / a.per) * a.m_nb1);
    const float * m = mu + h * hd, * d = bal ? mu + hd * a.nkv + h * hd : m;
    const float ma = m[ca], mb = m[cb];
    float ra = ma, rb = mb;
    if (a.tab) {
        const float * col = tq_cuda_rf_at(a.tab, (size_t) t * a.t_nb1);
        const float c = col[i], sn = col[half + i];
        ra = tq_fsub(tq_fmul(c, ma), tq_fmul(sn, mb));
        rb = tq_fadd(tq_fmul(sn, ma), tq_fmul(c, mb));
    }
    const float sa = bal ? tq_fadd(1.0f, d[ca]) : 1.0f, sb = bal ? tq_fadd(1.0f, d[cb]) : 1.0f;
    const float * kx = tq_cuda_rf_at(a.k, (size_t) h * a.k_nb1 + (size_t) t * a.k_nb2);
    float * ko = a.d + (t * a.nkv + h) * hd;
    ko[ca] = tq_fsub(bal ? tq_fmul(kx[ca], sa) : kx[ca], ra);
    ko[cb] = tq_fsub(bal ? tq_fmul(kx[cb], sb) : kx[cb], rb);
    float * qd = a.d + hd * a.nkv * a.nt, * ad = qd + hd * a.nq * a.nt;
    for (int64_t j = h * g; j < (h + 1) * g; ++j) {
        const float * qx = tq_cuda_rf_at(a.q, (size_t) j * a.q_nb1 + (size_t) t * a.q_nb2);
        const float qa = bal ? tq_fdiv(qx[ca], sa) : qx[ca], qb = bal ? tq_fdiv(qx[cb], sb) : qx[cb];
        const int64_t row = (t * a.nq + j) * hd;
        qd[row + ca] = qa;
        qd[row + cb] = qb;
        ad[row + i] = tq_fadd(tq_fmul(qa, ma), tq_fmul(qb, mb));
        ad[row + half + i] = tq_fsub(tq_fmul(qb, ma), tq_fmul(qa, mb));
    }
}

static __global__ void tq_cuda_rf_keep_kernel(const tq_rf_keep_args a) {
    const int64_t r = blockIdx.x, h = r % a.nkv, t = r / a.nkv;
    for (int64_t i = threadIdx.x; i < a.hd / 2; i += blockDim.x) {
        tq_cuda_rf_keep_pair(a, h, t, i);
    }
}

// Whether the kernel's grid covers the node's rows (one block each, gridDim.x < 2^31).
static inline bool tq_cuda_rf_keep_grid_ok(const tq_rf_keep_args & a) {
    return a.nkv > 0 && a.nt > 0 && a.nkv * a.nt <= INT32_MAX;
}

static inline void tq_cuda_rf_keep_launch(const tq_rf_keep_args & a, cudaStream_t stream) {
    tq_cuda_rf_keep_kernel<<<(unsigned) (a.nkv * a.nt), TQ_CUDA_RF_KEEP_THREADS, 0, stream>>>(a);
}
