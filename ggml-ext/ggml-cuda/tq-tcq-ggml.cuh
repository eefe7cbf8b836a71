// tq-tcq-ggml.cuh - what ggml-cuda's dispatch tables need for the trellis types turbo3_tcq /
// turbo2_tcq. Included by tq-cuda-ggml.cuh, whose macros expand the cases below next to the
// scalar turbo types'.
//
// Decoding runs through ggml's generic templates (two values per thread: tq_tcq_dequantize
// reads each state straight from its window). Encoding does not fit ggml's one thread per
// block: the Viterbi search takes a warp per 64-value block (tq-tcq-encode.cuh), so
// SET_ROWS and CPY f32 -> trellis have their own kernels here, with upstream's index
// arithmetic (k_set_rows_quant / cpy_f32_q), one block per warp, TQ_TCQ_WARPS warps per CUDA
// block, each warp with its scratch in shared memory.
#pragma once

#include "tq-tcq-encode.cuh"

static __device__ __forceinline__ void tq_cuda_dequantize_turbo3_tcq(const void * vx, const int64_t ib, const int iqs, float2 & v) {
    tq_tcq_dequantize<3>(vx, ib, iqs, v);
}
static __device__ __forceinline__ void tq_cuda_dequantize_turbo2_tcq(const void * vx, const int64_t ib, const int iqs, float2 & v) {
    tq_tcq_dequantize<2>(vx, ib, iqs, v);
}

// convert.cu (to_fp16 / to_fp32 / to_bf16, contiguous or not): TEMPLATE is the getter's block template.
#define TQ_TCQ_CONVERT_CASES(TEMPLATE)                                                              \
    case GGML_TYPE_TURBO3_TCQ: return TEMPLATE<TQ_BLOCK_VALUES, 2, tq_cuda_dequantize_turbo3_tcq>;  \
    case GGML_TYPE_TURBO2_TCQ: return TEMPLATE<TQ_BLOCK_VALUES, 2, tq_cuda_dequantize_turbo2_tcq>;

// getrows.cu
#define TQ_TCQ_GET_ROWS_CASE(NAME, STEM)                                                            \
    case GGML_TYPE_##STEM:                                                                          \
        get_rows_cuda_q<TQ_BLOCK_VALUES, 2, tq_cuda_dequantize_##NAME>(src0_d, src1_d, dst_d,       \
            ne00, nb01, nb02, nb03, ne10, ne11, ne12, nb10, nb11, nb12, nb1, nb2, nb3, stream);     \
        break;
#define TQ_TCQ_GET_ROWS_CASES TQ_TCQ_GET_ROWS_CASE(turbo3_tcq, TURBO3_TCQ) TQ_TCQ_GET_ROWS_CASE(turbo2_tcq, TURBO2_TCQ)

#define TQ_TCQ_WARPS 4 // warps (blocks encoded at once) per CUDA block

// SET_ROWS f32 -> trellis: k_set_rows_quant's indexing, block i = one warp.
template <typename idx_t, int K>
static __global__ void __launch_bounds__(32*TQ_TCQ_WARPS)
tq_tcq_k_set_rows(const float * src0_ptr, const idx_t * src1_ptr, typename tq_tcq_type<K>::block * dst_ptr, const int64_t ne_total,
                  const int64_t s01, const int64_t s02, const int64_t s03,
                  const int64_t s10, const int64_t s11, const int64_t s12,
                  const int64_t s1, const int64_t s2, const int64_t s3,
                  const int64_t ne00, const int64_t ne01, const int64_t ne02, const int64_t ne11, const int64_t ne12) {
    typedef typename tq_tcq_type<K>::block block;
    // restrict-qualified locals, never parameters (GGML_CUDA_RESTRICT is empty under PDL on
    // Hopper, and a parameter's qualifier must match between the host and device passes)
    const float * GGML_CUDA_RESTRICT src0 = src0_ptr;
    const idx_t * GGML_CUDA_RESTRICT src1 = src1_ptr;
    block       * GGML_CUDA_RESTRICT dst  = dst_ptr;
    __shared__ tq_tcq_scratch<K> sc[TQ_TCQ_WARPS];
    const int w = threadIdx.x / 32;
    const int64_t i = (int64_t) blockIdx.x * TQ_TCQ_WARPS + w; // warp-uniform
    if (i >= ne_total) {
        return;
    }
    const int64_t i_base = i * TQ_BLOCK_VALUES;
    const int64_t i00 = i_base % ne00;
    int64_t tmp = i_base / ne00;
    const int64_t i01 = tmp % ne01;
    tmp /= ne01;
    const int64_t i02 = tmp % ne02;
    const int64_t i03 = tmp / ne02;
    const int64_t i12 = i03 % ne12;
    const int64_t i11 = i02 % ne11;
    const int64_t i10 = i01;

    ggml_cuda_pdl_sync();
    const int64_t dst_row = *(src1 + i10*s10 + i11*s11 + i12*s12);
    const float * src_block = src0 + i01*s01 + i02*s02 + i03*s03 + i00;
    block * dst_block = (block *) ((char *) dst + dst_row*s1 + i02*s2 + i03*s3) + i00 / TQ_BLOCK_VALUES;
    tq_tcq_quantize_warp<K>(src_block, dst_block, sc[w]);
}

template <typename idx_t, int K>
static void tq_tcq_set_rows_launch(const ggml_tensor * src0, const ggml_tensor * src1, ggml_tensor * dst, cudaStream_t stream) {
    GGML_TENSOR_BINARY_OP_LOCALS
    GGML_ASSERT(ne00 % TQ_BLOCK_VALUES == 0);
    const int64_t ne_total = (ne00 * ne01 * ne02 * ne03) / TQ_BLOCK_VALUES;
    if (ne_total <= 0 || ne01 <= 0 || ne02 <= 0 || ne11 <= 0 || ne12 <= 0) {
        return;
    }
    const int64_t nblk = (ne_total + TQ_TCQ_WARPS - 1) / TQ_TCQ_WARPS;
    GGML_ASSERT(nblk <= INT_MAX);
    tq_tcq_k_set_rows<idx_t, K><<<(unsigned) nblk, 32*TQ_TCQ_WARPS, 0, stream>>>(
        (const float *) src0->data, (const idx_t *) src1->data, (typename tq_tcq_type<K>::block *) dst->data, ne_total,
        nb01/sizeof(float), nb02/sizeof(float), nb03/sizeof(float),
        nb10/sizeof(idx_t), nb11/sizeof(idx_t), nb12/sizeof(idx_t), nb1, nb2, nb3,
        ne00, ne01, ne02, ne11, ne12);
}

// CPY f32 -> trellis: cpy_f32_q's indexing (strided f32 source, blocks along dim 0 of the
// destination), block i = one warp.
template <int K>
static __global__ void __launch_bounds__(32*TQ_TCQ_WARPS)
tq_tcq_k_cpy_f32(const char * cx, char * cdst, const int64_t nblocks,
                 const int64_t ne00, const int64_t ne01, const int64_t ne02, const int64_t nb00, const int64_t nb01, const int64_t nb02,
                 const int64_t nb03, const int64_t ne10, const int64_t ne11, const int64_t ne12, const int64_t nb10, const int64_t nb11,
                 const int64_t nb12, const int64_t nb13) {
    typedef typename tq_tcq_type<K>::block block;
    __shared__ tq_tcq_scratch<K> sc[TQ_TCQ_WARPS];
    const int w = threadIdx.x / 32;
    const int64_t b = (int64_t) blockIdx.x * TQ_TCQ_WARPS + w; // warp-uniform
    if (b >= nblocks) {
        return;
    }
    const int64_t i = b * TQ_BLOCK_VALUES;
    const int64_t i03 = i/(ne00 * ne01 * ne02);
    const int64_t i02 = (i - i03*ne00*ne01*ne02) / (ne00*ne01);
    const int64_t i01 = (i - i03*ne00*ne01*ne02 - i02*ne01*ne00) / ne00;
    const int64_t i00 = i - i03*ne00*ne01*ne02 - i02*ne01*ne00 - i01*ne00;
    const int64_t x_offset = i00*nb00 + i01*nb01 + i02*nb02 + i03*nb03;

    const int64_t i13 = i/(ne10 * ne11 * ne12);
    const int64_t i12 = (i - i13*ne10*ne11*ne12) / (ne10*ne11);
    const int64_t i11 = (i - i13*ne10*ne11*ne12 - i12*ne10*ne11) / ne10;
    const int64_t i10 = i - i13*ne10*ne11*ne12 - i12*ne10*ne11 - i11*ne10;
    const int64_t dst_offset = (i10/TQ_BLOCK_VALUES)*nb10 + i11*nb11 + i12*nb12 + i13*nb13;

    ggml_cuda_pdl_sync();
    // a block's 64 source values are read as contiguous floats, as cpy_f32_q's block copies do
    tq_tcq_quantize_warp<K>((const float *) (cx + x_offset), (block *) (cdst + dst_offset), sc[w]);
}

template <int K>
static void tq_tcq_cpy_f32_launch(const ggml_tensor * src0, ggml_tensor * src1, cudaStream_t stream) {
    const int64_t ne = ggml_nelements(src0);
    GGML_ASSERT(ne == ggml_nelements(src1));
    GGML_ASSERT(ne % TQ_BLOCK_VALUES == 0);
    const int64_t nblocks = ne / TQ_BLOCK_VALUES;
    const int64_t grid = (nblocks + TQ_TCQ_WARPS - 1) / TQ_TCQ_WARPS;
    GGML_ASSERT(grid <= INT_MAX);
    tq_tcq_k_cpy_f32<K><<<(unsigned) grid, 32*TQ_TCQ_WARPS, 0, stream>>>((const char *) src0->data, (char *) src1->data, nblocks,
        src0->ne[0], src0->ne[1], src0->ne[2], src0->nb[0], src0->nb[1], src0->nb[2], src0->nb[3],
        src1->ne[0], src1->ne[1], src1->ne[2], src1->nb[0], src1->nb[1], src1->nb[2], src1->nb[3]);
}
