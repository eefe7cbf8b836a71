#version 450
// tq_encode.comp - f32 rows into turbo blocks: SET_ROWS (TQ_SET_ROWS defined, B_TYPE the index
// type) and CPY/DUP from f32. One invocation encodes one block of 64 values.
//
// Invariant: the bytes equal crates/codec's quantize_block (kernels/scalar.rs) for every input.
// Every step is that rule's exactly rounded IEEE operation, in its order: sums, products,
// quotients and square roots in f64 with `precise` (no contraction into FMA), the f64 -> f32 ->
// f16 rounding of the scale done in integer arithmetic (round to nearest even, as `as f32` and
// half::f16::from_f32 do), subnormal f32 inputs widened without the driver's help (tq_f64.glsl).
// It needs shaderFloat64; the host refuses the op on a device without it (tq-vulkan.h).

#extension GL_EXT_control_flow_attributes : enable

#include "tq_block.glsl"

#define A_TYPE float
#define D_TYPE tq_block
#if defined(TQ_SET_ROWS)
#include "generic_binary_head.glsl"
#if B_SIZE == 64
#define TQ_ROW_SWIZZLE .x
#else
#define TQ_ROW_SWIZZLE
#endif
#else
#include "generic_unary_head.glsl"
#endif

layout(local_size_x = 32, local_size_y = 1, local_size_z = 1) in;

#include "tq_f64.glsl"

// The codes of one gain candidate (nibbles, eight per uint) and their sums.
struct tq_cand {
    uint idx[8];
    double cs;
    double score;
};

// us[j] = xs[j] / n, the same quotient for every candidate, so it is divided once per block.
tq_cand tq_classify(const double xs[TQ_QK], const double us[TQ_QK], const int gain) {
    tq_cand c;
    precise double f = double(gain) * TQ_GAIN_STEP_LF;
    double t[TQ_LEVELS - 1];
    [[unroll]] for (int k = 0; k < TQ_LEVELS - 1; ++k) {
        precise double tk = double(TQ_THRESHOLDS[k]) * f;
        t[k] = tk;
    }
    [[unroll]] for (int w = 0; w < 8; ++w) {
        c.idx[w] = 0u;
    }
    precise double cs8[8];
    precise double sx8[8];
    [[unroll]] for (int l = 0; l < 8; ++l) {
        cs8[l] = 0.0lf;
        sx8[l] = 0.0lf;
    }
    for (uint j = 0u; j < TQ_QK; ++j) {
        const double u = us[j];
        uint k = 0u;
        [[unroll]] for (int q = 0; q < TQ_LEVELS - 1; ++q) {
            k += (u > t[q]) ? 1u : 0u;
        }
        c.idx[j >> 3] |= k << ((j & 7u) * 4u);
        const double cv = double(TQ_CODEBOOK[k]);
        const uint l = j & 7u;
        precise double cc = cv * cv;
        precise double xc = xs[j] * cv;
        cs8[l] = cs8[l] + cc;
        sx8[l] = sx8[l] + xc;
    }
    precise double cs = ((cs8[0] + cs8[1]) + (cs8[2] + cs8[3])) + ((cs8[4] + cs8[5]) + (cs8[6] + cs8[7]));
    precise double sxc = ((sx8[0] + sx8[1]) + (sx8[2] + sx8[3])) + ((sx8[4] + sx8[5]) + (sx8[6] + sx8[7]));
    precise double score = sxc * sxc / cs;
    c.cs = cs;
    c.score = score;
    return c;
}

uint tq_idx(const uint idx[8], const uint j) {
    return (idx[j >> 3] >> ((j & 7u) * 4u)) & 15u;
}

void tq_encode(const uint src, const uint dst) {
    double xs[TQ_QK];
    precise double ss = 0.0lf;
    for (uint j = 0u; j < TQ_QK; ++j) {
        const double v = tq_load(src + j);
        xs[j] = v;
        precise double vv = v * v;
        ss = ss + vv;
    }
    precise double n = sqrt(ss);
    uint idx[8];
    uint d = 0u;
    if (n == 0.0lf || isinf(n) || isnan(n)) {
        const uint mid = uint(TQ_LEVELS / 2);
        [[unroll]] for (int w = 0; w < 8; ++w) {
            idx[w] = mid * 0x11111111u;
        }
    } else {
        double us[TQ_QK];
        for (uint j = 0u; j < TQ_QK; ++j) {
            precise double u = xs[j] / n;
            us[j] = u;
        }
        tq_cand best = tq_classify(xs, us, TQ_GAIN_PLAIN);
        int best_gain = TQ_GAIN_PLAIN;
        const int coarse[TQ_GAIN_N_COARSE] = TQ_GAIN_COARSE;
        const int refine[TQ_GAIN_N_REFINE] = TQ_GAIN_REFINE;
        for (int i = 0; i < TQ_GAIN_N_COARSE; ++i) {
            const tq_cand c = tq_classify(xs, us, coarse[i]);
            if (c.score > best.score) {
                best = c;
                best_gain = coarse[i];
            }
        }
        for (int i = 0; i < TQ_GAIN_N_REFINE; ++i) {
            const int centre = best_gain;
            for (int s = -1; s <= 1; s += 2) {
                const int g = centre + s * refine[i];
                const tq_cand c = tq_classify(xs, us, g);
                if (c.score > best.score) {
                    best = c;
                    best_gain = g;
                }
            }
        }
        idx = best.idx;
        precise double r = n / sqrt(best.cs);
        d = tq_scale_bits(r);
    }

    data_d[dst].w[0] = uint16_t(d);
#if TQ_BITS == 4
    for (uint k = 0u; k < 16u; ++k) {
        const uint b0 = tq_idx(idx, 2u * k) | (tq_idx(idx, 2u * k + 32u) << 4);
        const uint b1 = tq_idx(idx, 2u * k + 1u) | (tq_idx(idx, 2u * k + 33u) << 4);
        data_d[dst].w[1u + k] = uint16_t(b0 | (b1 << 8));
    }
#else
    // low two bits, turbo2's layout: byte i holds indices i, i+16, i+32, i+48
    for (uint k = 0u; k < 8u; ++k) {
        uint wv = 0u;
        for (uint h = 0u; h < 2u; ++h) {
            const uint i = 2u * k + h;
            const uint b = (tq_idx(idx, i) & 3u) | ((tq_idx(idx, i + 16u) & 3u) << 2)
                         | ((tq_idx(idx, i + 32u) & 3u) << 4) | ((tq_idx(idx, i + 48u) & 3u) << 6);
            wv |= b << (8u * h);
        }
        data_d[dst].w[1u + k] = uint16_t(wv);
    }
#if TQ_BITS == 3
    // high bits: bit j % 8 of byte 16 + j / 8 is idx[j] >> 2
    for (uint k = 0u; k < 4u; ++k) {
        uint wv = 0u;
        for (uint bit = 0u; bit < 16u; ++bit) {
            wv |= ((tq_idx(idx, 16u * k + bit) >> 2) & 1u) << bit;
        }
        data_d[dst].w[9u + k] = uint16_t(wv);
    }
#endif
#endif
}

void main() {
#if defined(TQ_SET_ROWS)
    const uint idx = ((gl_WorkGroupID.z * 262144 + gl_WorkGroupID.y * 512 + gl_WorkGroupID.x) * 32 + gl_LocalInvocationID.x) * TQ_QK;
    if (idx >= p.ne) {
        return;
    }
    uint i00, i01, i02, i03;
    get_indices(idx, i00, i01, i02, i03);
    const uint i12 = fastmod(i03, p.ne12);
    const uint i11 = fastmod(i02, p.ne11);
    const uint i1 = uint(data_b[src1_idx(i01, i11, i12, 0) + get_boffset()] TQ_ROW_SWIZZLE);
    tq_encode(src0_idx(i00, i01, i02, i03) + get_aoffset(), dst_idx(i00 / TQ_QK, i1, i02, i03) + get_doffset());
#else
    const uint idx = (gl_WorkGroupID.z * 262144 + gl_WorkGroupID.y * 512 + gl_WorkGroupID.x * 32 + gl_LocalInvocationID.x) * TQ_QK;
    if (idx >= p.ne) {
        return;
    }
    // get_doffset(): a destination view's offset in blocks past its descriptor (upstream's
    // copy_to_quant.comp leaves it out, and a CPY into such a view wrote the wrong blocks)
    tq_encode(get_aoffset() + src0_idx(idx), dst_idx_quant(idx, TQ_QK) + get_doffset());
#endif
}
