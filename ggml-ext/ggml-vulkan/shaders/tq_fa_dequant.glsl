// tq_fa_dequant.glsl - turbo K and V decoded inside upstream's flash attention shaders
// (flash_attn.comp, flash_attn_cm1.comp): the block views at bindings 1 (K) and 2 (V) and the
// cases of dequantize4(), which returns elements iqs..iqs+3 (iqs a multiple of 4) of block
// a_offset + ib. Included by flash_attn_dequant.glsl (patch 0106); TQ_FA_DEQUANT4_CASES_K/_V
// go into its two switches.
//
// Invariant: element j of a block is f32(d) * C[idx_j] (turbo2/3/4, as tq_block.glsl) or
// f32(d) * TABLE[s_j] (turbo3_tcq / turbo2_tcq, as tq_tcq.glsl), the CPU's decode; the shader
// then converts it to FLOAT_TYPE as it does every other type's values.
#if !defined(TQ_FA_DEQUANT_GLSL)
#define TQ_FA_DEQUANT_GLSL

#include "tq_common.glsl"
#include "tq_tcq.glsl"

struct tq_fa_turbo2 { uint16_t w[TQ_TURBO2_BLOCK_BYTES / 2]; };
struct tq_fa_turbo3 { uint16_t w[TQ_TURBO3_BLOCK_BYTES / 2]; };
struct tq_fa_turbo4 { uint16_t w[TQ_TURBO4_BLOCK_BYTES / 2]; };
struct tq_fa_turbo3_tcq { uint16_t w[TQ_TURBO3_TCQ_BLOCK_BYTES / 2]; };
struct tq_fa_turbo2_tcq { uint16_t w[TQ_TURBO2_TCQ_BLOCK_BYTES / 2]; };

layout (binding = 1) readonly buffer K_PACKED_TURBO2 { tq_fa_turbo2 data[]; } k_packed_turbo2;
layout (binding = 2) readonly buffer V_PACKED_TURBO2 { tq_fa_turbo2 data[]; } v_packed_turbo2;
layout (binding = 1) readonly buffer K_PACKED_TURBO3 { tq_fa_turbo3 data[]; } k_packed_turbo3;
layout (binding = 2) readonly buffer V_PACKED_TURBO3 { tq_fa_turbo3 data[]; } v_packed_turbo3;
layout (binding = 1) readonly buffer K_PACKED_TURBO4 { tq_fa_turbo4 data[]; } k_packed_turbo4;
layout (binding = 2) readonly buffer V_PACKED_TURBO4 { tq_fa_turbo4 data[]; } v_packed_turbo4;
layout (binding = 1) readonly buffer K_PACKED_TURBO3_TCQ { tq_fa_turbo3_tcq data[]; } k_packed_turbo3_tcq;
layout (binding = 2) readonly buffer V_PACKED_TURBO3_TCQ { tq_fa_turbo3_tcq data[]; } v_packed_turbo3_tcq;
layout (binding = 1) readonly buffer K_PACKED_TURBO2_TCQ { tq_fa_turbo2_tcq data[]; } k_packed_turbo2_tcq;
layout (binding = 2) readonly buffer V_PACKED_TURBO2_TCQ { tq_fa_turbo2_tcq data[]; } v_packed_turbo2_tcq;

// Four consecutive values from four indices (f32 products, as the CPU decodes).
#define TQ_FA_VALUES4(CB, d, i0, i1, i2, i3) \
    return FLOAT_TYPEV4(vec4((d) * CB[i0], (d) * CB[i1], (d) * CB[i2], (d) * CB[i3]));

// turbo4: payload byte k holds index k (low nibble) and k + 32 (high nibble).
#define TQ_FA_DEQUANT4_TURBO4(BUF) {                                                       \
    const uint tq_k = iqs & 31u;                                                           \
    const uint tq_sh = (iqs >> 5) * 4u;                                                    \
    const uint tq_w0 = uint(BUF.data[a_offset + ib].w[1u + tq_k / 2u]);                    \
    const uint tq_w1 = uint(BUF.data[a_offset + ib].w[2u + tq_k / 2u]);                    \
    const float tq_d = tq_scale(uint(BUF.data[a_offset + ib].w[0]));                       \
    TQ_FA_VALUES4(TQ_CODEBOOK_4BIT, tq_d, (tq_w0 >> tq_sh) & 15u, (tq_w0 >> (8u + tq_sh)) & 15u, \
                  (tq_w1 >> tq_sh) & 15u, (tq_w1 >> (8u + tq_sh)) & 15u)                   \
}

// turbo2: payload byte k (0..15) holds indices k, k + 16, k + 32, k + 48 (two bits each).
#define TQ_FA_LOW2(BUF)                                                                    \
    const uint tq_k = iqs & 15u;                                                           \
    const uint tq_sh = (iqs >> 4) * 2u;                                                    \
    const uint tq_w0 = uint(BUF.data[a_offset + ib].w[1u + tq_k / 2u]);                    \
    const uint tq_w1 = uint(BUF.data[a_offset + ib].w[2u + tq_k / 2u]);                    \
    const float tq_d = tq_scale(uint(BUF.data[a_offset + ib].w[0]));                       \
    const uvec4 tq_lo = uvec4((tq_w0 >> tq_sh) & 3u, (tq_w0 >> (8u + tq_sh)) & 3u,         \
                              (tq_w1 >> tq_sh) & 3u, (tq_w1 >> (8u + tq_sh)) & 3u);

#define TQ_FA_DEQUANT4_TURBO2(BUF) {                                                       \
    TQ_FA_LOW2(BUF)                                                                        \
    TQ_FA_VALUES4(TQ_CODEBOOK_2BIT, tq_d, tq_lo.x, tq_lo.y, tq_lo.z, tq_lo.w)              \
}

// turbo3: the low two bits as turbo2; bit j % 8 of payload byte 16 + j / 8 is bit 2 of index j.
#define TQ_FA_DEQUANT4_TURBO3(BUF) {                                                       \
    TQ_FA_LOW2(BUF)                                                                        \
    const uint tq_hw = uint(BUF.data[a_offset + ib].w[9u + iqs / 16u]);                    \
    const uint tq_hb = (tq_hw >> (((iqs >> 3) & 1u) * 8u + (iqs & 7u))) & 15u;             \
    const uvec4 tq_i = tq_lo | (uvec4(tq_hb, tq_hb >> 1, tq_hb >> 2, tq_hb >> 3) & 1u) * 4u; \
    TQ_FA_VALUES4(TQ_CODEBOOK_3BIT, tq_d, tq_i.x, tq_i.y, tq_i.z, tq_i.w)                  \
}

// turbo3_tcq / turbo2_tcq: the four states from one 32-bit window of the payload (tq_tcq.glsl).
#define TQ_FA_DEQUANT4_TCQ(BUF, K, TABLE) {                                                \
    uvec4 tq_s;                                                                            \
    TQ_TCQ_STATES4(BUF.data[a_offset + ib].w, K, iqs, tq_s)                                \
    const float tq_d = tq_scale(uint(BUF.data[a_offset + ib].w[0]));                       \
    TQ_FA_VALUES4(TABLE, tq_d, tq_s.x, tq_s.y, tq_s.z, tq_s.w)                             \
}

#define TQ_FA_DEQUANT4_CASES(kv)                                                           \
    case uint(TQ_TURBO2_GGML_TYPE): TQ_FA_DEQUANT4_TURBO2(kv##_packed_turbo2)              \
    case uint(TQ_TURBO3_GGML_TYPE): TQ_FA_DEQUANT4_TURBO3(kv##_packed_turbo3)              \
    case uint(TQ_TURBO4_GGML_TYPE): TQ_FA_DEQUANT4_TURBO4(kv##_packed_turbo4)              \
    case uint(TQ_TURBO3_TCQ_GGML_TYPE): TQ_FA_DEQUANT4_TCQ(kv##_packed_turbo3_tcq, 3u, tq_tcq3_lut) \
    case uint(TQ_TURBO2_TCQ_GGML_TYPE): TQ_FA_DEQUANT4_TCQ(kv##_packed_turbo2_tcq, 2u, tq_tcq2_lut)

#endif
