/*
 * tq-rf-keep.h - the K side of the K mean in RoPE's frame as one ggml node (C++, ggml level):
 * what a KEEP ubatch stores and attends with, for every backend that runs the node.
 *
 * llama's graph (ggml-ext/llama/tq-kmean-rope.h) keeps each key as s k - R_p mu' and attends
 * with q / s plus a per-key term whose coefficients A come from q / s and mu'. Built from ops
 * every backend has, that is about ten nodes a layer; on a decode step each node costs a
 * thread barrier on the CPU and a dispatch on a GPU (about 90 us each on lavapipe, whatever
 * their size). This node computes all of it at once, from q, k, the stored means and an
 * optional position table:
 *
 *   k' = s k - R_p mu'   (no table: R_p is the identity, k' = s k - mu', for a k before its
 *                         rope, which the caller then ropes: R_p(s k~ - mu') = s k - R_p mu')
 *   q' = q / s,  A = [alpha; beta] of q' against mu' (tq_rf_coeffs_row)
 *
 * Its function, tq_rf_keep_op, is defined once in ggml-base (tq-rf-keep.cpp), so that a
 * backend can tell this GGML_OP_CUSTOM from any other by the function's address
 * (tq_rf_keep_is) and run its own kernel (ggml-vulkan: shaders/tq_rf_keep.comp; ggml-cuda:
 * ggml-cuda/tq-cuda-rf-keep.cuh); the CPU runs the function itself, which is also the oracle of
 * the other kernels. A backend that does not know the node refuses it (supports_op), and llama
 * then builds the ops instead.
 *
 * Invariant: every value is tq_rf_keep_rows' arithmetic (tq-rf-rows.h), per (token, KV head),
 * so a row gets the same bits whatever batch it comes in.
 */
#ifndef TQ_RF_KEEP_H
#define TQ_RF_KEEP_H

#include "ggml.h"
#include "tq-custom-op.h"
#include "tq-rf-rows.h"

#include <stdint.h>
#include <string.h>

/* The node's function (tq-rf-keep.cpp): sources q [hd, nq, nt], k [hd, nkv, nt] (rows of f32,
   any row strides), the means [mu' | s - 1] as columns [F, nb] (contiguous; token t takes
   column t / (nt / nb); s - 1 only with TQ_RF_KEEP_BAL) and the table T [hd, nt] or none; one
   f32 output holding k' [hd, nkv, nt], then q' [hd, nq, nt], then A [hd, nq, nt], each
   contiguous. Work is split by (token, KV head). */
GGML_API void tq_rf_keep_op(struct ggml_tensor * dst, int ith, int nth, void * userdata);

/* Whether `op` is this node (tq-custom-op.h). */
static inline bool tq_rf_keep_is(const struct ggml_tensor * op) {
    return tq_custom_op_is(op, tq_rf_keep_op);
}

/* The node's userdata (pairs and TQ_RF_KEEP_BAL). */
static inline uintptr_t tq_rf_keep_flags(const struct ggml_tensor * op) {
    return tq_custom_op_userdata(op);
}

/* The layout tq_rf_keep_op reads and writes (shapes, types, strides), for the builder's check
   and every backend's supports_op. */
static inline bool tq_rf_keep_layout_ok(const struct ggml_tensor * q, const struct ggml_tensor * k,
                                        const struct ggml_tensor * cols, const struct ggml_tensor * T, bool bal) {
    const int64_t hd = k->ne[0], nkv = k->ne[1], nt = k->ne[2], nq = q->ne[1];
    const size_t f = sizeof(float);
    return q->type == GGML_TYPE_F32 && k->type == GGML_TYPE_F32 && cols->type == GGML_TYPE_F32 && q->nb[0] == f &&
           k->nb[0] == f && q->ne[0] == hd && q->ne[2] == nt && q->ne[3] == 1 && k->ne[3] == 1 && nkv > 0 && nq % nkv == 0 &&
           hd % 2 == 0 && hd <= TQ_RF_HD_MAX && ggml_is_contiguous(cols) && cols->ne[0] == (bal ? 2 : 1) * hd * nkv &&
           cols->ne[1] > 0 && nt % cols->ne[1] == 0 && cols->ne[2] == 1 && cols->ne[3] == 1 &&
           (!T || (T->type == GGML_TYPE_F32 && T->nb[0] == f && T->ne[0] == hd && T->ne[1] == nt && T->ne[2] == 1 && T->ne[3] == 1));
}

/* Whether `op` is this node with the layout above and its one output. */
static inline bool tq_rf_keep_valid(const struct ggml_tensor * op) {
    if (!tq_rf_keep_is(op) || !op->src[0] || !op->src[1] || !op->src[2] || op->src[4] || op->type != GGML_TYPE_F32 ||
        !ggml_is_contiguous(op)) {
        return false;
    }
    const struct ggml_tensor * q = op->src[0], * k = op->src[1];
    const bool bal = (tq_rf_keep_flags(op) & TQ_RF_KEEP_BAL) != 0;
    return tq_rf_keep_layout_ok(q, k, op->src[2], op->src[3], bal) &&
           ggml_nelements(op) == k->ne[0] * (k->ne[1] + 2 * q->ne[1]) * k->ne[2];
}

/* The node's tensors as tq_rf_keep_rows reads them: their data pointers (host or device
   memory, as the backend holds them) and byte strides. */
static inline tq_rf_keep_args tq_rf_keep_args_of(struct ggml_tensor * dst) {
    const struct ggml_tensor * q = dst->src[0], * k = dst->src[1], * m = dst->src[2], * T = dst->src[3];
    tq_rf_keep_args a;
    a.q = (const float *) q->data;
    a.k = (const float *) k->data;
    a.m = (const float *) m->data;
    a.tab = T ? (const float *) T->data : nullptr;
    a.d = (float *) dst->data;
    a.hd = k->ne[0];
    a.nkv = k->ne[1];
    a.nt = k->ne[2];
    a.nq = q->ne[1];
    a.per = k->ne[2] / m->ne[1];
    a.q_nb1 = q->nb[1];
    a.q_nb2 = q->nb[2];
    a.k_nb1 = k->nb[1];
    a.k_nb2 = k->nb[2];
    a.m_nb1 = m->nb[1];
    a.t_nb1 = T ? T->nb[1] : 0;
    a.flags = tq_rf_keep_flags(dst);
    return a;
}

/* The node over q, k, the means' columns and T (or NULL), flags tq_rf_pairs_bits(pr, hd) |
   TQ_RF_KEEP_BAL with balancing: its one output [hd (nkv + 2 nq) nt] (the layout above). */
static inline struct ggml_tensor * tq_rf_keep_node(struct ggml_context * ctx, struct ggml_tensor * q, struct ggml_tensor * k,
                                                   struct ggml_tensor * cols, struct ggml_tensor * T, uintptr_t flags) {
    GGML_ASSERT(tq_rf_keep_layout_ok(q, k, cols, T, (flags & TQ_RF_KEEP_BAL) != 0));
    struct ggml_tensor * args[4] = { q, k, cols, T };
    return ggml_custom_4d(ctx, GGML_TYPE_F32, k->ne[0] * (k->ne[1] + 2 * q->ne[1]) * k->ne[2], 1, 1, 1, args, T ? 4 : 3,
                          tq_rf_keep_op, GGML_N_TASKS_MAX, (void *) flags);
}

#endif /* TQ_RF_KEEP_H */
