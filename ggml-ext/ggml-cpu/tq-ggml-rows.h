/*
 * tq-ggml-rows.h - how many threads ggml-cpu gives a row-copy node (GET_ROWS / SET_ROWS).
 *
 * Included by ggml-cpu.c only (0102-ggml-cpu.patch), so that changing it rebuilds one file,
 * not everything that includes tq-ggml.h.
 */
#pragma once

#include "tq-ggml.h"

/* Threads for a GET_ROWS / SET_ROWS node (ggml_get_n_tasks). Upstream runs both on one
   thread; a SET_ROWS that encodes into one of our types gets all of them: its rows are
   independent (each thread writes its own cache rows, with its own encoder scratch), and a
   trellis row is a Viterbi search per block (docs/TCQ.md), so prefill would otherwise wait
   on one core for every K and V write. TQ_ROWS_THREADS=0 restores upstream's one thread
   (for measuring the difference; tq-switches.def). */
static inline int tq_ggml_rows_n_tasks(const struct ggml_tensor *node, int n_threads) {
    static int on = -1; /* racy first read is benign: every thread computes the same value */
    if (on < 0) {
        on = tq_switch_get(TQ_SW_ROWS_THREADS); /* "0|1" */
    }
    return on && node->op == GGML_OP_SET_ROWS && TQ_GGML_IS_TURBO(node->type) ? n_threads : 1;
}
