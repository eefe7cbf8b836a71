#version 450
// tq_tcq_encode.comp - f32 rows into trellis blocks (TQ_TCQ_K 3: turbo3_tcq, 2: turbo2_tcq):
// SET_ROWS (TQ_SET_ROWS defined, B_TYPE the index type) and CPY/DUP from f32, with the
// interfaces and dispatch shape of tq_encode.comp (32 blocks per workgroup of 32 invocations).
// A Viterbi search over 256 states does not fit one invocation, so the workgroup encodes its 32
// blocks one after another, all 32 invocations on each: the port of the CUDA encoder
// (ggml-ext/ggml-cuda/tq-tcq-encode.cuh), the workgroup in the place of its warp and shared
// memory in the place of its shuffles. Invocation l holds the path costs of states 32 i + l.
//
// Invariant: the bytes equal crates/codec's (docs/TCQ.md, "Encoding rule"), for every input:
// - path costs in f32 as m + e * e, e = u - T, `precise` (never contracted into an FMA);
// - the group minimum over hi = 0, 1, .. with a strict < (ties to the lowest hi), which is also
//   the traceback's predecessor (Rust: the lowest hi whose cost equals the minimum);
// - the end state: the lowest-numbered minimum (free pass), or the first admitted state unless
//   a later one costs strictly less (tail-biting pass); costs are never NaN (u is finite);
// - norm, u = f32(x / (n / 8)) and the scale fit in f64, sums sequential in value order, the
//   f64 -> f32 (u) and f64 -> f32 -> f16 (scale) roundings in integer arithmetic (tq_f64.glsl).
//   u below f32's normal range becomes 0 where Rust keeps a subnormal: u only enters as u - T,
//   and every table entry has |T| >= 0.025, so u - T rounds to -T either way.
// It needs shaderFloat64; the host refuses the op on a device without it (tq-vulkan.h).

#extension GL_EXT_control_flow_attributes : enable

#include "tq_tcq.glsl"

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

#define TQ_K uint(TQ_TCQ_K)
#define TQ_G (256u >> TQ_K)     // groups of predecessors (also the overlap range)
#define TQ_R (TQ_G / 32u)       // groups per invocation
#define TQ_NH (1u << TQ_K)      // predecessors per group
#define TQ_NWORDS (1u + 4u * TQ_K) // uint16 words of a block: the scale, then 8 k payload bytes

shared uint sh_bp[TQ_QK - 1][32]; // step t's argmins of invocation l's groups (4 bits per group)
shared float sh_m[2][TQ_G];       // group minima, double-buffered by the step's parity
shared float sh_u[TQ_QK];         // the block's u
shared float sh_bc[32];           // per invocation: its best end cost and state
shared uint sh_bs[32];
shared uint sh_st[TQ_QK];         // the path of the tail-biting pass

// One Viterbi pass (tq_tcq_pass in the CUDA source) over u rotated by rot (value t is
// sh_u[(t + rot) % 64]). tb: only start states with s >> k == o and end states with
// s mod G == o; else any start and end. Traces back from the best end state down to value
// stop (into sh_st when store) and returns the state there, the same in every invocation.
uint tq_pass(const bool tb, const uint o, const uint rot, const uint stop, const bool store, const float tab[8]) {
    const uint l = gl_LocalInvocationID.x;
    float c[8];
    const float u0 = sh_u[rot & 63u];
    [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        precise float e = u0 - tab[i];
        precise float ee = e * e;
        c[i] = (tb && ((32u * i + l) >> TQ_K) != o) ? uintBitsToFloat(0x7f800000u) : ee;
    }
    for (uint t = 1u; t < TQ_QK; ++t) {
        // the minima of this invocation's groups 32 r + l: predecessors hi G + 32 r + l
        uint packed = 0u;
        [[unroll]] for (uint r = 0u; r < TQ_R; ++r) {
            float mv = c[r];
            uint a = 0u;
            [[unroll]] for (uint hi = 1u; hi < TQ_NH; ++hi) {
                const float cc = c[hi * TQ_R + r];
                if (cc < mv) {
                    mv = cc;
                    a = hi;
                }
            }
            sh_m[t & 1u][32u * r + l] = mv;
            packed |= a << (4u * r);
        }
        sh_bp[t - 1u][l] = packed;
        barrier();
        // state s = 32 i + l continues group s >> k (the other buffer of sh_m is the one the
        // next step writes: every invocation has passed this step's barrier before that)
        const float ut = sh_u[(t + rot) & 63u];
        [[unroll]] for (uint i = 0u; i < 8u; ++i) {
            const float mm = sh_m[t & 1u][(32u * i + l) >> TQ_K];
            precise float e = ut - tab[i];
            precise float ee = e * e;
            precise float cn = mm + ee;
            c[i] = cn;
        }
    }

    // the best end state, gathered through shared memory
    if (tb) {
        if (l == (o & 31u)) {
            // admitted states s = h G + o, ascending h: i = h R + (o >> 5)
            float b = 0.0;
            uint bs = 0xffffffffu;
            [[unroll]] for (uint i = 0u; i < 8u; ++i) {
                if (i % TQ_R == (o >> 5) && (bs == 0xffffffffu || c[i] < b)) {
                    b = c[i];
                    bs = 32u * i + l;
                }
            }
            sh_bs[0] = bs;
        }
        barrier();
    } else {
        float b = c[0];
        uint bs = l;
        [[unroll]] for (uint i = 1u; i < 8u; ++i) {
            if (c[i] < b) {
                b = c[i];
                bs = 32u * i + l;
            }
        }
        sh_bc[l] = b;
        sh_bs[l] = bs;
        barrier();
    }
    uint s = sh_bs[0];
    if (!tb) {
        // the lowest-numbered state of the minimum cost: (cost, state) in lexicographic order
        float b = sh_bc[0];
        for (uint j = 1u; j < 32u; ++j) {
            const float cj = sh_bc[j];
            const uint sj = sh_bs[j];
            if (cj < b || (cj == b && sj < s)) {
                b = cj;
                s = sj;
            }
        }
    }

    // traceback: the predecessor of s at step t is (argmin of group s >> k at t - 1) << (8 - k) | s >> k
    if (store && l == 0u) {
        sh_st[TQ_QK - 1u] = s;
    }
    for (uint t = TQ_QK - 1u; t > stop; --t) {
        const uint gi = s >> TQ_K;
        const uint a = (sh_bp[t - 1u][gi & 31u] >> (4u * (gi >> 5))) & 15u;
        s = (a << (8u - TQ_K)) | gi;
        if (store && l == 0u) {
            sh_st[t - 1u] = s;
        }
    }
    barrier(); // sh_bp, sh_bc and sh_bs are read by all before the next pass writes them
    return s;
}

// Encodes the 64 values at data_a[src..] into block dst; every invocation calls it with the same
// arguments (so the branches below are uniform and the barriers legal).
void tq_encode_block(const uint src, const uint dst) {
    const uint l = gl_LocalInvocationID.x;

    // 1. sanitize, norm in f64, sequential (every invocation the same)
    precise double ss = 0.0lf;
    for (uint j = 0u; j < TQ_QK; ++j) {
        const double v = tq_load(src + j);
        precise double vv = v * v;
        ss = ss + vv;
    }
    precise double n = sqrt(ss);

    // 2. a zero block: scale 0, every payload bit 0
    if (n == 0.0lf || isinf(n) || isnan(n)) {
        if (l < TQ_NWORDS) {
            data_d[dst].w[l] = uint16_t(0u);
        }
        return;
    }

    // 3. u_j = f32(x_j / (n / 8)); invocation l writes u_l and u_{l+32}
    precise double r = n / 8.0lf;
    precise double q0 = tq_load(src + l) / r;
    precise double q1 = tq_load(src + l + 32u) / r;
    sh_u[l] = uintBitsToFloat((unpackDouble2x32(q0).y & 0x80000000u) | tq_f32_bits(q0));
    sh_u[l + 32u] = uintBitsToFloat((unpackDouble2x32(q1).y & 0x80000000u) | tq_f32_bits(q1));
    float tab[8];
    [[unroll]] for (uint i = 0u; i < 8u; ++i) {
        tab[i] = TQ_TCQ_TABLE[32u * i + l];
    }
    barrier();

    // 4. tail-biting search: a free pass over u rotated by 32 (its value 31 is u_63) fixes the
    // overlap o, then the pass that starts and ends with it
    const uint s63 = tq_pass(false, 0u, 32u, 31u, false, tab);
    const uint o = s63 & (TQ_G - 1u);
    tq_pass(true, o, 0u, 0u, true, tab);

    // 5. least-squares scale (f64, sequential), norm-restoring if that is not positive
    precise double xt = 0.0lf;
    precise double tt = 0.0lf;
    for (uint j = 0u; j < TQ_QK; ++j) {
        const double v = tq_load(src + j);
        const double t = double(TQ_TCQ_TABLE[sh_st[j]]);
        precise double xv = v * t;
        precise double tv = t * t;
        xt = xt + xv;
        tt = tt + tv;
    }
    precise double d = 0.0lf;
    if (xt > 0.0lf) {
        d = xt / tt;
    } else if (tt > 0.0lf) {
        d = n / sqrt(tt);
    }
    const uint dh = d > 0.0lf ? tq_scale_bits(d) : 0u;

    // 6. symbols c_t = s_t mod 2^k, MSB-first: invocation w writes word w (payload bytes
    // 2w - 2 and 2w - 1; stream bit p is bit 7 - p % 8 of byte p / 8)
    if (l < TQ_NWORDS) {
        uint wv = dh;
        if (l > 0u) {
            wv = 0u;
            for (uint p = 16u * (l - 1u); p < 16u * l; ++p) {
                const uint bit = (sh_st[p / TQ_K] >> (TQ_K - 1u - p % TQ_K)) & 1u;
                wv |= bit << ((p & 8u) + 7u - (p & 7u));
            }
        }
        data_d[dst].w[l] = uint16_t(wv);
    }
    barrier(); // sh_u and sh_st are read by all before the next block writes them
}

void main() {
    for (uint b = 0u; b < 32u; ++b) {
#if defined(TQ_SET_ROWS)
        const uint idx = ((gl_WorkGroupID.z * 262144 + gl_WorkGroupID.y * 512 + gl_WorkGroupID.x) * 32 + b) * TQ_QK;
        if (idx >= p.ne) {
            return;
        }
        uint i00, i01, i02, i03;
        get_indices(idx, i00, i01, i02, i03);
        const uint i12 = fastmod(i03, p.ne12);
        const uint i11 = fastmod(i02, p.ne11);
        const uint i1 = uint(data_b[src1_idx(i01, i11, i12, 0) + get_boffset()] TQ_ROW_SWIZZLE);
        tq_encode_block(src0_idx(i00, i01, i02, i03) + get_aoffset(), dst_idx(i00 / TQ_QK, i1, i02, i03) + get_doffset());
#else
        const uint idx = (gl_WorkGroupID.z * 262144 + gl_WorkGroupID.y * 512 + gl_WorkGroupID.x * 32 + b) * TQ_QK;
        if (idx >= p.ne) {
            return;
        }
        tq_encode_block(get_aoffset() + src0_idx(idx), dst_idx_quant(idx, TQ_QK) + get_doffset());
#endif
    }
}
