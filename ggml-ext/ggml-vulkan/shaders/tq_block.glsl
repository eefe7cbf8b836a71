// tq_block.glsl - one turbo block as the Vulkan shaders see it, and its decode.
//
// Invariant: decodes exactly as crates/codec (block.rs, kernels/scalar.rs): value j of a block is
// f32(d) * C[idx_j], with d the block's fp16 scale read by tq_scale()'s rule (Inf, NaN and
// negative non-zero scales decode as 0) and C the codebook of turboquant_tables.h, the generated
// table that C, CUDA and Rust read too. A block is viewed as uint16 words: word 0 is the scale,
// words 1.. the packed indices (every turbo block size is even, so a block never splits a word).
//
// The including shader defines TQ_BITS (2, 3 or 4) before including this file.

#include "tq_common.glsl"

#if TQ_BITS == 2
#define TQ_BLOCK_BYTES TQ_TURBO2_BLOCK_BYTES
#define TQ_CODEBOOK TQ_CODEBOOK_2BIT
#define TQ_THRESHOLDS TQ_THRESHOLDS_2BIT
#elif TQ_BITS == 3
#define TQ_BLOCK_BYTES TQ_TURBO3_BLOCK_BYTES
#define TQ_CODEBOOK TQ_CODEBOOK_3BIT
#define TQ_THRESHOLDS TQ_THRESHOLDS_3BIT
#elif TQ_BITS == 4
#define TQ_BLOCK_BYTES TQ_TURBO4_BLOCK_BYTES
#define TQ_CODEBOOK TQ_CODEBOOK_4BIT
#define TQ_THRESHOLDS TQ_THRESHOLDS_4BIT
#else
#error "TQ_BITS must be 2, 3 or 4"
#endif

#define TQ_QK TQ_BLOCK_VALUES
#define TQ_BLOCK_WORDS (TQ_BLOCK_BYTES / 2)
#define TQ_LEVELS (1 << TQ_BITS)

struct tq_block {
    uint16_t w[TQ_BLOCK_WORDS];
};

// Index j (0..63) of a block whose words are W (block.rs pack_indices).
#if TQ_BITS == 4
#define TQ_INDEX(W, j) ((TQ_PAYLOAD_BYTE(W, (j) & 31u) >> (((j) >> 5) * 4u)) & 15u)
#elif TQ_BITS == 2
#define TQ_INDEX(W, j) ((TQ_PAYLOAD_BYTE(W, (j) & 15u) >> (((j) >> 4) * 2u)) & 3u)
#else
#define TQ_INDEX(W, j) (((TQ_PAYLOAD_BYTE(W, (j) & 15u) >> (((j) >> 4) * 2u)) & 3u) \
                        | (((TQ_PAYLOAD_BYTE(W, 16u + ((j) >> 3)) >> ((j) & 7u)) & 1u) << 2))
#endif

// Value j of a block whose words are W.
#define TQ_VALUE(W, j) (tq_scale(uint(W[0])) * TQ_CODEBOOK[TQ_INDEX(W, j)])
