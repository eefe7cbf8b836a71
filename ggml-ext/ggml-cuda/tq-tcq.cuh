// tq-tcq.cuh - the trellis-coded types turbo3_tcq / turbo2_tcq on the GPU: tables, state
// windows and the decoder (docs/TCQ.md is the normative format; the Rust codec is
// crates/codec/src/tcq/). The encoder is tq-tcq-encode.cuh.
//
// Like tq-cuda.cuh this is self-contained (CUDA headers and our C headers only) and
// __host__ __device__, so tq-parity.cu compiles the same source for the host and checks it
// against the Rust codec bit for bit.
//
// Value t of a block decodes to decode_scale(d) * TABLE[s_t], s_t the 8-bit window of
// stream bits [k t + k - 8, k t + k) mod 64 k of the circular, MSB-first payload: any value
// is read straight from the bytes, no serial state recursion.
#pragma once

#include "tq-cuda.cuh"

#ifdef TURBOQUANT_TCQ_TABLES_H
#error "include tq-tcq.cuh before turboquant_tcq_tables.h: it places one copy of the tables on each side"
#endif
// The generated trellis tables (one source: crates/gen), once for the host (namespace
// tq_host) and once in device memory, as tq-cuda.cuh does for the codebooks.
#undef TQ_TABLE_ATTR
#define TQ_TABLE_ATTR
namespace tq_host {
#include "turboquant_tcq_tables.h"
}
#undef TURBOQUANT_TCQ_TABLES_H
#undef TQ_TABLE_ATTR
#define TQ_TABLE_ATTR __device__
#include "turboquant_tcq_tables.h"

// k = bits shifted in per value (3: turbo3_tcq, 2: turbo2_tcq).
template <int K> struct tq_tcq_type;
template <> struct tq_tcq_type<3> {
    typedef tq_block_turbo3_tcq block;
    static constexpr int L = TQ_TCQ3_L;
    static TQ_HD const float * table() { return TQ_TABLE(TQ_TCQ3_TABLE); }
};
template <> struct tq_tcq_type<2> {
    typedef tq_block_turbo2_tcq block;
    static constexpr int L = TQ_TCQ2_L;
    static TQ_HD const float * table() { return TQ_TABLE(TQ_TCQ2_TABLE); }
};
static_assert(TQ_TCQ3_K == 3 && TQ_TCQ2_K == 2, "turbo3_tcq shifts in 3 bits per value, turbo2_tcq 2");
// The CUDA kernels are written for 256 states (8 per lane of a warp, one byte per state);
// a table regenerated with another L needs them reworked (the parity test would fail).
static_assert(TQ_TCQ3_L == 8 && TQ_TCQ2_L == 8, "the CUDA trellis kernels assume L = 8");
static_assert(sizeof(tq_block_turbo3_tcq) == 2 + 8*3 && sizeof(tq_block_turbo2_tcq) == 2 + 8*2, "block layout");

// State of value t (0..63): the 8-bit window ending at stream bit k t + k, read from the two
// bytes that hold it (the window wraps around the payload's end for the first values).
template <int K> static TQ_HD uint32_t tq_tcq_state(const uint8_t * qs, const int t) {
    constexpr int nbytes = 8*K;
    int p0 = K*t + K - 8;
    if (p0 < 0) {
        p0 += 8*nbytes;
    }
    const int b0 = p0 >> 3;
    const uint32_t w = ((uint32_t) qs[b0] << 8) | qs[b0 + 1 == nbytes ? 0 : b0 + 1];
    return (w >> (8 - (p0 & 7))) & 0xffu;
}

// The big-endian 32-bit window of group g (values 8g .. 8g+7): bytes qs[k g - 1 .. k g + 2]
// (qs[-1] being the payload's last byte). Value 8g + j has state
// (w >> (24 - k - k j)) & 0xff (docs/TCQ.md, "States without a serial loop"). For k = 2 the
// lowest byte is never used and not read (the last group would read past the block).
template <int K> static TQ_HD uint32_t tq_tcq_window(const uint8_t * qs, const int g) {
    constexpr int nbytes = 8*K;
    const uint32_t first = qs[g == 0 ? nbytes - 1 : K*g - 1];
    uint32_t w = (first << 24) | ((uint32_t) qs[K*g] << 16) | ((uint32_t) qs[K*g + 1] << 8);
    if constexpr (K == 3) {
        w |= qs[K*g + 2];
    }
    return w;
}
template <int K> static TQ_HD uint32_t tq_tcq_window_state(const uint32_t w, const int j) {
    return (w >> (24 - K - K*j)) & 0xffu;
}

// ggml's dequantize_kernel_t convention with qk = 64, qr = 2: values iqs and iqs + 32 of
// block ib. One f32 multiply each (__fmul_rn on the device), as the Rust decoder.
template <int K>
static TQ_HD void tq_tcq_dequantize(const void * vx, const int64_t ib, const int iqs, float2 & v) {
    const typename tq_tcq_type<K>::block * x = (const typename tq_tcq_type<K>::block *) vx + ib;
    const float * T = tq_tcq_type<K>::table();
    const float d = tq_cuda_scale(x->d);
    v.x = tq_fmul(d, T[tq_tcq_state<K>(x->qs, iqs)]);
    v.y = tq_fmul(d, T[tq_tcq_state<K>(x->qs, iqs + TQ_BLOCK_VALUES/2)]);
}
