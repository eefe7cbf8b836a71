// A device without turbo kernels must refuse every op on a turbo type (tests/vulkan.rs).
//
// Asks a backend device's supports_op, through ggml's backend API only, about the ops a
// turbo KV cache takes part in: the cache tensor itself, SET_ROWS into it, the K shift's CPY,
// GET_ROWS and CPY out of it, KQ as MUL_MAT, and FLASH_ATTN_EXT with a turbo K or V. Each is
// asked for every turbo type, and the same ops on f16 must be accepted, so that a device that
// refuses everything (or one that was never initialised) does not pass. Built into every
// build (it names no backend's headers); without the device it says so.

#include "ggml.h"
#include "ggml-backend.h"
#include "tq-ggml.h"
#include "tq-test-util.h"

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

// Device `index` of `reg_name` refuses every op on every turbo type and accepts the f16 ones.
// 0: yes; 1: no (what differed in err); 2: no such device.
extern "C" int tq_test_backend_refuses_turbo(const char * reg_name, int index, char * err_buf, size_t cap) {
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
                if (ggml_backend_dev_supports_op(dev, op)) {
                    return err.fail("%s accepts %s on %s (other cache %s)", ggml_backend_dev_name(dev), what.c_str(),
                                    ggml_type_name(t), ggml_type_name(other));
                }
            }
        }
    }
    return 0;
}
