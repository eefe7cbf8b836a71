// tq-cuda-set-rows.cuh - SET_ROWS into a turbo tensor for ggml-cuda's set-rows.cu. The patch
// includes this header right before set_rows_cuda<src_t, idx_t> (after set_rows_cuda_quant,
// which it uses) and calls tq_cuda_set_rows before that function's if-chain over dst types:
// it handles a turbo dst and returns true, or returns false and upstream's chain runs.
#pragma once

#include "tq-cuda-ggml.cuh"

template <typename idx_t, typename block_t, void (*quantize)(const float *, block_t *)>
static void tq_cuda_set_rows_launch(const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst,
                                    cudaStream_t stream) {
    GGML_TENSOR_BINARY_OP_LOCALS
    set_rows_cuda_quant<idx_t, block_t, TQ_BLOCK_VALUES, quantize>(
        (const float *) src0->data, (const idx_t *) src1->data, (block_t *) dst->data,
        ne00, ne01, ne02, ne03, ne10, ne11, ne12, ne13,
        nb01, nb02, nb03, nb10, nb11, nb12, nb1, nb2, nb3, stream);
}

// A turbo dst from an f32 source (what TQ_CUDA_SET_ROWS_SUPPORTED claims); false otherwise.
template <typename src_t, typename idx_t>
static bool tq_cuda_set_rows(const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst, cudaStream_t stream) {
    if constexpr (!std::is_same_v<src_t, float>) {
        return false;
    } else {
        switch (dst->type) {
            case GGML_TYPE_TURBO2: tq_cuda_set_rows_launch<idx_t, tq_block_turbo2, tq_cuda_quantize_turbo2>(src0, src1, dst, stream); return true;
            case GGML_TYPE_TURBO3: tq_cuda_set_rows_launch<idx_t, tq_block_turbo3, tq_cuda_quantize_turbo3>(src0, src1, dst, stream); return true;
            case GGML_TYPE_TURBO4: tq_cuda_set_rows_launch<idx_t, tq_block_turbo4, tq_cuda_quantize_turbo4>(src0, src1, dst, stream); return true;
            case GGML_TYPE_TURBO3_TCQ: tq_tcq_set_rows_launch<idx_t, 3>(src0, src1, dst, stream); return true;
            case GGML_TYPE_TURBO2_TCQ: tq_tcq_set_rows_launch<idx_t, 2>(src0, src1, dst, stream); return true;
            default: return false;
        }
    }
}
