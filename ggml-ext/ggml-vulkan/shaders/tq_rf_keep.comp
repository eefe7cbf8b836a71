#version 450
// tq_rf_keep.comp - the fused K side of the K mean in RoPE's frame (ggml-ext/ggml/tq-rf-keep.h):
// for token t and KV head h, one workgroup writes
//   k'[t, h]  = s k[t, h] - R_t mu'   (R_t the table's rotation, or the identity without one)
//   q'[t, j]  = q[t, j] / s           for the g query heads j of h
//   A[t, j]   = [alpha; beta] of q'[t, j] against mu'
// with mu' and s - 1 from the stored means' column of the token's block. Dispatched by
// tq_vk_rf_keep (tq-vulkan.h) for the GGML_OP_CUSTOM whose function is tq_rf_keep_op.
//
// Invariant: each value is tq_rf_keep_op's expression (tq-rf-keep.cpp: the row helpers), in the
// same order, with `precise` so that no product and sum are contracted into one rounding: a
// row's values do not depend on the batch it comes in, and match the CPU's up to the device's
// division.

#extension GL_EXT_control_flow_attributes : enable

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(binding = 0) readonly buffer Qb { float q[]; };
layout(binding = 1) readonly buffer Kb { float k[]; };
layout(binding = 2) readonly buffer Mb { float m[]; };
layout(binding = 3) readonly buffer Tb { float tab[]; };
layout(binding = 4) writeonly buffer Db { float d[]; };

// Offsets and strides in floats; tq_vk_rf_keep_pc.
layout(push_constant) uniform parameter {
    uint hd, nkv, nt, nq;
    uint per;               // tokens per column of the means
    uint q_off, q_nb1, q_nb2;
    uint k_off, k_nb1, k_nb2;
    uint m_off, m_nb1;
    uint t_off, t_nb1;      // t_off = 0xffffffff: no table
    uint d_off;
    uint flags;             // tq_rf_pairs_bits | TQ_RF_KEEP_BAL (tq-rf-keep.h)
} p;

// tq_rf_ch: channel a (ab = 0) or b (1) of pair i
uint channel(const uint i, const uint ab) {
    const uint n_rot = p.flags >> 8;
    if ((p.flags & 1u) == 0u) {
        return 2u * i + ab;
    }
    const uint r = n_rot > 0u && n_rot < p.hd ? n_rot : p.hd;
    return i < r / 2u ? i + ab * (r / 2u) : r + (i - r / 2u) + ab * ((p.hd - r) / 2u);
}

void main() {
    const uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    const uint half_ = p.hd / 2u, g = p.nq / p.nkv;
    const bool bal = (p.flags & 2u) != 0u;
    const uint mu = p.m_off + (t / p.per) * p.m_nb1 + h * p.hd;   // mu' of head h
    const uint sd = mu + p.hd * p.nkv;                             // its s - 1
    const uint kx = p.k_off + h * p.k_nb1 + t * p.k_nb2;
    const uint ko = p.d_off + (t * p.nkv + h) * p.hd;
    const uint qd = p.d_off + p.hd * p.nkv * p.nt, ad = qd + p.hd * p.nq * p.nt;
    for (uint i = gl_LocalInvocationID.x; i < half_; i += gl_WorkGroupSize.x) {
        const uint ca = channel(i, 0u), cb = channel(i, 1u);
        const float ma = m[mu + ca], mb = m[mu + cb];
        precise float ra = ma, rb = mb;
        if (p.t_off != 0xffffffffu) {
            const float c = tab[p.t_off + t * p.t_nb1 + i], sn = tab[p.t_off + t * p.t_nb1 + half_ + i];
            ra = c * ma - sn * mb;
            rb = sn * ma + c * mb;
        }
        const float sa = bal ? 1.0 + m[sd + ca] : 1.0, sb = bal ? 1.0 + m[sd + cb] : 1.0;
        precise float ka = k[kx + ca], kb = k[kx + cb];
        if (bal) {
            ka = ka * sa;
            kb = kb * sb;
        }
        d[ko + ca] = ka - ra;
        d[ko + cb] = kb - rb;
        for (uint j = h * g; j < (h + 1u) * g; ++j) {
            const uint qx = p.q_off + j * p.q_nb1 + t * p.q_nb2, row = (t * p.nq + j) * p.hd;
            precise float qa = q[qx + ca], qb = q[qx + cb];
            if (bal) {
                qa = qa / sa;
                qb = qb / sb;
            }
            d[qd + row + ca] = qa;
            d[qd + row + cb] = qb;
            precise float alpha = qa * ma + qb * mb, beta = qb * ma - qa * mb;
            d[ad + row + i] = alpha;
            d[ad + row + half_ + i] = beta;
        }
    }
}
