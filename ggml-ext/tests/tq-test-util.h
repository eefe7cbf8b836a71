// tq-test-util.h - what the ggml-level tests (ggml-ext/tests/*.cpp) share: an error buffer,
// a CPU context, seeded gaussian data, running one graph, and filling / decoding a tensor
// of any type through ggml's own type traits.
#pragma once

#include "ggml.h"
#include "ggml-cpu.h"
#include "tq-fa-contract.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace tq_test {

struct Err {
    char * buf;
    size_t cap;
    int fail(const char * fmt, ...) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(buf, cap, fmt, ap);
        va_end(ap);
        return 1;
    }
};

struct Ctx {
    ggml_context * ctx;
    explicit Ctx(size_t mb) {
        ggml_init_params p = { mb * 1024 * 1024, nullptr, false };
        ctx = ggml_init(p);
    }
    ~Ctx() { ggml_free(ctx); }
};

inline std::vector<float> gaussian(size_t n, uint32_t seed, float scale = 1.0f) {
    std::mt19937 rng(seed);
    std::normal_distribution<float> d(0.0f, scale);
    std::vector<float> v(n);
    for (auto & x : v) x = d(rng);
    return v;
}

inline void compute(ggml_context * ctx, ggml_tensor * out, int threads = 2) {
    ggml_cgraph * gf = ggml_new_graph(ctx);
    ggml_build_forward_expand(gf, out);
    ggml_graph_compute_with_ctx(ctx, gf, threads);
}

// Fill a tensor of any type from f32 values (quantizing through ggml's own traits).
inline void fill(ggml_tensor * t, const std::vector<float> & v) {
    if (t->type == GGML_TYPE_F32) {
        memcpy(t->data, v.data(), v.size() * sizeof(float));
    } else {
        ggml_quantize_chunk(t->type, v.data(), t->data, 0, ggml_nrows(t), t->ne[0], nullptr);
    }
}

// Decode any tensor to f32 values with ggml's to_float.
inline std::vector<float> decode(const ggml_tensor * t) {
    std::vector<float> out(ggml_nelements(t));
    if (t->type == GGML_TYPE_F32) {
        memcpy(out.data(), t->data, out.size() * sizeof(float));
    } else {
        ggml_get_type_traits(t->type)->to_float(t->data, out.data(), out.size());
    }
    return out;
}

// The turbo K terms of flash attention fa (tq-fa-contract.h) from their parts: T's cell
// columns [hd, n] and U's step columns [hd, TQ_FA_TERM_STEPS] into one table, the cells'
// positions P [n] and slots S [n] (NULL: all -1) into the cells input; R, RQ: the exact first
// keys or NULL.
inline void set_k_terms(ggml_context * ctx, ggml_tensor * fa, ggml_tensor * A, const ggml_tensor * T,
                        const ggml_tensor * P, const ggml_tensor * U, ggml_tensor * R = nullptr,
                        ggml_tensor * RQ = nullptr, const ggml_tensor * S = nullptr) {
    const int64_t hd = T->ne[0], n = T->ne[1];
    ggml_tensor * TU = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, hd, n + TQ_FA_TERM_STEPS);
    memcpy(TU->data, T->data, ggml_nbytes(T));
    memcpy((char *) TU->data + ggml_nbytes(T), U->data, ggml_nbytes(U));
    ggml_tensor * C = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n, 2);
    int32_t * c = (int32_t *) C->data;
    for (int64_t i = 0; i < n; ++i) {
        c[i] = ((const int32_t *) P->data)[i];
        c[n + i] = S ? ((const int32_t *) S->data)[i] : -1;
    }
    tq_flash_attn_ext_set_k_terms(fa, A, TU, C, R, RQ);
}

} // namespace tq_test
