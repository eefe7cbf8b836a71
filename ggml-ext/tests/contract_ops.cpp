// contract_ops.cpp - the turbo K terms of flash attention (ggml-ext/ggml/tq-fa-contract.h) are
// run or refused, never left out: what every device of this build answers through ggml's own
// supports_op for an op that carries them, next to what it answers for the same op without.
#include "tq-test-util.h"

#include "ggml-backend.h"
#include "tq-fa-contract.h"

#include <string>

using namespace tq_test;

namespace {

// A decode flash attention of head size hd over n_kv cells, K and V of kt and vt; with_terms:
// the terms attached through the setter; broken: a table one column short, set past it.
ggml_tensor * fa_op(ggml_context * ctx, ggml_type kt, ggml_type vt, int64_t hd, bool with_terms, bool broken = false) {
    const int64_t n_kv = 256, n_head = 4, n_head_kv = 2;
    ggml_tensor * q = ggml_new_tensor_4d(ctx, GGML_TYPE_F32, hd, 1, n_head, 1);
    ggml_tensor * k = ggml_new_tensor_4d(ctx, kt, hd, n_kv, n_head_kv, 1);
    ggml_tensor * v = ggml_new_tensor_4d(ctx, vt, hd, n_kv, n_head_kv, 1);
    ggml_tensor * mask = ggml_new_tensor_4d(ctx, GGML_TYPE_F16, n_kv, 1, 1, 1);
    ggml_tensor * fa = ggml_flash_attn_ext(ctx, q, k, v, mask, 1.0f, 0.0f, 0.0f);
    if (!with_terms) return fa;
    ggml_tensor * A = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, hd, n_head, 1);
    ggml_tensor * T = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hd, n_kv + TQ_FA_TERM_STEPS - (broken ? 1 : 0));
    ggml_tensor * C = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_kv, 2);
    ggml_tensor * R = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hd * n_head_kv, 3);
    ggml_tensor * RQ = ggml_new_tensor_2d(ctx, kt, hd * n_head_kv, 3);
    if (broken) { // what the setter refuses to build: the op as a careless caller could leave it
        fa->src[TQ_FA_SRC_A] = A;
        fa->src[TQ_FA_SRC_T] = T;
        fa->src[TQ_FA_SRC_CELLS] = C;
    } else {
        tq_flash_attn_ext_set_k_terms(fa, A, T, C, R, RQ);
    }
    return fa;
}

} // namespace

extern "C" int tq_test_fa_contract(char * err_buf, size_t cap, int * n_devices) {
    Err err{ err_buf, cap };
    ggml_init_params p = { 4096 * ggml_tensor_overhead(), nullptr, true }; // ~30 tensors per pair and head size
    ggml_context * ctx = ggml_init(p);
    *n_devices = (int) ggml_backend_dev_count();
    int rc = 0;
    for (size_t d = 0; d < ggml_backend_dev_count() && rc == 0; ++d) {
        ggml_backend_dev_t dev = ggml_backend_dev_get(d);
        const std::string reg = ggml_backend_reg_name(ggml_backend_dev_backend_reg(dev));
        const bool cpu = reg == "CPU";
        for (int64_t hd : { 64, 128, 256 }) {
            struct { ggml_type k, v; bool turbo; } pairs[] = {
                { GGML_TYPE_TURBO4, GGML_TYPE_TURBO3, true }, { GGML_TYPE_TURBO3_TCQ, GGML_TYPE_TURBO2, true },
                { GGML_TYPE_F16, GGML_TYPE_F16, false }, { GGML_TYPE_Q8_0, GGML_TYPE_Q8_0, false },
            };
            for (const auto & pr : pairs) {
                const bool plain = ggml_backend_dev_supports_op(dev, fa_op(ctx, pr.k, pr.v, hd, false));
                const bool terms = ggml_backend_dev_supports_op(dev, fa_op(ctx, pr.k, pr.v, hd, true));
                const bool broken = ggml_backend_dev_supports_op(dev, fa_op(ctx, pr.k, pr.v, hd, true, true));
                // the CPU runs the terms over turbo K and V (its tiles), Vulkan over a turbo K
                // (tq_fa_terms.comp); every other device of this build (RPC implements them
                // too, but has no device without a server) refuses them; nobody takes a broken
                // layout
                const bool want = (cpu || reg == "Vulkan") && pr.turbo;
                if (terms != want || broken || (cpu && !plain)) {
                    rc = err.fail("device %s (%s), hd %lld, K %s V %s: with the terms %d (want %d), broken layout %d "
                                  "(want 0), without them %d", ggml_backend_dev_name(dev), reg.c_str(), (long long) hd,
                                  ggml_type_name(pr.k), ggml_type_name(pr.v), terms, want, broken, plain);
                    break;
                }
            }
            if (rc) break;
        }
    }
    ggml_free(ctx);
    return rc;
}
