// tq-cuda-cpy.cuh - f32 <-> turbo copies for ggml-cuda's cpy.cu. The patch includes this
// header right before ggml_cuda_cpy (after cpy.cu's block-copy kernels, which it uses) and
// calls tq_cuda_cpy first thing in ggml_cuda_cpy: it handles the turbo pairs and returns
// true, or returns false and upstream's if-chain runs as before.
#pragma once

#include "tq-cuda-ggml.cuh"

static __device__ void tq_cpy_blck_f32_turbo2(const char * cxi, char * cdsti) { tq_cuda_quantize_turbo2((const float *) cxi, (tq_block_turbo2 *) cdsti); }
static __device__ void tq_cpy_blck_f32_turbo3(const char * cxi, char * cdsti) { tq_cuda_quantize_turbo3((const float *) cxi, (tq_block_turbo3 *) cdsti); }
static __device__ void tq_cpy_blck_f32_turbo4(const char * cxi, char * cdsti) { tq_cuda_quantize_turbo4((const float *) cxi, (tq_block_turbo4 *) cdsti); }

template <cpy_kernel_t cpy_blck, bool to_turbo>
static void tq_cuda_cpy_launch(const ggml_tensor * src0, ggml_tensor * src1, cudaStream_t stream) {
    const int64_t ne = ggml_nelements(src0);
    GGML_ASSERT(ne == ggml_nelements(src1));
    GGML_ASSERT(ne % TQ_BLOCK_VALUES == 0);
    const int64_t nblk = (ne/TQ_BLOCK_VALUES + CUDA_CPY_BLOCK_SIZE - 1) / CUDA_CPY_BLOCK_SIZE;
    GGML_ASSERT(nblk <= INT_MAX);
    const char * cx = (const char *) src0->data;
    char * cdst = (char *) src1->data;
    if constexpr (to_turbo) {
        cpy_f32_q<cpy_blck, TQ_BLOCK_VALUES><<<nblk, CUDA_CPY_BLOCK_SIZE, 0, stream>>>(cx, cdst, ne,
            src0->ne[0], src0->ne[1], src0->ne[2], src0->nb[0], src0->nb[1], src0->nb[2], src0->nb[3],
            src1->ne[0], src1->ne[1], src1->ne[2], src1->nb[0], src1->nb[1], src1->nb[2], src1->nb[3]);
    } else {
        cpy_q_f32<cpy_blck, TQ_BLOCK_VALUES><<<nblk, CUDA_CPY_BLOCK_SIZE, 0, stream>>>(cx, cdst, ne,
            src0->ne[0], src0->ne[1], src0->ne[2], src0->nb[0], src0->nb[1], src0->nb[2], src0->nb[3],
            src1->ne[0], src1->ne[1], src1->ne[2], src1->nb[0], src1->nb[1], src1->nb[2], src1->nb[3]);
    }
}

// f32 -> turbo and turbo -> f32 (what TQ_CUDA_CPY_SUPPORTED claims); false for anything else.
static bool tq_cuda_cpy(const ggml_tensor * src0, ggml_tensor * src1, cudaStream_t stream) {
    if (src0->type == GGML_TYPE_F32) {
        switch (src1->type) {
            case GGML_TYPE_TURBO2: tq_cuda_cpy_launch<tq_cpy_blck_f32_turbo2, true>(src0, src1, stream); return true;
            case GGML_TYPE_TURBO3: tq_cuda_cpy_launch<tq_cpy_blck_f32_turbo3, true>(src0, src1, stream); return true;
            case GGML_TYPE_TURBO4: tq_cuda_cpy_launch<tq_cpy_blck_f32_turbo4, true>(src0, src1, stream); return true;
            case GGML_TYPE_TURBO3_TCQ: tq_tcq_cpy_f32_launch<3>(src0, src1, stream); return true; // a warp per block
            case GGML_TYPE_TURBO2_TCQ: tq_tcq_cpy_f32_launch<2>(src0, src1, stream); return true;
            default: return false;
        }
    }
    if (src1->type == GGML_TYPE_F32) {
        switch (src0->type) {
            case GGML_TYPE_TURBO2: tq_cuda_cpy_launch<cpy_blck_q_f32<tq_cuda_dequantize_turbo2, TQ_BLOCK_VALUES>, false>(src0, src1, stream); return true;
            case GGML_TYPE_TURBO3: tq_cuda_cpy_launch<cpy_blck_q_f32<tq_cuda_dequantize_turbo3, TQ_BLOCK_VALUES>, false>(src0, src1, stream); return true;
            case GGML_TYPE_TURBO4: tq_cuda_cpy_launch<cpy_blck_q_f32<tq_cuda_dequantize_turbo4, TQ_BLOCK_VALUES>, false>(src0, src1, stream); return true;
            case GGML_TYPE_TURBO3_TCQ: tq_cuda_cpy_launch<cpy_blck_q_f32<tq_cuda_dequantize_turbo3_tcq, TQ_BLOCK_VALUES>, false>(src0, src1, stream); return true;
            case GGML_TYPE_TURBO2_TCQ: tq_cuda_cpy_launch<cpy_blck_q_f32<tq_cuda_dequantize_turbo2_tcq, TQ_BLOCK_VALUES>, false>(src0, src1, stream); return true;
            default: return false;
        }
    }
    return false;
}
