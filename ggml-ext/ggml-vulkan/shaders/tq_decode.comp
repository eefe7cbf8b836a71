#version 450
// tq_decode.comp - turbo blocks to f32/f16: GET_ROWS (TQ_GET_ROWS defined; D_TYPE float or
// float16_t) and CPY/CONT to f32 or f16 (D_TYPE, float when not defined), the source strided
// in whole blocks (a permuted view of a cache: MUL_MAT's K, tq-vulkan.h tq_vk_mul_mat). The
// same interfaces (bindings, push constants, dispatch shape) as upstream's get_rows_quant.comp
// and copy_from_quant.comp, so ggml-vulkan's op code dispatches these pipelines like its own.
//
// Invariant: value j of a block is f32(d) * C[idx_j] (tq_block.glsl; TQ_BITS defined) or
// f32(d) * TABLE[s_j] (tq_tcq.glsl, the trellis types; TQ_TCQ_K defined), the CPU's dequantize.

#extension GL_EXT_control_flow_attributes : enable

#if defined(TQ_TCQ_K)
#include "tq_tcq.glsl"
#else
#include "tq_block.glsl"
#endif

#define A_TYPE tq_block
#if defined(TQ_GET_ROWS)
#define B_TYPE int
#include "generic_binary_head.glsl"
layout(local_size_x = 512, local_size_y = 1, local_size_z = 1) in;
#else
#if !defined(D_TYPE)
#define D_TYPE float
#endif
#include "generic_unary_head.glsl"
layout(local_size_x = 1, local_size_y = 1, local_size_z = 1) in;
#endif

float tq_value(const uint ib, const uint j) {
    return TQ_VALUE(data_a[ib].w, j);
}

void main() {
#if defined(TQ_GET_ROWS)
    const uint i00 = gl_GlobalInvocationID.x;
    if (i00 >= p.ne00) {
        return;
    }
    uint gid_z = gl_GlobalInvocationID.z;
    while (gid_z < p.ne11 * p.ne12) {
        uint gid_y = gl_GlobalInvocationID.y;
        while (gid_y < p.ne10) {
            const uint i10 = gid_y;
            const uint i11 = gid_z / p.ne12;
            const uint i12 = gid_z % p.ne12;
            const uint i01 = uint(data_b[get_boffset() + i10*p.nb10 + i11*p.nb11 + i12*p.nb12]);
            const uint a_offset = get_aoffset() + i01*p.nb01 + i11*p.nb02 + i12*p.nb03;
            const uint d_offset = get_doffset() + i10*p.nb21 + i11*p.nb22 + i12*p.nb23;
            data_d[d_offset + i00] = D_TYPE(tq_value(a_offset + i00 / TQ_QK, i00 % TQ_QK));
            gid_y += gl_WorkGroupSize.y * gl_NumWorkGroups.y;
        }
        gid_z += gl_WorkGroupSize.z * gl_NumWorkGroups.z;
    }
#else
    const uint idx = gl_WorkGroupID.z * 262144 + gl_WorkGroupID.y * 512 + gl_WorkGroupID.x * TQ_QK;
    if (idx >= p.ne) {
        return;
    }
    const uint dst = get_doffset() + dst_idx(idx);
    const uint ib = get_aoffset() + src0_idx_quant(idx, TQ_QK);
    for (uint j = 0u; j < TQ_QK; ++j) {
        data_d[dst + j] = D_TYPE(tq_value(ib, j));
    }
#endif
}
