// tq-parity.cu - the CUDA codec against the Rust codec, byte for byte.
//
// Encodes shared test vectors with the Rust encoder (tq_quantize, libturboquant_capi.a) and with
// the CUDA port (tq-cuda.cuh, one thread per block as in SET_ROWS), and compares the bytes;
// then decodes the same blocks (plus blocks with corrupt scales) on both sides and compares
// the f32 bits. Exit status 0 only if everything is identical.
//
//   nvcc -std=c++17 -arch=sm_90 -use_fast_math -Xcompiler -ffp-contract=off
//        -I ggml-ext/abi -I ggml-ext/ggml -I ggml-ext/ggml-cuda ggml-ext/ggml-cuda/tq-parity.cu
//        target/release/libturboquant_capi.a -lpthread -ldl -lm -o tq-parity     (one command)
//   tq-parity           # on the GPU (and on the host too)
//   tq-parity --host    # the same source compiled for the host only: runs without a GPU (CI)
//
// Built with ggml's own `-use_fast_math` on purpose: the encoder must stay exact under it.
// The trellis types: tq-parity-tcq.cuh (it counts the exact ties the host search resolves).
// The fused K side's kernel against the CPU's function: tq-parity-rf-keep.cuh.
#include <stdint.h>
static int64_t g_tcq_ties = 0;
#ifndef __CUDA_ARCH__
#define TQ_TCQ_ON_TIE(cost) (g_tcq_ties += (cost) != INFINITY)
#endif
#include "tq-cuda.cuh"
#include "tq-fattn-gqa-decode.cuh"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#define CHECK(call)                                                                      \
    do {                                                                                 \
        cudaError_t err_ = (call);                                                       \
        if (err_ != cudaSuccess) {                                                       \
            fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(err_), __FILE__, __LINE__); \
            return 2;                                                                    \
        }                                                                                \
    } while (0)

template <int bits>
__global__ void quantize_kernel(const float * x, char * out, int64_t nblocks) {
    typedef typename tq_cuda_type<bits>::block block;
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    if (i < nblocks) {
        tq_cuda_quantize_block<bits>(x + i * TQ_BLOCK_VALUES, (block *) out + i);
    }
}

template <int bits>
__global__ void dequantize_kernel(const char * in, float * y, int64_t nblocks) {
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x; // one pair per thread
    if (i < nblocks * TQ_BLOCK_VALUES / 2) {
        const int64_t ib = i / (TQ_BLOCK_VALUES / 2);
        const int iqs = (int) (i % (TQ_BLOCK_VALUES / 2));
        float2 v;
        tq_cuda_dequantize<bits>(in, ib, iqs, v);
        y[ib * TQ_BLOCK_VALUES + iqs] = v.x;
        y[ib * TQ_BLOCK_VALUES + iqs + TQ_BLOCK_VALUES / 2] = v.y;
    }
}

// The GQA flash-attention kernel's row decode (tq-fattn-gqa-decode.cuh): thread i reads slot
// i % 8 of block i / 8 with the shuffle codebook, as in the kernel; every lane of a warp runs
// the lookup (the shuffle needs them all), only those with a block store.
template <int bits>
__global__ void gqa_dequantize_kernel(const char * in, float * y, int64_t nblocks) {
    typedef typename tq_cuda_type<bits>::block block;
    const int64_t i = (int64_t) blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t b = i / TQ_GQA_SLOTS < nblocks ? i / TQ_GQA_SLOTS : nblocks - 1;
    const int u = (int) (i % TQ_GQA_SLOTS);
    const tq_gqa_codebook<bits> cb;
    float scale, vals[TQ_GQA_SLOT_VALUES];
    tq_gqa_load_turbo<bits>((const block *) in + b, u, cb, scale, vals);
    if (i / TQ_GQA_SLOTS < nblocks) {
        for (int e = 0; e < TQ_GQA_SLOT_VALUES; ++e) {
            y[b * TQ_BLOCK_VALUES + tq_gqa_pos<bits>(u, e)] = tq_fmul(scale, vals[e]);
        }
    }
}

// The same on the host; also counts positions not written exactly once (the slots must
// cover the block).
template <int bits>
static int64_t host_gqa_dequantize(const char * in, float * y, int64_t nblocks) {
    typedef typename tq_cuda_type<bits>::block block;
    const tq_gqa_codebook<bits> cb;
    int64_t bad_cover = 0;
    for (int64_t b = 0; b < nblocks; ++b) {
        int seen[TQ_BLOCK_VALUES] = {0};
        for (int u = 0; u < TQ_GQA_SLOTS; ++u) {
            float scale, vals[TQ_GQA_SLOT_VALUES];
            tq_gqa_load_turbo<bits>((const block *) in + b, u, cb, scale, vals);
            for (int e = 0; e < TQ_GQA_SLOT_VALUES; ++e) {
                const int j = tq_gqa_pos<bits>(u, e);
                seen[j] += 1;
                y[b * TQ_BLOCK_VALUES + j] = tq_fmul(scale, vals[e]);
            }
        }
        for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
            bad_cover += seen[j] != 1;
        }
    }
    return bad_cover;
}

// The block norm exactly as the encoder computes it (sequential sum of squares in double).
static double block_norm(const float * x) {
    double ss = 0.0;
    for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
        const double v = tq_cuda_widen(x[j]);
        ss += v * v;
    }
    return sqrt(ss);
}

// Adversarial blocks for the f32 classification: 24 values placed within a few f32 ulps of
// a threshold (x_j = t_j * n, refined against the block's own norm, then nudged by -3..+3
// ulps; the threshold 0 gives +-subnormals, which -use_fast_math flushes), 40 filler values
// carrying the rest of the norm.
template <int bits, typename Rng>
static void add_near_threshold(std::vector<float> & v, Rng & next) {
    constexpr int levels = 1 << bits;
    const float * thr = tq_host::TQ_THRESHOLDS_4BIT;
    if (bits == 2) { thr = tq_host::TQ_THRESHOLDS_2BIT; }
    if (bits == 3) { thr = tq_host::TQ_THRESHOLDS_3BIT; }
    const float scales[] = {1e-3f, 1.0f, 300.0f};
    for (float sc : scales) {
        for (int trial = 0; trial < 40; ++trial) {
            float x[TQ_BLOCK_VALUES];
            double mass = 0.0;
            for (int j = 0; j < 24; ++j) {
                const double t = thr[(j + trial) % (levels - 1)];
                mass += t * t;
            }
            const float fill = (float) sqrt((1.0 - mass) / 40.0);
            for (int j = 24; j < TQ_BLOCK_VALUES; ++j) {
                x[j] = sc * fill * ((next() & 1) ? 1.0f : -1.0f);
            }
            for (int j = 0; j < 24; ++j) {
                x[j] = sc * thr[(j + trial) % (levels - 1)];
            }
            for (int it = 0; it < 4; ++it) {
                const double n = block_norm(x);
                for (int j = 0; j < 24; ++j) {
                    x[j] = (float) ((double) thr[(j + trial) % (levels - 1)] * n);
                }
            }
            for (int j = 0; j < 24; ++j) {
                const int nudge = (int) (next() % 7) - 3;
                for (int k = 0; k < (nudge < 0 ? -nudge : nudge); ++k) {
                    x[j] = nextafterf(x[j], nudge < 0 ? -INFINITY : INFINITY);
                }
            }
            v.insert(v.end(), x, x + TQ_BLOCK_VALUES);
        }
    }
}

// Exact ties: blocks whose norm is exactly 2^e and one value is exactly t * 2^e for a
// threshold t, so x/n == t in double and the rule sends it to the lower centroid. The other
// values y1..y4 are chosen greedily (in long double, exact for these magnitudes) so that
// t^2 + y1^2 + ... + y4^2 is 1 to about 2^-80; a candidate is kept only if the encoder's own
// sequential double sum (which rounds along the way) gives exactly 1.
template <int bits>
static void add_ties(std::vector<float> & v) {
    constexpr int levels = 1 << bits;
    const float * thr = tq_host::TQ_THRESHOLDS_4BIT;
    if (bits == 2) { thr = tq_host::TQ_THRESHOLDS_2BIT; }
    if (bits == 3) { thr = tq_host::TQ_THRESHOLDS_3BIT; }
    for (int t = 0; t < levels - 1; ++t) {
        if (thr[t] == 0.0f) {
            continue;
        }
        for (int attempt = 0; attempt < 16; ++attempt) {
            // the largest filler 0..7 ulps below its greedy value: other rounding paths
            const float sign = attempt % 2 ? -1.0f : 1.0f;
            float y[5] = {sign * thr[t], 0, 0, 0, 0};
            long double r = 1.0L - (long double) y[0] * y[0];
            for (int i = 1; i < 5; ++i) {
                float c = (float) sqrtl(r > 0 ? r : 0);
                while ((long double) c * c > r) {
                    c = nextafterf(c, 0.0f);
                }
                for (int k = 0; i == 1 && k < attempt / 2; ++k) {
                    c = nextafterf(c, 0.0f);
                }
                y[i] = c;
                r -= (long double) c * c;
            }
            for (float e : {0x1p-20f, 1.0f, 0x1p20f}) {
                for (int order = 0; order < 2; ++order) {
                    float x[TQ_BLOCK_VALUES] = {0};
                    for (int i = 0; i < 5; ++i) {
                        x[order ? 4 - i : 9 * i] = y[i] * e;
                    }
                    const double n = block_norm(x);
                    const float x0 = y[0] * e;
                    if (n == (double) e && (double) x0 / n == (double) y[0]) {
                        v.insert(v.end(), x, x + TQ_BLOCK_VALUES);
                    }
                }
            }
        }
    }
}

// How the f32 classification fared on these vectors: values it sent to the double path,
// among them the ones where the f32 decision alone would have been wrong, and exact ties.
template <int bits>
static void classify_stats(const std::vector<float> & x, int64_t & slow, int64_t & f32_wrong, int64_t & ties) {
    constexpr int levels = 1 << bits;
    const float * thr = tq_cuda_thresholds<bits>();
    slow = f32_wrong = ties = 0;
    for (size_t b = 0; b < x.size() / TQ_BLOCK_VALUES; ++b) {
        const float * xb = x.data() + b * TQ_BLOCK_VALUES;
        const double n = block_norm(xb);
        if (n == 0.0 || !std::isfinite(n)) {
            continue;
        }
        const float rf = tq_cuda_recip_f32(n);
        tq_cuda_thr<bits> th; // the plain candidate's thresholds, where the ties are
        tq_cuda_scaled_thresholds<bits>(TQ_GAIN_PLAIN, th);
        for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
            bool s;
            const int k = tq_cuda_classify<bits>(xb[j], n, rf, th, s);
            slow += s;
            const double u = tq_cuda_widen(xb[j]) / n;
            float xs = xb[j];
            if (std::isnan(xs)) { xs = 0.0f; }
            if (std::isinf(xs)) { xs = xs > 0 ? 65504.0f : -65504.0f; }
            const float uf = xs * rf;
            int kf = 0;
            for (int t = 0; t < levels - 1; ++t) {
                kf += uf > thr[t];
                ties += thr[t] != 0.0f && u == (double) thr[t];
            }
            f32_wrong += rf != 0.0f && kf != k;
        }
    }
}

// Test vectors: Gaussian blocks at scales from 1e-30 to 1e30, heavy tails, sparse blocks,
// and every special value the encoder has a rule for.
static std::vector<float> make_vectors() {
    uint64_t s = 0x9E3779B97F4A7C15ull;
    auto next = [&]() { s ^= s << 13; s ^= s >> 7; s ^= s << 17; return s; };
    auto unif = [&]() { return ((next() >> 11) + 0.5) * (1.0 / 9007199254740992.0); };
    auto gauss = [&]() { return (float) (sqrt(-2.0 * log(unif())) * cos(6.283185307179586 * unif())); };

    std::vector<float> v;
    const float scales[] = {1e-30f, 1e-6f, 1e-3f, 0.02f, 1.0f, 7.5f, 300.0f, 6e4f, 1e30f};
    for (float sc : scales) {
        for (int b = 0; b < 400; ++b) {
            for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
                v.push_back(sc * gauss());
            }
        }
    }
    for (int b = 0; b < 400; ++b) { // heavy tails and per-channel offsets, like real keys
        for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
            const float g = gauss();
            v.push_back(g * g * g + (j % 7 == 0 ? 5.0f : 0.0f));
        }
    }
    for (int b = 0; b < 200; ++b) { // sparse: one to three nonzero values
        for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
            v.push_back((j == b % 64 || j == (b * 7) % 64 || (b % 3 == 0 && j == 5)) ? gauss() : 0.0f);
        }
    }
    for (int b = 0; b < 8000; ++b) { // volume: Gaussian blocks at log-uniform scales 1e-20 .. 1e20
        const float sc = (float) pow(10.0, -20.0 + 40.0 * unif());
        for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
            v.push_back(sc * gauss());
        }
    }
    add_near_threshold<2>(v, next);
    add_near_threshold<3>(v, next);
    add_near_threshold<4>(v, next);
    add_ties<2>(v);
    add_ties<3>(v);
    add_ties<4>(v);
    const float nan = std::nanf(""), inf = INFINITY;
    const float specials[][4] = {
        {0.0f, 0.0f, 0.0f, 0.0f}, {-0.0f, 0.0f, -0.0f, 0.0f}, {nan, nan, nan, nan},
        {inf, 1.0f, -1.0f, 0.5f}, {-inf, inf, 0.0f, 2.0f}, {nan, 1.0f, inf, -3.0f},
        {1e-45f, -1e-45f, 1e-40f, 3e-39f}, {1e-40f, 0.0f, 0.0f, 0.0f}, {65504.0f, -65504.0f, 1.0f, 0.0f},
        {3.4e38f, -3.4e38f, 3.4e38f, 1.0f}, {1.0f, 1.0f, 1.0f, 1.0f},
    };
    for (const auto & sp : specials) {
        for (int j = 0; j < TQ_BLOCK_VALUES; ++j) {
            v.push_back(sp[j % 4] * (j < 32 ? 1.0f : (j % 2 ? -1.0f : 1.0f)));
        }
    }
    return v;
}

// The same codec functions run on the host: encode into out, decode into y.
template <int bits>
static void host_quantize(const std::vector<float> & x, char * out) {
    typedef typename tq_cuda_type<bits>::block block;
    for (size_t b = 0; b < x.size() / TQ_BLOCK_VALUES; ++b) {
        tq_cuda_quantize_block<bits>(x.data() + b * TQ_BLOCK_VALUES, (block *) out + b);
    }
}
template <int bits>
static void host_dequantize(const char * in, float * y, int64_t nblocks) {
    for (int64_t ib = 0; ib < nblocks; ++ib) {
        for (int iqs = 0; iqs < TQ_BLOCK_VALUES / 2; ++iqs) {
            float2 v;
            tq_cuda_dequantize<bits>(in, ib, iqs, v);
            y[ib * TQ_BLOCK_VALUES + iqs] = v.x;
            y[ib * TQ_BLOCK_VALUES + iqs + TQ_BLOCK_VALUES / 2] = v.y;
        }
    }
}

template <int bits>
static int check_type(const std::vector<float> & x, bool device, int & failures) {
    typedef typename tq_cuda_type<bits>::block block;
    const int64_t n = (int64_t) x.size();
    const int64_t nb = n / TQ_BLOCK_VALUES;
    const size_t bytes = nb * sizeof(block);

    std::vector<char> cpu(bytes), gpu(bytes);
    if (tq_quantize(bits, x.data(), cpu.data(), n) != TQ_OK) {
        fprintf(stderr, "tq_quantize failed\n");
        return 2;
    }

    if (device) {
        float * dx; char * dq;
        CHECK(cudaMalloc(&dx, n * sizeof(float)));
        CHECK(cudaMalloc(&dq, bytes));
        CHECK(cudaMemcpy(dx, x.data(), n * sizeof(float), cudaMemcpyHostToDevice));
        quantize_kernel<bits><<<(nb + 127) / 128, 128>>>(dx, dq, nb);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(gpu.data(), dq, bytes, cudaMemcpyDeviceToHost));
        cudaFree(dx); cudaFree(dq);
    } else {
        host_quantize<bits>(x, gpu.data());
    }

    int64_t bad_blocks = 0;
    for (int64_t b = 0; b < nb; ++b) {
        if (memcmp(cpu.data() + b * sizeof(block), gpu.data() + b * sizeof(block), sizeof(block)) != 0) {
            if (bad_blocks < 5) {
                fprintf(stderr, "%s turbo%d: block %lld differs (first value %g)\n", device ? "device" : "host", bits, (long long) b, x[b * TQ_BLOCK_VALUES]);
            }
            ++bad_blocks;
        }
    }

    // Decode: the encoded blocks, then the same blocks with corrupt scales (NaN, +-Inf,
    // negative, negative zero), which both decoders must read as 0.
    std::vector<char> enc = cpu;
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
    if (tq_dequantize(bits, enc.data(), ycpu.data(), n2) != TQ_OK) {
        fprintf(stderr, "tq_dequantize failed\n");
        return 2;
    }
    if (device) {
        char * de; float * dy2;
        CHECK(cudaMalloc(&de, enc.size()));
        CHECK(cudaMalloc(&dy2, n2 * sizeof(float)));
        CHECK(cudaMemcpy(de, enc.data(), enc.size(), cudaMemcpyHostToDevice));
        dequantize_kernel<bits><<<(n2 / 2 + 255) / 256, 256>>>(de, dy2, nb2);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(ygpu.data(), dy2, n2 * sizeof(float), cudaMemcpyDeviceToHost));
        cudaFree(de); cudaFree(dy2);
    } else {
        host_dequantize<bits>(enc.data(), ygpu.data(), nb2);
    }
    int64_t bad_values = 0;
    for (int64_t i = 0; i < n2; ++i) {
        if (memcmp(&ycpu[i], &ygpu[i], sizeof(float)) != 0) {
            if (bad_values < 5) {
                fprintf(stderr, "%s turbo%d: decoded value %lld: rust %a cuda %a\n", device ? "device" : "host", bits, (long long) i, ycpu[i], ygpu[i]);
            }
            ++bad_values;
        }
    }
    // The GQA kernel's decode path: same values, bit for bit, corrupt scales included.
    std::vector<float> ygqa(n2, -1.0f);
    int64_t bad_cover = 0;
    if (device) {
        char * de; float * dy2;
        CHECK(cudaMalloc(&de, enc.size()));
        CHECK(cudaMalloc(&dy2, n2 * sizeof(float)));
        CHECK(cudaMemcpy(de, enc.data(), enc.size(), cudaMemcpyHostToDevice));
        gqa_dequantize_kernel<bits><<<(nb2 * TQ_GQA_SLOTS + 255) / 256, 256>>>(de, dy2, nb2);
        CHECK(cudaGetLastError());
        CHECK(cudaMemcpy(ygqa.data(), dy2, n2 * sizeof(float), cudaMemcpyDeviceToHost));
        cudaFree(de); cudaFree(dy2);
    } else {
        bad_cover = host_gqa_dequantize<bits>(enc.data(), ygqa.data(), nb2);
    }
    int64_t bad_gqa = 0;
    for (int64_t i = 0; i < n2; ++i) {
        if (memcmp(&ycpu[i], &ygqa[i], sizeof(float)) != 0) {
            if (bad_gqa < 5) {
                fprintf(stderr, "%s turbo%d: GQA kernel decode of value %lld: rust %a cuda %a\n", device ? "device" : "host", bits, (long long) i, ycpu[i], ygqa[i]);
            }
            ++bad_gqa;
        }
    }
    printf("%s turbo%d: GQA kernel row decode: %lld values, %lld differ, %lld positions not covered once\n",
           device ? "device" : "host  ", bits, (long long) n2, (long long) bad_gqa, (long long) bad_cover);
    failures += bad_gqa != 0 || bad_cover != 0;

    // The flash-attention kernels unpack 4 or 8 indices at a time (tq_cuda_indices): they must
    // agree with the one-at-a-time unpacking the decoder above was just checked with.
    int64_t bad_unpack = 0;
    for (int64_t b = 0; b < nb; ++b) {
        const block * blk = (const block *) cpu.data() + b;
        for (int j0 = 0; j0 < TQ_BLOCK_VALUES; j0 += 4) {
            const uint32_t four = tq_cuda_indices<bits, 4>(blk->qs, j0);
            const uint32_t eight = j0 % 8 == 0 ? tq_cuda_indices<bits, 8>(blk->qs, j0) : 0;
            for (int i = 0; i < 4; ++i) {
                const uint32_t want = tq_cuda_index<bits>(blk->qs, j0 + i);
                bad_unpack += ((four >> (4 * i)) & 15) != want;
            }
            for (int i = 0; j0 % 8 == 0 && i < 8; ++i) {
                bad_unpack += ((eight >> (4 * i)) & 15) != (uint32_t) tq_cuda_index<bits>(blk->qs, j0 + i);
            }
        }
    }
    if (bad_unpack) {
        fprintf(stderr, "turbo%d: %lld indices unpacked 4/8 at a time differ\n", bits, (long long) bad_unpack);
    }
    failures += bad_unpack != 0;

    if (!device) {
        // The adversarial vectors must reach the double fallback, including values where f32
        // alone decides wrong, and exact ties; otherwise they test nothing.
        int64_t slow, wrong, ties;
        classify_stats<bits>(x, slow, wrong, ties);
        printf("host   turbo%d: %lld of %lld values classified in double (%lld of them wrong in f32 alone, %lld exact ties)\n",
               bits, (long long) slow, (long long) n, (long long) wrong, (long long) ties);
        if (wrong == 0 || ties == 0) {
            fprintf(stderr, "turbo%d: the adversarial vectors no longer reach the fallback\n", bits);
            failures += 1;
        }
    }
    printf("%s turbo%d: %lld blocks encoded, %lld differ; %lld values decoded, %lld differ\n",
           device ? "device" : "host  ", bits, (long long) nb, (long long) bad_blocks, (long long) n2, (long long) bad_values);
    failures += bad_blocks != 0 || bad_values != 0;
    return 0;
}

#include "tq-parity-tcq.cuh"
#include "tq-parity-rf-keep.cuh"

int main(int argc, char ** argv) {
    const bool host_only = argc > 1 && strcmp(argv[1], "--host") == 0;
    int ndev = 0;
    if (!host_only && (cudaGetDeviceCount(&ndev) != cudaSuccess || ndev == 0)) {
        fprintf(stderr, "tq-parity: no CUDA device (pass --host to check the host build alone)\n");
        return 2;
    }
    const std::vector<float> x = make_vectors();
    int failures = 0;
    for (bool device : {false, true}) {
        if (device && host_only) {
            break;
        }
        int rc = check_type<2>(x, device, failures);
        rc = rc ? rc : check_type<3>(x, device, failures);
        rc = rc ? rc : check_type<4>(x, device, failures);
        rc = rc ? rc : check_tcq<3>(x, device, failures);
        rc = rc ? rc : check_tcq<2>(x, device, failures);
        rc = rc ? rc : check_rf_keep(device, failures);
        if (rc) {
            return rc;
        }
    }
    printf("%s\n", failures ? "PARITY FAILED" : host_only
        ? "parity: the CUDA codec source, built for the host, is bit-identical to the Rust codec (the fused K side to the CPU's)"
        : "parity: the CUDA codec (host and device builds) is bit-identical to the Rust codec (the fused K side to the CPU's)");
    return failures ? 1 : 0;
}
