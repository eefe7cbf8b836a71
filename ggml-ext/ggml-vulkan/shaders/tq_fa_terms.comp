#version 450
// tq_fa_terms.comp - the turbo K terms of a flash attention (ggml-ext/ggml/tq-fa-contract.h) as
// the per-head mask upstream's flash attention shaders take: for cell j of stream s, query row
// t and head h,
//   out[j, t, h, s] = mask[j, t, s] + scale * (A[t, h] . T[j] + first(j, t, h))
// where first() is q . (R[slot] - k_j) for a cell whose stored bytes of KV head h / g equal its
// slot's quantized copy (it then reads the exact first key; tq-sink.h's match rule) and 0
// otherwise. Rows past the queries (the mask's padding) keep the mask. Dispatched by
// tq_vk_flash_attn (tq-vulkan.h) inside the flash attention node, into a scratch buffer that
// the flash attention then reads as its mask.
//
// Invariant: the sum is the CPU tiles' raw-score term (tq-fa-term.h) in f32, added to the mask
// in f32 and rounded to the mask's f16 once; K is decoded as every turbo shader decodes it
// (tq_block.glsl / tq_tcq.glsl, TQ_BITS or TQ_TCQ_K defined).

#extension GL_EXT_control_flow_attributes : enable
#extension GL_EXT_shader_16bit_storage : require

#if defined(TQ_TCQ_K)
#include "tq_tcq.glsl"
#else
#include "tq_block.glsl"
#endif
#include "tq_fa_terms.h"

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(binding = 0) readonly buffer Qb { float q[]; };
layout(binding = 1) readonly buffer Kb { tq_block k[]; };
layout(binding = 2) readonly buffer Mb { float16_t m[]; };
layout(binding = 3) readonly buffer Ab { float a[]; };
layout(binding = 4) readonly buffer Tb { float t[]; };
layout(binding = 5) readonly buffer Cb { int c[]; };
layout(binding = 6) readonly buffer Rb { float r[]; };
layout(binding = 7) readonly buffer RQb { tq_block rq[]; };
layout(binding = 8) writeonly buffer Ob { float16_t o[]; };

// Offsets and strides in elements of their buffer (floats, blocks, halves); tq_vk_fa_terms_pc.
layout(push_constant) uniform parameter {
    uint n_kv;   // cells per stream
    uint n_rows; // the mask's rows (queries and padding)
    uint n_tok;  // queries per stream
    uint nq;     // query heads
    uint g;      // query heads per KV head
    uint hd;
    uint q_off, q_nb1, q_nb2, q_nb3;
    uint k_off, k_nb1, k_nb2, k_nb3;
    uint m_off, m_nb1, m_nb3; // m_off = 0xffffffff: no mask
    uint a_off, t_off, c_off;
    uint n_cells;             // cells in view, all streams
    uint n_slots;             // readable first-key slots (0: none)
    uint r_off, r_row;        // floats
    uint rq_off, rq_row;      // blocks
    float scale;
} p;


// The first key's correction q . (R - k) for cell j (in stream s) and head h, or 0 where the
// cell has no slot or its bytes of KV head h / g differ from the slot's copy.
float first_key(const uint j, const uint s, const uint row, const uint h, const int slot) {
    const uint hk = h / p.g;
    const uint nb = p.hd / TQ_QK;
    const uint kb = p.k_off + j * p.k_nb1 + hk * p.k_nb2 + s * p.k_nb3;
    const uint qb = p.rq_off + uint(slot) * p.rq_row + hk * nb;
    bool same = true;
    for (uint b = 0u; b < nb; ++b) {
        [[unroll]] for (uint w = 0u; w < TQ_BLOCK_WORDS; ++w) {
            same = same && k[kb + b].w[w] == rq[qb + b].w[w];
        }
    }
    if (!same) {
        return 0.0;
    }
    const uint qo = p.q_off + row * p.q_nb1 + h * p.q_nb2 + s * p.q_nb3;
    const uint ro = p.r_off + uint(slot) * p.r_row + hk * p.hd;
    float d = 0.0;
    for (uint i = 0u; i < p.hd; ++i) {
        d += q[qo + i] * (r[ro + i] - TQ_VALUE(k[kb + i / TQ_QK].w, i % TQ_QK));
    }
    return d;
}

// Invocation (j, row, group z): cell j, query row `row`, heads TQ_FA_TERMS_HEADS * (z % n_groups)
// onwards of stream z / n_groups.
void main() {
    const uint j = gl_GlobalInvocationID.x;
    const uint row = gl_GlobalInvocationID.y;
    const uint n_groups = (p.nq + TQ_FA_TERMS_HEADS - 1u) / TQ_FA_TERMS_HEADS;
    const uint h0 = (gl_GlobalInvocationID.z % n_groups) * TQ_FA_TERMS_HEADS;
    const uint s = gl_GlobalInvocationID.z / n_groups;
    if (j >= p.n_kv) {
        return;
    }
    const uint nh = min(TQ_FA_TERMS_HEADS, p.nq - h0);
    const float mv = p.m_off == 0xffffffffu ? 0.0 : float(m[p.m_off + j + row * p.m_nb1 + s * p.m_nb3]);
    float term[TQ_FA_TERMS_HEADS];
    [[unroll]] for (uint e = 0u; e < TQ_FA_TERMS_HEADS; ++e) {
        term[e] = 0.0;
    }
    if (row < p.n_tok) {
        const uint cell = s * p.n_kv + j;
        const uint ar = p.a_off + ((s * p.n_tok + row) * p.nq + h0) * p.hd;
        const uint tc = p.t_off + cell * p.hd;
        for (uint i = 0u; i < p.hd; ++i) {
            const float tv = t[tc + i];
            [[unroll]] for (uint e = 0u; e < TQ_FA_TERMS_HEADS; ++e) {
                if (e < nh) {
                    term[e] += a[ar + e * p.hd + i] * tv;
                }
            }
        }
        const int slot = p.n_slots > 0u ? c[p.c_off + p.n_cells + cell] : -1;
        if (slot >= 0 && uint(slot) < p.n_slots) {
            for (uint e = 0u; e < nh; ++e) {
                term[e] += first_key(j, s, row, h0 + e, slot);
            }
        }
    }
    [[unroll]] for (uint e = 0u; e < TQ_FA_TERMS_HEADS; ++e) {
        if (e < nh) {
            o[((s * p.nq + h0 + e) * p.n_rows + row) * p.n_kv + j] = float16_t(mv + p.scale * term[e]);
        }
    }
}
