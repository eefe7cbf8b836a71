// ggml-level tests of the turbo types on the CPU backend, called from tests/ggml_ops.rs.
//
// Each entry point runs real ggml graphs (SET_ROWS, GET_ROWS, CPY, MUL_MAT,
// FLASH_ATTN_EXT) and compares them with the Rust codec (tq_quantize / tq_dequantize)
// or with the same op on f32 tensors holding the decoded values. It returns 0 on
// success, or writes what differed into `err` and returns 1.

#include "ggml.h"
#include "ggml-cpu.h"
#include "tq-ggml-graph.h"
#include "tq-ggml-rows.h"
#include "tq-kmean.h"
#include "tq-test-util.h"

#include <algorithm>
#include <cmath>
#include <complex>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <random>
#include <tuple>
#include <vector>

namespace {

using namespace tq_test;

const ggml_type TURBO[5] = { GGML_TYPE_TURBO2, GGML_TYPE_TURBO3, GGML_TYPE_TURBO4, GGML_TYPE_TURBO3_TCQ, GGML_TYPE_TURBO2_TCQ };

// The Rust codec's checked entry points for a ggml type.
int codec_quantize(ggml_type t, const float * x, void * out, int64_t n) {
    return tq_quantize(tq_ggml_codec_type(t), x, out, n);
}
int codec_dequantize(ggml_type t, const void * x, float * y, int64_t n) {
    return tq_dequantize(tq_ggml_codec_type(t), x, y, n);
}
int64_t codec_block_bytes(ggml_type t) {
    return tq_block_bytes(tq_ggml_codec_type(t));
}

} // namespace

extern "C" int tq_test_type_traits(char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    const char * names[5] = { "turbo2", "turbo3", "turbo4", "turbo3_tcq", "turbo2_tcq" };
    for (int i = 0; i < 5; ++i) {
        const ggml_type t = TURBO[i];
        if (strcmp(ggml_type_name(t), names[i]) != 0) return err.fail("name %s != %s", ggml_type_name(t), names[i]);
        if (tq_ggml_type_from_name(names[i]) != t) return err.fail("%s: tq_ggml_type_from_name", names[i]);
        if (ggml_blck_size(t) != TQ_BLOCK_VALUES) return err.fail("%s: block size %lld", names[i], (long long) ggml_blck_size(t));
        if ((int64_t) ggml_type_size(t) != codec_block_bytes(t)) return err.fail("%s: type size %zu", names[i], ggml_type_size(t));
        if (!ggml_is_quantized(t)) return err.fail("%s is not quantized", names[i]);
        if (ggml_get_type_traits_cpu(t)->vec_dot_type != GGML_TYPE_F32) return err.fail("%s: vec_dot_type", names[i]);
    }
    return 0;
}

// SET_ROWS (the cache write) then GET_ROWS and CPY (dequant) against the Rust codec.
extern "C" int tq_test_set_get_rows(char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    const int64_t D = 256, n_rows = 7, n_cache = 16;
    for (ggml_type t : TURBO) {
        Ctx c(64);
        auto src_v = gaussian(D * n_rows, 1234 + t);
        src_v[3] = NAN; // a bad value must stay inside its own block
        ggml_tensor * src = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, D, n_rows);
        memcpy(src->data, src_v.data(), src_v.size() * sizeof(float));
        ggml_tensor * cache = ggml_new_tensor_2d(c.ctx, t, D, n_cache);
        memset(cache->data, 0, ggml_nbytes(cache));
        ggml_tensor * idx = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I64, n_rows);
        const int64_t slots[n_rows] = { 3, 0, 9, 15, 4, 11, 7 };
        memcpy(idx->data, slots, sizeof(slots));
        ggml_tensor * set = ggml_set_rows(c.ctx, cache, src, idx);
        // the write runs on both threads (upstream: one), each thread on its own rows
        if (tq_switch_get(TQ_SW_ROWS_THREADS) && tq_ggml_rows_n_tasks(set, 2) != 2) return err.fail("%s: SET_ROWS not spread over threads", ggml_type_name(t));
        compute(c.ctx, set);

        std::vector<uint8_t> want(ggml_row_size(t, D));
        std::vector<float> want_f(D);
        ggml_tensor * idx32 = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, n_rows); // GET_ROWS takes i32
        for (int64_t r = 0; r < n_rows; ++r) ((int32_t *) idx32->data)[r] = (int32_t) slots[r];
        ggml_tensor * got = ggml_get_rows(c.ctx, cache, idx32);
        ggml_tensor * all = ggml_cpy(c.ctx, cache, ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, D, n_cache));
        compute(c.ctx, got);
        compute(c.ctx, all);
        for (int64_t r = 0; r < n_rows; ++r) {
            if (codec_quantize(t, src_v.data() + r * D, want.data(), D) != 0) return err.fail("codec quantize");
            const uint8_t * row = (const uint8_t *) cache->data + slots[r] * cache->nb[1];
            if (memcmp(row, want.data(), want.size()) != 0) return err.fail("%s: SET_ROWS bytes differ from tq_quantize (row %lld)", ggml_type_name(t), (long long) r);
            codec_dequantize(t, want.data(), want_f.data(), D);
            const float * g = (const float *) ((char *) got->data + r * got->nb[1]);
            const float * a = (const float *) ((char *) all->data + slots[r] * all->nb[1]);
            for (int64_t j = 0; j < D; ++j) {
                if (!std::isfinite(g[j])) return err.fail("%s: non-finite decode at row %lld col %lld", ggml_type_name(t), (long long) r, (long long) j);
                if (memcmp(&g[j], &want_f[j], 4) != 0) return err.fail("%s: GET_ROWS != tq_dequantize at (%lld,%lld): %g vs %g", ggml_type_name(t), (long long) r, (long long) j, g[j], want_f[j]);
                if (memcmp(&a[j], &want_f[j], 4) != 0) return err.fail("%s: CPY != tq_dequantize at (%lld,%lld)", ggml_type_name(t), (long long) r, (long long) j);
            }
        }
    }
    return 0;
}

// MUL_MAT with turbo src0 (K.Q without flash attention) equals MUL_MAT on decoded f32.
extern "C" int tq_test_mul_mat(char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    const int64_t D = 128, n_kv = 33, n_q = 5;
    for (ggml_type t : TURBO) {
        Ctx c(64);
        ggml_tensor * k = ggml_new_tensor_2d(c.ctx, t, D, n_kv);
        fill(k, gaussian(D * n_kv, 77 + t));
        ggml_tensor * kf = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, D, n_kv);
        fill(kf, decode(k));
        ggml_tensor * q = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, D, n_q);
        fill(q, gaussian(D * n_q, 99));
        ggml_tensor * a = ggml_mul_mat(c.ctx, k, q);
        ggml_tensor * b = ggml_mul_mat(c.ctx, kf, q);
        compute(c.ctx, a);
        compute(c.ctx, b);
        auto av = decode(a), bv = decode(b);
        for (size_t i = 0; i < av.size(); ++i) {
            if (std::fabs(av[i] - bv[i]) > 1e-4f * (1.0f + std::fabs(bv[i]))) return err.fail("%s: mul_mat %zu: %g vs %g", ggml_type_name(t), i, av[i], bv[i]);
        }
    }
    return 0;
}

// The rotation node (tq-rot-node.h) against ggml_mul_mat with the seeded matrix, as
// tq_mul_mat_rot builds each: a decode's 36 rows of n through the node (the matrix marked for
// it) equal the mul_mat rows within 2e-6 relative (the same products summed in another order;
// measured: 2.5e-7 at n = 64 to 6.1e-7 at 512),
// each row's bits are the row's alone, an unmarked matrix keeps mul_mat, and a prefill's rows
// keep it even where marked.
extern "C" int tq_test_rot_node(char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    for (int64_t n : { 64, 128, 256, 512 }) {
        const int64_t rows = 36;
        Ctx c(64 * n * n * 4 / 1024 / 1024 + 8);
        ggml_tensor * rot = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, n, n);
        if (tq_rotation_matrix(n, TQ_DEFAULT_SEED, (float *) rot->data) != TQ_OK) return err.fail("tq_rotation_matrix");
        tq_rot_mark_seeded(rot);
        ggml_tensor * x = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, n, 9, rows / 9); // [n, heads, tokens]
        fill(x, gaussian(n * rows, 31 + (uint32_t) n));
        ggml_tensor * plain = tq_mul_mat_rot(c.ctx, x, rot);
        if (tq_rot_is(plain->view_src ? plain->view_src : plain->src[0])) return err.fail("n %lld: an unmarked matrix took the node", (long long) n);
        tq_rot_mark_node(rot);
        ggml_tensor * node = tq_mul_mat_rot(c.ctx, x, rot);
        const ggml_tensor * inner = node->src[0];
        if (!tq_rot_is(inner)) return err.fail("n %lld: the marked matrix's decode rows did not take the node (%s)", (long long) n, ggml_op_desc(inner));
        ggml_tensor * big = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, n, 9, TQ_PREFILL_DECODE_MIN_TOKENS);
        if (tq_rot_is(tq_mul_mat_rot(c.ctx, big, rot)->src[0])) return err.fail("n %lld: a prefill's rows took the node", (long long) n);
        ggml_tensor * one = ggml_view_2d(c.ctx, x, n, 1, x->nb[1], 5 * x->nb[1]); // row 5 alone
        ggml_tensor * alone = tq_rot_node(c.ctx, rot, ggml_cont(c.ctx, one));
        compute(c.ctx, plain);
        compute(c.ctx, node);
        compute(c.ctx, alone);
        auto pv = decode(plain), nv = decode(node), av = decode(alone);
        double worst = 0;
        for (size_t i = 0; i < pv.size(); ++i) {
            const double d = std::fabs(pv[i] - nv[i]) / (1.0 + std::fabs(pv[i]));
            worst = std::max(worst, d);
            if (d > 2e-6) return err.fail("n %lld: value %zu: node %g, mul_mat %g", (long long) n, i, nv[i], pv[i]);
        }
        if (memcmp(av.data(), nv.data() + 5 * n, n * sizeof(float)) != 0) return err.fail("n %lld: row 5 alone differs from row 5 of 36", (long long) n);
        if (worst == 0) return err.fail("n %lld: node and mul_mat agree bit for bit: is the node in the graph?", (long long) n);
    }
    return 0;
}

// FLASH_ATTN_EXT with (k_type, v_type) equals the same op where every turbo tensor is
// replaced by f32 holding its decoded values. head size D, GQA ratio gqa.
// n_q >= 64 makes the f32 reference take ggml's tiled prefill kernel while the turbo
// side runs the per-row kernel; n_q == 1 takes the split-KV decode path. All must agree.
extern "C" int tq_test_flash_attn(int k_type, int v_type, int64_t D, int64_t gqa, int64_t n_q, char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    // one query (decode) over >= 512 keys takes the split-KV path that spreads keys over threads
    const int64_t n_kv = n_q == 1 ? 640 : 256, n_head_kv = 2, n_head = n_head_kv * gqa;
    Ctx c(256);
    auto mk = [&](ggml_type t, uint32_t seed) {
        ggml_tensor * x = ggml_new_tensor_3d(c.ctx, t, D, n_kv, n_head_kv);
        auto v = gaussian(D * n_kv * n_head_kv, seed);
        for (int64_t h = 0; h < n_head_kv; ++h) { // a per-channel offset, as real keys have
            for (int64_t i = 0; i < n_kv; ++i) v[(h * n_kv + i) * D + 5] += 3.0f;
        }
        fill(x, v);
        return x;
    };
    auto as_ref = [&](ggml_tensor * x) {
        if (!TQ_GGML_IS_TURBO(x->type)) return x;
        ggml_tensor * f = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, x->ne[0], x->ne[1], x->ne[2]);
        fill(f, decode(x));
        return f;
    };
    ggml_tensor * k = mk((ggml_type) k_type, 11);
    ggml_tensor * v = mk((ggml_type) v_type, 12);
    ggml_tensor * q = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, D, n_q, n_head);
    fill(q, gaussian(D * n_q * n_head, 13, 0.3f));
    // causal mask over the last positions (f16, one row per query)
    ggml_tensor * mask = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F16, n_kv, n_q);
    ggml_fp16_t * m = (ggml_fp16_t *) mask->data;
    for (int64_t i = 0; i < mask->ne[1]; ++i) {
        for (int64_t j = 0; j < n_kv; ++j) {
            m[i * n_kv + j] = ggml_fp32_to_fp16(j + n_q > n_kv + i ? -INFINITY : 0.0f);
        }
    }
    const float scale = 1.0f / std::sqrt((float) D);
    ggml_tensor * a = ggml_flash_attn_ext(c.ctx, q, k, v, mask, scale, 0.0f, 0.0f);
    ggml_tensor * b = ggml_flash_attn_ext(c.ctx, q, as_ref(k), as_ref(v), mask, scale, 0.0f, 0.0f);
    ggml_flash_attn_ext_set_prec(a, GGML_PREC_F32);
    ggml_flash_attn_ext_set_prec(b, GGML_PREC_F32);
    compute(c.ctx, a);
    compute(c.ctx, b);
    auto av = decode(a), bv = decode(b);
    double worst = 0;
    for (size_t i = 0; i < av.size(); ++i) {
        if (!std::isfinite(av[i])) return err.fail("non-finite output at %zu", i);
        worst = std::fmax(worst, std::fabs(av[i] - bv[i]) / (1.0 + std::fabs(bv[i])));
    }
    // An f16 V cache is accumulated in f16 by the CPU kernel: last-bit differences in the
    // scores (SIMD summation order) then show at f16 precision (2^-10), not f32's.
    const double tol = v_type == GGML_TYPE_F16 ? 2e-3 : 1e-4;
    if (worst > tol) {
        return err.fail("FA %s/%s D=%lld gqa=%lld differs from f32 reference by %g", ggml_type_name((ggml_type) k_type),
                        ggml_type_name((ggml_type) v_type), (long long) D, (long long) gqa, worst);
    }
    return 0;
}

// The tiled turbo decode path (tq-ggml-fa.h) against ggml's per-key loop (tiling off) and
// against the f32 reference, on a mask with holes (isolated -INF keys, a masked run longer
// than a tile, a fully masked tail), finite non-zero mask values, ALiBi slopes (max_bias),
// logit softcap and attention sinks. n_q == 1 with 640 keys takes the split-KV path.
// mask_heads == n_head gives every head its own mask row (as the K mean in RoPE's frame does):
// the same holes, other finite values, and in head 1 a few holes of its own.
extern "C" int tq_test_flash_attn_tiles(int k_type, int v_type, int64_t D, int64_t n_q, float softcap, int use_sinks,
                                        float max_bias, int64_t mask_heads, char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    const int64_t n_kv = 640, n_head_kv = 2, n_head = 6;
    Ctx c(256);
    auto mk = [&](ggml_type t, uint32_t seed) {
        ggml_tensor * x = ggml_new_tensor_3d(c.ctx, t, D, n_kv, n_head_kv);
        fill(x, gaussian(D * n_kv * n_head_kv, seed));
        return x;
    };
    auto as_ref = [&](ggml_tensor * x) {
        ggml_tensor * f = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, x->ne[0], x->ne[1], x->ne[2]);
        fill(f, decode(x));
        return f;
    };
    ggml_tensor * k = mk((ggml_type) k_type, 21);
    ggml_tensor * v = mk((ggml_type) v_type, 22);
    ggml_tensor * q = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, D, n_q, n_head);
    fill(q, gaussian(D * n_q * n_head, 23, 0.5f));
    if (mask_heads != 1 && mask_heads != n_head) return err.fail("mask_heads %lld: 1 or %lld", (long long) mask_heads, (long long) n_head);
    ggml_tensor * mask = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F16, n_kv, n_q, mask_heads);
    std::mt19937 rng(24);
    std::uniform_real_distribution<float> small(-2.0f, 0.0f);
    ggml_fp16_t * m = (ggml_fp16_t *) mask->data;
    for (int64_t h = 0; h < mask_heads; ++h) {
        for (int64_t i = 0; i < n_q; ++i) {
            for (int64_t j = 0; j < n_kv; ++j) {
                // a prefill (n_q > 8): the isolated holes only among the first keys, so that whole
                // tiles and several key windows follow, and a causal end that differs per query
                const bool pre = n_q > 8;
                const bool hole = (j % 7 == 3 && (!pre || j < 100)) || (j >= 40 && j < 90) ||
                                  (pre ? j > n_kv - n_q + i : j >= n_kv - 37 + i) || (h == 1 && j % 11 == 5 && (!pre || j < 200));
                const float val = mask_heads == 1 ? (j % 3 ? 0.0f : small(rng)) : small(rng);
                m[(h * n_q + i) * n_kv + j] = ggml_fp32_to_fp16(hole ? -INFINITY : val);
            }
        }
    }
    ggml_tensor * sinks = nullptr;
    if (use_sinks) {
        sinks = ggml_new_tensor_1d(c.ctx, GGML_TYPE_F32, n_head);
        fill(sinks, gaussian(n_head, 25, 2.0f));
    }
    const float scale = 1.0f / std::sqrt((float) D);
    auto attn = [&](ggml_tensor * kk, ggml_tensor * vv, int threads = 2) {
        ggml_tensor * a = ggml_flash_attn_ext(c.ctx, q, kk, vv, mask, scale, max_bias, softcap);
        ggml_flash_attn_ext_set_prec(a, GGML_PREC_F32);
        if (sinks) ggml_flash_attn_ext_add_sinks(a, sinks);
        compute(c.ctx, a, threads);
        return decode(a);
    };
    const int was_tile = tq_ggml_fa_tile();
    tq_ggml_set_fa_tile(2);
    // the 3 query heads of each K/V head share the tiles; where the type's fused tile kernels
    // sum in ggml_vec_dot_f32's order this is bit-identical to per-head tiles
    // one thread takes every row in one chunk (each group shares its tiles); two threads cut
    // the rows into chunks where most groups fall apart and their heads run alone. (One query
    // takes the split-KV path, where the thread count sets how the keys are split, and every
    // thread has all heads: two threads both times.)
    const auto shared = attn(k, v, n_q > 1 ? 1 : 2);
    const auto chunked = attn(k, v, 2);
    tq_ggml_set_fa_tile(1);
    const auto tiled = attn(k, v);  // every head decodes its own tiles
    tq_ggml_set_fa_tile(0);
    const auto per_key = attn(k, v);
    tq_ggml_set_fa_tile(was_tile);
    const auto ref = attn(as_ref(k), as_ref(v));
    const char * kn = ggml_type_name((ggml_type) k_type), * vn = ggml_type_name((ggml_type) v_type);
    // batch invariance: a head's result is the same bits in a group, alone, or in any chunking
    for (size_t i = 0; i < shared.size(); ++i) {
        if (shared[i] != tiled[i] || chunked[i] != tiled[i]) {
            return err.fail("FA tiles %s/%s D=%lld n_q=%lld: output %zu depends on grouping (shared %.9g, chunked %.9g, "
                            "per head %.9g)", kn, vn, (long long) D, (long long) n_q, i, shared[i], chunked[i], tiled[i]);
        }
    }
    // each query alone (an op of one query, as a decode has: its heads share tiles) gives the
    // bits it gets among all n_q (a chunk of 16 or more rows takes the decoded windows of
    // tq-fa-window.h, one key window for every row, with other tiles per row near the holes
    // and the causal end); two threads cut the keys apart where one query meets 512 or more
    // keys (split-KV), so the lone ops run on one thread
    if (n_q > 1) {
        tq_ggml_set_fa_tile(2);
        for (int64_t t = 0; t < n_q; t += n_q > 8 ? 13 : 1) {
            ggml_tensor * q1 = ggml_view_3d(c.ctx, q, D, 1, n_head, q->nb[1], q->nb[2], (size_t) t * q->nb[1]);
            ggml_tensor * m1 = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F16, n_kv, 1, mask_heads); // its rows (a view is not contiguous)
            for (int64_t h = 0; h < mask_heads; ++h) memcpy((ggml_fp16_t *) m1->data + h * n_kv, m + (h * n_q + t) * n_kv, n_kv * sizeof(ggml_fp16_t));
            ggml_tensor * o = ggml_flash_attn_ext(c.ctx, q1, k, v, m1, scale, max_bias, softcap);
            ggml_flash_attn_ext_set_prec(o, GGML_PREC_F32);
            if (sinks) ggml_flash_attn_ext_add_sinks(o, sinks);
            compute(c.ctx, o, 1);
            const auto one = decode(o); // [D, n_head]
            for (int64_t h = 0; h < n_head; ++h)
                for (int64_t d = 0; d < D; ++d) {
                    const float all = shared[(t * n_head + h) * D + d]; // the output is [D, n_head, n_q]
                    if (one[h * D + d] != all) {
                        tq_ggml_set_fa_tile(was_tile);
                        return err.fail("FA tiles %s/%s D=%lld n_q=%lld: query %lld head %lld alone %.9g, among all %.9g: "
                                        "not batch-invariant", kn, vn, (long long) D, (long long) n_q, (long long) t,
                                        (long long) h, one[h * D + d], all);
                    }
                }
        }
        tq_ggml_set_fa_tile(was_tile);
    }
    const struct { const char * name; const std::vector<float> & out; } paths[] = { { "shared", shared }, { "tiled", tiled } };
    for (const auto & p : paths) {
        double worst_on_off = 0, worst_ref = 0;
        bool identical = true;
        for (size_t i = 0; i < p.out.size(); ++i) {
            if (!std::isfinite(p.out[i])) return err.fail("non-finite %s output at %zu", p.name, i);
            identical = identical && p.out[i] == per_key[i];
            worst_on_off = std::fmax(worst_on_off, std::fabs(p.out[i] - per_key[i]) / (1.0 + std::fabs(per_key[i])));
            worst_ref = std::fmax(worst_ref, std::fabs(p.out[i] - ref[i]) / (1.0 + std::fabs(ref[i])));
        }
        if (worst_on_off > 1e-5 || worst_ref > 1e-4) {
            return err.fail("FA tiles (%s) %s/%s D=%lld n_q=%lld softcap=%g sinks=%d mask heads %lld: vs per-key %g, vs f32 %g",
                            p.name, kn, vn, (long long) D, (long long) n_q, softcap, use_sinks, (long long) mask_heads,
                            worst_on_off, worst_ref);
        }
        // Different float summation order: bit-identical output means the path never ran.
        if (identical) return err.fail("FA tiles (%s) %s/%s: output bit-identical to per-key", p.name, kn, vn);
    }
    return 0;
}

// K mean removal (tq-kmean.h), on f32 tensors so only the algebra is under test:
// 1. tq_kmean_apply in its three modes: SET stores and subtracts M times the ubatch mean,
//    KEEP the stored one, ZERO nothing;
// 2. attention over k - m equals attention over k (the softmax-invariance it relies on);
// 3. a K shift of stored keys R (rope_p(k) - m), done as llama's build_rope_shift does with
//    tq_kmean_unshift / tq_kmean_reshift between its rotations, equals R (rope_{p+d}(k) - m).
extern "C" int tq_test_kmean(char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    const int64_t hd = 64, nh = 3, nt = 40, n = hd * nh;
    Ctx c(64);
    auto kv = gaussian(n * nt, 21);
    for (int64_t t = 0; t < nt; ++t) {
        for (int64_t i = 0; i < n; i += 7) kv[t * n + i] += 4.0f; // a shared component
    }
    auto new3 = [&](const std::vector<float> & v, int64_t a, int64_t b, int64_t d) {
        ggml_tensor * x = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, a, b, d);
        fill(x, v);
        return x;
    };

    // 1. modes, with the identity map (m = the ubatch mean) and with a map of random scaled
    //    rotations on the channel pairs (m = M kbar)
    const auto m0 = gaussian(n, 22);
    for (bool ident : { true, false }) for (int mode : { TQ_KMEAN_SET, TQ_KMEAN_KEEP, TQ_KMEAN_ZERO }) {
        ggml_tensor * k = new3(kv, hd, nh, nt);
        ggml_tensor * q = new3(gaussian(n * nt, 25), hd, nh, nt);
        ggml_tensor * km = ggml_new_tensor_1d(c.ctx, GGML_TYPE_F32, tq_kmean_floats(hd, nh, false));
        float * kmd = (float *) km->data;
        memcpy(kmd, m0.data(), n * sizeof(float));
        ggml_tensor * map = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, hd, hd);
        const float * M = (const float *) map->data;
        std::vector<double> w(hd / 2);
        std::vector<int32_t> pos(nt);
        for (int64_t i = 0; i < hd / 2; ++i) w[i] = ident ? 0.0 : std::pow(10000.0, -2.0 * i / hd);
        for (int64_t t = 0; t < nt; ++t) pos[t] = (int32_t) t;
        tq_kmean_map(w.data(), hd / 2, hd, false, pos.data(), nt, ident ? nt : 4096, (float *) map->data);
        ggml_cgraph * gf = ggml_new_graph(c.ctx);
        ggml_tensor * q0 = q;
        ggml_tensor * out = tq_kmean_apply(c.ctx, gf, &q, k, km, mode, mode == TQ_KMEAN_SET ? map : nullptr, 0.125f, tq_rf_pairs{ false, 0 });
        if (q != q0) return err.fail("mean removal alone changed q");
        ggml_build_forward_expand(gf, out);
        ggml_graph_compute_with_ctx(c.ctx, gf, 2);
        const float * o = (const float *) out->data;
        std::vector<double> mean(n, 0.0);
        for (int64_t i = 0; i < n; ++i) {
            for (int64_t t = 0; t < nt; ++t) mean[i] += kv[t * n + i];
            mean[i] /= nt;
        }
        for (int64_t i = 0; i < n; ++i) {
            const int64_t h = i / hd, r = i % hd;
            double mm = 0;
            for (int64_t j = 0; j < hd; ++j) mm += (double) M[r * hd + j] * mean[h * hd + j];
            if (ident && std::fabs(mm - mean[i]) > 1e-6 * (1 + std::fabs(mean[i]))) return err.fail("identity map moved the mean");
            const double want_m = mode == TQ_KMEAN_SET ? mm : mode == TQ_KMEAN_KEEP ? m0[i] : 0.0;
            if (std::fabs(kmd[i] - want_m) > 1e-5 * (1 + std::fabs(want_m))) return err.fail("ident %d mode %d: stored mean[%lld] %g, want %g", ident, mode, (long long) i, kmd[i], want_m);
            for (int64_t t = 0; t < nt; ++t) {
                const double want = kv[t * n + i] - want_m;
                if (std::fabs(o[t * n + i] - want) > 1e-5 * (1 + std::fabs(want))) return err.fail("mode %d: k-m at %lld,%lld: %g, want %g", mode, (long long) i, (long long) t, o[t * n + i], want);
            }
        }
    }

    // 2. attention is unchanged: FA(q, k - m, v) == FA(q, k, v), keys laid out [hd, nt, nh]
    {
        std::vector<float> kt(n * nt), kmt(n * nt);
        for (int64_t t = 0; t < nt; ++t)
            for (int64_t h = 0; h < nh; ++h)
                for (int64_t d = 0; d < hd; ++d) {
                    kt[(h * nt + t) * hd + d] = kv[t * n + h * hd + d];
                    kmt[(h * nt + t) * hd + d] = kv[t * n + h * hd + d] - m0[h * hd + d];
                }
        ggml_tensor * k = new3(kt, hd, nt, nh), * km = new3(kmt, hd, nt, nh);
        ggml_tensor * v = new3(gaussian(n * nt, 23), hd, nt, nh);
        ggml_tensor * q = new3(gaussian(hd * 4 * nh, 24, 0.5f), hd, 4, nh);
        const float scale = 1.0f / std::sqrt((float) hd);
        ggml_tensor * a = ggml_flash_attn_ext(c.ctx, q, k, v, nullptr, scale, 0.0f, 0.0f);
        ggml_tensor * b = ggml_flash_attn_ext(c.ctx, q, km, v, nullptr, scale, 0.0f, 0.0f);
        ggml_flash_attn_ext_set_prec(a, GGML_PREC_F32);
        ggml_flash_attn_ext_set_prec(b, GGML_PREC_F32);
        compute(c.ctx, a);
        compute(c.ctx, b);
        auto av = decode(a), bv = decode(b);
        for (size_t i = 0; i < av.size(); ++i) {
            if (std::fabs(av[i] - bv[i]) > 1e-4 * (1 + std::fabs(av[i]))) return err.fail("attention over k-m differs at %zu: %g vs %g", i, bv[i], av[i]);
        }
    }

    // 3. K shift
    {
        ggml_tensor * rot = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, hd, hd);
        if (tq_rotation_matrix(hd, TQ_DEFAULT_SEED, (float *) rot->data) != TQ_OK) return err.fail("tq_rotation_matrix");
        ggml_tensor * km = ggml_new_tensor_1d(c.ctx, GGML_TYPE_F32, n + 2);
        memcpy(km->data, m0.data(), n * sizeof(float));
        ggml_tensor * pos = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, nt);
        ggml_tensor * shift = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, nt);
        ggml_tensor * pos2 = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, nt);
        for (int64_t t = 0; t < nt; ++t) {
            ((int32_t *) pos->data)[t] = (int32_t) (100 + 3 * t);
            ((int32_t *) shift->data)[t] = (int32_t) (t % 2 ? -57 : 0); // per-cell shifts, some none
            ((int32_t *) pos2->data)[t] = ((int32_t *) pos->data)[t] + ((int32_t *) shift->data)[t];
        }
        auto rope = [&](ggml_tensor * x, ggml_tensor * p) {
            return ggml_rope_ext(c.ctx, x, p, nullptr, hd, 0, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
        };
        auto rotate = [&](ggml_tensor * x) { // x [hd, nh, nt]; R is symmetric
            return ggml_reshape_3d(c.ctx, ggml_mul_mat(c.ctx, rot, ggml_reshape_2d(c.ctx, x, hd, nh * nt)), hd, nh, nt);
        };
        ggml_tensor * k = new3(kv, hd, nh, nt);
        ggml_tensor * stored = rotate(tq_kmean_reshift(c.ctx, rope(k, pos), km));
        ggml_tensor * shifted = rotate(tq_kmean_reshift(c.ctx, rope(tq_kmean_unshift(c.ctx, rotate(stored), km), shift), km));
        ggml_tensor * want = rotate(tq_kmean_reshift(c.ctx, rope(k, pos2), km));
        compute(c.ctx, shifted);
        compute(c.ctx, want);
        auto sv = decode(shifted), wv = decode(want);
        for (size_t i = 0; i < sv.size(); ++i) {
            if (std::fabs(sv[i] - wv[i]) > 2e-4 * (1 + std::fabs(wv[i]))) return err.fail("K shift with mean at %zu: %g, want %g", i, sv[i], wv[i]);
        }
    }

    // 4. the position map: keys e^{ipw} mu (a pre-RoPE mean mu, RoPE frequency w) stored at
    //    positions 0..N-1, the mean taken from a first ubatch at positions 0..B-1. Over the
    //    cache's positions, the residual energy mean_p |e^{ipw} mu - m|^2 of m = F kbar is
    //    never above no mean (|mu|^2) nor above the ubatch's own mean kbar (the estimator this
    //    replaced), and is the optimum |mu|^2 (1 - |a_N|^2) where |a_B| >= |a_N|; with N = B
    //    the map is the identity.
    {
        const int64_t hd4 = 64, half = hd4 / 2;
        std::vector<double> w(half);
        for (int64_t i = 0; i < half; ++i) w[i] = std::pow(100000.0, -2.0 * i / hd4) * (1.0 + 0.01 * i); // SmolLM2-like, not on a grid
        for (int64_t B : { (int64_t) 64, (int64_t) 512 }) for (uint32_t N : { (uint32_t) B, 4096u, 32768u }) {
            std::vector<int32_t> pos(B);
            for (int64_t t = 0; t < B; ++t) pos[t] = (int32_t) t;
            std::vector<float> M(hd4 * hd4);
            tq_kmean_map(w.data(), half, hd4, false, pos.data(), B, N, M.data());
            int n_opt = 0;
            for (int64_t i = 0; i < half; ++i) {
                const std::complex<double> mu(1.0, -0.5);
                std::complex<double> aB = 0, aN = 0;
                for (int64_t t = 0; t < B; ++t) aB += std::polar(1.0, w[i] * t) / (double) B;
                for (uint32_t p = 0; p < N; ++p) aN += std::polar(1.0, w[i] * p) / (double) N;
                const std::complex<double> kbar = aB * mu;
                const int64_t a = 2 * i, b = 2 * i + 1;
                const std::complex<double> m(M[a * hd4 + a] * kbar.real() + M[a * hd4 + b] * kbar.imag(),
                                             M[b * hd4 + a] * kbar.real() + M[b * hd4 + b] * kbar.imag());
                auto resid = [&](std::complex<double> mm) { // mean_p |e^{ipw} mu - mm|^2
                    return std::norm(mu) - 2.0 * std::real(std::conj(mm) * aN * mu) + std::norm(mm);
                };
                const double e = std::norm(mu), r = resid(m), r_old = resid(kbar), r_opt = e * (1.0 - std::norm(aN));
                if (std::abs(std::complex<double>(M[a * hd4 + a], M[b * hd4 + a])) > 1.0 + 1e-6) return err.fail("|F| > 1 at pair %lld", (long long) i);
                if (r > e * (1 + 1e-6)) return err.fail("B %lld N %u pair %lld: residual %g above no mean %g", (long long) B, N, (long long) i, r, e);
                if (r > r_old + 1e-6 * e) return err.fail("B %lld N %u pair %lld: residual %g above the ubatch mean's %g", (long long) B, N, (long long) i, r, r_old);
                if (std::abs(aB) >= std::abs(aN)) {
                    ++n_opt;
                    if (std::fabs(r - r_opt) > 1e-5 * e) return err.fail("B %lld N %u pair %lld: residual %g, optimum %g", (long long) B, N, (long long) i, r, r_opt);
                }
                if (N == (uint32_t) B && (std::fabs(M[a * hd4 + a] - 1.0f) > 1e-6 || std::fabs(M[b * hd4 + a]) > 1e-6)) return err.fail("N = B: F != 1 at pair %lld", (long long) i);
            }
            if (n_opt < half / 2) return err.fail("B %lld N %u: only %d pairs where the ubatch pins the mean down", (long long) B, N, n_opt);
        }
    }
    return 0;
}

// K/Q channel balancing (tq-kmean.h), f32 only:
// 1. every logit q.k is unchanged by tq_kmean_apply with balancing (up to the mean's constant
//    per query), in all three modes, for a prefill-sized ubatch (statistics computed) and a
//    decode-sized one (stored s only); the map M is the identity here;
// 2. SET stores s - 1 with s equal on every RoPE pair (adjacent or halves), within
//    [1/TQ_KBAL_MAX, TQ_KBAL_MAX], the attention-weighted centred key energy kept per KV head when nothing is
//    clamped, and s^4 proportional to the pair's query energy over that key energy; KEEP
//    uses the stored s, ZERO s = 1;
// 3. s commutes with RoPE (so the K shift needs no change), and on keys and queries whose
//    channel energies differ it lowers E|q/s|^2 E|s k|^2, the logit error it targets.
extern "C" int tq_test_kbal(char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    const int64_t hd = 64, nkv = 2, g = 3, nq = nkv * g, n = hd * nkv;
    const float kq_scale = 0.125f;
    for (int64_t nrot : { hd, (int64_t) 16 }) // full RoPE, and partial (tq_rf_pairs)
    for (bool neox : { false, true }) {
        const tq_rf_pairs pr = { neox, nrot };
        std::vector<int64_t> partner(hd); // the other channel of each channel's RoPE pair
        for (int64_t j = 0; j < hd / 2; ++j) {
            partner[tq_rf_ch(pr, hd, j, 0)] = tq_rf_ch(pr, hd, j, 1);
            partner[tq_rf_ch(pr, hd, j, 1)] = tq_rf_ch(pr, hd, j, 0);
        }
        for (int64_t nt : { (int64_t) 40, (int64_t) (TQ_KBAL_QUERIES + 16), (int64_t) 1 }) {
            for (int mode : { TQ_KMEAN_SET, TQ_KMEAN_KEEP, TQ_KMEAN_ZERO }) {
                Ctx c(64);
                // channel c of keys ~ N(1, ak_c^2), of queries ~ N(0, aq_c^2), aq = 1 / ak: queries
                // weigh most the channels where keys vary least
                std::vector<float> kv = gaussian(n * nt, 31), qv = gaussian(hd * nq * nt, 32);
                std::vector<float> ak(hd), aq(hd);
                for (int64_t i = 0; i < hd; ++i) {
                    ak[i] = 0.25f + 3.0f * (float) ((i * 37) % hd) / hd;
                    aq[i] = 1.0f / ak[i];
                }
                for (int64_t t = 0; t < nt; ++t) {
                    for (int64_t h = 0; h < nkv; ++h)
                        for (int64_t i = 0; i < hd; ++i) kv[(t * nkv + h) * hd + i] = 1.0f + ak[i] * kv[(t * nkv + h) * hd + i];
                    for (int64_t h = 0; h < nq; ++h)
                        for (int64_t i = 0; i < hd; ++i) qv[(t * nq + h) * hd + i] *= aq[i];
                }
                ggml_tensor * k = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nkv, nt);
                ggml_tensor * q = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nq, nt);
                fill(k, kv);
                fill(q, qv);
                if (mode == TQ_KMEAN_SET && nt < TQ_KMEAN_MIN_TOKENS) continue; // the host never picks it
                ggml_tensor * km = ggml_new_tensor_1d(c.ctx, GGML_TYPE_F32, tq_kmean_floats(hd, nkv, true));
                float * kmd = (float *) km->data;
                const auto s0 = gaussian(n, 33, 0.2f); // a stored s - 1 for KEEP
                memset(kmd, 0, n * sizeof(float));      // stored m = 0
                memcpy(kmd + n, s0.data(), n * sizeof(float));
                ggml_tensor * map = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, hd, hd); // the identity
                memset(map->data, 0, ggml_nbytes(map));
                for (int64_t i = 0; i < hd; ++i) ((float *) map->data)[i * hd + i] = 1.0f;
                ggml_cgraph * gf = ggml_new_graph(c.ctx);
                ggml_tensor * qs = q;
                ggml_tensor * ks = tq_kmean_apply(c.ctx, gf, &qs, k, km, mode, mode == TQ_KMEAN_SET ? map : nullptr, kq_scale, pr);
                ggml_build_forward_expand(gf, qs);
                ggml_build_forward_expand(gf, ks);
                ggml_graph_compute_with_ctx(c.ctx, gf, 2);
                const float * qo = (const float *) qs->data, * ko = (const float *) ks->data;
                const bool set = mode == TQ_KMEAN_SET && nt >= TQ_KMEAN_MIN_TOKENS;

                // the s in use, from the outputs: ko = s k - m, m = 0 unless SET, where
                // differences between tokens cancel it
                std::vector<double> su(n);
                for (int64_t i = 0; i < n; ++i) {
                    if (!set) { su[i] = ko[i] / kv[i]; continue; }
                    double mk = 0, mo = 0, sxy = 0, sxx = 0; // least-squares slope of ko over kv
                    for (int64_t t = 0; t < nt; ++t) { mk += kv[t * n + i] / (double) nt; mo += ko[t * n + i] / (double) nt; }
                    for (int64_t t = 0; t < nt; ++t) { sxy += (kv[t * n + i] - mk) * (ko[t * n + i] - mo); sxx += (kv[t * n + i] - mk) * (kv[t * n + i] - mk); }
                    su[i] = sxy / sxx;
                }
                for (int64_t i = 0; i < n; ++i) {
                    const double want = set ? 1.0 + kmd[n + i] : mode == TQ_KMEAN_KEEP ? 1.0 + s0[i] : 1.0;
                    if (!set && std::fabs(su[i] - want) > 1e-5 * want) return err.fail("neox %d nt %lld mode %d: s[%lld] %g, want %g", neox, (long long) nt, mode, (long long) i, su[i], want);
                    if (set && std::fabs(su[i] - want) > 1e-3 * want) return err.fail("neox %d SET: s in use %g, stored %g", neox, su[i], want);
                }
                if (mode == TQ_KMEAN_ZERO && (kmd[0] != 0.0f || kmd[n] != 0.0f)) return err.fail("ZERO left a stored m or s - 1");

                // 1. logits unchanged up to one constant per query (softmax-invariant): the
                //    difference between a query's logits on key t2 and on key 0 is kept
                for (int64_t t = 0; t < nt; ++t)
                    for (int64_t h = 0; h < nq; ++h) {
                        const int64_t hk = h / g;
                        auto logits = [&](int64_t t2, double & a, double & b, double & sc) {
                            a = b = sc = 0;
                            for (int64_t i = 0; i < hd; ++i) {
                                const float qi = qv[(t * nq + h) * hd + i], ki = kv[(t2 * nkv + hk) * hd + i];
                                a += (double) qi * ki;
                                b += (double) qo[(t * nq + h) * hd + i] * ko[(t2 * nkv + hk) * hd + i];
                                sc += std::fabs((double) qi * ki);
                            }
                        };
                        double a0, b0, sc0;
                        logits(0, a0, b0, sc0);
                        for (int64_t t2 = 0; t2 < nt; t2 += 3) {
                            double a, b, sc;
                            logits(t2, a, b, sc);
                            if (std::fabs((a - a0) - (b - b0)) > 1e-5 * (sc + sc0)) return err.fail("neox %d nt %lld mode %d: logit difference %g -> %g", neox, (long long) nt, mode, a - a0, b - b0);
                        }
                    }
                if (!set) continue;

                // 2. the stored s (exact values, not ratios of outputs)
                for (int64_t i = 0; i < n; ++i) su[i] = 1.0 + (double) kmd[n + i];
                std::vector<double> rk(n, 0.0), mk(n, 0.0), rq(n, 0.0);
                for (int64_t t = 0; t < nt; ++t)
                    for (int64_t i = 0; i < n; ++i) { mk[i] += kv[t * n + i] / nt; rk[i] += (double) kv[t * n + i] * kv[t * n + i] / nt; }
                // attention-weighted: w_j = causal softmax(kq_scale q.k_j) averaged over the last
                // TQ_KBAL_QUERIES queries and the query heads of the KV head;
                // rk = sum_j w_j (k_j - mean)^2 (the map M is the identity)
                std::fill(rk.begin(), rk.end(), 0.0);
                const int64_t nql = std::min<int64_t>(nt, TQ_KBAL_QUERIES);
                for (int64_t h = 0; h < nkv; ++h) {
                    std::vector<double> w(nt, 0.0);
                    for (int64_t t = nt - nql; t < nt; ++t)
                        for (int64_t qh = h * g; qh < (h + 1) * g; ++qh) {
                            std::vector<double> l(t + 1);
                            double mx = -1e300, z = 0;
                            for (int64_t j = 0; j <= t; ++j) {
                                double dot = 0;
                                for (int64_t i = 0; i < hd; ++i) dot += (double) qv[(t * nq + qh) * hd + i] * kv[(j * nkv + h) * hd + i];
                                l[j] = kq_scale * dot;
                                mx = std::max(mx, l[j]);
                            }
                            for (int64_t j = 0; j <= t; ++j) z += std::exp(l[j] - mx);
                            for (int64_t j = 0; j <= t; ++j) w[j] += std::exp(l[j] - mx) / z / (double) (nql * g);
                        }
                    for (int64_t j = 0; j < nt; ++j)
                        for (int64_t i = 0; i < hd; ++i) {
                            const double x = kv[(j * nkv + h) * hd + i] - mk[h * hd + i];
                            rk[h * hd + i] += w[j] * x * x;
                        }
                }
                for (int64_t t = 0; t < nt; ++t)
                    for (int64_t h = 0; h < nq; ++h)
                        for (int64_t i = 0; i < hd; ++i) rq[(h / g) * hd + i] += (double) qv[(t * nq + h) * hd + i] * qv[(t * nq + h) * hd + i] / (nt * g);
                for (int64_t h = 0; h < nkv; ++h) {
                    double e0 = 0, e1 = 0;
                    for (int64_t i = 0; i < hd; ++i) {
                        const int64_t a = h * hd + i;
                        const int64_t p = h * hd + partner[i];
                        if (su[a] != su[p]) return err.fail("neox %d nrot %lld: s differs inside a RoPE pair: %g vs %g", neox, (long long) nrot, su[a], su[p]);
                        if (su[a] < 1.0 / TQ_KBAL_MAX * (1 - 1e-6) || su[a] > TQ_KBAL_MAX * (1 + 1e-6)) return err.fail("s %g out of range", su[a]);
                        e0 += rk[a];
                        e1 += su[a] * su[a] * rk[a];
                    }
                    if (std::fabs(e1 - e0) > 1e-3 * e0) return err.fail("neox %d head %lld: |s k|^2 %g, |k|^2 %g", neox, (long long) h, e1, e0);
                    // s^4 ratio between two pairs equals their (tied) energy ratio ratio
                    auto tied = [&](const std::vector<double> & r, int64_t i) {
                        return 0.5 * (r[h * hd + i] + r[h * hd + partner[i]]);
                    };
                    for (int64_t i = 2; i < hd / 2; i += 5) {
                        const double want = (tied(rq, i) / tied(rk, i)) / (tied(rq, 0) / tied(rk, 0));
                        const double got = std::pow(su[h * hd + i] / su[h * hd + 0], 4);
                        if (std::fabs(got - want) > 1e-3 * want) return err.fail("neox %d: s^4 ratio %g, want %g", neox, got, want);
                    }
                }

                // 3a. the targeted error goes down: E|q/s|^2 E|s (k - mk)|^2 < E|q|^2 E|k - mk|^2
                double qq = 0, kk = 0, qqs = 0, kks = 0;
                for (int64_t h = 0; h < nkv; ++h)
                    for (int64_t i = 0; i < hd; ++i) {
                        const int64_t a = h * hd + i;
                        qq += rq[a]; kk += rk[a];
                        qqs += rq[a] / (su[a] * su[a]); kks += rk[a] * su[a] * su[a];
                    }
                // 0.57 of it for these profiles
                if (!(qqs * kks < 0.7 * qq * kk)) return err.fail("neox %d: balancing does not lower the logit error: %g vs %g", neox, qqs * kks, qq * kk);

                // 3b. rope(s k) == s rope(k) for this rope type
                ggml_tensor * pos = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, nt);
                for (int64_t t = 0; t < nt; ++t) ((int32_t *) pos->data)[t] = (int32_t) (7 + 13 * t);
                const int rt = neox ? GGML_ROPE_TYPE_NEOX : 0;
                auto rope = [&](ggml_tensor * x) {
                    return ggml_rope_ext(c.ctx, x, pos, nullptr, (int) nrot, rt, 0, 10000.0f, 1.0f, 0.0f, 1.0f, 32.0f, 1.0f);
                };
                ggml_tensor * sv = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nkv, 1);
                for (int64_t i = 0; i < n; ++i) ((float *) sv->data)[i] = (float) su[i];
                ggml_tensor * x1 = rope(ggml_mul(c.ctx, k, sv));
                ggml_tensor * x2 = ggml_mul(c.ctx, rope(k), sv);
                compute(c.ctx, x1);
                compute(c.ctx, x2);
                auto v1 = decode(x1), v2 = decode(x2);
                for (size_t i = 0; i < v1.size(); ++i)
                    if (std::fabs(v1[i] - v2[i]) > 1e-4 * (1 + std::fabs(v2[i]))) return err.fail("neox %d nrot %lld: rope(s k) != s rope(k) at %zu: %g vs %g", neox, (long long) nrot, i, v1[i], v2[i]);
            }
        }
    }
    return 0;
}

// For benches/vs_ggml.rs: a row of type `t` (from f32 x), the query converted to the
// type's vec_dot_type (from f32 y), and ggml's CPU vec_dot for the pair. Buffers are the
// caller's: qx needs ggml_row_size(t, n), qy ggml_row_size(vec_dot_type, n) bytes.
extern "C" int tq_ggml_prepare_vec_dot(int t, const float * x, const float * y, int64_t n, void * qx, void * qy,
                                       ggml_vec_dot_t * dot) {
    const ggml_type type = (ggml_type) t;
    const auto * cpu = ggml_get_type_traits_cpu(type);
    if (!cpu->vec_dot || n % ggml_blck_size(type) != 0) return 1;
    ggml_quantize_chunk(type, x, qx, 0, 1, n, nullptr);
    const ggml_type vt = cpu->vec_dot_type;
    if (vt == GGML_TYPE_F32) {
        memcpy(qy, y, n * sizeof(float));
    } else {
        ggml_get_type_traits_cpu(vt)->from_float(y, qy, n);
    }
    *dot = cpu->vec_dot;
    return 0;
}

extern "C" size_t tq_ggml_row_size(int t, int64_t n) {
    return ggml_row_size((ggml_type) t, n);
}

// (3) of tq_test_kmean_rope: turbo4 K (the stored keys ko) and V through flash attention with
// the term carried on the mask, against f32 K = decoded + R_p mu' (mu' from kmd) with the
// plain mask. Inputs as the test has them: ko [hd, nkv, nt], qo and A [hd, nq, nt], the cells'
// positions pos and the RoPE frequencies w (for P and U, tq-fa-term.h).
static int kmean_rope_fa(Err & err, Ctx & c, tq_rf_pairs pr, const float * ko, const float * qo, const float * A,
                         ggml_tensor * tab, const float * kmd, int64_t hd, int64_t nkv, int64_t nq, int64_t nt,
                         float kq_scale, const std::vector<int64_t> & pos, const std::vector<double> & w) {
    const int64_t half = hd / 2;
    const bool neox = pr.neox;
    auto ch = [&](int64_t i, int ab) { return tq_rf_ch(pr, hd, i, ab); };
    std::vector<float> kst(hd * nt * nkv), qf(hd * nt * nq);
    for (int64_t t = 0; t < nt; ++t) {
        for (int64_t h = 0; h < nkv; ++h) memcpy(&kst[(h * nt + t) * hd], &ko[(t * nkv + h) * hd], hd * sizeof(float));
        for (int64_t h = 0; h < nq; ++h) memcpy(&qf[(h * nt + t) * hd], &qo[(t * nq + h) * hd], hd * sizeof(float));
    }
    ggml_tensor * kt = ggml_new_tensor_3d(c.ctx, GGML_TYPE_TURBO4, hd, nt, nkv);
    ggml_tensor * vt = ggml_new_tensor_3d(c.ctx, GGML_TYPE_TURBO4, hd, nt, nkv);
    ggml_tensor * q = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nt, nq);
    ggml_tensor * a = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nq, nt);
    fill(kt, kst);
    fill(vt, gaussian(hd * nt * nkv, 45));
    fill(q, qf);
    memcpy(a->data, A, ggml_nbytes(a));
    // the reference keys: decoded, plus R_p mu' per cell
    std::vector<float> kref = decode(kt);
    const float * T = (const float *) tab->data;
    for (int64_t h = 0; h < nkv; ++h)
        for (int64_t t = 0; t < nt; ++t)
            for (int64_t i = 0; i < half; ++i) {
                const double ma = kmd[h * hd + ch(i, 0)], mb = kmd[h * hd + ch(i, 1)], cs = T[t * hd + i], sn = T[t * hd + half + i];
                kref[(h * nt + t) * hd + ch(i, 0)] += (float) (cs * ma - sn * mb);
                kref[(h * nt + t) * hd + ch(i, 1)] += (float) (sn * ma + cs * mb);
            }
    ggml_tensor * kr = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nt, nkv);
    ggml_tensor * vr = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nt, nkv);
    fill(kr, kref);
    fill(vr, decode(vt));
    ggml_tensor * mask = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F16, nt, nt);
    ggml_fp16_t * m = (ggml_fp16_t *) mask->data;
    for (int64_t i = 0; i < nt * nt; ++i) m[i] = ggml_fp32_to_fp16(nt > 2 && i % nt == 1 ? -INFINITY : 0.0f); // a hole at key 1
    ggml_tensor * P = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, nt);
    ggml_tensor * U = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, hd, TQ_FA_TERM_STEPS);
    ggml_tensor * U0 = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, hd, TQ_FA_TERM_STEPS);
    for (int64_t t = 0; t < nt; ++t) ((int32_t *) P->data)[t] = (int32_t) pos[t];
    for (int64_t j = 0; j < TQ_FA_TERM_STEPS; ++j)
        for (int64_t i = 0; i < half; ++i) {
            ((float *) U->data)[j * hd + i] = (float) std::cos(j * w[i]);
            ((float *) U->data)[j * hd + half + i] = (float) std::sin(j * w[i]);
        }
    memset(U0->data, 0, ggml_nbytes(U0));
    // the logits' soft cap and learned sink logits (gpt-oss): the term goes into the raw
    // score, before the cap, and leaves the sink logit alone, so attention stays exact there
    float softcap = 0.0f;
    ggml_tensor * sinks = ggml_new_tensor_1d(c.ctx, GGML_TYPE_F32, nq);
    const std::vector<float> sink_logits = gaussian(nq, 46, 2.0f);
    memcpy(sinks->data, sink_logits.data(), ggml_nbytes(sinks));
    bool use_sinks = false;
    auto attn = [&](ggml_tensor * kk, ggml_tensor * vv, ggml_tensor * mm, const ggml_tensor * UU = nullptr) {
        ggml_tensor * o = ggml_flash_attn_ext(c.ctx, q, kk, vv, mm, kq_scale, 0.0f, softcap);
        ggml_flash_attn_ext_set_prec(o, GGML_PREC_F32);
        if (use_sinks) ggml_flash_attn_ext_add_sinks(o, sinks);
        if (UU) set_k_terms(c.ctx, o, a, tab, P, UU);
        compute(c.ctx, o);
        return decode(o);
    };
    bool consecutive = true;
    for (int64_t t = 1; t < nt; ++t) consecutive = consecutive && pos[t] == pos[t - 1] + 1;
    const int was_tile = tq_ggml_fa_tile();
    for (int variant : { 1, 2, 0 }) { // soft cap, learned sinks, neither (what the zeroed-U check below uses)
    softcap = variant == 1 ? 2.0f : 0.0f;
    use_sinks = variant == 2;
    const auto ref = attn(kr, vr, mask);
    const auto plain = attn(kt, vt, mask); // without the term: must be far from ref
    double off_plain = 0;
    for (size_t i = 0; i < ref.size(); ++i) off_plain = std::fmax(off_plain, std::fabs(plain[i] - ref[i]) / (1.0 + std::fabs(ref[i])));
    for (int tile : { 2, 1, 0 }) { // shared GQA tiles, per-head tiles, per-key loop
        tq_ggml_set_fa_tile(tile);
        const auto got = attn(kt, vt, mask, U);
        double worst = 0;
        for (size_t i = 0; i < ref.size(); ++i) {
            if (!std::isfinite(got[i])) { tq_ggml_set_fa_tile(was_tile); return err.fail("FA term: non-finite output"); }
            worst = std::fmax(worst, std::fabs(got[i] - ref[i]) / (1.0 + std::fabs(ref[i])));
        }
        // measured: at most 4.7e-6 against the reference, at least 0.78 without the term
        if (worst > 2e-5 || off_plain < 0.1) {
            tq_ggml_set_fa_tile(was_tile);
            return err.fail("FA term (tile %d, neox %d, nrot %lld, nt %lld, softcap %g, sinks %d): vs f32 keys + R_p mu' %g (want <= 2e-5); "
                            "without the term %g (want >= 0.1)", tile, neox, (long long) tq_rf_nrot(pr, hd), (long long) nt, softcap,
                            use_sinks, worst, off_plain);
        }
    }
    if (variant != 0) continue;
    // batch invariance with the term: each query row alone (an op of one query, as a decode
    // of one token has) gives the same bits as within the op of all nt rows, which is what a
    // prefill over turbo K and V takes with TQ_PREFILL_DECODE=0 (tq_llama_attn_kq)
    if (nt > 2) {
        tq_ggml_set_fa_tile(2);
        const auto all = attn(kt, vt, mask, U);
        for (int64_t t = 0; t < nt; t += 3) {
            ggml_tensor * q1 = ggml_view_3d(c.ctx, q, hd, 1, nq, q->nb[1], q->nb[2], (size_t) t * q->nb[1]);
            ggml_tensor * m1 = ggml_view_2d(c.ctx, mask, nt, 1, mask->nb[1], (size_t) t * mask->nb[1]);
            ggml_tensor * a1 = ggml_view_3d(c.ctx, a, hd, nq, 1, a->nb[1], a->nb[2], (size_t) t * a->nb[2]);
            ggml_tensor * o = ggml_flash_attn_ext(c.ctx, q1, kt, vt, m1, kq_scale, 0.0f, 0.0f);
            ggml_flash_attn_ext_set_prec(o, GGML_PREC_F32);
            set_k_terms(c.ctx, o, a1, tab, P, U);
            compute(c.ctx, o);
            const auto one = decode(o);
            for (int64_t i = 0; i < hd * nq; ++i) {
                if (one[i] != all[t * hd * nq + i]) {
                    tq_ggml_set_fa_tile(was_tile);
                    return err.fail("FA term (neox %d, nt %lld): query %lld alone %.9g, among %lld queries %.9g (output %lld): "
                                    "not batch-invariant", neox, (long long) nt, (long long) t, one[i], (long long) nt,
                                    all[t * hd * nq + i], (long long) i);
                }
            }
        }
    }
    // the shared tiles read U where the cells' positions run consecutively, and T's rows
    // elsewhere: a zeroed U must then lose the term (as far off as no term), and only then
    tq_ggml_set_fa_tile(2);
    const auto zeroed = attn(kt, vt, mask, U0);
    tq_ggml_set_fa_tile(was_tile);
    double off_zeroed = 0;
    for (size_t i = 0; i < ref.size(); ++i) off_zeroed = std::fmax(off_zeroed, std::fabs(zeroed[i] - ref[i]) / (1.0 + std::fabs(ref[i])));
    if (consecutive ? off_zeroed < 0.5 * off_plain : off_zeroed > 2e-5) {
        return err.fail("FA term, zeroed U (neox %d, nt %lld, consecutive %d): off %g (no term: %g)", neox, (long long) nt,
                        consecutive, off_zeroed, off_plain);
    }
    }
    tq_ggml_set_fa_tile(was_tile);
    return 0;
}

// The K mean in RoPE's frame (tq-kmean-rope.h). Keys are roped copies of mu0 + noise at
// scattered positions; a k_mean marked for the frame, SET and KEEP, with and without
// balancing, both RoPE layouts, with the host ops and with the chains of ops every backend
// has (tq_rf_rotate_mean_ops, tq_rf_coeffs_ops: a device without the terms). Checked: (1)
// every logit is exact per key (not only up to a constant) through both ways the term goes
// back, the per-head mask and the f32 keys;
// (2) SET takes the common component out at every position: the stored keys keep about the
// noise's share of the raw keys' energy, which a fixed vector cannot reach at these positions.
// Partial RoPE (n_rot 16 and 32 of a 64-wide head, StableLM's and Phi's shape): the keys are
// roped by ggml_rope_ext itself with n_dims = n_rot, so (2) also proves that tq_rf_pairs pairs
// the channels as llama's rope turns them, and the channels past n_rot (frequency 0 in the
// table) carry a plain mean whose q.mu the term adds back: (1) and (3) hold exactly there too,
// (3) with the soft cap and with learned sinks.
extern "C" int tq_test_kmean_rope(char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    const int64_t hd = 64, half = hd / 2, nkv = 2, g = 3, nq = nkv * g, n = hd * nkv;
    const float kq_scale = 0.125f;
    for (int64_t nrot : { hd, (int64_t) 16, (int64_t) 32 })
    for (bool neox : { false, true })
    for (bool bal : { false, true })
    for (int mode : { TQ_KMEAN_SET, TQ_KMEAN_KEEP })
    for (int64_t nt : { (int64_t) 40, (int64_t) 2 })
    for (bool consecutive : { false, true }) // scattered positions, or one sequence's run
    for (bool host : { true, false }) { // the host ops, or the chains a device without them gets
        if (mode == TQ_KMEAN_SET && nt < TQ_KMEAN_MIN_TOKENS) continue;
        const bool partial = nrot < hd;
        Ctx c(64);
        std::vector<int64_t> pos(nt);
        for (int64_t t = 0; t < nt; ++t) pos[t] = consecutive ? 4000 + t : 5 + 97 * t + (t * t) % 13;
        const tq_rf_pairs pr = { neox, partial ? nrot : 0 };
        auto ch = [&](int64_t i, int ab) { return tq_rf_ch(pr, hd, i, ab); };
        // RoPE's angular frequencies as the host's table has them: ggml's theta_scale^i over the
        // roped pairs, 0 past n_rot (tq_kmean_rope_setup)
        std::vector<double> w(half, 0.0);
        for (int64_t i = 0; i < nrot / 2; ++i) w[i] = std::pow(10000.0, -2.0 * i / nrot);
        // pre-RoPE keys mu0 + N(0, 1), |mu0_c| = 3, roped to their positions
        const std::vector<float> noise = gaussian(n * nt, 41), qv = gaussian(hd * nq * nt, 42);
        std::vector<float> kv(n * nt);
        double e_raw = 0;
        for (int64_t t = 0; t < nt; ++t)
            for (int64_t h = 0; h < nkv; ++h)
                for (int64_t i = 0; i < half; ++i) {
                    const float * x = &noise[(t * nkv + h) * hd];
                    const double a = x[ch(i, 0)] + 3.0 * (((i + h) % 2) ? 1 : -1), b = x[ch(i, 1)] + 3.0;
                    const double cs = std::cos(pos[t] * w[i]), sn = std::sin(pos[t] * w[i]);
                    float * k = &kv[(t * nkv + h) * hd];
                    if (partial) { // pre-RoPE here; ggml_rope_ext below
                        k[ch(i, 0)] = (float) a;
                        k[ch(i, 1)] = (float) b;
                    } else {
                        k[ch(i, 0)] = (float) (cs * a - sn * b);
                        k[ch(i, 1)] = (float) (sn * a + cs * b);
                    }
                    e_raw += a * a + b * b;
                }
        if (partial) {
            ggml_tensor * kpre = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nkv, nt);
            ggml_tensor * pt = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, nt);
            fill(kpre, kv);
            for (int64_t t = 0; t < nt; ++t) ((int32_t *) pt->data)[t] = (int32_t) pos[t];
            ggml_tensor * kr = ggml_rope_ext(c.ctx, kpre, pt, nullptr, (int) nrot, neox ? GGML_ROPE_TYPE_NEOX : 0, 0, 10000.0f,
                                             1.0f, 0.0f, 1.0f, 0.0f, 0.0f);
            compute(c.ctx, kr);
            kv = decode(kr);
        }
        ggml_tensor * k = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nkv, nt);
        ggml_tensor * q = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nq, nt);
        ggml_tensor * tab = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, hd, nt); // tokens = cells here
        fill(k, kv);
        fill(q, qv);
        for (int64_t t = 0; t < nt; ++t)
            for (int64_t i = 0; i < half; ++i) {
                ((float *) tab->data)[t * hd + i] = (float) std::cos(pos[t] * w[i]);
                ((float *) tab->data)[t * hd + half + i] = (float) std::sin(pos[t] * w[i]);
            }
        ggml_tensor * km = ggml_new_tensor_1d(c.ctx, GGML_TYPE_F32, tq_kmean_floats(hd, nkv, bal));
        tq_kmean_rope_mark(km);
        float * kmd = (float *) km->data;
        const auto m0 = gaussian(n, 43, 2.0f), s0 = gaussian(n, 44, 0.2f); // KEEP: a stored mu' and s - 1
        memcpy(kmd, m0.data(), n * sizeof(float));
        if (bal)
            for (int64_t h = 0; h < nkv; ++h) // s tied on each pair, as SET writes it
                for (int64_t i = 0; i < half; ++i) kmd[n + h * hd + ch(i, 0)] = kmd[n + h * hd + ch(i, 1)] = s0[h * hd + i];
        ggml_cgraph * gf = ggml_new_graph(c.ctx);
        ggml_tensor * qs = q, * A = nullptr;
        ggml_tensor * ks = tq_kmean_apply(c.ctx, gf, &qs, k, km, mode, nullptr, kq_scale, pr, tab, &A, nullptr, host);
        if (!A) return err.fail("neox %d bal %d mode %d: no coefficients", neox, bal, mode);
        ggml_tensor * mask = ggml_new_tensor_4d(c.ctx, GGML_TYPE_F32, nt, nt, 1, 1);
        memset(mask->data, 0, ggml_nbytes(mask));
        ggml_tensor * bias = tq_rf_mask(c.ctx, mask, A, tab, 1.0f);
        ggml_tensor * kfull = tq_rf_keys(c.ctx, ggml_reshape_4d(c.ctx, ks, hd, nkv, nt, 1), tq_kmean_view(c.ctx, km, hd, nkv), tab,
                                         nullptr, pr, nullptr, nullptr, nullptr, nullptr, nullptr, host);
        ggml_build_forward_expand(gf, qs);
        ggml_build_forward_expand(gf, ks);
        ggml_build_forward_expand(gf, bias);
        ggml_build_forward_expand(gf, kfull);
        ggml_graph_compute_with_ctx(c.ctx, gf, 2);
        const float * qo = (const float *) qs->data, * ko = (const float *) ks->data, * kf = (const float *) kfull->data,
                    * bo = (const float *) bias->data;
        // (1) q.k_j = q'.stored_j + bias = q'.(stored_j + R_p mu'), for every query and key
        for (int64_t t = 0; t < nt; ++t)
            for (int64_t h = 0; h < nq; ++h)
                for (int64_t j = 0; j < nt; ++j) {
                    const int64_t hk = h / g;
                    double want = 0, st = 0, full = 0, sc = 0;
                    for (int64_t i = 0; i < hd; ++i) {
                        const double qi = qv[(t * nq + h) * hd + i], q2 = qo[(t * nq + h) * hd + i];
                        want += qi * kv[(j * nkv + hk) * hd + i];
                        st += q2 * ko[(j * nkv + hk) * hd + i];
                        full += q2 * kf[(j * nkv + hk) * hd + i];
                        sc += std::fabs(qi * kv[(j * nkv + hk) * hd + i]) + std::fabs(q2 * ko[(j * nkv + hk) * hd + i]);
                    }
                    const double via_mask = st + bo[(h * nt + t) * nt + j];
                    if (std::fabs(via_mask - want) > 1e-5 * sc || std::fabs(full - want) > 1e-5 * sc)
                        return err.fail("neox %d nrot %lld bal %d mode %d nt %lld host ops %d: logit q%lld.k%lld head %lld %g, via mask %g, via keys %g",
                                        neox, (long long) nrot, bal, mode, (long long) nt, host, (long long) t, (long long) j, (long long) h, want,
                                        via_mask, full);
                }
        // (2) SET: the stored keys (divided by s) keep the noise's share of the energy, 1/10
        //     in expectation (|mu0|^2 = 9 per channel against 1), plus the estimate's 1/nt (measured 0.098)
        if (mode == TQ_KMEAN_SET) {
            double e_st = 0;
            for (int64_t t = 0; t < nt; ++t)
                for (int64_t i = 0; i < n; ++i) {
                    const double s = bal ? 1.0 + kmd[n + i] : 1.0, x = ko[t * n + i] / s;
                    e_st += x * x;
                }
            if (e_st / e_raw > 0.105) return err.fail("neox %d nrot %lld bal %d: stored energy %.4f of the raw keys', want <= 0.105", neox, (long long) nrot, bal, e_st / e_raw);
        }
        // (3) the turbo flash-attention tiles with the term (tq-fa-term.h), every tile path,
        //     equal flash attention over f32 keys decoded + R_p mu'
        if (int fail = kmean_rope_fa(err, c, pr, ko, qo, (const float *) A->data, tab, kmd, hd, nkv, nq, nt, kq_scale, pos, w)) {
            return fail;
        }
    }
    return 0;
}

// The lowered terms with the layer's own rope (tq_rf_rope_of, tq-kmean-rope.h): against the
// host's table in double precision, (1) the stored keys R_p (s k~ - mu') equal s k - R_p mu',
// (2) the cells' table from the rope equals cos/sin of the same angles, (3) R_p mu' of the
// cells equals the table chain's; all within ggml's f32 angles at positions up to 3844
// (p w rounded to f32: about 1e-4 rad on the fastest pairs). (4) Exactness on one side: the
// logits through the stored keys plus the mask built from the rope's table equal q.k. (5) The
// fused node before the rope (tq-rf-keep.h, a device's dev_keep) gives the ops' keys, q / s and A.
extern "C" int tq_test_kmean_rope_node(char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    const int64_t hd = 64, half = hd / 2, nkv = 2, g = 3, nq = nkv * g, n = hd * nkv, nt = 24;
    for (bool neox : { false, true })
    for (bool bal : { false, true }) {
        Ctx c(32);
        const tq_rf_pairs pr = { neox, 0 };
        auto ch = [&](int64_t i, int ab) { return tq_rf_ch(pr, hd, i, ab); };
        std::vector<int32_t> pos(nt);
        for (int64_t t = 0; t < nt; ++t) pos[t] = (int32_t) (3 + 167 * t);
        std::vector<double> w(half);
        for (int64_t i = 0; i < half; ++i) w[i] = std::pow(10000.0, -2.0 * i / hd);
        ggml_tensor * kpre = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nkv, nt);
        ggml_tensor * q = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nq, nt);
        ggml_tensor * pt = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, nt);
        ggml_tensor * tab = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, hd, nt);
        ggml_tensor * e = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, 1, 1);
        ggml_tensor * cols = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, tq_kmean_floats(hd, nkv, bal), 1);
        std::vector<float> kv = gaussian(n * nt, 61);
        for (auto & x : kv) x += 2.0f;
        fill(kpre, kv);
        const std::vector<float> qv = gaussian(hd * nq * nt, 62);
        fill(q, qv);
        memcpy(pt->data, pos.data(), nt * sizeof(int32_t));
        for (int64_t t = 0; t < nt; ++t)
            for (int64_t i = 0; i < half; ++i) {
                ((float *) tab->data)[t * hd + i] = (float) std::cos(pos[t] * w[i]);
                ((float *) tab->data)[t * hd + half + i] = (float) std::sin(pos[t] * w[i]);
            }
        for (int64_t i = 0; i < hd; ++i) ((float *) e->data)[i] = i < half ? 1.0f : 0.0f;
        float * cd = (float *) cols->data;
        const auto m0 = gaussian(n, 63, 2.0f), s0 = gaussian(n, 64, 0.2f);
        memcpy(cd, m0.data(), n * sizeof(float));
        if (bal)
            for (int64_t h = 0; h < nkv; ++h)
                for (int64_t i = 0; i < half; ++i) cd[n + h * hd + ch(i, 0)] = cd[n + h * hd + ch(i, 1)] = s0[h * hd + i];
        ggml_tensor * kr = ggml_rope_ext(c.ctx, kpre, pt, nullptr, (int) hd, neox ? GGML_ROPE_TYPE_NEOX : 0, 0, 10000.0f, 1.0f,
                                         0.0f, 1.0f, 0.0f, 0.0f);
        const ggml_tensor * rope = tq_rf_rope_of(kr, pr);
        if (!rope) return err.fail("neox %d: the rope node was not taken", neox);
        if (tq_rf_rope_of(kr, { !neox, 0 })) return err.fail("neox %d: a rope of the other pairing was taken", neox);
        ggml_tensor * qa = q, * qb = q, * Aa = nullptr, * Ab = nullptr;
        ggml_tensor * ka = tq_kmean_rf_use(c.ctx, &qa, kr, cols, tab, bal, pr, false, &Aa);
        ggml_tensor * kb = tq_kmean_rf_use(c.ctx, &qb, kr, cols, tab, bal, pr, false, &Ab, rope);
        if (kb->op != GGML_OP_ROPE || kb->src[1] != pt) return err.fail("neox %d bal %d: the stored keys are not the rope's", neox, bal);
        // (5) the same through the fused node before the rope (a device that runs it: dev_keep)
        ggml_tensor * qc = q, * Ac = nullptr;
        ggml_tensor * kc = tq_kmean_rf_use(c.ctx, &qc, kr, cols, tab, bal, pr, false, &Ac, rope, true);
        if (kc->op != GGML_OP_ROPE || !kc->src[0]->view_src || !tq_rf_keep_is(kc->src[0]->view_src) ||
            qc->view_src != kc->src[0]->view_src || Ac->view_src != qc->view_src)
            return err.fail("neox %d bal %d: dev_keep did not take the fused node before the rope", neox, bal);
        ggml_tensor * Tr = tq_rf_rope_table(c.ctx, e, pt, rope);
        ggml_tensor * mu = ggml_cont(c.ctx, ggml_view_3d(c.ctx, cols, hd, nkv, 1, hd * sizeof(float), cols->nb[1], 0));
        ggml_tensor * rma = tq_rf_rotate_mean_ops(c.ctx, mu, tab, pr), * rmb = tq_rf_rope_mean(c.ctx, mu, pt, rope);
        ggml_tensor * mask = ggml_new_tensor_4d(c.ctx, GGML_TYPE_F32, nt, nt, 1, 1);
        memset(mask->data, 0, ggml_nbytes(mask));
        ggml_tensor * bias = tq_rf_mask(c.ctx, mask, Ab, Tr, 1.0f);
        ggml_cgraph * gf = ggml_new_graph(c.ctx);
        for (ggml_tensor * t : { ka, kb, Tr, rma, rmb, bias, qb, kc, qc, Ac }) ggml_build_forward_expand(gf, t);
        ggml_graph_compute_with_ctx(c.ctx, gf, 2);
        auto maxdiff = [](const ggml_tensor * a, const ggml_tensor * b, double * scale) {
            const std::vector<float> x = decode(a), y = decode(b);
            double d = 0, s = 0;
            for (size_t i = 0; i < x.size(); ++i) {
                d = std::max(d, (double) std::fabs(x[i] - y[i]));
                s = std::max(s, (double) std::fabs(x[i]));
            }
            *scale = s;
            return d;
        };
        double sk, st, sm;
        const double dk = maxdiff(ka, kb, &sk), dt = maxdiff(tab, Tr, &st), dm = maxdiff(rma, rmb, &sm);
        // measured: keys and R_p mu' 5e-5 .. 1.3e-4 of their largest value, the table 1.6e-4 (half
        // an f32 ulp of the largest angle, 3844 rad)
        if (dk > 3e-4 * sk || dt > 4e-4 || dm > 3e-4 * sm)
            return err.fail("neox %d bal %d: rope against table: keys %g (of %g), table %g, R_p mu %g (of %g)", neox, bal, dk, sk, dt,
                            dm, sm);
        // (5) the fused node computes the ops' products in their order: the same values, up to
        // one rounding where a compiler contracts a product and a sum (measured: 0)
        double s5k, s5q, s5a;
        const double d5k = maxdiff(kb, kc, &s5k), d5q = maxdiff(qb, qc, &s5q), d5a = maxdiff(Ab, Ac, &s5a);
        if (d5k > 1e-6 * s5k || d5q > 1e-6 * s5q || d5a > 1e-6 * s5a)
            return err.fail("neox %d bal %d: fused node against the ops: keys %g (of %g), q %g (of %g), A %g (of %g)", neox, bal, d5k,
                            s5k, d5q, s5q, d5a, s5a);
        // (4) q.k through the stored keys and the rope table's mask, every query, key and head
        const float * ko = (const float *) kb->data, * qo = (const float *) qb->data, * bo = (const float *) bias->data;
        const std::vector<float> krv = decode(kr);
        for (int64_t t = 0; t < nt; ++t)
            for (int64_t h = 0; h < nq; ++h)
                for (int64_t j = 0; j < nt; ++j) {
                    double want = 0, got = 0, sc = 0;
                    for (int64_t i = 0; i < hd; ++i) {
                        const double qi = qv[(t * nq + h) * hd + i], ki = krv[(j * nkv + h / g) * hd + i];
                        want += qi * ki;
                        got += qo[(t * nq + h) * hd + i] * ko[(j * nkv + h / g) * hd + i];
                        sc += std::fabs(qi * ki);
                    }
                    got += bo[(h * nt + t) * nt + j];
                    if (std::fabs(got - want) > 1e-5 * sc)
                        return err.fail("neox %d bal %d: q%lld.k%lld head %lld: %g through the rope's mask, want %g", neox, bal,
                                        (long long) t, (long long) j, (long long) h, got, want);
                }
    }
    return 0;
}

// The SET statistics' token weights (tq_kmean_stat_weights, tq-kmean.h). (1) The host rule:
// tokens at position 0 count 0 where the first keys are kept exact, all count otherwise or if
// none would. (2) In RoPE's frame with balancing, a SET weighted so that the token at
// position 0 counts 0 stores the pre-RoPE mean of the other tokens (mu = stored m / s), the
// same whatever that token's key is, while equal weights let an outlier there move it.
extern "C" int tq_test_kmean_stat_w(char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    {
        const int32_t pos[5] = { 0, 7, 0, 8, 9 };
        float w[5];
        tq_kmean_stat_weights(pos, 5, true, w);
        const float want[5] = { 0.0f, 1.0f / 3, 0.0f, 1.0f / 3, 1.0f / 3 };
        for (int j = 0; j < 5; ++j)
            if (std::fabs(w[j] - want[j]) > 1e-7f) return err.fail("skip: weight %d = %g, want %g", j, w[j], want[j]);
        tq_kmean_stat_weights(pos, 5, false, w);
        for (int j = 0; j < 5; ++j)
            if (std::fabs(w[j] - 0.2f) > 1e-7f) return err.fail("no skip: weight %d = %g, want 0.2", j, w[j]);
        const int32_t zeros[2] = { 0, 0 };
        tq_kmean_stat_weights(zeros, 2, true, w);
        if (w[0] != 0.5f || w[1] != 0.5f) return err.fail("only position 0: weights %g %g, want 0.5 each", w[0], w[1]);
    }
    const int64_t hd = 64, half = hd / 2, nkv = 2, g = 3, nq = nkv * g, n = hd * nkv, nt = 6;
    std::vector<double> fr(half);
    for (int64_t i = 0; i < half; ++i) fr[i] = std::pow(10000.0, -2.0 * i / hd);
    for (bool neox : { false, true }) {
        const tq_rf_pairs pr = { neox, 0 };
        auto ch = [&](int64_t i, int ab) { return tq_rf_ch(pr, hd, i, ab); };
        std::vector<float> base = gaussian(n * nt, 51), qv = gaussian(hd * nq * nt, 52);
        for (int64_t i = 0; i < n * nt; ++i) base[i] += 2.0f;
        // the reference: the mean of R_p^-1 k_p over tokens 1..nt-1 (positions = token index)
        std::vector<double> mu(n, 0.0);
        for (int64_t t = 1; t < nt; ++t)
            for (int64_t h = 0; h < nkv; ++h)
                for (int64_t i = 0; i < half; ++i) {
                    const float * k = &base[(t * nkv + h) * hd];
                    const double cs = std::cos(t * fr[i]), sn = std::sin(t * fr[i]);
                    mu[h * hd + ch(i, 0)] += (cs * k[ch(i, 0)] + sn * k[ch(i, 1)]) / (nt - 1);
                    mu[h * hd + ch(i, 1)] += (cs * k[ch(i, 1)] - sn * k[ch(i, 0)]) / (nt - 1);
                }
        for (int variant = 0; variant < 3; ++variant) { // two outliers at position 0, weighted 0; one weighted
            std::vector<float> kv = base;
            const std::vector<float> out = gaussian(n, 60 + variant % 2, 40.0f);
            std::copy(out.begin(), out.end(), kv.begin());
            Ctx c(16);
            ggml_tensor * k = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nkv, nt);
            ggml_tensor * q = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nq, nt);
            ggml_tensor * tab = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, hd, nt);
            ggml_tensor * sw = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, 1, nt, 1);
            fill(k, kv);
            fill(q, qv);
            for (int64_t t = 0; t < nt; ++t)
                for (int64_t i = 0; i < half; ++i) {
                    ((float *) tab->data)[t * hd + i] = (float) std::cos(t * fr[i]);
                    ((float *) tab->data)[t * hd + half + i] = (float) std::sin(t * fr[i]);
                }
            std::vector<int32_t> pos(nt);
            for (int64_t t = 0; t < nt; ++t) pos[t] = (int32_t) t;
            tq_kmean_stat_weights(pos.data(), nt, variant < 2, (float *) sw->data);
            ggml_tensor * km = ggml_new_tensor_1d(c.ctx, GGML_TYPE_F32, tq_kmean_floats(hd, nkv, true));
            tq_kmean_rope_mark(km);
            memset(km->data, 0, ggml_nbytes(km));
            ggml_cgraph * gf = ggml_new_graph(c.ctx);
            ggml_tensor * qs = q, * A = nullptr;
            ggml_tensor * ks = tq_kmean_apply(c.ctx, gf, &qs, k, km, TQ_KMEAN_SET, nullptr, 0.125f, pr, tab, &A, sw);
            ggml_build_forward_expand(gf, ks);
            ggml_build_forward_expand(gf, qs);
            ggml_graph_compute_with_ctx(c.ctx, gf, 2);
            const float * kmd = (const float *) km->data;
            double worst = 0, scale = 0;
            for (int64_t i = 0; i < n; ++i) {
                worst = std::max(worst, std::fabs(kmd[i] / (1.0 + kmd[n + i]) - mu[i]));
                scale = std::max(scale, std::fabs(mu[i]));
            }
            if (variant < 2 && worst > 1e-5 * scale)
                return err.fail("neox %d outlier %d weighted 0: stored mu off the others' mean by %g (|mu| %g)", neox, variant,
                                worst, scale);
            if (variant == 2 && worst < 0.5 * scale)
                return err.fail("neox %d: an outlier weighted equally moved mu by only %g (|mu| %g)", neox, worst, scale);
        }
    }
    return 0;
}

// ggml's switch readers (tq-switches.def), for tests/switches.rs, which runs each in a child
// process with the variable set: the value index the reader took, or (for a value the row
// does not know) the process stops with the table's message. reader: 0 tq_switch_get(id)
// (the one C parser, every row), 1 the SET_ROWS thread count (TQ_ROWS_THREADS), 2 the
// prefill decode (TQ_PREFILL_DECODE).
extern "C" int tq_test_switch_read(int reader, int id) {
    switch (reader) {
        case 0:
            return tq_switch_get((enum tq_switch) id);
        case 1: {
            ggml_tensor node = {};
            node.op          = GGML_OP_SET_ROWS;
            node.type        = GGML_TYPE_TURBO3;
            return tq_ggml_rows_n_tasks(&node, 2) == 2;
        }
        case 2:
            return tq_ggml_prefill_decode_enabled();
        default:
            return -1;
    }
}

// Statistics per stream in RoPE's frame (tq_kmean_rf_streams, tq-kmean.h). A ubatch of three
// blocks (streams 2, 0, 3 of a 4-stream cache) against each block alone (a one-block ubatch
// into another cache): (1) SET: every block's k', q / s and coefficients A, and the column
// written for its stream, are the bits of the block alone, and the shared column is the
// chosen block's; (2) a later ubatch of KEEP, INHERIT and ZERO blocks runs the first on its
// stream's stored column (the bits of a KEEP graph), gives the second the shared column and
// writes it to its stream, zeroes the third (and its k' is then the roped keys unchanged);
// with balancing and without, both RoPE layouts, the CPU's fused op and the chains of ops a
// device without host ops gets.
extern "C" int tq_test_kmean_streams(char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    const int64_t hd = 64, half = hd / 2, nkv = 2, g = 3, nq = nkv * g, per = 40, nb = 3, n_stream = 4;
    const int32_t strm[nb] = { 2, 0, 3 };
    std::vector<double> w(half);
    for (int64_t i = 0; i < half; ++i) w[i] = std::pow(10000.0, -2.0 * i / hd);
    for (bool neox : { false, true })
    for (bool bal : { false, true })
    for (bool host : { true, false }) {
        const tq_rf_pairs pr = { neox, 0 };
        const int64_t F = tq_kmean_floats(hd, nkv, bal), nt = nb * per;
        const std::vector<float> kv = gaussian(hd * nkv * nt, 61), qv = gaussian(hd * nq * nt, 62);
        std::vector<float> kx(kv);
        for (int64_t i = 0; i < (int64_t) kx.size(); ++i) kx[i] += 1.5f * (float) ((i % hd) % 3); // a common component
        std::vector<float> tabv(hd * nt);
        for (int64_t t = 0; t < nt; ++t) {
            const int64_t p = (t % per) + 100 * (t / per); // each block its own sequence's positions
            for (int64_t i = 0; i < half; ++i) {
                tabv[t * hd + i] = (float) std::cos(p * w[i]);
                tabv[t * hd + half + i] = (float) std::sin(p * w[i]);
            }
        }
        // one ubatch of nbk blocks (tokens t0 ..) into the cache km; returns k', q', A, cols
        struct out { std::vector<float> k, q, a; };
        auto run = [&](Ctx & c, ggml_tensor * km, int kind, const std::vector<int32_t> & st, const std::vector<int32_t> & sl,
                       int64_t t0, int64_t nbk) {
            const int64_t n = nbk * per;
            ggml_tensor * k = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nkv, n);
            ggml_tensor * q = ggml_new_tensor_3d(c.ctx, GGML_TYPE_F32, hd, nq, n);
            ggml_tensor * tab = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, hd, n);
            memcpy(k->data, kx.data() + t0 * hd * nkv, ggml_nbytes(k));
            memcpy(q->data, qv.data() + t0 * hd * nq, ggml_nbytes(q));
            memcpy(tab->data, tabv.data() + t0 * hd, ggml_nbytes(tab));
            ggml_tensor * ts = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, nbk + 1);
            ggml_tensor * tl = ggml_new_tensor_1d(c.ctx, GGML_TYPE_I32, nbk + 1);
            memcpy(ts->data, st.data(), ggml_nbytes(ts));
            memcpy(tl->data, sl.data(), ggml_nbytes(tl));
            ggml_cgraph * gf = ggml_new_graph_custom(c.ctx, 4096, false);
            ggml_tensor * qs = q, * A = nullptr, * cols = nullptr;
            ggml_tensor * ks = tq_kmean_rf_streams(c.ctx, gf, &qs, k, km, kind, ts, kind == TQ_KMEAN_KEEP ? nullptr : tl, tab,
                                                   nullptr, 0.125f, pr, host, &A, &cols);
            for (ggml_tensor * t : { ks, qs, A }) ggml_build_forward_expand(gf, t);
            ggml_graph_compute_with_ctx(c.ctx, gf, 2);
            auto flat = [](ggml_tensor * t) {
                std::vector<float> v(ggml_nelements(t));
                for (int64_t i3 = 0, j = 0; i3 < t->ne[2]; ++i3)
                    for (int64_t i2 = 0; i2 < t->ne[1]; ++i2)
                        for (int64_t i1 = 0; i1 < t->ne[0]; ++i1, ++j)
                            v[j] = *(const float *) ((const char *) t->data + i1 * t->nb[0] + i2 * t->nb[1] + i3 * t->nb[2]);
                return v;
            };
            return out{ flat(ks), flat(qs), flat(A) };
        };
        auto new_km = [&](Ctx & c) {
            ggml_tensor * km = ggml_new_tensor_2d(c.ctx, GGML_TYPE_F32, F, n_stream + 1);
            tq_kmean_rope_mark(km);
            const auto junk = gaussian(F * (n_stream + 1), 63, 0.1f); // stored columns no one may read
            memcpy(km->data, junk.data(), ggml_nbytes(km));
            return km;
        };
        auto col = [&](ggml_tensor * km, int64_t s) { return (const float *) km->data + s * F; };
        const char * how = host ? "fused op" : "ops";
        // (1) SET: three blocks together, shared from block 1
        Ctx ca(256);
        ggml_tensor * km = new_km(ca);
        const out all = run(ca, km, TQ_KMEAN_SET, { strm[0], strm[1], strm[2], (int32_t) n_stream },
                            { nb + 1, nb + 2, nb + 3, nb + 2 }, 0, nb);
        for (int64_t b = 0; b < nb; ++b) {
            Ctx c1(64);
            ggml_tensor * k1 = new_km(c1);
            const out one = run(c1, k1, TQ_KMEAN_SET, { strm[b], (int32_t) n_stream }, { 2, 2 }, b * per, 1);
            for (auto [x, y, n, what] : { std::make_tuple(&all.k, &one.k, hd * nkv, "k'"), std::make_tuple(&all.q, &one.q, hd * nq, "q/s"),
                                          std::make_tuple(&all.a, &one.a, hd * nq, "A") })
                for (int64_t i = 0; i < per * n; ++i)
                    if ((*x)[b * per * n + i] != (*y)[i])
                        return err.fail("streams SET (%s, neox %d, bal %d): block %lld's %s value %lld is %.9g among 3 blocks, %.9g alone",
                                        how, neox, bal, (long long) b, what, (long long) i, (*x)[b * per * n + i], (*y)[i]);
            if (memcmp(col(km, strm[b]), col(k1, strm[b]), F * sizeof(float)) != 0)
                return err.fail("streams SET (%s, neox %d, bal %d): stream %d's stored column differs from the block's alone", how, neox, bal, strm[b]);
        }
        if (memcmp(col(km, n_stream), col(km, strm[1]), F * sizeof(float)) != 0)
            return err.fail("streams SET (%s, neox %d, bal %d): the shared column is not block 1's", how, neox, bal);
        // (2) KEEP stream 2, INHERIT stream 1 (no cells yet), ZERO stream 0; shared kept
        std::vector<float> shared(col(km, n_stream), col(km, n_stream) + F), kept(col(km, 2), col(km, 2) + F);
        const out mix = run(ca, km, TQ_KMEAN_ZERO, { 2, 1, 0, (int32_t) n_stream }, { 0, nb, nb + 1, nb }, 0, nb);
        if (memcmp(col(km, 1), shared.data(), F * sizeof(float)) != 0 || memcmp(col(km, 2), kept.data(), F * sizeof(float)) != 0 ||
            memcmp(col(km, n_stream), shared.data(), F * sizeof(float)) != 0)
            return err.fail("streams (%s, neox %d, bal %d): INHERIT did not take the shared column, or KEEP / the shared one changed", how, neox, bal);
        for (int64_t i = 0; i < F; ++i)
            if (col(km, 0)[i] != 0.0f) return err.fail("streams (%s, neox %d, bal %d): ZERO left %g in its column", how, neox, bal, col(km, 0)[i]);
        const out keep = run(ca, km, TQ_KMEAN_KEEP, { 2, 1, 0, (int32_t) n_stream }, { 0, 0, 0, 0 }, 0, nb);
        if (memcmp(keep.k.data(), mix.k.data(), mix.k.size() * sizeof(float)) != 0 ||
            memcmp(keep.a.data(), mix.a.data(), mix.a.size() * sizeof(float)) != 0)
            return err.fail("streams (%s, neox %d, bal %d): the chosen columns do not run as a KEEP over the stored ones", how, neox, bal);
        for (int64_t i = 0; i < per * hd * nkv; ++i) {
            const float want = kx[2 * per * hd * nkv + i], got = mix.k[2 * per * hd * nkv + i];
            if (want != got) return err.fail("streams (%s, neox %d, bal %d): a ZERO block's k' %g, the key %g", how, neox, bal, got, want);
        }
    }
    return 0;
}
