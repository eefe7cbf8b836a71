/*
 * tq-rot-node.h - the seeded rotation of a decode's rows as one ggml node (C++, ggml level).
 *
 * A turbo cache rotates Q, K, V and the attention output with its seeded n x n matrix
 * (tq-ggml-graph.h, tq_mul_mat_rot). As a matrix product a small batch must be shaped as
 * one mat-vec per row to give a token the same bits alone and inside a speculative draft's
 * verification, and on a GPU-class device each such mat-vec over a batch of rows costs far
 * more than the product it computes (lavapipe: about 0.5 ms for 9 rows of 64, four times
 * upstream's tiled matmul over the same rows). This node computes
 *
 *   y_r = R^T x_r    for every row r of x [n, rows]: y_r[i] = sum_k R[k n + i] x_r[k]
 *
 * with each output's sum in one fixed order (tq_rot_dot), so a row's bits never depend on
 * the other rows. R is read by columns so that a kernel's threads (one per output i) read
 * consecutive floats; llama passes its seeded matrix, D H D / sqrt(n), whose entries s_i s_j
 * h_ij are symmetric bit for bit (crates/capi/tests/codec_rotation.rs), so the node
 * gives R x, what ggml_mul_mat(R, x) computes. Its function, tq_rot_op, is defined once in ggml-base (tq-rot-node.cpp);
 * a backend recognises the node by that address (tq_rot_is) and runs its own kernel
 * (ggml-vulkan: shaders/tq_rot.comp). llama takes the node only where every layer's cache sits
 * on a device that claims it (supports_op), not on the CPU, which keeps ggml's mul_mat.
 */
#ifndef TQ_ROT_NODE_H
#define TQ_ROT_NODE_H

#include "ggml.h"
#include "tq-custom-op.h"

#include <stdint.h>

/* The largest n the node takes (llama's K rotation is the largest power of two dividing the
   head, at most the head: 512 for Gemma 4's widest). */
#define TQ_ROT_N_MAX 512

/* y[i] = sum_k R[k n + i] x[k] (r = R + i), as eight partial sums over k mod 8 (k ascending
   within each) combined pairwise: the one order every kernel of the node follows. */
static inline float tq_rot_dot(const float * r, const float * x, int64_t n) {
    float s[8] = { 0, 0, 0, 0, 0, 0, 0, 0 };
    for (int64_t k = 0; k < n; ++k) {
        const float p = r[k * n] * x[k];
        s[k & 7] = s[k & 7] + p;
    }
    return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/* The node's function (tq-rot-node.cpp): src[0] R [n, n], src[1] x [n, rows], both f32 and
   contiguous; dst [n, rows]. Work is split by rows. */
GGML_API void tq_rot_op(struct ggml_tensor * dst, int ith, int nth, void * userdata);

/* Whether `op` is this node (tq-custom-op.h). */
static inline bool tq_rot_is(const struct ggml_tensor * op) {
    return tq_custom_op_is(op, tq_rot_op);
}

/* The layout tq_rot_op reads and writes, for the builder and every backend's supports_op. */
static inline bool tq_rot_layout_ok(const struct ggml_tensor * rot, const struct ggml_tensor * x) {
    const int64_t n = rot->ne[0];
    return rot->type == GGML_TYPE_F32 && x->type == GGML_TYPE_F32 && n > 0 && n % 8 == 0 && n <= TQ_ROT_N_MAX &&
           rot->ne[1] == n && rot->ne[2] == 1 && rot->ne[3] == 1 && ggml_is_contiguous(rot) && ggml_is_contiguous(x) &&
           x->ne[0] == n && x->ne[2] == 1 && x->ne[3] == 1;
}

/* Whether `op` is this node with that layout and its output. */
static inline bool tq_rot_valid(const struct ggml_tensor * op) {
    if (!tq_rot_is(op) || !op->src[0] || !op->src[1] || op->src[2] || op->type != GGML_TYPE_F32 || !ggml_is_contiguous(op)) {
        return false;
    }
    return tq_rot_layout_ok(op->src[0], op->src[1]) && op->ne[0] == op->src[1]->ne[0] && op->ne[1] == op->src[1]->ne[1] &&
           op->ne[2] == 1 && op->ne[3] == 1;
}

/* R^T x_r for the rows of x [n, rows]: [n, rows]. */
static inline struct ggml_tensor * tq_rot_node(struct ggml_context * ctx, struct ggml_tensor * rot, struct ggml_tensor * x) {
    GGML_ASSERT(tq_rot_layout_ok(rot, x));
    struct ggml_tensor * args[2] = { rot, x };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, x->ne[0], x->ne[1], 1, 1, args, 2, tq_rot_op, GGML_N_TASKS_MAX, nullptr);
}

#endif /* TQ_ROT_NODE_H */
