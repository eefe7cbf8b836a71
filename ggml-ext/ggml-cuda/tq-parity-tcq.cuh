// tq-parity-tcq.cuh - the trellis half of tq-parity.cu: the CUDA trellis encoder
// (tq-tcq-encode.cuh, one block per warp) and decoder (tq-tcq.cuh) against the Rust codec
// (tq_quantize / tq_dequantize with TQ_TURBO3_TCQ / TQ_TURBO2_TCQ), bytes and f32 bits.
// Included by tq-parity.cu after its CHECK macro and make_vectors(); on the host the warp is
// emulated lane by lane (tq-tcq-encode.cuh), on a GPU it runs as a warp.
#pragma once

#include "tq-tcq-encode.cuh"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

// g_tcq_ties: exact ties in the group minima that the host build resolved (finite costs
// only), counted by the TQ_TCQ_ON_TIE that tq-parity.cu defines before the CUDA headers.

template <int K>
__global__ void tcq_quantize_kernel(const float * x, char * out, int64_t nblocks) {
    typedef typename tq_tcq_type<K>::block block;
    __shared__ tq_tcq_scratch<K> sc[4]; // blockDim.x == 128: one per warp
    const int w = threadIdx.x / 32;
    for (int64_t b = (int64_t) blockIdx.x * 4 + w; b < nblocks; b += (int64_t) gridDim.x * 4) {
        tq_tcq_quantize_warp<K>(x + b * TQ_BLOCK_VALUES, (block *) out + b, sc[w]);
    }
}

template <int K>
__global__ void tcq_dequantize_kernel(const char * in, float * y, int64_t nblocks) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; // one pair per thread
    if (i < nblocks * TQ_BLOCK_VALUES / 2) {
        const int64_t ib = i / (TQ_BLOCK_VALUES / 2);
        const int iqs = (int) (i % (TQ_BLOCK_VALUES / 2));
        float2 v;
        tq_tcq_dequantize<K>(in, ib, iqs, v);
        y[ib * TQ_BLOCK_VALUES + iqs] = v.x;
        y[ib * TQ_BLOCK_VALUES + iqs + TQ_BLOCK_VALUES / 2] = v.y;
    }
}

// Blocks aimed at the trellis search on top of the shared vectors: exact decodings of random
// paths at several scales (a zero-cost path exists), constant blocks, values on a coarse grid,
// one-hot blocks and blocks with most values zero (costs tie between complementary states).
template <int K>
static void add_tcq_vectors(std::vector<float> & v) {
    uint64_t s = 0xD1B54A32D192ED03ull + K;
    auto next = [&]() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; };
    const float * T = tq_host::TQ_TCQ3_TABLE;
    if (K == 2) { T = tq_host::TQ_TCQ2_TABLE; }
    const float scales[] = {1e-3f, 1.0f, 0.37f, 3e4f};
    for (float sc : scales) {
        for (int b = 0; b < 100; ++b) {
            uint8_t qs[8 * K];
            for (int i = 0; i < 8 * K; ++i) { qs[i] = (uint8_t) next(); }
            for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
                v.push_back(sc * T[tq_tcq_state<K>(qs, j)]);
            }
        }
    }
    for (int b = 0; b < 64; ++b) { // constant
        const float c = (b % 2 ? -1.0f : 1.0f) * (float) (b + 1) * 0.25f;
        for (int j = 0; j < TQ_BLOCK_VALUES; ++j) { v.push_back(c); }
    }
    for (int b = 0; b < 300; ++b) { // grid {-2, -1, 0, 1, 2} * c
        const float c = b % 3 == 0 ? 1.0f : b % 3 == 1 ? 0.5f : 1e-20f;
        for (int j = 0; j < TQ_BLOCK_VALUES; ++j) { v.push_back(c * (float) ((int) (next() % 5) - 2)); }
    }
    for (int b = 0; b < 128; ++b) { // one-hot, and mostly zero
        for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
            const bool on = b < 64 ? j == b : (next() % 16) == 0;
            v.push_back(on ? (b % 2 ? -3.0f : 2.0f) : 0.0f);
        }
    }
}

template <int K>
static int check_tcq(const std::vector<float> & shared, bool device, int & failures) {
    typedef typename tq_tcq_type<K>::block block;
    const int id = K == 3 ? TQ_TURBO3_TCQ : TQ_TURBO2_TCQ;
    const char * name = K == 3 ? "turbo3_tcq" : "turbo2_tcq";
    std::vector<float> x = shared;
    add_tcq_vectors<K>(x);
    const int64_t n = (int64_t) x.size();
    const int64_t nb = n / TQ_BLOCK_VALUES;
    const size_t bytes = nb * sizeof(block);

    std::vector<char> cpu(bytes), gpu(bytes);
    if (tq_quantize(id, x.data(), cpu.data(), n) != TQ_OK) {
        fprintf(stderr, "tq_quantize(%s) failed\n", name);
        return 2;
    }
    const int64_t ties0 = g_tcq_ties;
    if (device) {
        float * dx; char * dq;
        CHECK(cudaMalloc(&dx, n * sizeof(float)));
        CHECK(cudaMalloc(&dq, bytes));
        CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        tcq_quantize_kernel<K><<<(unsigned) ((nb + 3) / 4 < 4096 ? (nb + 3) / 4 : 4096), 128>>>(dx, dq, nb);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(gpu.data(), dq, bytes, cudaMemcpyDeviceToHost));
        cudaFree(dx); cudaFree(dq);
    } else {
        tq_tcq_scratch<K> sc;
        for (int64_t b = 0; b < nb; ++b) {
            tq_tcq_quantize_warp<K>(x.data() + b * TQ_BLOCK_VALUES, (block *) gpu.data() + b, sc);
        }
    }
    int64_t bad_blocks = 0;
    for (int64_t b = 0; b < nb; ++b) {
        if (memcmp(cpu.data() + b * sizeof(block), gpu.data() + b * sizeof(block), sizeof(block)) != 0) {
            if (bad_blocks < 5) {
                fprintf(stderr, "%s %s: block %lld differs (first value %g)\n", device ? "device" : "host", name, (long long) b, x[b * TQ_BLOCK_VALUES]);
            }
            ++bad_blocks;
        }
    }

    // Decode: the encoded blocks, random payloads (every state pattern) with random finite
    // scales, and the encoded blocks with corrupt scales, which both sides read as 0.
    std::vector<char> enc = cpu;
    uint64_t s = 0x2545F4914F6CDD1Dull;
    auto next = [&]() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; };
    for (int b = 0; b < 4096; ++b) {
        block blk;
        for (size_t i = 0; i < sizeof(blk.qs); ++i) { blk.qs[i] = (uint8_t) next(); }
        blk.d = (uint16_t) (next() % 0x7c00); // every finite non-negative fp16, subnormals included
        enc.insert(enc.end(), (const char *) &blk, (const char *) &blk + sizeof(block));
    }
    const uint16_t corrupt[] = {0x7e00, 0x7c00, 0xfc00, 0xbc00, 0x8000, 0x8001};
    for (uint16_t c : corrupt) {
        for (int64_t b = 0; b < 64 && b < nb; ++b) {
            block blk;
            memcpy(&blk, cpu.data() + b * sizeof(block), sizeof(block));
            blk.d = c;
            enc.insert(enc.end(), (const char *) &blk, (const char *) &blk + sizeof(block));
        }
    }
    const int64_t nb2 = (int64_t) (enc.size() / sizeof(block));
    const int64_t n2 = nb2 * TQ_BLOCK_VALUES;
    std::vector<float> ycpu(n2), ygpu(n2);
    if (tq_dequantize(id, enc.data(), ycpu.data(), n2) != TQ_OK) {
        fprintf(stderr, "tq_dequantize(%s) failed\n", name);
        return 2;
    }
    if (device) {
        char * de; float * dy;
        CHECK(cudaMalloc(&de, enc.size()));
        CHECK(cudaMalloc(&dy, n2 * sizeof(float)));
        CHECK(cudaMemcpy(de, enc.data(), enc.size(), cudaMemcpyHostToDevice));
        tcq_dequantize_kernel<K><<<(unsigned) ((n2 / 2 + 255) / 256), 256>>>(de, dy, nb2);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(ygpu.data(), dy, n2 * sizeof(float), cudaMemcpyDeviceToHost));
        cudaFree(de); cudaFree(dy);
    } else {
        for (int64_t ib = 0; ib < nb2; ++ib) {
            for (int iqs = 0; iqs < TQ_BLOCK_VALUES / 2; ++iqs) {
                float2 v;
                tq_tcq_dequantize<K>(enc.data(), ib, iqs, v);
                ygpu[ib * TQ_BLOCK_VALUES + iqs] = v.x;
                ygpu[ib * TQ_BLOCK_VALUES + iqs + TQ_BLOCK_VALUES / 2] = v.y;
            }
        }
    }
    int64_t bad_values = 0;
    for (int64_t i = 0; i < n2; ++i) {
        if (memcmp(&ycpu[i], &ygpu[i], sizeof(float)) != 0) {
            if (bad_values < 5) {
                fprintf(stderr, "%s %s: decoded value %lld: rust %a cuda %a\n", device ? "device" : "host", name, (long long) i, ycpu[i], ygpu[i]);
            }
            ++bad_values;
        }
    }
    // The attention kernels read eight states from one 32-bit window (tq_tcq_window): they
    // must be the states the decoder just checked reads one at a time.
    int64_t bad_window = 0;
    for (int64_t b = 0; b < nb2; ++b) {
        const block * blk = (const block *) enc.data() + b;
        for (int g = 0; g < 8; ++g) {
            const uint32_t w = tq_tcq_window<K>(blk->qs, g);
            for (int j = 0; j < 8; ++j) {
                bad_window += tq_tcq_window_state<K>(w, j) != tq_tcq_state<K>(blk->qs, 8 * g + j);
            }
        }
    }
    if (bad_window) {
        fprintf(stderr, "%s: %lld states read from the 32-bit windows differ\n", name, (long long) bad_window);
    }
    failures += bad_window != 0;
    if (!device) {
        // The vectors must make the search resolve exact ties (strict <, lowest hi), or the
        // tie rule would go untested.
        const int64_t ties = g_tcq_ties - ties0;
        printf("host   %s: %lld exact ties of finite path costs resolved in the group minima\n", name, (long long) ties);
        if (ties == 0) {
            fprintf(stderr, "%s: no exact ties in the group minima: the tie rule is untested\n", name);
            failures += 1;
        }
    }
    printf("%s %s: %lld blocks encoded, %lld differ; %lld values decoded, %lld differ\n",
           device ? "device" : "host  ", name, (long long) nb, (long long) bad_blocks, (long long) n2, (long long) bad_values);
    failures += bad_blocks != 0 || bad_values != 0;
    return 0;
}
