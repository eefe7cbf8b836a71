// tq-cuda-ggml.cuh - what ggml-cuda's dispatch tables need to know about the turbo types.
//
// The patch adds one include of this header to each hooked upstream file and expands one
// macro per table; the kernels are ggml's own generic templates (one thread per 64-value
// block for encoding, two values per thread for decoding) instantiated with our codec, so
// strides, views and index types behave exactly as for q4_0/q8_0.
#pragma once

#include "tq-ggml.h"
#include "tq-cuda.cuh"
#include "tq-tcq-ggml.cuh" // the trellis types
#include "tq-cuda-rf-keep.cuh"
#include "tq-rf-keep.h"

static __device__ __forceinline__ void tq_cuda_dequantize_turbo2(const void * vx, const int64_t ib, const int iqs, float2 & v) {
    tq_cuda_dequantize<2>(vx, ib, iqs, v);
}
static __device__ __forceinline__ void tq_cuda_dequantize_turbo3(const void * vx, const int64_t ib, const int iqs, float2 & v) {
    tq_cuda_dequantize<3>(vx, ib, iqs, v);
}
static __device__ __forceinline__ void tq_cuda_dequantize_turbo4(const void * vx, const int64_t ib, const int iqs, float2 & v) {
    tq_cuda_dequantize<4>(vx, ib, iqs, v);
}

static __device__ void tq_cuda_quantize_turbo2(const float * x, tq_block_turbo2 * y) { tq_cuda_quantize_block<2>(x, y); }
static __device__ void tq_cuda_quantize_turbo3(const float * x, tq_block_turbo3 * y) { tq_cuda_quantize_block<3>(x, y); }
static __device__ void tq_cuda_quantize_turbo4(const float * x, tq_block_turbo4 * y) { tq_cuda_quantize_block<4>(x, y); }

// convert.cu: `case`s for the six to_fp16/fp32/bf16 getters. TEMPLATE is the getter's
// generic block template (dequantize_block_cont_cuda or dequantize_block_cuda).
#define TQ_CUDA_CONVERT_CASES(TEMPLATE)                                                         \
    case GGML_TYPE_TURBO2: return TEMPLATE<TQ_BLOCK_VALUES, 2, tq_cuda_dequantize_turbo2>;      \
    case GGML_TYPE_TURBO3: return TEMPLATE<TQ_BLOCK_VALUES, 2, tq_cuda_dequantize_turbo3>;      \
    case GGML_TYPE_TURBO4: return TEMPLATE<TQ_BLOCK_VALUES, 2, tq_cuda_dequantize_turbo4>;      \
    TQ_TCQ_CONVERT_CASES(TEMPLATE)

// getrows.cu: `case`s for ggml_cuda_get_rows_switch_src0_type.
#define TQ_CUDA_GET_ROWS_CASE(T)                                                                \
    case GGML_TYPE_TURBO##T:                                                                    \
        get_rows_cuda_q<TQ_BLOCK_VALUES, 2, tq_cuda_dequantize_turbo##T>(src0_d, src1_d, dst_d, \
            ne00, nb01, nb02, nb03, ne10, ne11, ne12, nb10, nb11, nb12, nb1, nb2, nb3, stream); \
        break;
#define TQ_CUDA_GET_ROWS_CASES TQ_CUDA_GET_ROWS_CASE(2) TQ_CUDA_GET_ROWS_CASE(3) TQ_CUDA_GET_ROWS_CASE(4) TQ_TCQ_GET_ROWS_CASES

// set-rows.cu and cpy.cu: tq-cuda-set-rows.cuh and tq-cuda-cpy.cuh (hooks before upstream's if-chains).

// ggml-cuda.cu supports_op: exactly the cases above, for all five types (the trellis ones
// encode in their own warp-per-block kernels, tq-tcq-ggml.cuh).
#define TQ_CUDA_SET_ROWS_SUPPORTED(op)                                                          \
    (TQ_GGML_IS_TURBO((op)->type) && (op)->src[0]->type == GGML_TYPE_F32 &&                     \
     ((op)->src[1]->type == GGML_TYPE_I64 || (op)->src[1]->type == GGML_TYPE_I32))
#define TQ_CUDA_CPY_SUPPORTED(src0_type, src1_type)                                             \
    ((TQ_GGML_IS_TURBO(src1_type) && (src0_type) == GGML_TYPE_F32) ||                           \
     (TQ_GGML_IS_TURBO(src0_type) && (src1_type) == GGML_TYPE_F32))

// ggml-cuda.cu MUL_MAT (flash attention off: KQ = K·Q against a turbo K cache). There is no
// turbo kernel for mul_mat_vec_q / mul_mat_q, so ggml_cuda_mul_mat and the mmvq fusion check
// send turbo operands to cuBLAS, which decodes them to f16 (or f32 under GGML_PREC_F32)
// through the converters above. MUL_MAT_ID (expert weights) is not a KV-cache op: unclaimed.
#define TQ_CUDA_MUL_MAT_VIA_CUBLAS(type) TQ_GGML_IS_TURBO(type)
#define TQ_CUDA_MUL_MAT_SUPPORTED(op)                                                           \
    ((op)->op == GGML_OP_MUL_MAT && (op)->src[1]->type == GGML_TYPE_F32)

// ggml-cuda.cu supports_op and compute_forward, GGML_OP_CUSTOM: the fused K side's node
// (tq_rf_keep_is) runs tq-cuda-rf-keep.cuh's kernel on the layout the CPU's function reads
// (tq_rf_keep_valid); every other custom op stays refused, as upstream refuses them all.
static bool tq_cuda_rf_keep_ok(const ggml_tensor * op) {
    return tq_rf_keep_valid(op) && tq_cuda_rf_keep_grid_ok(tq_rf_keep_args_of(const_cast<ggml_tensor *>(op)));
}
// false: not the node (compute_forward then reports the op as unsupported, as upstream does)
static bool tq_cuda_rf_keep(ggml_tensor * dst, cudaStream_t stream) {
    if (!tq_rf_keep_is(dst)) {
        return false;
    }
    GGML_ASSERT(tq_cuda_rf_keep_ok(dst) && "tq_rf_keep: supports_op accepted a layout the kernel does not read");
    tq_cuda_rf_keep_launch(tq_rf_keep_args_of(dst), stream);
    return true;
}
