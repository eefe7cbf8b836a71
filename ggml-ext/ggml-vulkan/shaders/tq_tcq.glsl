// tq_tcq.glsl - the trellis types (turbo3_tcq, turbo2_tcq) as the Vulkan shaders see them: the
// generated tables and the state windows their values decode from (docs/TCQ.md, "Format").
//
// Invariant: value t of a block decodes to tq_scale(d) * TABLE[s_t], one f32 multiply, s_t the
// 8-bit window of stream bits [k t + k - 8, k t + k) mod 64 k of the circular, MSB-first
// payload: the Rust codec's value (crates/codec/src/tcq/) and the CUDA decoder's
// (ggml-ext/ggml-cuda/tq-tcq.cuh). Any value is read straight from its bytes, no recursion.
//
// A shader that handles one trellis type defines TQ_TCQ_K (3: turbo3_tcq, 2: turbo2_tcq) before
// including this file and gets tq_block, TQ_QK, TQ_TCQ_TABLE and TQ_VALUE(W, j); flash attention
// (tq_fa_dequant.glsl) decodes both types in one shader and uses the K-generic macros.
#if !defined(TQ_TCQ_GLSL)
#define TQ_TCQ_GLSL

#include "tq_common.glsl"
#include "../../abi/turboquant_tcq_tables.h"

#if TQ_TCQ3_L != 8 || TQ_TCQ2_L != 8 || TQ_TCQ3_K != 3 || TQ_TCQ2_K != 2
#error "the Vulkan trellis shaders are written for 8-bit states and k = 3 / 2 (one byte per state)"
#endif

// The tables as private arrays, read through these names: a const array indexed at run time
// makes glslang copy all of it into a function variable at each such index (flash attention's
// shader had 40 copies of 1 KB, which lavapipe compiled for over ten minutes per pipeline);
// a global variable is one array, the generated header stays the one source of its values.
float tq_tcq3_lut[256] = TQ_TCQ3_TABLE;
float tq_tcq2_lut[256] = TQ_TCQ2_TABLE;

// The stream bit where value t's window starts: k t + k - 8, modulo the 64 k payload bits.
#define TQ_TCQ_P0(K, t) (((K) * (t) + (K) + 64u * (K) - 8u) % (64u * (K)))

// The big-endian 32-bit window of payload bytes b0 .. b0 + 3 (modulo the 8 k payload bytes) of
// a block viewed as uint16 words W (word 0 the scale).
#define TQ_TCQ_WIN32(W, K, b0)                                                              \
    ((TQ_PAYLOAD_BYTE(W, (b0)) << 24) | (TQ_PAYLOAD_BYTE(W, ((b0) + 1u) % (8u * (K))) << 16) | \
     (TQ_PAYLOAD_BYTE(W, ((b0) + 2u) % (8u * (K))) << 8) | TQ_PAYLOAD_BYTE(W, ((b0) + 3u) % (8u * (K))))

// The states of values t .. t + 3 (t <= 60): one 32-bit window holds their 8 + 3 k bits.
#define TQ_TCQ_STATES4(W, K, t, OUT) {                                                       \
    const uint tq_p0 = TQ_TCQ_P0(K, t);                                                      \
    const uint tq_win = TQ_TCQ_WIN32(W, K, tq_p0 >> 3);                                      \
    const uint tq_sh = 24u - (tq_p0 & 7u);                                                   \
    OUT = uvec4(tq_win >> tq_sh, tq_win >> (tq_sh - (K)), tq_win >> (tq_sh - 2u * (K)),     \
                tq_win >> (tq_sh - 3u * (K))) & 0xffu;                                       \
}

// The state of value t.
#define TQ_TCQ_STATE(W, K, t) \
    ((TQ_TCQ_WIN32(W, K, TQ_TCQ_P0(K, t) >> 3) >> (24u - (TQ_TCQ_P0(K, t) & 7u))) & 0xffu)

#if defined(TQ_TCQ_K)
#if TQ_TCQ_K == 3
#define TQ_BLOCK_BYTES TQ_TURBO3_TCQ_BLOCK_BYTES
#define TQ_TCQ_TABLE tq_tcq3_lut
#elif TQ_TCQ_K == 2
#define TQ_BLOCK_BYTES TQ_TURBO2_TCQ_BLOCK_BYTES
#define TQ_TCQ_TABLE tq_tcq2_lut
#else
#error "TQ_TCQ_K must be 3 or 2"
#endif
#define TQ_QK TQ_BLOCK_VALUES
#define TQ_BLOCK_WORDS (TQ_BLOCK_BYTES / 2)

struct tq_block {
    uint16_t w[TQ_BLOCK_WORDS];
};

// Value j of a block whose words are W.
#define TQ_VALUE(W, j) (tq_scale(uint(W[0])) * TQ_TCQ_TABLE[TQ_TCQ_STATE(W, uint(TQ_TCQ_K), j)])
#endif

#endif
