// A backend device and the turbo types (tests/vulkan.rs), through ggml's backend API only
// (no backend's headers, so it is built into every build; without the device it says so):
//
// - tq_test_backend_turbo_ops: which ops of a turbo KV cache the device takes (the cache tensor
//   itself, SET_ROWS into it, the K shift's CPY, GET_ROWS and CPY out of it, KQ as MUL_MAT (a
//   2-d view and llama's K view at f32 precision; an f16 B is refused), and
//   FLASH_ATTN_EXT with a turbo K or V), for every turbo type, against what the caller says it
//   implements; the same ops on f16 must be accepted, so that a device that refuses everything
//   (or one that was never initialised) does not pass.
// - tq_test_backend_turbo_bytes: the device's SET_ROWS / CPY into a turbo type (the trellis
//   types' Viterbi search included) write the bytes of the Rust codec (tq_quantize), and its
//   GET_ROWS / CPY out of one give tq_dequantize's floats bit for bit, on gaussian rows, on the
//   rows that take the encoder's edge rules (NaN, +-Inf, zero, f32 subnormals, a scale past
//   fp16's range, one below it) and on rows full of exact ties of path costs (constant, a
//   coarse grid, a trellis block's own decode); all rows in one op, and again in ops of 3 rows
//   (CPY into views at row offsets).

#include "ggml.h"
#include "ggml-backend.h"
#include "tq-ggml.h"
#include "tq-test-util.h"

#include "turboquant.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>

namespace {

using namespace tq_test;

const ggml_type TURBO[5] = { GGML_TYPE_TURBO2, GGML_TYPE_TURBO3, GGML_TYPE_TURBO4, GGML_TYPE_TURBO3_TCQ, GGML_TYPE_TURBO2_TCQ };

// The ops of a cache of `type` (head size 64, 2 KV heads, 256 cells), built without data.
// `other` is the type of the other cache in flash attention (K when `type` is V, and so on).
struct CacheOps {
    ggml_context * ctx = nullptr;
    std::vector<std::pair<std::string, ggml_tensor *>> ops;

    CacheOps(ggml_type type, ggml_type other) {
        ggml_init_params p = { 64 * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, /*no_alloc =*/ true };
        ctx = ggml_init(p);
        const int64_t d = 64, n_kv = 256, h = 2, n_q = 1;
        ggml_tensor * cache = ggml_new_tensor_2d(ctx, type, d * h, n_kv);
        ggml_tensor * rows  = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d * h, 2);
        ggml_tensor * idx64 = ggml_new_tensor_1d(ctx, GGML_TYPE_I64, 2);
        ggml_tensor * idx32 = ggml_new_tensor_1d(ctx, GGML_TYPE_I32, 2);
        ggml_tensor * f32   = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d * h, n_kv);
        ggml_tensor * q     = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, d, n_q, h, 1);
        ggml_tensor * mask  = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, n_q, 1, 1);
        // the cache as attention reads it: [d, n_kv, h] with a head's rows in one cell's row
        ggml_tensor * kv    = ggml_view_3d(ctx, cache, d, n_kv, h, cache->nb[1], ggml_row_size(type, d), 0);
        ggml_tensor * o     = ggml_new_tensor_3d(ctx, other, d, n_kv, h);
        ggml_tensor * k     = kv;
        // flash attention off: KQ over the K view (heads interleaved), GGML_PREC_F32 as llama sets it
        ggml_tensor * kq_f32 = ggml_mul_mat(ctx, kv, q);
        ggml_prec_set_acc(kq_f32, GGML_PREC_F32);
        ops = {
            { "the cache tensor (NONE)", cache },
            { "VIEW of the cache", kv },
            { "SET_ROWS f32 -> cache (i64 rows)", ggml_set_rows(ctx, cache, rows, idx64) },
            { "SET_ROWS f32 -> cache (i32 rows)", ggml_set_rows(ctx, cache, rows, idx32) },
            { "CPY f32 -> cache (K shift)", ggml_cpy(ctx, f32, cache) },
            { "CPY cache -> f32", ggml_cpy(ctx, cache, f32) },
            { "GET_ROWS from the cache", ggml_get_rows(ctx, cache, idx32) },
            { "MUL_MAT cache x f32 (KQ)", ggml_mul_mat(ctx, ggml_view_2d(ctx, cache, d, n_kv, cache->nb[1], 0),
                                                       ggml_new_tensor_2d(ctx, GGML_TYPE_F32, d, n_q)) },
            { "MUL_MAT K view x Q at f32 precision (llama's KQ)", kq_f32 },
            { "MUL_MAT cache x f16", ggml_mul_mat(ctx, ggml_view_2d(ctx, cache, d, n_kv, cache->nb[1], 0),
                                                  ggml_new_tensor_2d(ctx, GGML_TYPE_F16, d, n_q)) },
            { "FLASH_ATTN_EXT with this K", ggml_flash_attn_ext(ctx, q, k, o, mask, 0.125f, 0.0f, 0.0f) },
            { "FLASH_ATTN_EXT with this V", ggml_flash_attn_ext(ctx, q, o, k, mask, 0.125f, 0.0f, 0.0f) },
        };
    }
    ~CacheOps() { ggml_free(ctx); }
};

} // namespace

// The number of devices of backend registry `reg_name` (0 when this build has no such backend
// or it found no device).
extern "C" int tq_test_backend_devices(const char * reg_name) {
    ggml_backend_reg_t reg = ggml_backend_reg_by_name(reg_name);
    return reg ? (int) ggml_backend_reg_dev_count(reg) : 0;
}

// Device `index` of `reg_name` takes the ops of the caches of the types it has shaders for
// (MUL_MAT with an f32 B; not with an f16 one) and refuses those of the others; `shaders` says
// which: 0 none, 1 turbo2/3/4, 2 those and the trellis types. It accepts the f16 ops.
// 0: as expected; 1: not (what differed in err); 2: no such device.
extern "C" int tq_test_backend_turbo_ops(const char * reg_name, int index, int shaders, char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    ggml_backend_reg_t reg = ggml_backend_reg_by_name(reg_name);
    if (!reg || index < 0 || (size_t) index >= ggml_backend_reg_dev_count(reg)) {
        err.fail("no %s device %d in this build (devices: %zu)", reg_name, index,
                 reg ? ggml_backend_reg_dev_count(reg) : (size_t) 0);
        return 2;
    }
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, index);
    {
        CacheOps f16(GGML_TYPE_F16, GGML_TYPE_F16);
        for (auto & [what, op] : f16.ops) {
            if (!ggml_backend_dev_supports_op(dev, op)) {
                return err.fail("%s refuses f16 %s (%s): the check would pass vacuously",
                                ggml_backend_dev_name(dev), what.c_str(), ggml_op_desc(op));
            }
        }
    }
    for (ggml_type t : TURBO) {
        for (ggml_type other : { GGML_TYPE_F16, t }) {
            CacheOps c(t, other);
            for (auto & [what, op] : c.ops) {
                const bool f16_b = op->op == GGML_OP_MUL_MAT && op->src[1]->type == GGML_TYPE_F16;
                const bool has = shaders == 2 || (shaders == 1 && !TQ_GGML_IS_TCQ(t) && !TQ_GGML_IS_TCQ(other));
                const bool want = has && !f16_b;
                if (ggml_backend_dev_supports_op(dev, op) != want) {
                    return err.fail("%s %s %s on %s (other cache %s)", ggml_backend_dev_name(dev),
                                    want ? "refuses" : "accepts", what.c_str(), ggml_type_name(t),
                                    ggml_type_name(other));
                }
            }
        }
    }
    return 0;
}

namespace {

// Rows of 256 values: gaussian ones and one per edge rule of the encoder.
std::vector<float> edge_rows(int64_t n_per_row, int64_t & n_rows) {
    std::vector<float> v;
    auto add = [&](const std::vector<float> & r) { v.insert(v.end(), r.begin(), r.end()); };
    add(gaussian(n_per_row, 1));
    add(gaussian(n_per_row, 2, 30.0f));
    std::vector<float> r = gaussian(n_per_row, 3);
    r[0] = std::numeric_limits<float>::quiet_NaN();
    r[5] = std::numeric_limits<float>::infinity();
    r[70] = -std::numeric_limits<float>::infinity();
    add(r);
    add(std::vector<float>(n_per_row, 0.0f));                          // zero blocks: d = 0
    r = gaussian(n_per_row, 4);
    for (auto & x : r) x *= 1e-39f;                                    // f32 subnormals
    add(r);
    r = gaussian(n_per_row, 5);
    for (auto & x : r) x *= 1e30f;                                     // scale past fp16: 65504
    add(r);
    r = gaussian(n_per_row, 6);
    for (auto & x : r) x *= 1e-12f;                                    // scale below fp16's least
    add(r);
    // exact ties of the trellis search's path costs: a constant row, a coarse grid, and the
    // decode of a trellis block (every value a table entry times one scale)
    add(std::vector<float>(n_per_row, 0.75f));
    r = gaussian(n_per_row, 7);
    for (auto & x : r) x = std::round(x * 2.0f) * 0.5f;
    add(r);
    for (int t : { TQ_TURBO3_TCQ, TQ_TURBO2_TCQ }) {
        std::vector<uint8_t> q(tq_block_bytes(t) * (n_per_row / 64));
        if (tq_quantize(t, gaussian(n_per_row, 8 + t).data(), q.data(), n_per_row) != 0 ||
            tq_dequantize(t, q.data(), r.data(), n_per_row) != 0) {
            abort();
        }
        add(r);
    }
    for (int i = 0; i < 16; ++i) {                                     // more searches, scales 2^-16 .. 2^14
        r = gaussian(n_per_row, 100 + i, std::ldexp(1.0f, 2 * i - 16));
        add(r);
    }
    n_rows = (int64_t) v.size() / n_per_row;
    return v;
}

struct Backend {
    ggml_backend_t be = nullptr;
    ggml_context * ctx = nullptr;
    ggml_backend_buffer_t buf = nullptr;
    ~Backend() {
        if (buf) ggml_backend_buffer_free(buf);
        if (ctx) ggml_free(ctx);
        if (be) ggml_backend_free(be);
    }
};

} // namespace

// 0: the bytes and floats agree for every turbo type; 1: they do not (err says where); 2: no device.
extern "C" int tq_test_backend_turbo_bytes(const char * reg_name, int index, char * err_buf, size_t cap) {
    Err err{ err_buf, cap };
    ggml_backend_reg_t reg = ggml_backend_reg_by_name(reg_name);
    if (!reg || index < 0 || (size_t) index >= ggml_backend_reg_dev_count(reg)) {
        err.fail("no %s device %d in this build", reg_name, index);
        return 2;
    }
    ggml_backend_dev_t dev = ggml_backend_reg_dev_get(reg, index);
    const int64_t d = 256;
    int64_t n = 0;
    const std::vector<float> x = edge_rows(d, n);
    // n rows into n_cells cells, scattered: i -> (5 i + 2) mod n_cells, distinct cells since
    // n_cells is prime (two rows into one cell would make the order of the writes matter)
    int64_t n_cells = n + 3;
    auto prime = [](int64_t p) { for (int64_t q = 2; q * q <= p; ++q) if (p % q == 0) return false; return true; };
    while (!prime(n_cells) || n_cells % 5 == 0) ++n_cells;
    std::vector<int64_t> slot(n);
    std::vector<int32_t> slot32(n);
    for (int64_t i = 0; i < n; ++i) {
        slot[i] = (i * 5 + 2) % n_cells;
        slot32[i] = (int32_t) slot[i];
    }
    for (ggml_type t : TURBO) {
        const int tq = tq_ggml_codec_type(t);
        const size_t row = ggml_row_size(t, d);
        // what the Rust codec writes and reads
        std::vector<uint8_t> want_cache(row * n_cells, 0), want_rows(row * n);
        if (tq_quantize(tq, x.data(), want_rows.data(), n * d) != 0) {
            return err.fail("tq_quantize(%s) failed", ggml_type_name(t));
        }
        for (int64_t i = 0; i < n; ++i) {
            memcpy(want_cache.data() + slot[i] * row, want_rows.data() + i * row, row);
        }
        std::vector<float> want_x(n * d);
        tq_dequantize(tq, want_rows.data(), want_x.data(), n * d);

        // all rows in one op, then ops of 3 rows (12 blocks, a decode's dispatch size): SET_ROWS
        // chained on the cache, CPY into views of the destination at row offsets, which the
        // device binds short of the view and reaches through the op's destination offset (the
        // encoders once dropped it and wrote the wrong blocks)
        for (const int64_t per : { n, (int64_t) 3 }) {
            Backend b;
            b.be = ggml_backend_dev_init(dev, nullptr);
            ggml_init_params p = { (32 + 4 * (size_t) n) * ggml_tensor_overhead() + ggml_graph_overhead(), nullptr, true };
            b.ctx = ggml_init(p);
            ggml_tensor * src = ggml_new_tensor_2d(b.ctx, GGML_TYPE_F32, d, n);
            ggml_tensor * cache = ggml_new_tensor_2d(b.ctx, t, d, n_cells);
            ggml_tensor * idx = ggml_new_tensor_1d(b.ctx, GGML_TYPE_I64, n);
            ggml_tensor * idx32 = ggml_new_tensor_1d(b.ctx, GGML_TYPE_I32, n);
            ggml_tensor * packed = ggml_new_tensor_2d(b.ctx, t, d, n);
            ggml_tensor * set = cache;
            std::vector<ggml_tensor *> cpys;
            for (int64_t i0 = 0; i0 < n; i0 += per) {
                const int64_t m = std::min(per, n - i0);
                ggml_tensor * s_rows = ggml_view_2d(b.ctx, src, d, m, src->nb[1], i0 * src->nb[1]);
                set = ggml_set_rows(b.ctx, set, s_rows, ggml_view_1d(b.ctx, idx, m, i0 * idx->nb[0]));
                cpys.push_back(ggml_cpy(b.ctx, s_rows, ggml_view_2d(b.ctx, packed, d, m, packed->nb[1], i0 * packed->nb[1])));
            }
            ggml_tensor * got = ggml_get_rows(b.ctx, set, idx32);          // f32 rows back out
            ggml_tensor * cpy = cpys[0];                                    // CPY f32 -> turbo
            ggml_tensor * back = ggml_cpy(b.ctx, cpy, ggml_new_tensor_2d(b.ctx, GGML_TYPE_F32, d, cpy->ne[1]));
            b.buf = ggml_backend_alloc_ctx_tensors(b.ctx, b.be);
            if (!b.buf) {
                return err.fail("%s: cannot allocate the tensors", ggml_backend_dev_name(dev));
            }
            for (ggml_tensor * op : { set, got, cpy, back }) {
                if (!ggml_backend_dev_supports_op(dev, op)) {
                    return err.fail("%s refuses %s on %s", ggml_backend_dev_name(dev), ggml_op_desc(op), ggml_type_name(t));
                }
            }
            ggml_backend_tensor_set(src, x.data(), 0, ggml_nbytes(src));
            ggml_backend_tensor_set(idx, slot.data(), 0, ggml_nbytes(idx));
            ggml_backend_tensor_set(idx32, slot32.data(), 0, ggml_nbytes(idx32));
            std::vector<uint8_t> zeros(ggml_nbytes(cache), 0);
            ggml_backend_tensor_set(cache, zeros.data(), 0, zeros.size());
            // one graph, as llama's: the reads come after the writes they depend on
            ggml_cgraph * gf = ggml_new_graph(b.ctx);
            ggml_build_forward_expand(gf, got);
            for (ggml_tensor * c : cpys) {
                ggml_build_forward_expand(gf, c);
            }
            ggml_build_forward_expand(gf, back);
            if (ggml_backend_graph_compute(b.be, gf) != GGML_STATUS_SUCCESS) {
                return err.fail("%s: graph_compute failed on %s", ggml_backend_dev_name(dev), ggml_type_name(t));
            }
            std::vector<uint8_t> have_cache(ggml_nbytes(cache)), have_packed(ggml_nbytes(packed));
            ggml_backend_tensor_get(cache, have_cache.data(), 0, have_cache.size());
            ggml_backend_tensor_get(packed, have_packed.data(), 0, have_packed.size());
            for (int64_t c = 0; c < n_cells; ++c) {
                if (memcmp(have_cache.data() + c * row, want_cache.data() + c * row, row) != 0) {
                    return err.fail("%s SET_ROWS %s (%lld rows an op): cell %lld differs from the Rust codec's bytes",
                                    ggml_backend_dev_name(dev), ggml_type_name(t), (long long) per, (long long) c);
                }
            }
            for (int64_t i = 0; i < n; ++i) {
                if (memcmp(have_packed.data() + i * row, want_rows.data() + i * row, row) != 0) {
                    return err.fail("%s CPY f32 -> %s (%lld rows an op): row %lld differs from the Rust codec's bytes",
                                    ggml_backend_dev_name(dev), ggml_type_name(t), (long long) per, (long long) i);
                }
            }
            // GET_ROWS reads every row; the CPY back reads the first op's rows
            for (ggml_tensor * out : { got, back }) {
                std::vector<float> have(ggml_nelements(out));
                ggml_backend_tensor_get(out, have.data(), 0, ggml_nbytes(out));
                for (size_t j = 0; j < have.size(); ++j) {
                    if (memcmp(&have[j], &want_x[j], sizeof(float)) != 0) {
                        return err.fail("%s %s from %s: value %zu (row %zu) is %a, tq_dequantize's %a",
                                        ggml_backend_dev_name(dev), ggml_op_desc(out), ggml_type_name(t), j,
                                        j / (size_t) d, (double) have[j], (double) want_x[j]);
                    }
                }
            }
        }
    }
    return 0;
}
