// tq_common.glsl - what every turbo shader reads: the generated type table and codebooks
// (ggml-ext/abi, the headers C, CUDA and Rust read) and the scale rule.
#if !defined(TQ_COMMON_GLSL)
#define TQ_COMMON_GLSL

#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_int16 : require

#define TQ_TABLE_ATTR
#define TQ_TABLE_STATIC
#include "../../abi/turboquant_tables.h"
#include "../../abi/turboquant_types.h"

// Byte k of the payload (the bytes after the fp16 scale) of a block viewed as uint16 words W:
// word 0 is the scale, every block size is even, so a block never splits a word.
#define TQ_PAYLOAD_BYTE(W, k) ((uint(W[1u + ((k) >> 1)]) >> (((k) & 1u) * 8u)) & 0xffu)

// The scale a decoder uses for stored bits h (crates/codec block.rs decode_scale): Inf, NaN and
// negative non-zero scales decode as 0, so a corrupt block gives zeros, never NaN.
float tq_scale(uint h) {
    if ((h & 0x7c00u) == 0x7c00u || h > 0x8000u) {
        return 0.0;
    }
    return unpackHalf2x16(h).x;
}

#endif
