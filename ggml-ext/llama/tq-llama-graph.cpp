// tq-llama-graph.cpp - turboquant's pieces of llama's attention graph: K mean removal and
// K/Q balancing on the roped K, the turbo K terms (or their lowered form) and the exact first
// keys beside the cache, the CPU prefill's decoded K/V (tq-kmean.h, tq-kmean-rope.h and
// tq-sink.h have the graph pieces and the reasoning). A source of libllama (the patch adds it
// to the target in src/CMakeLists.txt, where upstream's unity build may batch it with model
// sources: its own names are in an anonymous namespace or static); llama-graph.cpp includes
// tq-llama-graph.h for the four calls the patch makes.
//
// The mode (SET / KEEP / ZERO) the host picked for this ubatch shapes the graph, and a graph
// input of this file carries it: a graph built for one mode is never reused for another, and
// a SET graph gets the position maps M through the input tensor, filled from the ubatch's
// positions by llama's ordinary input path.

#include "tq-llama-graph.h"

#include "ggml-backend.h"
#include "llama-graph.h"
#include "llama-impl.h"
#include "llama-kv-cache.h"
#include "llama-cparams.h"
#include "tq-ggml-graph.h"
#include "tq-kmean.h"
#include "tq-sink.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>
#include <vector>

namespace {

class tq_kmean_input : public llm_graph_input_i {
public:
    tq_kmean_input(const llama_kv_cache * kv, int mode) : kv(kv), mode(mode) {}

    void set_input(const llama_ubatch * ubatch) override {
        if (map) {
            std::vector<float> buf(ggml_nelements(map), 0.0f);
            kv->tq_kmean_fill_map(*ubatch, buf.data(), map->ne[0]);
            ggml_backend_tensor_set(map, buf.data(), 0, ggml_nbytes(map));
        }
        if (stat_w) {
            // per block (stream) of the ubatch: its statistics are its own tokens'
            const int64_t per = stat_w->ne[1];
            std::vector<float> w(ubatch->n_tokens);
            for (int64_t b = 0; b * per < (int64_t) ubatch->n_tokens; ++b) {
                tq_kmean_stat_weights(ubatch->pos + b * per, per, stat_skip_first, w.data() + b * per);
            }
            ggml_backend_tensor_set(stat_w, w.data(), 0, ggml_nbytes(stat_w));
        }
        if (streams && streams->buffer) { // a one-stream KEEP graph reads its column as a view
            std::vector<int32_t> st(streams->ne[0]), sl(streams->ne[0]);
            kv->tq_kmean_fill_blocks(*ubatch, st.data(), sl.data(), streams->ne[0] - 1);
            ggml_backend_tensor_set(streams, st.data(), 0, ggml_nbytes(streams));
            if (sel) {
                ggml_backend_tensor_set(sel, sl.data(), 0, ggml_nbytes(sel));
            }
        }
        if (sink_idx) {
            // each token's slot of the exact first keys (tq-sink.h)
            const int64_t n_slots = kv->tq_sink_slots();
            std::vector<int64_t> idx(ubatch->n_tokens);
            for (uint32_t j = 0; j < ubatch->n_tokens; ++j) {
                // a token of several sequences writes its lowest one's slot, the slot its cell
                // reads (tq_sink_fill_cells)
                llama_seq_id s = ubatch->n_seq_id[j] > 0 ? ubatch->seq_id[j][0] : -1;
                for (int32_t k = 1; k < ubatch->n_seq_id[j]; ++k) {
                    s = std::min(s, ubatch->seq_id[j][k]);
                }
                idx[j] = tq_sink_slot(ubatch->pos[j], s, n_slots);
            }
            ggml_backend_tensor_set(sink_idx, idx.data(), 0, ggml_nbytes(sink_idx));
        }
        if (cells) {
            kv->tq_sink_fill_cells(*ubatch, cells, kv_streams, cells_slots);
            kv->tq_kv_fill_positions(*ubatch, cells, kv_streams);
        }
        if (steps && steps->buffer) {
            std::vector<int32_t> p(TQ_FA_TERM_STEPS);
            for (int32_t i = 0; i < TQ_FA_TERM_STEPS; ++i) {
                p[i] = i;
            }
            ggml_backend_tensor_set(steps, p.data(), 0, ggml_nbytes(steps));
        }
        for (ggml_tensor * t : rope_e) {
            std::vector<float> e(t->ne[0], 0.0f);
            std::fill(e.begin(), e.begin() + e.size() / 2, 1.0f);
            ggml_backend_tensor_set(t, e.data(), 0, ggml_nbytes(t));
        }
        if (sel_cells) {
            kv->tq_sink_fill_select(*ubatch, sel_cells, sel_slots, sel_onehot);
        }
        for (size_t i = 0; i < tab_ub.size(); ++i) {
            // a table no node reads has no memory (a lowered layer that takes its own rope
            // reads the ubatch's only for SET statistics)
            auto used = [](ggml_tensor * t) { return t && t->buffer ? t : nullptr; };
            kv->tq_kmean_rope_fill((int) i, *ubatch, used(tab_ub[i]), used(tab_kv[i]), kv_streams);
        }
    }

    // the graph fits a ubatch of the same mode and blocks (the positions and streams only
    // change the inputs' data)
    bool can_reuse(const llm_graph_params & params) override {
        GGML_UNUSED(params);
        return kv->tq_kmean_mode_get() == mode && (!streams || kv->tq_kmean_n_blocks() == streams->ne[0] - 1) &&
               (!sink_decided || sink_wrote == kv->tq_sink_ub_writes());
    }

    const llama_kv_cache * kv;
    const int mode;
    ggml_tensor * map = nullptr; // SET only: f32 [hd_max * hd_max, n_layer], layer il's M in row il
    // SET in RoPE's frame: f32 [1, n_tokens / nb, nb], the tokens' weights in the statistics of
    // their block (tq_kmean_stat_weights), skipping the first keys where the cache keeps them exact
    ggml_tensor * stat_w = nullptr;
    bool stat_skip_first = false;
    // in RoPE's frame (tq_kmean_rf_streams): i32 [nb + 1], the stream of each block of the
    // ubatch's tokens and the shared column's row; and (not KEEP) each one's column choice
    ggml_tensor * streams = nullptr, * sel = nullptr;

    // the mean in RoPE's frame (tq-kmean-rope.h), per set of RoPE frequencies: the position
    // tables of the ubatch's tokens [hd, n_tokens] and of the cells in view [hd, n_kv * the
    // view's streams + TQ_FA_TERM_STEPS] (T of tq-fa-contract.h); per layer, the per-key term's
    // coefficients from tq_kmean_apply
    std::vector<ggml_tensor *> tab_ub, tab_kv;
    int64_t kv_streams = 1;
    std::vector<ggml_tensor *> coeffs;
    std::vector<ggml_tensor *> cols; // per layer: the means [F, nb] its blocks run on
    // per layer with the terms lowered: the rope node that turns its mean (tq_rf_rope_of), and
    // the cells' tables built from such nodes on the device (tq_rf_rope_table), one per set of
    // rope parameters, from e (f32 [hd, 1, 1]: 1 in the first half, 0 in the second)
    std::vector<const ggml_tensor *> ropes;
    struct rope_tab {
        const ggml_tensor * rope;
        ggml_tensor * e;                 // the rope's input of ones (rope_e, by head size)
        ggml_tensor * T;
        ggml_tensor * T_steps = nullptr; // T and the step columns (tq_rope_terms_table)
    };
    std::vector<rope_tab> rope_tabs;
    std::vector<ggml_tensor *> rope_e; // one per head size
    ggml_tensor * steps = nullptr;     // i32 [TQ_FA_TERM_STEPS]: positions 0, 1, ... (tq_rope_terms_table)
    // the lowered terms' masks: each graph mask with its f32 copy, made once
    std::vector<std::pair<ggml_tensor *, ggml_tensor *>> masks_f32;
    ggml_tensor * sink_idx = nullptr; // i64 [n_tokens]: each token's slot of the exact first keys
    // whether the graph chose about writing first keys, and wrote them (tq_sink_ub_writes)
    bool sink_decided = false, sink_wrote = false;
    // i32 [n_kv * the view's streams, 2]: each cell's position and its slot of the exact first
    // keys (C of tq-fa-contract.h; slots all -1 unless cells_slots)
    ggml_tensor * cells = nullptr;
    bool cells_slots = false;
    // the lowered first keys (tq_sink_delta), for layers that do not read them natively (a device
    // that takes the terms as a mask; a CPU decode whose V is not turbo):
    // per stream the cells that have a slot, i32 [n_sel, ns]; their slots i32 [n_sel ns]; and the
    // one-hot map entry -> cell f32 [n_sel, n_kv, 1, ns] (tq_sink_fill_select)
    ggml_tensor * sel_cells = nullptr, * sel_slots = nullptr, * sel_onehot = nullptr;

    // per layer, the turbo K terms its flash attention takes (tq_llama_fa_k_terms)
    struct fa_terms {
        ggml_tensor * A = nullptr, * T = nullptr, * C = nullptr, * R = nullptr, * RQ = nullptr;
    };
    std::vector<fa_terms> fa;
};

} // namespace

// The position table of RoPE frequency set `set` for n columns (ubatch tokens or cells).
static ggml_tensor * tq_kmean_rope_table(ggml_context * ctx, tq_kmean_input * in, std::vector<ggml_tensor *> & tabs,
                                                int set, int64_t n, const char * name) {
    if (tabs.size() <= (size_t) set) {
        tabs.resize(set + 1, nullptr);
        in->tab_ub.resize(set + 1, nullptr);
        in->tab_kv.resize(set + 1, nullptr);
    }
    if (!tabs[set]) {
        tabs[set] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, in->kv->tq_kmean_rope_hd(set), n);
        ggml_set_input(tabs[set]);
        ggml_format_name(tabs[set], "%s_%d", name, set);
    }
    return tabs[set];
}

static tq_kmean_input * tq_kmean_input_find(llm_graph_result * res, const llama_kv_cache * kv) {
    for (auto & i : res->inputs) {
        auto * t = dynamic_cast<tq_kmean_input *>(i.get());
        if (t && t->kv == kv) {
            return t;
        }
    }
    return nullptr;
}

// The mode a graph is built for: the host's choice, or for a graph built before any ubatch
// (the scheduler's reserve) the largest one its size allows.
static int tq_kmean_graph_mode(const llama_kv_cache * kv, int64_t n_tokens) {
    const int mode = kv->tq_kmean_mode_get();
    if (mode < 0) {
        return n_tokens >= TQ_KMEAN_MIN_TOKENS ? TQ_KMEAN_SET : TQ_KMEAN_KEEP;
    }
    return mode;
}

// q_cur [hd, n_head, n_tokens], k_cur [hd, n_head_kv, n_tokens]: roped, not yet rotated.
static ggml_tensor * tq_kmean_graph(ggml_context * ctx, ggml_cgraph * gf, llm_graph_result * res,
                                           ggml_tensor ** q_cur, ggml_tensor * k_cur, const llama_kv_cache_context * mctx,
                                           int il, float kq_scale, bool neox) {
    ggml_tensor * k_mean = k_cur ? mctx->tq_get_k_mean(il) : nullptr;
    if (!k_mean) {
        return k_cur;
    }
    const llama_kv_cache * kv = mctx->tq_kv();
    const tq_rf_pairs pr = { neox, kv->tq_kmean_n_rot(il) }; // partial RoPE: its roped channels
    // one input per cache and graph (an SWA model has two caches)
    tq_kmean_input * in = tq_kmean_input_find(res, kv);
    if (!in) {
        in = static_cast<tq_kmean_input *>(
            res->add_input(std::make_unique<tq_kmean_input>(kv, tq_kmean_graph_mode(kv, k_cur->ne[2]))));
    }
    int mode = in->mode;
    if (mode == TQ_KMEAN_SET && !tq_kmean_rope_is(k_mean) && k_cur->ne[2] < TQ_KMEAN_MIN_TOKENS) {
        mode = TQ_KMEAN_ZERO; // not reached: the host picks SET only for a ubatch this large (in
                              // RoPE's frame the host's rule reaches the graph as its weights)
    }
    ggml_tensor * map = nullptr;
    if (tq_kmean_rope_is(k_mean)) {
        // statistics per stream (tq_kmean_rf_streams): the ubatch's tokens in nb blocks, one
        // per stream of the cache's view
        const int set = kv->tq_kmean_rope_set(il);
        GGML_ASSERT(set >= 0);
        const int64_t nt = k_cur->ne[2], nb = mctx->tq_n_blocks();
        GGML_ASSERT(nb >= 1 && nt % nb == 0);
        ggml_tensor * tab = tq_kmean_rope_table(ctx, in, in->tab_ub, set, nt, "tq_kmean_rope_ub");
        if (in->coeffs.size() <= (size_t) il) {
            in->coeffs.resize(il + 1, nullptr);
            in->cols.resize(il + 1, nullptr);
            in->ropes.resize(il + 1, nullptr);
        }
        const bool host_ops = !kv->tq_kmean_rope_masked(il);
        in->ropes[il] = host_ops ? nullptr : tq_rf_rope_of(k_cur, pr);
        if (!in->streams) {
            in->streams = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, nb + 1);
            ggml_set_input(in->streams);
            ggml_set_name(in->streams, "tq_kmean_streams");
            if (mode != TQ_KMEAN_KEEP) {
                in->sel = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, nb + 1);
                ggml_set_input(in->sel);
                ggml_set_name(in->sel, "tq_kmean_sel");
            }
        }
        GGML_ASSERT(in->streams->ne[0] == nb + 1);
        if (mode == TQ_KMEAN_SET && !in->stat_w) {
            in->stat_w = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, 1, nt / nb, nb);
            ggml_set_input(in->stat_w);
            ggml_set_name(in->stat_w, "tq_kmean_stat_w");
            in->stat_skip_first = kv->tq_sink_reads();
        }
        return tq_kmean_rf_streams(ctx, gf, q_cur, k_cur, k_mean, mode, in->streams, in->sel, tab, in->stat_w, kq_scale, pr,
                                   host_ops, &in->coeffs[il], &in->cols[il], in->ropes[il],
                                   !host_ops && kv->tq_kmean_rope_dev_keep(il));
    }
    if (mode == TQ_KMEAN_SET) {
        if (!in->map) {
            const int64_t hd = kv->tq_kmean_map_hd();
            in->map = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hd * hd, kv->tq_kmean_map_rows());
            ggml_set_input(in->map);
            ggml_set_name(in->map, "tq_kmean_map");
        }
        const int64_t hd = k_cur->ne[0];
        map = ggml_view_2d(ctx, in->map, hd, hd, hd * sizeof(float), (size_t) il * in->map->nb[1]);
    }
    return tq_kmean_apply(ctx, gf, q_cur, k_cur, k_mean, mode, map, kq_scale, pr);
}

// The patch's call in both build_attn overloads: K mean removal and K/Q balancing where they
// keep attention exact: not while training, and with learned attention sinks (an extra logit
// that a shift does not move) only in RoPE's frame, whose term restores every key's logit
// (the cache turns the mean off for such a model where the frame cannot run).
ggml_tensor * tq_llama_attn_k(ggml_context * ctx, ggml_cgraph * gf, llm_graph_result * res,
                                            const llama_cparams & cparams, const ggml_tensor * sinks,
                                            ggml_tensor ** q_cur, ggml_tensor * k_cur,
                                            const llama_kv_cache_context * mctx, int il, float kq_scale, int rope_type) {
    if (cparams.training) {
        return k_cur;
    }
    if (sinks) {
        const ggml_tensor * k_mean = k_cur ? mctx->tq_get_k_mean(il) : nullptr;
        if (!k_mean || !tq_kmean_rope_is(k_mean)) {
            return k_cur;
        }
    }
    return tq_kmean_graph(ctx, gf, res, q_cur, k_cur, mctx, il, kq_scale, rope_type != LLAMA_ROPE_TYPE_NORM);
}

// The exact first keys' slots of layer il as this graph leaves them (tq-sink.h): the
// ubatch's K (k_cur, as the cache got it) written in, or for a layer that reuses another's
// cache (no k_cur) the slots as that layer wrote them. False where the cache keeps none.
static bool tq_sink_graph(ggml_context * ctx, tq_kmean_input * in, const llama_kv_cache * kv, int il,
                                 ggml_tensor * k_cur, int64_t n_tokens, ggml_tensor ** rows, ggml_tensor ** q) {
    ggml_tensor * r = kv->tq_get_k_sink(il, 0), * rq = kv->tq_get_k_sink(il, 1);
    if (!r || !rq) {
        return false;
    }
    if (k_cur) {
        in->sink_decided = true;
        in->sink_wrote = kv->tq_sink_ub_writes();
    }
    if (!k_cur || !in->sink_wrote) { // no first token in this ubatch: the slots as they are
        *rows = r;
        *q = rq;
        return true;
    }
    if (!in->sink_idx) {
        in->sink_idx = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, n_tokens);
        ggml_set_input(in->sink_idx);
        ggml_set_name(in->sink_idx, "tq_sink_idx");
    }
    GGML_ASSERT(in->sink_idx->ne[0] == k_cur->ne[2]);
    if (!ggml_is_contiguous(k_cur)) {
        k_cur = ggml_cont(ctx, k_cur);
    }
    tq_sink_write(ctx, k_cur, in->sink_idx, r, rq, rows, q);
    return true;
}

// The lowered first keys' selection inputs of a graph (tq_sink_fill_select), made once.
static void tq_sink_select_inputs(ggml_context * ctx, tq_kmean_input * in, int64_t n_kv, int64_t ns) {
    if (in->sel_cells) {
        GGML_ASSERT(in->sel_onehot->ne[1] == n_kv && in->sel_onehot->ne[3] == ns);
        return;
    }
    const int64_t n_sel = in->kv->tq_sink_slots();
    in->sel_cells = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_sel, ns);
    in->sel_slots = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, n_sel * ns);
    in->sel_onehot = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, n_sel, n_kv, 1, ns);
    for (ggml_tensor * t : { in->sel_cells, in->sel_slots, in->sel_onehot }) {
        ggml_set_input(t);
    }
    ggml_set_name(in->sel_cells, "tq_sink_sel_cells");
    ggml_set_name(in->sel_slots, "tq_sink_sel_slots");
    ggml_set_name(in->sel_onehot, "tq_sink_sel_onehot");
}

// The cells input C of a graph (i32 [n_cells, 2], tq-fa-contract.h), made once; returns its
// row 0, the cells' positions.
static ggml_tensor * tq_cells_input(ggml_context * ctx, tq_kmean_input * in, int64_t n_cells) {
    if (!in->cells) {
        in->cells = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_cells, 2);
        ggml_set_input(in->cells);
        ggml_set_name(in->cells, "tq_kv_cells");
    }
    GGML_ASSERT(in->cells->ne[0] == n_cells);
    return ggml_view_1d(ctx, in->cells, n_cells, 0);
}

// The cells' table [hd, n_cells] under a lowered layer's rope (tq_rf_rope_table), one per
// graph for the layers whose ropes turn alike (same parameters and frequency factors): its
// entry of in->rope_tabs (valid until the next one is made).
static tq_kmean_input::rope_tab & tq_rope_tab(ggml_context * ctx, tq_kmean_input * in, const ggml_tensor * rope,
                                              int64_t n_cells) {
    for (auto & t : in->rope_tabs) {
        if (t.rope->src[2] == rope->src[2] && t.rope->ne[0] == rope->ne[0] &&
            memcmp(t.rope->op_params, rope->op_params, sizeof(rope->op_params)) == 0) {
            return t;
        }
    }
    const int64_t hd = rope->ne[0];
    ggml_tensor * e = nullptr;
    for (ggml_tensor * x : in->rope_e) {
        e = x->ne[0] == hd ? x : e;
    }
    if (!e) {
        e = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hd, 1, 1);
        ggml_set_input(e);
        ggml_format_name(e, "tq_rope_e_%lld", (long long) hd);
        in->rope_e.push_back(e);
    }
    ggml_tensor * T = tq_rf_rope_table(ctx, e, tq_cells_input(ctx, in, n_cells), rope);
    ggml_format_name(T, "tq_rope_cells_%zu", in->rope_tabs.size());
    in->rope_tabs.push_back({ rope, e, T });
    return in->rope_tabs.back();
}

static ggml_tensor * tq_rope_cells_table(ggml_context * ctx, tq_kmean_input * in, const ggml_tensor * rope, int64_t n_cells) {
    return tq_rope_tab(ctx, in, rope, n_cells).T;
}

// The contract's T (tq-fa-contract.h) under a device layer's rope: the cells' table, then the
// step columns (positions 0 .. TQ_FA_TERM_STEPS - 1), one per graph and set of rope parameters.
static ggml_tensor * tq_rope_terms_table(ggml_context * ctx, tq_kmean_input * in, const ggml_tensor * rope, int64_t n_cells) {
    tq_kmean_input::rope_tab & t = tq_rope_tab(ctx, in, rope, n_cells);
    if (!t.T_steps) {
        if (!in->steps) {
            in->steps = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, TQ_FA_TERM_STEPS);
            ggml_set_input(in->steps);
            ggml_set_name(in->steps, "tq_fa_term_steps");
        }
        t.T_steps = ggml_concat(ctx, t.T, tq_rf_rope_table(ctx, t.e, in->steps, rope), 1);
    }
    GGML_ASSERT(t.T_steps->ne[1] == n_cells + TQ_FA_TERM_STEPS);
    return t.T_steps;
}

// The patch's call in build_attn after the mask is known: with the mean in RoPE's frame
// (tq-kmean-rope.h) the per-key term q.R_p mu' goes back into attention, and where flash
// attention runs over turbo K and V the first keys are kept exact (tq-sink.h): k_cur, the
// ubatch's K as the cache got it, goes to their slots. Three forms:
// - the turbo K terms of flash attention (tq-fa-contract.h, attached by tq_llama_fa_k_terms)
//   for few queries, on a device that runs them;
// - where the device does not (tq_kmean_rope_masked), the same terms lowered to ops every
//   backend has: a per-head mask carrying the term and q.(R_j - k_c) at the first keys' cells
//   (tq_sink_mask_delta), q: the queries flash attention gets;
// - for a prefill, or without flash attention over turbo K and V, K decoded to f32 with
//   R_p mu' added (rot: the cache's rotation) and the first keys in place, or the mask alone.
void tq_llama_attn_kq(ggml_context * ctx, llm_graph_result * res, ggml_tensor ** kq_mask, ggml_tensor ** k,
                                    const ggml_tensor * v, bool flash_attn, const llama_kv_cache_context * mctx, int il,
                                    float kq_scale, ggml_tensor * rot, int rope_type, ggml_tensor * k_cur, ggml_tensor * q) {
    const llama_kv_cache * kv = mctx->tq_kv();
    kv->tq_note_flash_attn(flash_attn);
    ggml_tensor * k_mean = mctx->tq_get_k_mean(il);
    tq_kmean_input * in = tq_kmean_rope_is(k_mean) ? tq_kmean_input_find(res, kv) : nullptr;
    ggml_tensor * A = in && in->coeffs.size() > (size_t) il ? in->coeffs[il] : nullptr;
    if (!A) {
        return;
    }
    const int set = kv->tq_kmean_rope_set(il);
    in->kv_streams = (*k)->ne[3];
    const int64_t n_cells = (*k)->ne[2] * (*k)->ne[3];
    const bool fa_turbo_k = flash_attn && TQ_GGML_IS_TURBO((*k)->type);
    const bool turbo_fa = fa_turbo_k && TQ_GGML_IS_TURBO(v->type);
    const bool masked = kv->tq_kmean_rope_masked(il);
    const bool dev_terms = masked && kv->tq_kmean_rope_dev_terms(il); // a device whose flash attention runs them
    const bool terms = turbo_fa && (!masked || dev_terms);
    // a lowered layer whose K side took its own rope (tq_rf_rope_of) reads the cells' angles
    // from the same rope, on the device; every other layer from the host's table
    const ggml_tensor * rope = in->ropes.size() > (size_t) il ? in->ropes[il] : nullptr; // set for lowered layers only
    ggml_tensor * tab = nullptr, * tab_cells = nullptr; // the rope's table: made where read (a decode)
    if (!rope) {
        tab = tq_kmean_rope_table(ctx, in, in->tab_kv, set, n_cells + TQ_FA_TERM_STEPS, "tq_kmean_rope_kv");
        GGML_ASSERT(tab->ne[1] == n_cells + TQ_FA_TERM_STEPS);
        tab_cells = ggml_view_2d(ctx, tab, tab->ne[0], n_cells, tab->nb[1], 0);
    }
    // the first keys wherever flash attention reads a turbo K, whatever V is: natively with the
    // terms, else lowered (a CPU prefill's host op, or the corrections of tq_sink_delta)
    ggml_tensor * sink_rows = nullptr, * sink_q = nullptr;
    const bool sink = fa_turbo_k && tq_sink_graph(ctx, in, kv, il, k_cur, A->ne[2], &sink_rows, &sink_q);
    // K decoded to f32 with R_p mu' added (tq_rf_keys) only for the tiled kernel of a CPU
    // prefill (tq_llama_prefill_decode) and for a prefill on a device without the terms; where
    // that is off (TQ_PREFILL_DECODE=0) a prefill over turbo K and V on the CPU takes the
    // decode's turbo K terms, the same float order as a decode
    const bool prefill =
        A->ne[2] >= TQ_PREFILL_DECODE_MIN_TOKENS && (!terms || dev_terms || tq_ggml_decode_for_prefill(*k, v, A->ne[2]));
    // an input the graph does not read would have no memory: the cells only where flash
    // attention or the CPU prefill's first keys read them
    // the slots go with the cells where the CPU reads them itself: the turbo tiles' terms, or
    // a prefill's host op (tq_sink_keys); a CPU decode without the terms takes the corrections
    const bool sink_host = sink && !masked && (terms || prefill);
    const bool sink_dev = sink && dev_terms && terms && !prefill; // read by the device's flash attention
    const bool sink_lowered = sink && !sink_host && !sink_dev;
    if ((terms && !prefill) || sink_host) {
        tq_cells_input(ctx, in, n_cells);
    }
    in->cells_slots = in->cells_slots || sink_host || sink_dev;
    GGML_ASSERT(!in->cells || in->cells->ne[0] == n_cells);
    ggml_tensor * sink_d = nullptr; // the lowered first keys' corrections (tq_sink_delta)
    if (sink_lowered) {
        tq_sink_select_inputs(ctx, in, (*k)->ne[2], (*k)->ne[3]);
        sink_d = tq_sink_delta(ctx, *k, in->sel_cells, in->sel_slots, sink_rows, sink_q);
    }
    if (prefill) {
        // the means each stream of the view runs on (one column per stream, tq_kmean_rf_streams)
        const int64_t hd = (*k)->ne[0];
        ggml_tensor * cols = in->cols[il];
        GGML_ASSERT(cols && cols->ne[1] == (*k)->ne[3]);
        ggml_tensor * mu = ggml_cont(ctx, ggml_view_3d(ctx, cols, hd, (*k)->ne[1], cols->ne[1], hd * sizeof(float), cols->nb[1], 0));
        ggml_tensor * slots = sink_host ? ggml_view_1d(ctx, in->cells, n_cells, in->cells->nb[1]) : nullptr;
        const tq_rf_pairs pr = { rope_type != LLAMA_ROPE_TYPE_NORM, kv->tq_kmean_n_rot(il) };
        ggml_tensor * rm = rope ? tq_rf_rope_mean(ctx, mu, tq_cells_input(ctx, in, n_cells), rope) : nullptr;
        *k = tq_rf_keys(ctx, *k, mu, tab_cells, rot, pr, llama_mul_mat_hadamard, slots, sink_rows, sink_q,
                        sink_d ? tq_sink_keys_delta(ctx, sink_d, in->sel_onehot) : nullptr, !masked, rm);
    } else if (terms) {
        if (in->fa.size() <= (size_t) il) {
            in->fa.resize(il + 1);
        }
        // T: the host's table, or on a device the layer's own rope of the cells and the steps
        ggml_tensor * T = rope ? tq_rope_terms_table(ctx, in, rope, n_cells) : tab;
        in->fa[il] = { ggml_is_contiguous(A) ? A : ggml_cont(ctx, A), T, in->cells, sink_rows, sink_q };
    } else {
        // the graph's mask as f32, once for the layers that share it (a sliding-window model has two)
        ggml_tensor * mask_f32 = nullptr;
        if ((*kq_mask)->type != GGML_TYPE_F32) {
            for (const auto & mf : in->masks_f32) {
                mask_f32 = mf.first == *kq_mask ? mf.second : mask_f32;
            }
            if (!mask_f32) {
                mask_f32 = ggml_cast(ctx, *kq_mask, GGML_TYPE_F32);
                in->masks_f32.emplace_back(*kq_mask, mask_f32);
            }
        }
        *kq_mask = tq_rf_mask(ctx, *kq_mask, A, rope ? tq_rope_cells_table(ctx, in, rope, n_cells) : tab_cells, kq_scale,
                              sink_d ? tq_sink_mask_delta(ctx, q, sink_d, in->sel_onehot) : nullptr, mask_f32);
    }
}

// The patch's call in build_attn_mha right after ggml_flash_attn_ext: the turbo K terms that
// tq_llama_attn_kq chose for layer il become sources of the op (tq-fa-contract.h).
void tq_llama_fa_k_terms(llm_graph_result * res, ggml_tensor * fa, int il) {
    for (auto & i : res->inputs) {
        const auto * in = dynamic_cast<const tq_kmean_input *>(i.get());
        if (in && (size_t) il < in->fa.size() && in->fa[il].A) {
            const auto & t = in->fa[il];
            tq_flash_attn_ext_set_k_terms(fa, t.A, t.T, t.C, t.R, t.RQ);
            return;
        }
    }
}

// The patch's call before ggml_flash_attn_ext: K and V decoded to f32 for a CPU prefill over
// a turbo cache (tq_ggml_decode_for_prefill in tq-ggml-graph.h says when and why).
// A K built in this graph (the K mean in RoPE's frame adds R_p mu' to the decoded keys,
// tq_rf_keys) is not in the cache's buffer, so V's residency decides; llama has cast that K
// from f32 to f16, and the f32 it was cast from is taken instead (the tiled kernel wants K and
// V of one type). Such a K is never turbo, so the turbo tiles cannot take the pair whatever
// TQ_PREFILL_DECODE says: V is decoded, with V first in the call so that its buffer decides
// (the K mean's terms lowered on the CPU, TQ_K_TERMS=lowered, would otherwise run the per-key
// loop over f16 K and turbo V).
void tq_llama_prefill_decode(ggml_context * ctx, ggml_tensor ** k, ggml_tensor ** v, int64_t n_tokens) {
    const bool k_built = (*k)->buffer == nullptr && (*k)->view_src == nullptr && !TQ_GGML_IS_TURBO((*k)->type);
    if (k_built && TQ_GGML_IS_TURBO((*v)->type) && tq_ggml_decode_for_prefill(*v, *k, n_tokens)) {
        if ((*k)->op == GGML_OP_CPY && (*k)->src[0]->type == GGML_TYPE_F32) {
            *k = (*k)->src[0];
        }
        *k = (*k)->type == GGML_TYPE_F32 ? *k : ggml_cast(ctx, *k, GGML_TYPE_F32);
        *v = ggml_cast(ctx, *v, GGML_TYPE_F32);
        return;
    }
    if (tq_ggml_decode_for_prefill(*k, *v, n_tokens)) {
        *k = (*k)->type == GGML_TYPE_F32 ? *k : ggml_cast(ctx, *k, GGML_TYPE_F32);
        *v = (*v)->type == GGML_TYPE_F32 ? *v : ggml_cast(ctx, *v, GGML_TYPE_F32);
    }
}
