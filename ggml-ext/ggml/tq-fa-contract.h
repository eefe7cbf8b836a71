/*
 * tq-fa-contract.h - the turbo-K inputs of GGML_OP_FLASH_ATTN_EXT: named sources of the op,
 * set by one function, that a backend either computes or refuses (C; ggml level).
 *
 * Why they exist: llama keeps the per-head K mean in RoPE's frame and the exact key of each
 * sequence's first token beside a turbo cache (ggml-ext/llama/tq-kmean-rope.h, tq-sink.h).
 * Both change what attention must compute over the stored keys:
 *   score(r, j) = q_r . k_j + A_r . T_j       (before the scale and the softcap, like q.k)
 * where k_j is cell j's key as stored, or the exact first key where cell j holds one. A
 * backend that ignores these sources computes other logits, so every backend's answer goes
 * through tq_fa_k_terms_supported (one call in ggml_backend_dev_supports_op): the ones that
 * implement the contract say so there; every other backend refuses the op, and the
 * scheduler places it elsewhere or llama turns the terms off and says why.
 *
 * The sources, after upstream's q, k, v, mask, sinks (src[0..4]); n_cells = k->ne[1] * k->ne[3]
 * (the cells in view, stream after stream), hd = k->ne[0]:
 *   src[5] A  f32 [hd, n_head, n_tokens * ns]: per query row (token t of stream s, head h at
 *             row (s * n_tokens + t) * n_head + h) the coefficients of its mean term.
 *   src[6] T  f32 [hd, n_cells + TQ_FA_TERM_STEPS]: column j < n_cells the cos/sin table of
 *             cell j's position; the last TQ_FA_TERM_STEPS columns the table of positions 0,
 *             1, ... (a kernel may use them to turn A once per run of consecutive positions).
 *   src[7] C  i32 [n_cells, 2]: row 0 each cell's position, row 1 its slot of the exact first
 *             keys (-1: none).
 *   src[8] R  f32 [hd * n_head_kv, n_slots + 1]: the exact first keys, a row per slot (the
 *             last row is written, never read). Optional, with src[9].
 *   src[9] RQ K's type, same shape: those rows as the cache stores them. A cell with slot
 *             j >= 0 whose stored bytes of KV head h equal RQ's row j, head h, reads R's row j,
 *             head h as its key; any other cell reads its decoded key.
 */
#ifndef TQ_FA_CONTRACT_H
#define TQ_FA_CONTRACT_H

#include "ggml.h"
#include "ggml-backend.h"
#include "tq-ggml.h"

#include <stdint.h>
#include <string.h>

#define TQ_FA_SRC_A 5
#define TQ_FA_SRC_T 6
#define TQ_FA_SRC_CELLS 7
#define TQ_FA_SRC_SINK_ROWS 8
#define TQ_FA_SRC_SINK_Q 9
#if GGML_MAX_SRC < 10
#error "the flash-attention contract needs ten sources"
#endif

/* T's step columns: positions 0 .. TQ_FA_TERM_STEPS - 1 (at least a CPU tile). */
#define TQ_FA_TERM_STEPS 32

/* Whether op is a flash attention that carries the turbo-K terms. */
static inline int tq_fa_has_k_terms(const struct ggml_tensor *op) {
    return op && op->op == GGML_OP_FLASH_ATTN_EXT && op->src[TQ_FA_SRC_A] != NULL;
}

/* Whether op runs a host function of the caller (ggml_custom_*, ggml_map_custom*): only a
   backend in the caller's process can run it, never one behind RPC. */
static inline int tq_ggml_op_calls_host(const struct ggml_tensor *op) {
    return op->op == GGML_OP_CUSTOM || op->op == GGML_OP_MAP_CUSTOM1 || op->op == GGML_OP_MAP_CUSTOM2 ||
           op->op == GGML_OP_MAP_CUSTOM3;
}

/* The exact first keys as a kernel reads them (src[8], src[9]). */
typedef struct {
    const float *rows; /* slot j, head h: rows + j * row_f + h * DK */
    const char *q;     /* the same in K's type: q + j * row_q + h * (bytes of DK values) */
    int64_t n_slots;   /* the readable slots (not the write-only last row) */
    int64_t row_f;     /* floats per slot row */
    size_t row_q;      /* bytes per quantized slot row */
} tq_sink_t;

/* The slots of f32 rows `rows` [n, n_slots + 1] and their copy `q` [n, n_slots + 1] in the
   type of K; n_slots = 0 (none) when either is NULL or their layout is not this one. */
static inline tq_sink_t tq_sink_of(const struct ggml_tensor *rows, const struct ggml_tensor *q) {
    tq_sink_t s = { NULL, NULL, 0, 0, 0 };
    if (!rows || !q || rows->type != GGML_TYPE_F32 || !ggml_is_contiguous(rows) || !ggml_is_contiguous(q) ||
        rows->ne[0] != q->ne[0] || rows->ne[1] != q->ne[1] || rows->ne[1] < 2 || rows->ne[2] != 1 || q->ne[2] != 1) {
        return s;
    }
    s.rows = (const float *) rows->data;
    s.q = (const char *) q->data;
    s.n_slots = rows->ne[1] - 1;
    s.row_f = rows->ne[0];
    s.row_q = q->nb[1];
    return s;
}

/* The exact row (DK floats) of KV head h of a cell whose slot is j (j < 0 or past the slots:
   none) when its stored bytes kb (head_bytes of them) equal the slot's, or NULL. */
static inline const float *tq_sink_find(const tq_sink_t *s, int64_t j, const void *kb, size_t head_bytes, int64_t h,
                                        int64_t DK) {
    if (!s || j < 0 || j >= s->n_slots || memcmp(s->q + j * s->row_q + h * head_bytes, kb, head_bytes) != 0) return NULL;
    return s->rows + j * s->row_f + h * DK;
}

/* Whether the sources of fa have the layout above (0: a caller's bug; the setter asserts it,
   the kernels refuse such an op rather than attend without the terms). */
static inline int tq_fa_k_terms_valid(const struct ggml_tensor *fa) {
    const struct ggml_tensor *q = fa->src[0], *k = fa->src[1];
    const struct ggml_tensor *A = fa->src[TQ_FA_SRC_A], *T = fa->src[TQ_FA_SRC_T], *C = fa->src[TQ_FA_SRC_CELLS];
    const struct ggml_tensor *R = fa->src[TQ_FA_SRC_SINK_ROWS], *RQ = fa->src[TQ_FA_SRC_SINK_Q];
    if (!q || !k || !A || !T || !C) return 0;
    const int64_t hd = k->ne[0], n_cells = k->ne[1] * k->ne[3];
    if (A->type != GGML_TYPE_F32 || !ggml_is_contiguous(A) || A->ne[0] != hd || A->ne[1] != q->ne[2] ||
        A->ne[2] != q->ne[1] * q->ne[3] || A->ne[3] != 1) {
        return 0;
    }
    if (T->type != GGML_TYPE_F32 || !ggml_is_contiguous(T) || T->ne[0] != hd || T->ne[1] != n_cells + TQ_FA_TERM_STEPS ||
        T->ne[2] != 1 || T->ne[3] != 1) {
        return 0;
    }
    if (C->type != GGML_TYPE_I32 || !ggml_is_contiguous(C) || C->ne[0] != n_cells || C->ne[1] != 2 || C->ne[2] != 1 ||
        C->ne[3] != 1) {
        return 0;
    }
    if (!R && !RQ) return 1;
    return R && RQ && RQ->type == k->type && R->ne[0] == hd * k->ne[2] && tq_sink_of(R, RQ).n_slots > 0 &&
           RQ->nb[1] == ggml_row_size(k->type, hd) * (size_t) k->ne[2];
}

/* Attach the terms to a flash attention built by ggml_flash_attn_ext (R, RQ may be NULL). */
static inline void tq_flash_attn_ext_set_k_terms(struct ggml_tensor *fa, struct ggml_tensor *A, struct ggml_tensor *T,
                                                 struct ggml_tensor *C, struct ggml_tensor *R, struct ggml_tensor *RQ) {
    GGML_ASSERT(fa->op == GGML_OP_FLASH_ATTN_EXT && fa->src[TQ_FA_SRC_A] == NULL);
    fa->src[TQ_FA_SRC_A] = A;
    fa->src[TQ_FA_SRC_T] = T;
    fa->src[TQ_FA_SRC_CELLS] = C;
    fa->src[TQ_FA_SRC_SINK_ROWS] = R;
    fa->src[TQ_FA_SRC_SINK_Q] = RQ;
    GGML_ASSERT(tq_fa_k_terms_valid(fa) && "turbo K terms: layout (tq-fa-contract.h)");
}

/* The one place that says which backends run the terms; ggml_backend_dev_supports_op asks it
   for every flash attention that carries them, except on a device that answers itself
   (tq_fa_k_terms_own).
   - CPU: its turbo tiles (ggml-ext/ggml-cpu/tq-ggml-fa.h), i.e. K and V turbo and Q f32.
   - RPC: the remote server runs its own backend's answer (it refuses a graph whose flash
     attention its backend cannot run: ggml-rpc.cpp's graph_compute).
   - Vulkan: its own supports_op answers (tq_vk_supports_op, ggml-ext/ggml-vulkan/tq-vulkan.h):
     a shader turns the terms into the per-head mask its flash attention reads, inside the
     flash attention node, where the layout, K's type and the op's parameters allow.
   Every other backend (CUDA, Metal, ...) refuses until it implements them; llama then lowers
   them to ops every backend has where the device's flash attention takes a mask per head
   (CUDA's GQA kernel: the term and the first keys' corrections in that mask, tq_rf_mask and
   tq_sink_mask_delta), and keeps the fitted mean where it does not. */
static inline const char *tq_fa_dev_reg_name(ggml_backend_dev_t dev) {
    ggml_backend_reg_t reg = dev ? ggml_backend_dev_backend_reg(dev) : NULL;
    return reg ? ggml_backend_reg_name(reg) : "";
}

/* Whether dev's own supports_op says whether it runs the terms. */
static inline int tq_fa_k_terms_own(ggml_backend_dev_t dev) {
    return strcmp(tq_fa_dev_reg_name(dev), "Vulkan") == 0;
}

/* Whether the graph's pieces that feed the terms may be host ops (ggml_custom_*) where dev
   runs them: the CPU, and RPC (whose graph splits run the host ops on the caller's CPU); a
   GPU-class device takes them from ops it has (llama: tq_kmean_rope_dev_terms). */
static inline int tq_fa_k_terms_host_fed(ggml_backend_dev_t dev) {
    const char *name = tq_fa_dev_reg_name(dev);
    return strcmp(name, "CPU") == 0 || strcmp(name, "RPC") == 0;
}

/* What the CPU runs the terms over: its turbo tiles, i.e. turbo K and V, f32 Q, this layout. */
static inline int tq_fa_k_terms_cpu_runs(const struct ggml_tensor *op) {
    return TQ_GGML_IS_TURBO(op->src[1]->type) && TQ_GGML_IS_TURBO(op->src[2]->type) && op->src[0]->type == GGML_TYPE_F32 &&
           tq_fa_k_terms_valid(op);
}

static inline int tq_fa_k_terms_supported(ggml_backend_dev_t dev, const struct ggml_tensor *op) {
    const char *name = tq_fa_dev_reg_name(dev);
    if (strcmp(name, "CPU") == 0) {
        return tq_fa_k_terms_cpu_runs(op);
    }
    if (strcmp(name, "RPC") == 0) {
        return tq_fa_k_terms_valid(op);
    }
    return 0;
}

#endif /* TQ_FA_CONTRACT_H */
