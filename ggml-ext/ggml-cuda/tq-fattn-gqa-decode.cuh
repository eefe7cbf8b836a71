// tq-fattn-gqa-decode.cuh - how the GQA decode kernel (tq-fattn-gqa.cuh) reads a K or V row:
// which values of a 64-value block a thread owns, which bits of which 32-bit word hold their
// indices, the sanitised scale, the codebook lookup.
//
// Self-contained (tq-cuda.cuh and our C headers only) and __host__ __device__, so that
// tq-parity.cu can run exactly this code on the CPU against the Rust decoder.
//
// Layout: a 64-value block is read by 8 threads ("slots" u = 0..7), 8 values each. A slot
// loads whole 32-bit words of the packed indices (one for turbo2 and turbo4, two for
// turbo3) and turns them into two words of byte-wide indices, value e of the slot (e = 0..7)
// in byte e%4 of word e/4. A byte holds nothing above the index, so the lookup can hand the
// word, shifted, straight to a warp shuffle: the shuffle reads the low 5 bits of its lane
// argument, and lanes l hold codebook[l % levels].
//   turbo4: slot u loads qs word u (values 4u..4u+3 in the low nibbles, 4u+32.. in the
//           high ones): indices = word & 0x0f0f0f0f, (word >> 4) & 0x0f0f0f0f.
//   turbo2: qs word m = u/2 holds values 4m+i+16k (i, k < 4) at bits 8i+2k; slot u takes
//           k = 2(u%2), 2(u%2)+1.
//   turbo3: the same 2 low bits, plus the high bit of value j at bit j of qs[16..23]: for
//           slot u those 4+4 bits are nibbles of one 32-bit word, spread to bit 2 of each
//           byte with one multiply.
// Value positions and the slot's word loads are chosen so that a slot's Q values (K) or
// output dims (V) are 4 consecutive floats twice.
#pragma once

#include "tq-cuda.cuh"

// Values a slot owns and slots per 64-value block.
#define TQ_GQA_SLOT_VALUES 8
#define TQ_GQA_SLOTS 8

// Position (0..63) in its block of value e (0..7) of slot u (0..7).
template <int bits> static TQ_HD int tq_gqa_pos(const int u, const int e) {
    if constexpr (bits == 4) {
        return 4*u + (e & 3) + 32*(e >> 2);
    } else {
        static_assert(bits == 2 || bits == 3, "turbo2..4");
        return 4*(u >> 1) + (e & 3) + 16*(2*(u & 1) + (e >> 2));
    }
}

// A 32-bit little-endian word at p, which is only 2-byte aligned in general (blocks are 18,
// 26 or 34 bytes long, so qs sits at offset 2 mod 4 in every other block): one 32-bit load
// when p is 4-byte aligned, two 16-bit loads otherwise (never past the 4 bytes at p).
static TQ_HD uint32_t tq_gqa_load_u32(const uint8_t * p) {
#ifdef __CUDA_ARCH__
    if ((((uintptr_t) p) & 3) == 0) {
        return *(const uint32_t *) p;
    }
    const uint16_t * h = (const uint16_t *) p;
    return (uint32_t) h[0] | ((uint32_t) h[1] << 16);
#else
    uint32_t w;
    memcpy(&w, p, sizeof(w));
    return w;
#endif
}

// The byte-wide indices of slot u's 8 values: value e in byte e%4 of idx[e/4], nothing else
// in that byte.
template <int bits> static TQ_HD void tq_gqa_unpack(const typename tq_cuda_type<bits>::block * b, const int u, uint32_t (&idx)[2]) {
    if constexpr (bits == 4) {
        const uint32_t w = tq_gqa_load_u32(b->qs + 4*u);
        idx[0] = w & 0x0f0f0f0fu;
        idx[1] = (w >> 4) & 0x0f0f0f0fu;
    } else {
        const int m = u >> 1, h = u & 1;
        const uint32_t w = tq_gqa_load_u32(b->qs + 4*m);
        idx[0] = (w >> (4*h))     & 0x03030303u;
        idx[1] = (w >> (4*h + 2)) & 0x03030303u;
        if constexpr (bits == 3) {
            // Value 4m+i+16k has its high bit at bit 4m+i+16k of qs[16..23]; k = 2h+k2, so
            // it is bit i of nibble (4m + 16k2)/4 of the slot's word h.
            const uint32_t hw = tq_gqa_load_u32(b->qs + 16 + 4*h);
TQ_UNROLL
            for (int k2 = 0; k2 < 2; ++k2) {
                const uint32_t nib = (hw >> (4*m + 16*k2)) & 15u;
                // bit i of nib to bit 8i: nib * (1 + 2^7 + 2^14 + 2^21), the four copies
                // never overlap, so no carries; then to bit 2 of each byte.
                idx[k2] |= ((nib * 0x00204081u) & 0x01010101u) << 2;
            }
        }
    }
}

// A codebook held in registers: on the device lane l holds codebook[l % levels] and a lookup
// is one warp shuffle (every lane of the warp must call it); on the host a table read, which
// is what the parity test runs.
template <int bits> struct tq_gqa_codebook {
#ifdef __CUDA_ARCH__
    float lane;
    __device__ __forceinline__ tq_gqa_codebook() : lane(tq_cuda_codebook<bits>()[threadIdx.x % (1 << bits)]) {}
    // idx: the byte-wide index in bits 0..7 (anything above bit 7 is ignored by the shuffle,
    // which reads bits 0..4 only; bits `bits`..7 are zero).
    __device__ __forceinline__ float operator()(const uint32_t idx) const { return __shfl_sync(0xFFFFFFFF, lane, (int) idx, 32); }
#else
    const float * cb;
    tq_gqa_codebook() : cb(tq_cuda_codebook<bits>()) {}
    float operator()(const uint32_t idx) const { return cb[idx & 0xffu]; }
#endif
};

// A slot's 8 values of block b: vals[e] = codebook[index], scale = the sanitised stored scale
// (NaN, Inf, negative non-zero -> 0, as decode_scale in crates/codec/src/block.rs), read once
// per block; the decoded value is tq_fmul(scale, vals[e]) (the kernel folds the scale into
// the dot product or the softmax weight instead of multiplying each value).
template <int bits> static TQ_HD void tq_gqa_load_turbo(const typename tq_cuda_type<bits>::block * b, const int u,
                                                        const tq_gqa_codebook<bits> & cb, float & scale, float (&vals)[8]) {
    uint32_t idx[2];
    tq_gqa_unpack<bits>(b, u, idx);
    scale = tq_cuda_scale(b->d);
TQ_UNROLL
    for (int e = 0; e < 8; ++e) {
        vals[e] = cb(idx[e >> 2] >> (8*(e & 3)));
    }
}
