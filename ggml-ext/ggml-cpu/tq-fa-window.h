/*
 * tq-fa-window.h - the query rows of a prefill chunk share decoded keys (CPU flash
 * attention over turbo K and V; included by tq-ggml-fa.h).
 *
 * A decode (a few query rows) decodes each tile of keys once for the heads of a GQA group
 * (tq_ggml_fa_rows_shared). A prefill chunk holds hundreds of rows over the same keys, and
 * decoding per row made it less than half as fast at depth as decoding the cache to f32 for
 * ggml's tiled kernel, whose float order differs from a decode's: the same prompt then gave
 * other logits when cut into other ubatches (docs/RELIABILITY.md, "Statistics and
 * batching"). Here the keys are decoded once per window of TQ_FA_WIN_BYTES for every row
 * of the chunk that reads the same K/V head, and each row then takes exactly the tiles
 * (runs of its own mask row) that tq_ggml_fa_rows_shared gives it, through the same
 * tq_ggml_fa_heads_tile: a row's bits do not depend on the chunk, the window or the other
 * rows. Rows whose current tile is the same keys take it in one call (up to TQ_FA_GQA_MAX),
 * so one decoded row is loaded for several queries, as it is for a group's heads.
 */
#ifndef TQ_FA_WINDOW_H
#define TQ_FA_WINDOW_H

/* Decoded K and V rows kept per window: about half of a core's L2 for head size 64 (256 keys). */
#define TQ_FA_WIN_BYTES (128 * 1024)

/* A chunk of several query tokens takes the windows when it has at least this many rows (a
   decode's few rows keep tq_ggml_fa_rows_shared's tile on the stack; the bits are the same
   either way). */
#define TQ_FA_WIN_MIN_ROWS 16

/* One query row: its head state, the mask row its tiles follow (its GQA group's first
   head's), the next key to look at, and its current tile (n 0: none in this window). */
typedef struct {
    tq_ggml_fa_head_t h;
    const ggml_fp16_t *runs;
    int64_t ic, start;
    int n, done;
    float mv[TQ_FA_TILE];
} tq_fa_win_row_t;

/* Keys a window holds: a multiple of TQ_FA_TILE, at least two tiles. */
static inline int64_t tq_fa_win_keys(int64_t DK, int64_t DV) {
    int64_t w = TQ_FA_WIN_BYTES / ((DK + DV) * (int64_t) sizeof(float));
    w -= w % TQ_FA_TILE;
    return w < 2 * TQ_FA_TILE ? 2 * TQ_FA_TILE : w;
}

/* Row r's next tile if it lies inside the window (keys before w1): r->n > 0 then; a tile
   past the window leaves r->ic at its start for the next window (tq_ggml_fa_next_run from
   there gives the same tile); none left sets r->done. */
static inline void tq_fa_win_next(tq_fa_win_row_t *r, int64_t w1, int64_t ic1) {
    r->n = 0;
    if (r->done) return;
    const int n = tq_ggml_fa_next_run(r->runs, 1.0f, &r->ic, ic1, &r->start, r->mv);
    if (n == 0) {
        r->done = 1;
    } else if (r->start + n > w1) {
        r->ic = r->start;
    } else {
        r->n = n;
    }
}

/* Rows rows[0..nr) (one K/V head: k, v at its key row 0) over keys [ic0, ic1), each left
   with the M, S and VKQ that tq_ggml_fa_rows_shared would leave it, bit for bit. Scratch:
   kf and vf hold W keys, have W flags (W = tq_fa_win_keys). */
static inline void tq_ggml_fa_window_rows(ggml_to_float_t k_dec, ggml_to_float_t v_dec, const char *k, size_t nbk1,
                                          const char *v, size_t nbv1, tq_fa_win_row_t *rows, int nr, int64_t DK,
                                          int64_t DV, float scale, float softcap, int64_t ic0, int64_t ic1,
                                          const tq_fa_term_cells_t *tc, float *kf, float *vf, unsigned char *have,
                                          int64_t W) {
    for (int r = 0; r < nr; ++r) {
        rows[r].ic = ic0;
        rows[r].done = 0;
    }
    int64_t w0 = ic0;
    for (;;) {
        const int64_t w1 = w0 + W < ic1 ? w0 + W : ic1;
        memset(have, 0, (size_t) (w1 - w0));
        for (int b = 0; b < nr; b += TQ_FA_GQA_MAX) {
            const int be = b + TQ_FA_GQA_MAX < nr ? b + TQ_FA_GQA_MAX : nr;
            for (int r = b; r < be; ++r) tq_fa_win_next(&rows[r], w1, ic1);
            for (;;) {
                /* the first row with a tile here, and every row of the block on the same keys */
                int lead = b;
                while (lead < be && rows[lead].n == 0) ++lead;
                if (lead == be) break;
                const int64_t start = rows[lead].start;
                const int n = rows[lead].n;
                tq_ggml_fa_head_t *hp[TQ_FA_GQA_MAX];
                int in[TQ_FA_GQA_MAX], g = 0;
                for (int r = lead; r < be; ++r) {
                    if (rows[r].n == n && rows[r].start == start) {
                        in[g] = r;
                        hp[g++] = &rows[r].h;
                    }
                }
                for (int i = 0; i < n; ++i) {
                    const int64_t j = start + i - w0;
                    if (have[j]) continue;
                    tq_ggml_fa_decode_key(k_dec, v_dec, k, nbk1, v, nbv1, start + i, DK, DV, tc, kf + j * DK, vf + j * DV);
                    have[j] = 1;
                }
                tq_ggml_fa_heads_tile(hp, g, kf + (start - w0) * DK, vf + (start - w0) * DV, start, n, rows[lead].runs,
                                      rows[lead].mv, DK, DV, scale, softcap, tc);
                for (int i = 0; i < g; ++i) tq_fa_win_next(&rows[in[i]], w1, ic1);
            }
        }
        /* the next window starts at the first tile a row has left: each such tile started
           past w1 - TQ_FA_TILE, so the windows advance */
        int64_t next = ic1;
        for (int r = 0; r < nr; ++r) {
            if (!rows[r].done && rows[r].ic < next) next = rows[r].ic;
        }
        if (next >= ic1) break;
        w0 = next;
    }
}

#endif /* TQ_FA_WINDOW_H */
