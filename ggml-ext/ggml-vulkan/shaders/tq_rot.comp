#version 450
// tq_rot.comp - the seeded rotation of a decode's rows (ggml-ext/ggml/tq-rot-node.h):
// y_r[i] = sum_k R[k n + i] x_r[k] (R^T x_r; llama's R is symmetric) for row r = the
// workgroup, output i per invocation (stride 64), so that neighbouring invocations read
// neighbouring floats of R. Dispatched by tq_vk_rot (tq-vulkan.h) for the GGML_OP_CUSTOM whose function
// is tq_rot_op.
//
// Invariant: each output is tq_rot_dot's sum (eight partial sums over k mod 8, k ascending,
// combined pairwise), `precise` so that no product and sum are contracted: a row's bits do
// not depend on the rows beside it.

layout(local_size_x = 64, local_size_y = 1, local_size_z = 1) in;

layout(binding = 0) readonly buffer Rb { float r[]; };
layout(binding = 1) readonly buffer Xb { float x[]; };
layout(binding = 2) writeonly buffer Yb { float y[]; };

// Offsets and row strides in floats; tq_vk_rot_pc.
layout(push_constant) uniform parameter {
    uint n;
    uint r_off;
    uint x_off, x_nb1;
    uint y_off, y_nb1;
} p;

void main() {
    const uint row = gl_WorkGroupID.x;
    const uint xr = p.x_off + row * p.x_nb1, yr = p.y_off + row * p.y_nb1;
    for (uint i = gl_LocalInvocationID.x; i < p.n; i += gl_WorkGroupSize.x) {
        precise float s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0, s4 = 0.0, s5 = 0.0, s6 = 0.0, s7 = 0.0;
        uint ri = p.r_off + i;
        const uint step = p.n;
        for (uint k = 0u; k < p.n; k += 8u) {
            const uint xk = xr + k;
            precise float q0 = r[ri] * x[xk];
            precise float q1 = r[ri + step] * x[xk + 1u];
            precise float q2 = r[ri + 2u * step] * x[xk + 2u];
            precise float q3 = r[ri + 3u * step] * x[xk + 3u];
            precise float q4 = r[ri + 4u * step] * x[xk + 4u];
            precise float q5 = r[ri + 5u * step] * x[xk + 5u];
            precise float q6 = r[ri + 6u * step] * x[xk + 6u];
            precise float q7 = r[ri + 7u * step] * x[xk + 7u];
            s0 = s0 + q0;
            s1 = s1 + q1;
            s2 = s2 + q2;
            s3 = s3 + q3;
            s4 = s4 + q4;
            s5 = s5 + q5;
            s6 = s6 + q6;
            s7 = s7 + q7;
            ri += 8u * step;
        }
        precise float t = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7));
        y[yr + i] = t;
    }
}
