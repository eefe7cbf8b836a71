// tq-llama-kv-cache.cpp - turboquant's members of llama_kv_cache (the seeded rotation, K mean
// removal and K/Q channel balancing, the exact first keys; see tq-kmean.h, tq-sink.h). A
// translation unit of libllama of its own (the patch adds it to the target in
// src/CMakeLists.txt); the declarations are in tq-llama-kv-cache-members.inc, which the patch
// includes inside the class.

#include "llama-kv-cache.h"

#include "llama-impl.h"
#include "llama-io.h"
#include "llama-model.h"
#include "llama-context.h"

#include "tq-kmean.h"
#include "tq-llama-options.h"
#include "tq-sink.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

// The rotation for turbo caches (the patch calls this where llama decides attn_rot_k/v):
// turbo blocks assume randomly rotated heads, so both K and V get the seeded rotation, which
// is symmetric and involutory like llama's Walsh-Hadamard matrix, so the rotate-back paths
// stay valid. A turbo cache whose heads cannot be rotated is refused (unless rotation is
// turned off on purpose).
void llama_kv_cache::tq_rot_init(ggml_type type_k, ggml_type type_v, bool attn_rot_disable) {
    attn_rot_seeded = TQ_GGML_IS_TURBO(type_k) || TQ_GGML_IS_TURBO(type_v);
    if (layers.empty()) {
        // a cache with no layer (an iSWA model's sliding-window half when every attention
        // layer is global, or the reverse) stores nothing, so it has nothing to rotate
        return;
    }
    // an MLA cache stores no V (V is a view of K): its V type names nothing to rotate
    const bool has_v = std::any_of(layers.begin(), layers.end(), [](const kv_layer & l) { return l.v != nullptr; });
    if ((TQ_GGML_IS_TURBO(type_k) && !attn_rot_k) || (has_v && TQ_GGML_IS_TURBO(type_v) && !attn_rot_v)) {
        if (!attn_rot_disable) {
            throw std::runtime_error(format("turbo KV cache needs every layer's head size to be a multiple of 64 "
                "(n_embd_head_k = %d, n_embd_head_v = %d); use q8_0/q4_0/f16 for this model",
                n_embd_head_k_all, n_embd_head_v_all));
        }
        LLAMA_LOG_WARN("%s: turbo KV cache without rotation (LLAMA_ATTN_ROT_DISABLE): quality will suffer\n", __func__);
    }
    if (attn_rot_seeded && (attn_rot_k || attn_rot_v)) {
        LLAMA_LOG_INFO("%s: turbo cache: seeded randomized Hadamard rotation (seed 0x%016llx)\n", __func__,
            (unsigned long long) TQ_DEFAULT_SEED);
    }
}

// Whether `dev` can hold a cache of `type` with rows of n_embd values: every op that writes the
// cache runs where the cache lives (SET_ROWS, the K shift's CPY; ggml's scheduler aborts on a
// pre-allocated tensor whose backend refuses its op), so the device must take SET_ROWS into it
// and the cache tensor itself. Non-turbo types are upstream's business: always true.
static bool tq_kv_dev_holds(ggml_backend_dev_t dev, ggml_type type, int64_t n_embd) {
    if (!TQ_GGML_IS_TURBO(type) || n_embd <= 0) {
        return true;
    }
    ggml_init_params params = { 4*ggml_tensor_overhead(), nullptr, /*no_alloc =*/ true };
    ggml_context_ptr ctx { ggml_init(params) };
    if (!ctx) {
        throw std::runtime_error("failed to create ggml context for the turbo cache check");
    }
    ggml_tensor * cache = ggml_new_tensor_2d(ctx.get(), type, n_embd, 2);
    ggml_tensor * row   = ggml_new_tensor_2d(ctx.get(), GGML_TYPE_F32, n_embd, 1);
    ggml_tensor * idx   = ggml_new_tensor_1d(ctx.get(), GGML_TYPE_I64, 1);
    ggml_tensor * set   = ggml_set_rows(ctx.get(), cache, row, idx);
    return ggml_backend_dev_supports_op(dev, cache) && ggml_backend_dev_supports_op(dev, set);
}

// Called for each offloaded layer after llama picks its device's buffer type: a device without
// kernels for a turbo K or V type (ggml-vulkan without shaderFloat64, ggml-ext/ggml-vulkan/tq-vulkan.h)
// cannot hold the cache, so that layer's K and V stay in host memory, where the CPU backend
// writes them and runs their attention; the layer's weights and other ops stay on the device.
// Logged once per cache (the per-layer device is in the debug log).
void llama_kv_cache::tq_kv_keep_host(ggml_backend_dev_t dev, uint32_t il, ggml_type type_k, ggml_type type_v,
                                     uint32_t n_embd_k, uint32_t n_embd_v, ggml_backend_buffer_type_t * buft,
                                     const char ** dev_name) {
    if (dev == nullptr || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
        return;
    }
    if (tq_kv_dev_holds(dev, type_k, n_embd_k) && tq_kv_dev_holds(dev, type_v, n_embd_v)) {
        return;
    }
    if (tq_kv_host_layers++ == 0) {
        LLAMA_LOG_WARN("%s: %s has no kernels for a %s K / %s V cache: the KV cache of the layers on it stays in "
                       "host memory, where the CPU writes it and runs its attention (first: layer %u)\n",
                       __func__, ggml_backend_dev_name(dev), ggml_type_name(type_k), ggml_type_name(type_v), il);
    }
    *buft = ggml_backend_cpu_buffer_type();
    *dev_name = "CPU";
}

// Called after llama fills an n x n rotation matrix: a turbo cache replaces it with the
// seeded one. Its graph input is marked (tq_rot_mark_seeded) so that llama_mul_mat_hadamard
// does not ask the backend for the unsigned fast Walsh-Hadamard transform.
void llama_kv_cache::tq_rot_matrix(int64_t n, float * dst) const {
    if (attn_rot_seeded) {
        GGML_ASSERT(tq_rotation_matrix(n, TQ_DEFAULT_SEED, dst) == TQ_OK);
    }
}

// Decide whether this cache stores K minus a per-layer mean, and whether it balances K/Q.
// Called before the layers are created (each layer then gets its k_mean tensor), with the
// options of the context being created (tq-llama-options.h), and logged with what decided.
// filter: the constructor's, so a cache that will hold no layer (an iSWA model's half whose
// attention layers all sit in the other, as LFM2 with a window) decides nothing and logs
// nothing: its lines would claim a mean for keys it never stores.
void llama_kv_cache::tq_kmean_init(ggml_type type_k, const layer_filter_cb & filter) {
    tq_kmean = false;
    tq_kbal  = false;
    if (!TQ_GGML_IS_TURBO(type_k)) {
        return;
    }
    bool any_layer = false;
    for (uint32_t il = 0; !any_layer && il < hparams.n_layer_all; ++il) {
        any_layer = hparams.has_kv(il) && (!filter || filter(il));
    }
    if (!any_layer) {
        return;
    }
    const tq_llama_options opts = tq_llama_options_get();
    const char * src_mean = nullptr;
    const char * src_bal  = nullptr;
    const bool want_mean = tq_llama_switch_resolve(opts.k_mean, tq_llama_env_k_mean(), "TQ_K_MEAN", "option tq_k_mean", &src_mean);
    const bool want_bal  = tq_llama_switch_resolve(opts.k_balance, tq_llama_env_k_balance(), "TQ_K_BALANCE", "option tq_k_balance", &src_bal);

    const char * why = nullptr;
    std::string why_off;
    // a soft cap or a learned sink logit is not shift-invariant: the fitted mean would change
    // attention there, while the mean in RoPE's frame adds every key's share back to its raw
    // logit (before the cap, not to the sink), so it stays exact and may run
    tq_kmean_exact_why = nullptr;
    if (!want_mean) {
        why_off = format("turned off: %s", src_mean);
        why = why_off.c_str();
    } else if (other) {
        why = "cells shared with another cache";
    } else if (hparams.is_mla()) {
        // the cache's K row is [latent | roped part] and V is a view of its latent part: a mean
        // taken out of K would come out of V too, and attention's output would need the
        // weighted mean added back after the softmax (and V's up-projection), not a logit term
        why = "MLA: V is a view of K's latent part, so a K mean would shift V too";
    } else if (hparams.attn_soft_cap) {
        tq_kmean_exact_why = "attention logit soft-capping";
    }
    // partial RoPE (n_rot < head size: StableLM, Phi, GLM): the roped channels keep the mean
    // as full RoPE does, the rest a plain one (tq_rf_pairs in tq-kmean-rope.h); that needs
    // the pairing of a RoPE kind handled here
    const char * partial = nullptr;
    for (uint32_t il = 0; !why && il < hparams.n_layer_all; ++il) {
        if (!hparams.has_kv(il)) {
            continue;
        }
        if (il < model.layers.size() && model.layers[il].attn_sinks) {
            tq_kmean_exact_why = "learned attention sinks";
        }
        if (hparams.has_rope(il) && hparams.n_rot(il) != hparams.n_embd_head_k(il)) {
            const uint32_t nr = hparams.n_rot(il), hd = hparams.n_embd_head_k(il);
            if ((hparams.rope_type != LLAMA_ROPE_TYPE_NORM && hparams.rope_type != LLAMA_ROPE_TYPE_NEOX) || nr % 2 != 0 ||
                nr > hd || (hd - nr) % 2 != 0) {
                why = "partial RoPE of a kind whose channel pairs are not handled here (NORM and NEOX are)";
            } else {
                partial = "; partial RoPE: the roped channels as with full RoPE, the others a plain mean";
            }
        }
    }
    const char * frame = tq_llama_k_mean_frame(); // rope, fitted or NULL (checked by the options table)
    if (!why && tq_kmean_exact_why && frame && strcmp(frame, "fitted") == 0) {
        why_off = format("%s needs the mean in RoPE's frame, and the frame is set to fitted", tq_kmean_exact_why);
        why = why_off.c_str();
    }
    tq_kmean = why == nullptr;
    // the mean in RoPE's frame is the default where it can run (tq_kmean_rope_setup says where)
    tq_rf_want = tq_kmean && (!frame || strcmp(frame, "rope") == 0);
    tq_rf_asked = frame != nullptr;
    // the exact first keys ride on the mean in RoPE's frame (tq-sink.h says where they apply)
    const char * src_sink = nullptr;
    const bool want_sink =
        tq_llama_switch_resolve(opts.k_sink, tq_llama_env_k_sink(), "TQ_K_SINK", "option tq_k_sink", &src_sink);
    tq_sink_type = tq_rf_want && want_sink ? type_k : GGML_TYPE_COUNT;
    tq_rf_lowered_asked = opts.value[TQ_OPT_K_TERMS] == 1; // k_terms = lowered (tq-options.def)
    if (tq_rf_want) {
        LLAMA_LOG_INFO("%s: turbo exact first keys: %s (%s; where the K mean in RoPE's frame and flash attention over "
                       "a turbo K run, decided with the frame when the first graph is built; --tq-k-sink off turns "
                       "them off)\n", __func__, want_sink ? "on" : "off", src_sink);
    }
    if (tq_kmean) {
        LLAMA_LOG_INFO("%s: turbo K mean removal: on (%s; softmax-invariant, fitted to RoPE over the cache's positions%s; "
                       "--tq-k-mean off turns it off)\n", __func__, src_mean, partial ? partial : "");
    } else {
        LLAMA_LOG_INFO("%s: turbo K mean removal: off (%s)\n", __func__, why);
    }

    // K/Q channel balancing rides on the same per-layer tensor and modes (tq-kmean.h)
    const char * why_bal = nullptr;
    std::string why_bal_off;
    if (!tq_kmean) {
        why_bal = "needs K mean removal";
    } else if (!want_bal) {
        why_bal_off = format("turned off: %s", src_bal);
        why_bal = why_bal_off.c_str();
    }
    for (uint32_t il = 0; !why_bal && il < hparams.n_layer_all; ++il) {
        if (!hparams.has_kv(il)) {
            why_bal = "a layer reuses another layer's KV, its queries could not be rescaled";
        }
    }
    tq_kbal = why_bal == nullptr;
    if (tq_kbal) {
        LLAMA_LOG_INFO("%s: turbo K/Q channel balancing: on (%s; logit-exact; --tq-k-balance off turns it off)\n",
                       __func__, src_bal);
    } else {
        LLAMA_LOG_INFO("%s: turbo K/Q channel balancing: off (%s)\n", __func__, why_bal);
    }
}

ggml_tensor * llama_kv_cache::tq_kmean_new(ggml_context * ctx, uint32_t il) {
    if (!tq_kmean) {
        return nullptr;
    }
    if (tq_sink_type != GGML_TYPE_COUNT) {
        // the exact first keys' slots: one per sequence and a last row for every other token
        if (tq_sink_rows.size() <= il) {
            tq_sink_rows.resize(il + 1, nullptr);
            tq_sink_q.resize(il + 1, nullptr);
        }
        const int64_t n = hparams.n_embd_k_gqa(il), rows = (int64_t) n_seq_max + 1;
        tq_sink_rows[il] = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, rows);
        tq_sink_q[il] = ggml_new_tensor_2d(ctx, tq_sink_type, n, rows);
        ggml_format_name(tq_sink_rows[il], "cache_k_sink_l%d", il);
        ggml_format_name(tq_sink_q[il], "cache_k_sink_q_l%d", il);
    }
    // [m | s - 1 (balancing only)] per stream and a shared column (tq_kmean_rf_streams in
    // tq-kmean.h; the fitted mean uses column 0 for the whole cache)
    const int64_t hd = hparams.n_embd_head_k(il);
    ggml_tensor * t = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, tq_kmean_floats(hd, hparams.n_embd_k_gqa(il) / hd, tq_kbal),
                                         (int64_t) n_stream + 1);
    ggml_format_name(t, "cache_k_mean_l%d", il);
    return t;
}

ggml_tensor * llama_kv_cache::tq_get_k_mean(int32_t il) const {
    tq_kmean_rope_setup();
    if (tq_kmean_exact_off) {
        return nullptr;
    }
    const auto it = map_layer_ids.find(il);
    return it == map_layer_ids.end() ? nullptr : layers[it->second].k_mean;
}

// The RoPE angle per position of each channel pair of layer il, as ggml's rope computes it
// (rope_yarn: frequency base and scale, YaRN ramp, frequency factors). From the model's
// trained RoPE settings: a context that overrides them (--rope-freq-base ...) gets a
// slightly less fitting mean, never a wrong attention. Empty: the layer has no RoPE of a
// kind handled here, and M stays the identity.
static std::vector<double> tq_kmean_rope_freqs(const llama_model & model, const llama_hparams & hp, uint32_t il, uint32_t n_pos) {
    if (!hp.has_rope(il) || (hp.rope_type != LLAMA_ROPE_TYPE_NORM && hp.rope_type != LLAMA_ROPE_TYPE_NEOX)) {
        return {};
    }
    const int n_dims = hp.n_rot(il);
    const bool swa = hp.is_swa(il);
    const float base  = swa ? hp.rope_freq_base_train_swa  : hp.rope_freq_base_train;
    const float scale = swa ? hp.rope_freq_scale_train_swa : hp.rope_freq_scale_train;
    const float ext = hp.yarn_ext_factor >= 0.0f ? hp.yarn_ext_factor
                    : hp.rope_scaling_type_train == LLAMA_ROPE_SCALING_TYPE_YARN ? 1.0f : 0.0f;
    float corr[2];
    ggml_rope_yarn_corr_dims(n_dims, hp.n_ctx_orig_yarn, base, hp.yarn_beta_fast, hp.yarn_beta_slow, corr);
    // frequency factors, chosen as llama_model::get_rope_factors does
    std::vector<float> ff(n_dims / 2, 1.0f);
    const auto & L = model.layers[il];
    ggml_tensor * fft = L.rope_freqs ? L.rope_freqs : n_pos > hp.n_ctx_orig_yarn ? L.rope_long : L.rope_short;
    if (fft && fft->type == GGML_TYPE_F32 && ggml_nelements(fft) >= n_dims / 2) {
        ggml_backend_tensor_get(fft, ff.data(), 0, ff.size() * sizeof(float));
    }
    std::vector<double> w(n_dims / 2);
    const double theta_scale = std::pow((double) base, -2.0 / n_dims);
    for (int i = 0; i < n_dims / 2; ++i) {
        const double extrap = std::pow(theta_scale, i) / ff[i];
        const double interp = scale * extrap;
        double ramp = 0.0;
        if (ext != 0.0f) {
            const double y = (i - corr[0]) / std::max(0.001, (double) corr[1] - corr[0]);
            ramp = (1.0 - std::min(1.0, std::max(0.0, y))) * ext;
        }
        w[i] = interp * (1.0 - ramp) + extrap * ramp;
    }
    return w;
}

// For `tq capture` (declared in crates/tq/src/capture.rs): the frequencies above for layer
// il, so that the lab models the K mean llama.cpp uses with the very same numbers. Returns
// the number of pairs written to w (0: the layer's RoPE is not handled and its map is the
// identity), or -1 for a null pointer, a layer out of range or a w shorter than needed.
// *neox: 1 when pair i is channels (i, i + n_rot/2), 0 when it is (2i, 2i + 1).
extern "C" int32_t tq_llama_rope_freqs(const llama_model * model, int32_t il, uint32_t n_pos, double * w, int32_t cap,
                                       int32_t * neox);
extern "C" int32_t tq_llama_rope_freqs(const llama_model * model, int32_t il, uint32_t n_pos, double * w, int32_t cap,
                                       int32_t * neox) {
    if (!model || !w || !neox || il < 0 || (uint32_t) il >= model->hparams.n_layer()) {
        return -1;
    }
    const std::vector<double> f = tq_kmean_rope_freqs(*model, model->hparams, (uint32_t) il, n_pos);
    if ((int64_t) f.size() > cap) {
        return -1;
    }
    std::copy(f.begin(), f.end(), w);
    *neox = model->hparams.rope_type == LLAMA_ROPE_TYPE_NEOX ? 1 : 0;
    return (int32_t) f.size();
}

// How the device that holds a layer's K can take the turbo K terms of flash attention
// (tq-fa-contract.h), asked through ggml's own supports_op with ops of the layer's shape:
//   TQ_RF_NATIVE  its flash attention runs them (the CPU's turbo tiles, RPC);
//   TQ_RF_DEVICE  its flash attention runs them, and the pieces that feed them must be ops it
//                 has, not host ops (Vulkan: tq_fa_k_terms_host_fed), as for TQ_RF_MASKED,
//                 whose form a prefill keeps (a per-head mask of every token is not made);
//   TQ_RF_MASKED  it does not, but runs flash attention over the layer's K and V with a mask
//                 per head, the form the terms are lowered to there (tq_rf_mask; prefill:
//                 tq_rf_keys), from ops every backend has;
//   TQ_RF_NONE    neither (the fitted mean instead).
// lowered (k_terms = lowered): the second answer even where the first would be native.
// The terms only ever go with turbo K and V, so a cache of other types asks about turbo4 for
// both: the question is whether the device implements the contract, on which the mean in
// RoPE's frame depends for its decode steps.
enum { TQ_RF_NONE = 0, TQ_RF_NATIVE = 1, TQ_RF_MASKED = 2, TQ_RF_DEVICE = 3 };
// The device that holds a layer's K cache (the CPU's where its buffer names none).
static ggml_backend_dev_t tq_cache_dev(const ggml_tensor * k_cache) {
    ggml_backend_buffer_type_t buft = k_cache->buffer ? ggml_backend_buffer_get_type(k_cache->buffer) : nullptr;
    ggml_backend_dev_t dev = buft ? ggml_backend_buft_get_device(buft) : nullptr;
    return dev ? dev : ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
}

// Whether the device of k_cache runs tq_rf_keep's node (tq-rf-keep.h) for a layer of this
// shape: q of n_head heads, k of n_head_kv, the stored means' column of f floats, as a decode
// step and before k's rope (no table) builds it.
static bool tq_rf_keep_on(const ggml_tensor * k_cache, int64_t hd, int64_t n_head, int64_t n_head_kv, int64_t f) {
    ggml_backend_dev_t dev = tq_cache_dev(k_cache);
    ggml_init_params params = { 8 * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(params);
    ggml_tensor * q = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hd, n_head, 1);
    ggml_tensor * k = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hd, n_head_kv, 1);
    ggml_tensor * cols = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, f, 1);
    ggml_tensor * A = nullptr;
    const bool bal = f == tq_kmean_floats(hd, n_head_kv, true);
    const bool ok = dev && tq_rf_keep_layout_ok(q, k, cols, nullptr, bal) &&
                    ggml_backend_dev_supports_op(dev, tq_rf_keep(ctx, &q, k, cols, nullptr, bal, { true, 0 }, &A)->view_src);
    ggml_free(ctx);
    return ok;
}

// Whether every layer's K cache sits on a device other than the CPU that runs the rotation
// node (tq-rot-node.h) for rows of n: then a decode's rows take it (tq_mul_mat_rot). The CPU
// keeps ggml's mul_mat, as does a model with any layer on the CPU or behind RPC (which refuses
// custom ops). Probed once per n, and logged where the node is taken.
bool llama_kv_cache::tq_rot_node_on(int64_t n) const {
    for (const auto & e : tq_rot_node_n) {
        if (e.first == n) {
            return e.second;
        }
    }
    bool on = !layers.empty();
    ggml_backend_dev_t dev0 = nullptr;
    for (const auto & layer : layers) {
        ggml_backend_dev_t dev = tq_cache_dev(layer.k);
        if (!on || !dev || ggml_backend_dev_type(dev) == GGML_BACKEND_DEVICE_TYPE_CPU) {
            on = false;
            break;
        }
        ggml_init_params params = { 4 * ggml_tensor_overhead(), nullptr, true };
        ggml_context * ctx = ggml_init(params);
        ggml_tensor * rot = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, n);
        ggml_tensor * x = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n, 9);
        on = tq_rot_layout_ok(rot, x) && ggml_backend_dev_supports_op(dev, tq_rot_node(ctx, rot, x));
        ggml_free(ctx);
        dev0 = dev0 ? dev0 : dev;
    }
    tq_rot_node_n.emplace_back(n, on);
    if (on) {
        LLAMA_LOG_INFO("%s: turbo rotation: a decode's rows of %lld on %s as one node (tq-rot-node.h)\n", __func__,
                       (long long) n, ggml_backend_dev_name(dev0));
    }
    return on;
}

void llama_kv_cache::tq_rot_mark(ggml_tensor * rot) const {
    tq_rot_mark_seeded(rot);
    if (tq_rot_node_on(rot->ne[0])) {
        tq_rot_mark_node(rot);
    }
}

static int tq_fa_terms_on(const ggml_tensor * k_cache, const ggml_tensor * v_cache, int64_t hd, int64_t n_head,
                          int64_t n_head_kv, float max_bias, float softcap, bool lowered, std::string & dev_name) {
    ggml_backend_dev_t dev = tq_cache_dev(k_cache);
    dev_name = dev ? ggml_backend_dev_name(dev) : "none";
    const bool turbo = TQ_GGML_IS_TURBO(k_cache->type) && TQ_GGML_IS_TURBO(v_cache->type);
    const ggml_type kt = turbo ? k_cache->type : GGML_TYPE_TURBO4, vt = turbo ? v_cache->type : GGML_TYPE_TURBO4;
    if (!dev || hd % ggml_blck_size(kt) != 0 || hd % ggml_blck_size(vt) != 0) {
        return TQ_RF_NONE;
    }
    const int64_t n_kv = 256;
    ggml_init_params params = { 32 * ggml_tensor_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(params);
    ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, hd, 1, n_head, 1);
    ggml_tensor * k = ggml_new_tensor_4d(ctx, kt, hd, n_kv, n_head_kv, 1);
    ggml_tensor * v = ggml_new_tensor_4d(ctx, vt, hd, n_kv, n_head_kv, 1);
    ggml_tensor * mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, 1, 1, 1);
    // the model's ALiBi and soft-cap: a device may run the terms only without them (Vulkan)
    ggml_tensor * fa = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f, max_bias, softcap);
    tq_flash_attn_ext_set_k_terms(fa, ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hd, n_head, 1),
                                  ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hd, n_kv + TQ_FA_TERM_STEPS),
                                  ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_kv, 2), nullptr, nullptr);
    int how = ggml_backend_dev_supports_op(dev, fa) && !lowered ? (tq_fa_k_terms_host_fed(dev) ? TQ_RF_NATIVE : TQ_RF_DEVICE)
                                                                 : TQ_RF_NONE;
    if (how != TQ_RF_NATIVE) {
        // the lowered form: a decode's per-head mask over the cache's own K and V (a prefill
        // decodes K, tq_rf_keys, and the turbo V then goes with K of f16)
        ggml_tensor * k2 = ggml_new_tensor_4d(ctx, k_cache->type, hd, n_kv, n_head_kv, 1);
        ggml_tensor * v2 = ggml_new_tensor_4d(ctx, v_cache->type, hd, n_kv, n_head_kv, 1);
        ggml_tensor * mh = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, 1, n_head, 1);
        ggml_tensor * k16 = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, hd, n_kv, n_head_kv, 1);
        if (ggml_backend_dev_supports_op(dev, ggml_flash_attn_ext(ctx, q, k2, v2, mh, 1.0f, 0.0f, 0.0f)) &&
            ggml_backend_dev_supports_op(dev, ggml_flash_attn_ext(ctx, q, k16, v2, mh, 1.0f, 0.0f, 0.0f))) {
            how = how == TQ_RF_DEVICE ? TQ_RF_DEVICE : TQ_RF_MASKED;
        } else {
            how = TQ_RF_NONE; // a prefill needs the masked form
        }
    }
    ggml_free(ctx);
    return how;
}

// Whether this cache keeps the mean in RoPE's frame (tq-kmean-rope.h), decided when the
// first graph asks (the buffers exist by then, and nothing has been stored): every layer
// with a mean needs full RoPE of a kind handled here, and its K on a device that runs the
// turbo K terms of flash attention (tq_fa_terms_on). Marks the k_mean tensors, logs the choice.
void llama_kv_cache::tq_kmean_rope_setup() const {
    if (tq_rf_ready) {
        return;
    }
    tq_rf_ready = true;
    if (!tq_rf_want) {
        return;
    }
    const uint32_t n_pos = std::max<uint32_t>(tq_kmean_n_pos, v_cells.empty() ? 1u : v_cells[0].size());
    const char * why = nullptr;
    std::string why_dev, masked_dev, dev_terms_dev;
    int n_masked = 0, n_dev_terms = 0;
    tq_rf_layer_set.assign(hparams.n_layer_all, -1);
    tq_rf_layer_masked.assign(hparams.n_layer_all, 0);
    tq_rf_layer_dev_terms.assign(hparams.n_layer_all, 0);
    tq_rf_layer_dev_keep.assign(hparams.n_layer_all, 0);
    int n_dev_keep = 0;
    std::string dev_keep_dev;
    for (const auto & layer : layers) {
        if (why || !layer.k_mean) {
            continue;
        }
        int how = TQ_RF_NONE;
        const int64_t hd = hparams.n_embd_head_k(layer.il);
        std::vector<double> w = tq_kmean_rope_freqs(model, hparams, layer.il, n_pos);
        if (!w.empty() && (int64_t) w.size() * 2 < hd) {
            // partial RoPE: the channels past n_rot as pairs of frequency 0 (tq_rf_pairs), whose
            // table columns are cos 1, sin 0: there the stored key is k - mu, the term q.mu
            w.resize(hd / 2, 0.0);
        }
        if ((int64_t) w.size() * 2 != hd) {
            why = "a layer without full RoPE of a handled kind";
        } else if (std::string dev; (how = tq_fa_terms_on(layer.k, layer.v, hd, hparams.n_head(layer.il),
                                                          hparams.n_head_kv(layer.il), hparams.f_max_alibi_bias,
                                                          hparams.attn_soft_cap ? hparams.f_attn_logit_softcapping : 0.0f,
                                                          tq_rf_lowered_asked, dev)) == TQ_RF_NONE) {
            why_dev = "layer " + std::to_string(layer.il) + "'s K is on " + dev +
                      ", whose flash attention takes neither the turbo K terms (tq-fa-contract.h) nor a mask per head";
            why = why_dev.c_str();
        } else if (how == TQ_RF_MASKED) {
            masked_dev = dev;
            n_masked++;
        } else if (how == TQ_RF_DEVICE) {
            dev_terms_dev = dev;
            n_dev_terms++;
        }
        size_t set = 0;
        while (set < tq_rf_sets.size() && tq_rf_sets[set] != w) {
            ++set;
        }
        if (set == tq_rf_sets.size()) {
            tq_rf_sets.push_back(std::move(w));
            tq_rf_tab.emplace_back();
            tq_rf_tab_pos.emplace_back();
        }
        tq_rf_layer_set[layer.il] = (int) set;
        tq_rf_layer_masked[layer.il] = how == TQ_RF_MASKED || how == TQ_RF_DEVICE;
        tq_rf_layer_dev_terms[layer.il] = how == TQ_RF_DEVICE;
        if (tq_rf_layer_masked[layer.il] &&
            tq_rf_keep_on(layer.k, hd, hparams.n_head(layer.il), hparams.n_head_kv(layer.il), layer.k_mean->ne[0])) {
            tq_rf_layer_dev_keep[layer.il] = 1;
            n_dev_keep++;
            dev_keep_dev = ggml_backend_dev_name(tq_cache_dev(layer.k));
        }
    }
    if (why) {
        tq_rf_sets.clear();
        tq_rf_tab.clear();
        tq_rf_tab_pos.clear();
        tq_rf_layer_set.assign(hparams.n_layer_all, -1);
        tq_rf_layer_masked.assign(hparams.n_layer_all, 0);
        tq_rf_layer_dev_terms.assign(hparams.n_layer_all, 0);
        tq_rf_layer_dev_keep.assign(hparams.n_layer_all, 0);
        if (tq_kmean_exact_why) {
            // the fitted mean would not be exact here: no mean (nor balancing, which rides on it)
            tq_kmean_exact_off = true;
            LLAMA_LOG_INFO("%s: turbo K mean removal and K/Q balancing: off here (%s needs the mean in RoPE's frame: "
                           "%s)\n", __func__, tq_kmean_exact_why, why);
        } else if (tq_rf_asked) {
            LLAMA_LOG_WARN("%s: turbo K mean in RoPE's frame (TQ_K_MEAN_FRAME=rope): not possible here (%s); the fitted mean instead\n", __func__, why);
        } else {
            LLAMA_LOG_INFO("%s: turbo K mean in RoPE's frame: off here (%s); the fitted mean instead\n", __func__, why);
        }
        if (tq_sink_type != GGML_TYPE_COUNT) {
            // init said "on" for the option; this is the decision
            LLAMA_LOG_INFO("%s: turbo exact first keys: off here (they ride on the K mean in RoPE's frame, off above)\n",
                           __func__);
        }
        return;
    }
    for (const auto & layer : layers) {
        if (layer.k_mean) {
            tq_kmean_rope_mark(layer.k_mean);
        }
    }
    LLAMA_LOG_INFO("%s: turbo K mean in RoPE's frame: on (%zu RoPE frequency set(s); TQ_K_MEAN_FRAME=fitted keeps the "
                   "fitted mean)\n", __func__, tq_rf_sets.size());
    if (n_masked > 0 && tq_rf_lowered_asked) {
        LLAMA_LOG_INFO("%s: turbo K terms: %d layer(s) on %s take them lowered, as asked (TQ_K_TERMS=lowered): as a mask "
                       "per head and, in a prefill, keys decoded to f32\n", __func__, n_masked, masked_dev.c_str());
    } else if (n_masked > 0) {
        LLAMA_LOG_INFO("%s: turbo K terms: %d layer(s) on %s, whose flash attention does not take them (tq-fa-contract.h), "
                       "take them as a mask per head and, in a prefill, keys decoded to f32\n", __func__, n_masked,
                       masked_dev.c_str());
    }
    if (n_dev_terms > 0) {
        LLAMA_LOG_INFO("%s: turbo K terms: %d layer(s) on %s take them in its flash attention (a decode's; the K side "
                       "and a prefill's keys from its own ops)\n", __func__, n_dev_terms, dev_terms_dev.c_str());
    }
    if (n_dev_keep > 0) {
        LLAMA_LOG_INFO("%s: turbo K side: %d layer(s) on %s run it as one node a layer (tq-rf-keep.h)\n", __func__,
                       n_dev_keep, dev_keep_dev.c_str());
    }
}

bool llama_kv_cache::tq_kmean_rope_dev_terms(int32_t il) const {
    tq_kmean_rope_setup();
    return il >= 0 && (size_t) il < tq_rf_layer_dev_terms.size() && tq_rf_layer_dev_terms[il] != 0;
}

bool llama_kv_cache::tq_kmean_rope_dev_keep(int32_t il) const {
    tq_kmean_rope_setup();
    return il >= 0 && (size_t) il < tq_rf_layer_dev_keep.size() && tq_rf_layer_dev_keep[il] != 0;
}

bool llama_kv_cache::tq_kmean_rope_masked(int32_t il) const {
    tq_kmean_rope_setup();
    return il >= 0 && (size_t) il < tq_rf_layer_masked.size() && tq_rf_layer_masked[il] != 0;
}

ggml_tensor * llama_kv_cache::tq_get_k_sink(int32_t il, int which) const {
    if (tq_kmean_rope_set(il) < 0 || il < 0 || (size_t) il >= tq_sink_rows.size()) {
        return nullptr;
    }
    return which == 0 ? tq_sink_rows[il] : tq_sink_q[il];
}

int64_t llama_kv_cache::tq_sink_slots() const {
    return (int64_t) n_seq_max;
}

// Whether attention reads the exact first keys (tq-sink.h, "Where it applies"): the slots are
// kept, every layer's K is turbo and flash attention reads it, whatever V is. A turbo V implies
// flash attention (llama refuses a quantized V without it); with another V the graphs say
// (tq_note_flash_attn; the reserve graphs are built before any ubatch). The mean in RoPE's
// frame is the caller's to check: the slots are read only with it.
bool llama_kv_cache::tq_sink_reads() const {
    if (tq_sink_type == GGML_TYPE_COUNT) {
        return false;
    }
    for (const auto & layer : layers) {
        if (!layer.k || !TQ_GGML_IS_TURBO(layer.k->type) ||
            (tq_sink_fa == 0 && !(layer.v && TQ_GGML_IS_TURBO(layer.v->type)))) {
            return false;
        }
    }
    return true;
}

// The slot a cell reads: at position 0 its lowest sequence's (the slot that sequence's first
// token, its copies and its restores write), else -1.
static int32_t tq_sink_cell_slot(const llama_kv_cells & cells, uint32_t c, int64_t n_slots) {
    if (cells.is_empty(c) || cells.pos_get(c) != 0) {
        return -1;
    }
    for (int64_t j = 0; j < n_slots; ++j) {
        if (cells.seq_has(c, (llama_seq_id) j)) {
            return (int32_t) j;
        }
    }
    return -1;
}

// Each cell's slot for the cells in view (n_cells = n_kv per stream, stream after stream;
// block s of the ubatch's tokens names stream s of the view), -1 without slots.
std::vector<int32_t> llama_kv_cache::tq_sink_cell_slots(const llama_ubatch & ub, int64_t n_cells, int64_t n_stream,
                                                        bool with_slots) const {
    const int64_t n_kv = n_cells / n_stream, n_slots = tq_sink_slots();
    GGML_ASSERT(n_stream >= 1 && n_cells % n_stream == 0 && ub.n_tokens % n_stream == 0 &&
                n_kv <= (int64_t) v_cells[0].size());
    const int64_t n_tps = ub.n_tokens / n_stream;
    std::vector<int32_t> slot((size_t) n_cells, -1);
    for (int64_t s = 0; s < n_stream && with_slots; ++s) {
        const auto & cells = v_cells[seq_to_stream[ub.seq_id[s * n_tps][0]]];
        for (int64_t c = 0; c < n_kv; ++c) {
            slot[s * n_kv + c] = tq_sink_cell_slot(cells, (uint32_t) c, n_slots);
        }
    }
    return slot;
}

// Row 1 of the cells input C (tq-fa-contract.h): each cell's slot, for the cells of
// tq_kmean_rope_fill.
void llama_kv_cache::tq_sink_fill_cells(const llama_ubatch & ub, ggml_tensor * dst, int64_t n_stream, bool with_slots) const {
    GGML_ASSERT(dst->type == GGML_TYPE_I32 && dst->ne[1] == 2);
    const std::vector<int32_t> slot = tq_sink_cell_slots(ub, dst->ne[0], n_stream, with_slots);
    ggml_backend_tensor_set(dst, slot.data(), dst->nb[1], slot.size() * sizeof(int32_t));
}

// The same cells as a selection, for the lowered terms (tq_sink_select in tq-sink.h): per
// stream s up to n_sel cells that have a slot, their index in the stream (cell_idx i32
// [n_sel, ns]), their slot (slot_idx i32 [n_sel ns]) and a one-hot map entry -> cell (onehot
// f32 [n_sel, n_kv, 1, ns]). Unused entries name cell 0 and the write-only last slot row, and
// map to no cell.
void llama_kv_cache::tq_sink_fill_select(const llama_ubatch & ub, ggml_tensor * cell_idx, ggml_tensor * slot_idx,
                                         ggml_tensor * onehot) const {
    const int64_t n_sel = cell_idx->ne[0], ns = cell_idx->ne[1], n_kv = onehot->ne[1];
    GGML_ASSERT(cell_idx->type == GGML_TYPE_I32 && slot_idx->type == GGML_TYPE_I32 && onehot->type == GGML_TYPE_F32 &&
                ggml_nelements(slot_idx) == n_sel * ns && onehot->ne[0] == n_sel && onehot->ne[3] == ns);
    const std::vector<int32_t> slot = tq_sink_cell_slots(ub, n_kv * ns, ns, true);
    std::vector<int32_t> ci((size_t) (n_sel * ns), 0), si((size_t) (n_sel * ns), (int32_t) tq_sink_slots());
    std::vector<float> oh((size_t) (n_sel * n_kv * ns), 0.0f);
    for (int64_t s = 0; s < ns; ++s) {
        int64_t i = 0;
        for (int64_t c = 0; c < n_kv && i < n_sel; ++c) {
            if (slot[s * n_kv + c] >= 0) {
                ci[s * n_sel + i] = (int32_t) c;
                si[s * n_sel + i] = slot[s * n_kv + c];
                oh[(s * n_kv + c) * n_sel + i] = 1.0f;
                ++i;
            }
        }
    }
    ggml_backend_tensor_set(cell_idx, ci.data(), 0, ci.size() * sizeof(int32_t));
    ggml_backend_tensor_set(slot_idx, si.data(), 0, si.size() * sizeof(int32_t));
    ggml_backend_tensor_set(onehot, oh.data(), 0, oh.size() * sizeof(float));
}

int llama_kv_cache::tq_kmean_rope_set(int32_t il) const {
    tq_kmean_rope_setup();
    return il >= 0 && (size_t) il < tq_rf_layer_set.size() ? tq_rf_layer_set[il] : -1;
}

int64_t llama_kv_cache::tq_kmean_n_rot(int32_t il) const {
    if (il < 0 || (uint32_t) il >= hparams.n_layer_all || !hparams.has_rope(il) ||
        hparams.n_rot(il) >= hparams.n_embd_head_k(il)) {
        return 0;
    }
    return hparams.n_rot(il);
}

int64_t llama_kv_cache::tq_kmean_rope_hd(int set) const {
    return 2 * (int64_t) tq_rf_sets.at(set).size();
}

// Column j of a table: cos(p_j w_i) in rows i < hd/2, sin(p_j w_i) in rows hd/2 + i. The ubatch's
// tokens and the cells take theirs from the same positions through the same arithmetic, so
// what a key stores and what its logit gets back cancel exactly. An empty cell (masked) gets 0.
// tab_kv: the cells' columns, then TQ_FA_TERM_STEPS columns for positions 0, 1, ... (T of
// tq-fa-contract.h).
void llama_kv_cache::tq_kmean_rope_fill(int set, const llama_ubatch & ub, ggml_tensor * tab_ub, ggml_tensor * tab_kv,
                                        int64_t n_stream) const {
    const std::vector<double> & w = tq_rf_sets.at(set);
    const int64_t half = (int64_t) w.size(), hd = 2 * half;
    auto col = [&](llama_pos p, float * dst) {
        for (int64_t i = 0; i < half; ++i) {
            const double a = (double) p * w[i];
            dst[i] = (float) std::cos(a);
            dst[half + i] = (float) std::sin(a);
        }
    };
    if (tab_ub) {
        GGML_ASSERT(tab_ub->ne[0] == hd && tab_ub->ne[1] == ub.n_tokens);
        std::vector<float> t(ub.n_tokens * hd);
        for (uint32_t j = 0; j < ub.n_tokens; ++j) {
            col(ub.pos[j], t.data() + (int64_t) j * hd);
        }
        ggml_backend_tensor_set(tab_ub, t.data(), 0, ggml_nbytes(tab_ub));
    }
    if (!tab_kv) {
        return;
    }
    const int64_t n_cells = tab_kv->ne[1] - TQ_FA_TERM_STEPS;
    {
        // the columns of positions 0 .. TQ_FA_TERM_STEPS - 1, through the same col()
        std::vector<float> t(TQ_FA_TERM_STEPS * hd);
        for (int j = 0; j < TQ_FA_TERM_STEPS; ++j) {
            col(j, t.data() + (int64_t) j * hd);
        }
        ggml_backend_tensor_set(tab_kv, t.data(), (size_t) n_cells * tab_kv->nb[1], t.size() * sizeof(float));
    }
    // the view's streams are those of the ubatch's blocks of n_tokens / n_stream tokens, as
    // llama's mask takes them; column s * n_kv + c is cell c of block s's stream. The columns
    // are kept between ubatches, per stream and cell (a decode step changes one cell), so only
    // a cell whose position changed is computed again, and each block goes to the tensor
    // straight from that store.
    const int64_t n_kv = n_cells / n_stream, kv_size = v_cells[0].size();
    GGML_ASSERT(tab_kv->ne[0] == hd && n_stream >= 1 && n_cells % n_stream == 0 && ub.n_tokens % n_stream == 0);
    GGML_ASSERT(n_kv <= kv_size);
    const int64_t n_tps = ub.n_tokens / n_stream;
    std::vector<float> & keep = tq_rf_tab.at(set);
    std::vector<llama_pos> & kept_pos = tq_rf_tab_pos.at(set);
    if ((int64_t) kept_pos.size() < (int64_t) v_cells.size() * kv_size) {
        kept_pos.assign(v_cells.size() * kv_size, -1);
        keep.assign(kept_pos.size() * hd, 0.0f);
    }
    for (int64_t s = 0; s < n_stream; ++s) {
        const uint32_t stream = seq_to_stream[ub.seq_id[s * n_tps][0]];
        const auto & cells = v_cells[stream];
        const int64_t at0 = stream * kv_size;
        for (int64_t c = 0; c < n_kv; ++c) {
            const llama_pos p = !cells.is_empty((uint32_t) c) ? cells.pos_get((uint32_t) c) : 0;
            if (kept_pos[at0 + c] != p) {
                col(p, keep.data() + (at0 + c) * hd);
                kept_pos[at0 + c] = p;
            }
        }
        ggml_backend_tensor_set(tab_kv, keep.data() + at0 * hd, s * n_kv * hd * sizeof(float), n_kv * hd * sizeof(float));
    }
}

// The cells' positions as the tables take them (an empty cell: 0), stream after stream as in
// tq_kmean_rope_fill.
void llama_kv_cache::tq_kv_fill_positions(const llama_ubatch & ub, ggml_tensor * dst, int64_t n_stream) const {
    static_assert(sizeof(llama_pos) == sizeof(int32_t), "the tiles read positions as int32");
    const int64_t n_cells = dst->ne[0], n_kv = n_cells / n_stream;
    GGML_ASSERT(dst->type == GGML_TYPE_I32 && n_stream >= 1 && n_cells % n_stream == 0 && ub.n_tokens % n_stream == 0 &&
                n_kv <= (int64_t) v_cells[0].size());
    const int64_t n_tps = ub.n_tokens / n_stream;
    std::vector<int32_t> pos((size_t) n_cells, 0);
    for (int64_t s = 0; s < n_stream; ++s) {
        const auto & cells = v_cells[seq_to_stream[ub.seq_id[s * n_tps][0]]];
        for (int64_t c = 0; c < n_kv; ++c) {
            pos[s * n_kv + c] = !cells.is_empty((uint32_t) c) ? cells.pos_get((uint32_t) c) : 0;
        }
    }
    ggml_backend_tensor_set(dst, pos.data(), 0, pos.size() * sizeof(int32_t));
}

void llama_kv_cache::tq_kmean_set_positions(uint32_t n_pos) {
    tq_kmean_n_pos = n_pos;
}

// Whether tokens at pos[0..n) give statistics (SET, tq-kmean.h): with the first keys read
// exact (skip_first) the tokens not at position 0 count, and fewer are enough, since the sink
// that made a small sample unreliable is left out of it.
static bool tq_kmean_can_set(const llama_pos * pos, uint32_t n, bool skip_first) {
    if (!skip_first) {
        return n >= TQ_KMEAN_MIN_TOKENS;
    }
    uint32_t k = 0;
    for (uint32_t j = 0; j < n; ++j) {
        k += pos[j] != 0;
    }
    return k >= TQ_KMEAN_MIN_TOKENS_SKIP;
}

// init_batch's call before it splits a batch: with statistics per stream (RoPE's frame) and a
// cache that holds no cell, every stream starts fresh in this batch (its first ubatch sets
// its own statistics, tq_kmean_prepare), and a multi-stream cache then gives each sequence its
// first ubatch alone (true: split_seq instead of split_equal), so that its statistics come
// from its first min(length, n_ubatch) tokens whatever the batch holds besides; that costs
// no throughput (the same tokens per ubatch, only not interleaved). A busy cache: nothing
// fresh (new streams inherit the shared column), the usual split.
// Whether this cache keeps the K mean in RoPE's frame (so its statistics are per stream).
bool llama_kv_cache::tq_kmean_rf_on() const {
    tq_kmean_rope_setup();
    return std::any_of(layers.begin(), layers.end(), [](const kv_layer & l) { return tq_kmean_rope_is(l.k_mean); });
}

bool llama_kv_cache::tq_kmean_batch_begin() {
    tq_kmean_fresh.assign(n_stream, 0);
    if (!tq_kmean) {
        return false;
    }
    for (const auto & cells : v_cells) {
        if (cells.get_used() != 0) {
            return false;
        }
    }
    if (!tq_kmean_rf_on()) {
        return false;
    }
    tq_kmean_fresh.assign(n_stream, 1);
    tq_kmean_shared_pending = true;
    return n_stream > 1;
}

// Before a ubatch is applied (and its graph built or reused): pick the modes (tq-kmean.h).
// The fitted mean: one for the cache, SET / ZERO by the first ubatch into an empty cache,
// KEEP after. In RoPE's frame: one per block of the ubatch (a stream each, tq_kmean_rf_streams):
// a fresh stream (tq_kmean_batch_begin; any stream of an empty cache) SETs or ZEROes by the
// block's own tokens, the shared column from the first block that SETs in a fresh batch; a
// stream that holds cells KEEPs, one that holds none in a busy cache INHERITs. The graph's
// kind: KEEP when every block keeps, SET when one computes statistics, else ZERO (columns
// chosen and written, no statistics).
void llama_kv_cache::tq_kmean_prepare(const llama_ubatch & ubatch) {
    tq_sink_ub_write = std::any_of(ubatch.pos, ubatch.pos + ubatch.n_tokens, [](llama_pos p) { return p == 0; });
    if (!tq_kmean) {
        return;
    }
    bool empty = true;
    for (const auto & cells : v_cells) {
        empty = empty && cells.get_used() == 0;
    }
    if (!tq_kmean_rf_on()) {
        tq_kmean_blocks.clear();
        tq_kmean_mode = !empty ? TQ_KMEAN_KEEP : tq_kmean_can_set(ubatch.pos, ubatch.n_tokens, false) ? TQ_KMEAN_SET : TQ_KMEAN_ZERO;
        return;
    }
    const uint32_t nb = n_stream > 1 ? ubatch.n_seqs_unq : 1, per = ubatch.n_tokens / nb;
    GGML_ASSERT(nb >= 1 && per * nb == ubatch.n_tokens);
    const bool skip = tq_sink_reads();
    if (empty) {
        tq_kmean_shared_pending = true; // an empty cache starts fresh even without init_batch's call
    }
    tq_kmean_blocks.assign(nb, TQ_KMEAN_KEEP);
    tq_kmean_shared = -1; // -1: the stored one, else the block whose SET it takes
    bool any_set = false, any_new = false;
    for (uint32_t b = 0; b < nb; ++b) {
        const uint32_t stream = seq_to_stream[ubatch.seq_id[b * per][0]];
        const bool unused = v_cells[stream].get_used() == 0;
        const bool fresh = unused && (empty || (stream < tq_kmean_fresh.size() && tq_kmean_fresh[stream]));
        int8_t m = TQ_KMEAN_KEEP;
        if (fresh) {
            m = tq_kmean_can_set(ubatch.pos + b * per, per, skip) ? TQ_KMEAN_SET : TQ_KMEAN_ZERO;
            if (m == TQ_KMEAN_SET && tq_kmean_shared_pending) {
                tq_kmean_shared = (int) b;
                tq_kmean_shared_pending = false;
            }
            if (stream < tq_kmean_fresh.size()) {
                tq_kmean_fresh[stream] = 0;
            }
        } else if (unused) {
            m = TQ_KMEAN_INHERIT;
        }
        any_set = any_set || m == TQ_KMEAN_SET;
        any_new = any_new || m != TQ_KMEAN_KEEP;
        tq_kmean_blocks[b] = m;
    }
    tq_kmean_mode = any_set ? TQ_KMEAN_SET : any_new ? TQ_KMEAN_ZERO : TQ_KMEAN_KEEP;
}

int64_t llama_kv_cache::tq_kmean_n_blocks() const {
    return (int64_t) tq_kmean_blocks.size();
}

// The graph inputs of tq_kmean_rf_streams for this ubatch (nb blocks): each block's stream
// and the shared column's row n_stream; the column each takes among [the stored ones of
// streams[0..nb] | the blocks' SET statistics (SET graphs only) | zeros].
void llama_kv_cache::tq_kmean_fill_blocks(const llama_ubatch & ub, int32_t * streams, int32_t * sel, int64_t nb) const {
    GGML_ASSERT(nb == (int64_t) tq_kmean_blocks.size() && ub.n_tokens % nb == 0);
    const int64_t per = ub.n_tokens / nb, zero = tq_kmean_mode == TQ_KMEAN_SET ? 2 * nb + 1 : nb + 1;
    for (int64_t b = 0; b < nb; ++b) {
        streams[b] = (int32_t) seq_to_stream[ub.seq_id[b * per][0]];
        switch (tq_kmean_blocks[b]) {
            case TQ_KMEAN_SET:     sel[b] = (int32_t) (nb + 1 + b); break;
            case TQ_KMEAN_ZERO:    sel[b] = (int32_t) zero; break;
            case TQ_KMEAN_INHERIT: sel[b] = (int32_t) nb; break;
            default:               sel[b] = (int32_t) b; break;
        }
    }
    streams[nb] = (int32_t) n_stream;
    sel[nb] = (int32_t) (tq_kmean_shared >= 0 ? nb + 1 + tq_kmean_shared : nb);
}

// Stream copy (seq_cp across streams, applied in update): the destination stream now holds
// the source's keys, stored with the source's means.
void llama_kv_cache::tq_kmean_stream_copy(uint32_t ssrc, uint32_t sdst) {
    std::vector<uint8_t> buf;
    for (const auto & layer : layers) {
        if (tq_kmean_rope_is(layer.k_mean)) {
            const size_t row = layer.k_mean->nb[1];
            buf.resize(row);
            ggml_backend_tensor_get(layer.k_mean, buf.data(), (size_t) ssrc * row, row);
            ggml_backend_tensor_set(layer.k_mean, buf.data(), (size_t) sdst * row, row);
        }
    }
}

int llama_kv_cache::tq_kmean_mode_get() const {
    return tq_kmean_mode;
}

int64_t llama_kv_cache::tq_kmean_map_hd() const {
    int64_t hd = 0;
    for (const auto & layer : layers) {
        hd = layer.k_mean ? std::max<int64_t>(hd, hparams.n_embd_head_k(layer.il)) : hd;
    }
    return hd;
}

int64_t llama_kv_cache::tq_kmean_map_rows() const {
    int64_t rows = 1;
    for (const auto & layer : layers) {
        rows = layer.k_mean ? std::max<int64_t>(rows, (int64_t) layer.il + 1) : rows;
    }
    return rows;
}

// The position maps M of a SET ubatch (tq-kmean.h) for every layer with a mean, layer il's
// at dst + il * stride (row-major hd x hd); the identity where the layer's RoPE is not
// handled. N, the positions a sequence of this cache can reach: its cells, or what the
// owner says (an SWA cache holds a window of a longer sequence).
void llama_kv_cache::tq_kmean_fill_map(const llama_ubatch & ub, float * dst, int64_t stride) const {
    const uint32_t n_pos = std::max<uint32_t>(tq_kmean_n_pos, v_cells.empty() ? 1u : v_cells[0].size());
    for (const auto & layer : layers) {
        if (layer.k_mean) {
            const int64_t hd = hparams.n_embd_head_k(layer.il);
            const std::vector<double> w = tq_kmean_rope_freqs(model, hparams, layer.il, n_pos);
            tq_kmean_map(w.data(), (int64_t) w.size(), hd, hparams.rope_type == LLAMA_ROPE_TYPE_NEOX, ub.pos, ub.n_tokens,
                         n_pos, dst + (int64_t) layer.il * stride);
        }
    }
}

// Saved state: after a layer's K rows, a tag and its mean (the keys are meaningless without
// it). The tag makes a state saved with the mean unreadable by a cache without it (its next
// read is a key type, which fails) and the reverse (the tag is missing).
// The tags changed when m moved to the channel frame: an older state is refused, not misread.
static const uint32_t TQ_KMEAN_STATE_TAG = 0x324d5154; // "TQM2": m
static const uint32_t TQ_KBAL_STATE_TAG  = 0x32425154; // "TQB2": m and s
static const uint32_t TQ_KMEAN_RF_STATE_TAG = 0x464d5154; // "TQMF": mu' (RoPE's frame)
static const uint32_t TQ_KBAL_RF_STATE_TAG  = 0x46425154; // "TQBF": mu' and s

static uint32_t tq_kmean_state_tag(bool kbal, bool rf) {
    return rf ? (kbal ? TQ_KBAL_RF_STATE_TAG : TQ_KMEAN_RF_STATE_TAG) : (kbal ? TQ_KBAL_STATE_TAG : TQ_KMEAN_STATE_TAG);
}

void llama_kv_cache::tq_kmean_state_write(llama_io_write_i & io, const kv_layer & layer, uint32_t strm,
                              const std::vector<std::pair<uint32_t, uint32_t>> & ranges) const {
    if (layer.k_mean) {
        // the stream's column in RoPE's frame, the cache's (column 0) for the fitted mean
        const bool rf = tq_kmean_rope_is(layer.k_mean);
        const uint32_t tag = tq_kmean_state_tag(tq_kbal, rf);
        io.write(&tag, sizeof(tag));
        io.write_tensor(layer.k_mean, rf ? (size_t) strm * layer.k_mean->nb[1] : 0, layer.k_mean->nb[1]);
        tq_sink_state_write(io, layer, strm, ranges);
    }
}

static bool tq_kmean_state_check(const float * v, int64_t n_f, bool kbal, int il);

// Restoring: the cache adopts the saved mean when it holds no other cells than the restored
// ones (adopt); otherwise the saved mean must equal the one in use, or the restore is
// refused, because the cache's other keys were stored with a different mean.
// A layer's saved values are checked before any of them is adopted: a NaN mean or scale
// would survive even an emptied cache (the SET/ZERO modes multiply the stored values by 0,
// and NaN * 0 is NaN), and s divides every query. Earlier layers of a state refused at a
// later one keep their checked, finite values only for cells that llama then removes
// (state_read drops the sequence on failure), and the next ubatch into the emptied cache
// sets or zeroes them.
bool llama_kv_cache::tq_kmean_state_read(llama_io_read_i & io, const kv_layer & layer, bool adopt, uint32_t strm,
                                         uint32_t cell_count, const slot_info & sinfo) {
    if (!layer.k_mean) {
        return true;
    }
    const int64_t n_f = layer.k_mean->ne[0]; // m and s - 1 of one column, tq-kmean.h
    const size_t n = (size_t) n_f * sizeof(float);
    uint32_t tag = 0;
    io.read(&tag, sizeof(tag));
    tq_kmean_rope_setup();
    const uint32_t want = tq_kmean_state_tag(tq_kbal, tq_kmean_rope_is(layer.k_mean));
    if (tag != want) {
        if (tag == tq_kmean_state_tag(false, false) || tag == tq_kmean_state_tag(true, false) ||
            tag == tq_kmean_state_tag(false, true) || tag == tq_kmean_state_tag(true, true)) {
            LLAMA_LOG_ERROR("%s: layer %d: the state's turbo K mean/balancing does not match this cache's (saved with "
                            "other --tq-k-mean / --tq-k-balance / TQ_K_MEAN_FRAME settings)\n", __func__, layer.il);
        } else {
            LLAMA_LOG_ERROR("%s: layer %d: unknown turbo K mean tag 0x%08x in the state (expected 0x%08x): a corrupt "
                            "state or one written by another build\n", __func__, layer.il, tag, want);
        }
        return false;
    }
    std::vector<float> saved(n_f);
    io.read(saved.data(), n);
    if (!tq_kmean_state_check(saved.data(), n_f, tq_kbal, layer.il)) {
        return false;
    }
    // in RoPE's frame the stream's own column, which it adopts when it holds no other cells
    // than the restored ones (whatever the other streams hold); the fitted mean's is the cache's
    const bool rf = tq_kmean_rope_is(layer.k_mean);
    const size_t at = rf ? (size_t) strm * layer.k_mean->nb[1] : 0;
    const bool adopt_col = rf ? v_cells[strm].get_used() <= cell_count : adopt;
    if (!adopt_col) {
        std::vector<float> cur(n_f);
        ggml_backend_tensor_get(layer.k_mean, cur.data(), at, n);
        if (memcmp(saved.data(), cur.data(), n) != 0) {
            LLAMA_LOG_ERROR("%s: layer %d: the saved turbo K mean differs from the one this cache's other sequences use; "
                            "restore into an empty cache (or run with --tq-k-mean off on both sides)\n", __func__, layer.il);
            return false;
        }
    }
    if (!tq_sink_state_read(io, layer, adopt, strm, cell_count, sinfo)) {
        return false;
    }
    if (adopt_col) {
        ggml_backend_tensor_set(layer.k_mean, saved.data(), at, n);
    }
    if (rf && adopt) {
        // a cache that holds only what is restored: streams that start later inherit these
        ggml_backend_tensor_set(layer.k_mean, saved.data(), (size_t) n_stream * layer.k_mean->nb[1], n);
    }
    return true;
}

// Saved state, after a layer's mean: the exact first keys of the saved cells (tq-sink.h) where
// the cache keeps them: a tag, the entry count and floats per row, then per entry the index
// of a saved cell at position 0 (in the order the cells are saved) and its exact row. The
// entries follow the cells, not the slots, so that a restore can put each key in the slot
// of the sequence it is restored into (a cell takes a slot's row only while its bytes match
// it, and the slot of sequence s is the one s's next first token and s's copies write).
// TQS1 saved the slots themselves and is refused: restored into a cache whose slots were
// all in use it dropped the key, and its slot order was the saving cache's.
static const uint32_t TQ_SINK_STATE_TAG = 0x32535154; // "TQS2"

void llama_kv_cache::tq_sink_state_write(llama_io_write_i & io, const kv_layer & layer, uint32_t strm,
                              const std::vector<std::pair<uint32_t, uint32_t>> & ranges) const {
    ggml_tensor * r = tq_get_k_sink((int32_t) layer.il, 0), * q = tq_get_k_sink((int32_t) layer.il, 1);
    if (!r || !q) {
        return;
    }
    const auto & cells = v_cells[strm];
    const ggml_tensor * k = layer.k_stream[strm];
    const int64_t n_slots = r->ne[1] - 1, row_f = r->ne[0];
    const size_t row_q = q->nb[1];
    GGML_ASSERT(k->type == q->type && k->ne[0] == row_f && (size_t) k->nb[1] == row_q);
    std::vector<uint8_t> slots_q((size_t) n_slots * row_q), kb(row_q);
    ggml_backend_tensor_get(q, slots_q.data(), 0, slots_q.size());
    std::vector<std::pair<uint32_t, int64_t>> entries; // (saved cell index, slot)
    uint32_t n_saved = 0;
    for (const auto & range : ranges) {
        for (uint32_t i = range.first; i < range.second; ++i, ++n_saved) {
            // the cell's slot where its bytes match it: the key the kernels use
            const int32_t j = tq_sink_cell_slot(cells, i, n_slots);
            if (j < 0) {
                continue;
            }
            ggml_backend_tensor_get(k, kb.data(), (size_t) i * row_q, row_q);
            if (memcmp(slots_q.data() + j * row_q, kb.data(), row_q) == 0) {
                entries.emplace_back(n_saved, j);
            }
        }
    }
    const uint32_t tag = TQ_SINK_STATE_TAG, n = (uint32_t) entries.size();
    const uint64_t nf = (uint64_t) row_f;
    io.write(&tag, sizeof(tag));
    io.write(&n, sizeof(n));
    io.write(&nf, sizeof(nf));
    for (const auto & e : entries) {
        io.write(&e.first, sizeof(e.first));
        io.write_tensor(r, (size_t) e.second * r->nb[1], (size_t) row_f * sizeof(float));
    }
}

// Each entry's key goes to the slots of the sequences its restored cell belongs to (the
// restored sequence, or a whole state's own sequences), in K's type the cell's restored
// bytes, so the cell matches it. adopt: the cache holds only the restored cells, and the
// slots are cleared first. Everything is checked before any slot changes.
bool llama_kv_cache::tq_sink_state_read(llama_io_read_i & io, const kv_layer & layer, bool adopt, uint32_t strm,
                                        uint32_t cell_count, const slot_info & sinfo) {
    ggml_tensor * r = tq_get_k_sink((int32_t) layer.il, 0), * q = tq_get_k_sink((int32_t) layer.il, 1);
    if (!r || !q) {
        return true;
    }
    const uint32_t il = layer.il;
    uint32_t tag = 0, n = 0;
    uint64_t nf = 0;
    io.read(&tag, sizeof(tag));
    if (tag != TQ_SINK_STATE_TAG) {
        LLAMA_LOG_ERROR("%s: layer %u: expected the turbo exact first keys (tag 0x%08x), found 0x%08x: a corrupt "
                        "state or one written by another build\n", __func__, il, TQ_SINK_STATE_TAG, tag);
        return false;
    }
    io.read(&n, sizeof(n));
    io.read(&nf, sizeof(nf));
    const int64_t row_f = r->ne[0];
    if (n > cell_count || nf != (uint64_t) row_f) {
        LLAMA_LOG_ERROR("%s: layer %u: the state has exact first keys for %u cells of %llu floats (it restores %u "
                        "cells, this cache's keys have %lld floats); refusing them\n", __func__, il, n,
                        (unsigned long long) nf, cell_count, (long long) row_f);
        return false;
    }
    const auto & cells = v_cells[strm];
    std::vector<uint32_t> at(n);
    std::vector<float> rows((size_t) n * row_f);
    for (uint32_t e = 0; e < n; ++e) {
        io.read(&at[e], sizeof(at[e]));
        io.read(rows.data() + (size_t) e * row_f, (size_t) row_f * sizeof(float));
        const bool placed = at[e] < cell_count && (e == 0 || at[e] > at[e - 1]);
        if (!placed || cells.pos_get(sinfo.idxs[0][at[e]]) != 0) {
            LLAMA_LOG_ERROR("%s: layer %u: the state's exact first key %u is for saved cell %u, which is %s; refusing "
                            "it\n", __func__, il, e, at[e], !placed ? "out of order or past the restored cells" :
                            "not at position 0");
            return false;
        }
        for (int64_t i = 0; i < row_f; ++i) {
            if (!std::isfinite(rows[(size_t) e * row_f + i])) {
                LLAMA_LOG_ERROR("%s: layer %u: the state's exact first key %u is not finite; refusing it\n", __func__,
                                il, e);
                return false;
            }
        }
    }
    const int64_t n_slots = r->ne[1] - 1;
    const size_t row_q = q->nb[1];
    const ggml_tensor * k = layer.k_stream[strm];
    GGML_ASSERT(k->type == q->type && k->ne[0] == row_f && (size_t) k->nb[1] == row_q);
    std::vector<float> cur_rows((size_t) n_slots * row_f, 0.0f);
    std::vector<uint8_t> cur_q((size_t) n_slots * row_q, 0);
    if (!adopt) {
        ggml_backend_tensor_get(r, cur_rows.data(), 0, cur_rows.size() * sizeof(float));
        ggml_backend_tensor_get(q, cur_q.data(), 0, cur_q.size());
    }
    // The slot's copy in K's type is the exact row quantized as set_rows writes it (the same
    // function), so it equals the restored cell's bytes exactly when the state's cell and row
    // agree. It is not read back from the cell: llama's buffer reader (the server's host
    // prompt cache) writes the restored rows into the tensors only once the whole state is
    // read, so here the cell still holds what it held before the restore.
    const ggml_from_float_t quantize = ggml_get_type_traits(k->type)->from_float_ref;
    GGML_ASSERT(quantize != nullptr);
    std::vector<uint8_t> kb(row_q);
    for (uint32_t e = 0; e < n; ++e) {
        const uint32_t c = sinfo.idxs[0][at[e]];
        quantize(rows.data() + (size_t) e * row_f, kb.data(), row_f);
        for (int64_t s = 0; s < n_slots; ++s) {
            if (cells.seq_has(c, (llama_seq_id) s)) {
                memcpy(cur_rows.data() + s * row_f, rows.data() + (size_t) e * row_f, row_f * sizeof(float));
                memcpy(cur_q.data() + s * row_q, kb.data(), row_q);
            }
        }
    }
    ggml_backend_tensor_set(r, cur_rows.data(), 0, cur_rows.size() * sizeof(float));
    ggml_backend_tensor_set(q, cur_q.data(), 0, cur_q.size());
    return true;
}

// seq_cp: a copy that takes src's first key makes it dst's too, in dst's slot, so that the
// copy keeps its exact first key when src's slot later takes another one.
void llama_kv_cache::tq_sink_seq_cp(llama_seq_id src, llama_seq_id dst, llama_pos p0, llama_pos p1) {
    const int64_t n_slots = tq_sink_type == GGML_TYPE_COUNT ? 0 : tq_sink_slots();
    if (n_slots == 0 || src == dst || src < 0 || dst < 0 || src >= n_slots || dst >= n_slots || p0 > 0 || p1 == 0 ||
        v_cells[seq_to_stream[src]].seq_pos_min(src) != 0) {
        return;
    }
    std::vector<uint8_t> buf;
    for (size_t il = 0; il < tq_sink_rows.size(); ++il) {
        for (ggml_tensor * x : { tq_sink_rows[il], tq_sink_q[il] }) {
            if (x) {
                buf.resize(x->nb[1]);
                ggml_backend_tensor_get(x, buf.data(), (size_t) src * x->nb[1], x->nb[1]);
                ggml_backend_tensor_set(x, buf.data(), (size_t) dst * x->nb[1], x->nb[1]);
            }
        }
    }
}

// What the writer can produce: a finite mean; with balancing, s - 1 where s was clamped to
// [1/TQ_KBAL_MAX, TQ_KBAL_MAX] (tq-kmean.h), allowing float rounding of the - 1 / + 1.
static bool tq_kmean_state_check(const float * v, int64_t n_f, bool kbal, int il) {
    const int64_t n = kbal ? n_f / 2 : n_f;
    for (int64_t i = 0; i < n; ++i) {
        if (!std::isfinite(v[i])) {
            LLAMA_LOG_ERROR("%s: layer %d: the state's turbo K mean is not finite (value %lld is %g); refusing it\n",
                            __func__, il, (long long) i, (double) v[i]);
            return false;
        }
    }
    const float lo = (1.0f / TQ_KBAL_MAX) * (1.0f - 1e-5f), hi = TQ_KBAL_MAX * (1.0f + 1e-5f);
    for (int64_t i = n; kbal && i < n_f; ++i) {
        const float s = v[i] + 1.0f;
        if (!std::isfinite(v[i]) || !(s >= lo && s <= hi)) {
            LLAMA_LOG_ERROR("%s: layer %d: the state's turbo K/Q balancing scale %lld is %g, outside [1/%g, %g] "
                            "(what a saving cache clamps to); refusing it\n",
                            __func__, il, (long long) (i - n), (double) s, (double) TQ_KBAL_MAX, (double) TQ_KBAL_MAX);
            return false;
        }
    }
    return true;
}

bool llama_kv_cache::tq_kmean_adopt(uint32_t cell_count) const {
    uint32_t used = 0;
    for (const auto & cells : v_cells) {
        used += cells.get_used();
    }
    return used <= cell_count;
}
