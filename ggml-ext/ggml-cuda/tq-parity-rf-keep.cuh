// tq-parity-rf-keep.cuh - the fused K side's CUDA kernel (tq-cuda-rf-keep.cuh) against the
// CPU's function (tq_rf_keep_rows, tq-rf-rows.h), f32 bits. Included by tq-parity.cu after its
// CHECK macro. On the host the kernel's pair function runs for every (row, pair); on a GPU the
// kernel runs as ggml-cuda launches it. The shapes are test-backend-ops' cases of the node
// (ggml-ext/tests/tq-backend-ops.inc) plus 512-wide heads (more pairs than threads) and
// partial RoPE in both pairings.
#pragma once

#include "tq-cuda-rf-keep.cuh"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

struct tq_rf_parity_case {
    int64_t hd, nkv, g, nt, nb, n_rot;
    bool neox, bal, table, k_view;
};

// One case: fills q, k (a view with padded rows when k_view), the means and the table from a
// fixed seed, and compares the output's bits with tq_rf_keep_rows'.
static int check_rf_keep_case(const tq_rf_parity_case & c, bool device, int64_t & bad) {
    uint64_t s = 0x2545F4914F6CDD1Dull ^ (uint64_t) (c.hd * 131 + c.nt * 7 + c.nkv);
    auto next = [&]() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; };
    auto unif = [&](float lo, float hi) { return lo + (hi - lo) * (float) ((next() >> 40) * (1.0 / 16777216.0)); };
    const int64_t nq = c.nkv * c.g, krows = c.k_view ? 2 * c.nkv + 1 : c.nkv, koff = c.k_view ? (c.nkv + 1) * c.hd : 0;
    const int64_t F = (c.bal ? 2 : 1) * c.hd * c.nkv;
    std::vector<float> q(c.hd * nq * c.nt), k(c.hd * krows * c.nt), m(F * c.nb), tab(c.hd * c.nt);
    for (float & v : q) { v = unif(-1.0f, 1.0f); }
    for (float & v : k) { v = unif(-1.0f, 1.0f); }
    for (float & v : m) { v = unif(-0.5f, 0.5f); }
    for (int64_t t = 0; t < c.nt; ++t) {
        for (int64_t i = 0; i < c.hd / 2; ++i) {
            const float a = unif(-3.2f, 3.2f);
            tab[t * c.hd + i] = cosf(a);
            tab[t * c.hd + c.hd / 2 + i] = sinf(a);
        }
    }
    const int64_t nout = c.hd * (c.nkv + 2 * nq) * c.nt;
    std::vector<float> want(nout, NAN), got(nout, NAN);
    const tq_rf_pairs pr = { c.neox, c.n_rot };
    tq_rf_keep_args a = {};
    a.hd = c.hd;
    a.nkv = c.nkv;
    a.nt = c.nt;
    a.nq = nq;
    a.per = c.nt / c.nb;
    a.q_nb1 = c.hd * sizeof(float);
    a.q_nb2 = c.hd * nq * sizeof(float);
    a.k_nb1 = c.hd * sizeof(float);
    a.k_nb2 = c.hd * krows * sizeof(float);
    a.m_nb1 = F * sizeof(float);
    a.t_nb1 = c.hd * sizeof(float);
    a.flags = tq_rf_pairs_bits(pr, c.hd) | (c.bal ? TQ_RF_KEEP_BAL : 0u);
    a.q = q.data();
    a.k = k.data() + koff;
    a.m = m.data();
    a.tab = c.table ? tab.data() : nullptr;
    a.d = want.data();
    tq_rf_keep_rows(a, 0, 1);
    if (!device) {
        a.d = got.data();
        for (int64_t r = 0; r < c.nkv * c.nt; ++r) {
            for (int64_t i = 0; i < c.hd / 2; ++i) {
                tq_cuda_rf_keep_pair(a, r % c.nkv, r / c.nkv, i);
            }
        }
    } else {
        float * dq, * dk, * dm, * dt, * dd;
        CHECK(cudaMalloc(&dq, q.size() * sizeof(float)));
        CHECK(cudaMalloc(&dk, k.size() * sizeof(float)));
        CHECK(cudaMalloc(&dm, m.size() * sizeof(float)));
        CHECK(cudaMalloc(&dt, tab.size() * sizeof(float)));
        CHECK(cudaMalloc(&dd, nout * sizeof(float)));
        CHECK(cudaMemcpy(dq, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dk, k.data(), k.size() * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dm, m.data(), m.size() * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(dt, tab.data(), tab.size() * sizeof(float), cudaMemcpyHostToDevice));
        CHECK(cudaMemset(dd, 0xff, nout * sizeof(float)));
        a.q = dq;
        a.k = dk + koff;
        a.m = dm;
        a.tab = c.table ? dt : nullptr;
        a.d = dd;
        if (!tq_cuda_rf_keep_grid_ok(a)) {
            fprintf(stderr, "rf_keep: grid refused for hd %lld\n", (long long) c.hd);
            return 2;
        }
        tq_cuda_rf_keep_launch(a, 0);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(got.data(), dd, nout * sizeof(float), cudaMemcpyDeviceToHost));
        CHECK(cudaFree(dq));
        CHECK(cudaFree(dk));
        CHECK(cudaFree(dm));
        CHECK(cudaFree(dt));
        CHECK(cudaFree(dd));
    }
    for (int64_t i = 0; i < nout; ++i) {
        if (memcmp(&want[i], &got[i], sizeof(float)) != 0) {
            if (bad++ < 5) {
                fprintf(stderr, "%s rf_keep hd %lld nkv %lld g %lld nt %lld n_rot %lld neox %d bal %d table %d: value %lld: cpu %a cuda %a\n",
                        device ? "device" : "host", (long long) c.hd, (long long) c.nkv, (long long) c.g, (long long) c.nt,
                        (long long) c.n_rot, c.neox, c.bal, c.table, (long long) i, want[i], got[i]);
            }
        }
    }
    return 0;
}

static int check_rf_keep(bool device, int & failures) {
    const tq_rf_parity_case cases[] = {
        { 64, 3, 3, 1, 1, 0, false, true, false, false },
        { 64, 3, 3, 1, 1, 0, false, true, true, false },
        { 64, 3, 3, 4, 1, 0, false, true, false, true },
        { 64, 2, 4, 6, 2, 0, true, true, true, false },
        { 64, 2, 2, 3, 3, 0, true, true, false, true },
        { 64, 2, 2, 5, 1, 32, true, true, true, false },
        { 64, 2, 2, 5, 1, 32, false, true, true, false },
        { 128, 4, 1, 5, 1, 0, true, false, true, false },
        { 256, 1, 8, 2, 1, 0, true, true, false, false },
        { 512, 2, 4, 3, 1, 128, true, true, true, true },
    };
    int64_t bad = 0, values = 0;
    for (const tq_rf_parity_case & c : cases) {
        const int rc = check_rf_keep_case(c, device, bad);
        if (rc) {
            return rc;
        }
        values += c.hd * (c.nkv + 2 * c.nkv * c.g) * c.nt;
    }
    printf("%s rf_keep: %zu cases, %lld values, %lld differ from tq_rf_keep_rows\n", device ? "device" : "host  ",
           sizeof(cases) / sizeof(cases[0]), (long long) values, (long long) bad);
    failures += bad != 0;
    return 0;
}
