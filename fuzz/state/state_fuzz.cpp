// state_fuzz.cpp - mutation fuzzer for llama_state_seq_set_data on turbo caches (turbo4 K,
// turbo3 V, K mean removal and K/Q balancing on), built with ASan + UBSan by
// scripts/fuzz-state.sh. No libFuzzer here (the machine has no clang), so it is a seeded,
// structure-aware mutation loop: each input is a real sequence state (the seeds) with 1-4
// mutations (bit flips, bytes, u32 fields set to edge values, f32 values set to NaN / Inf /
// 0 / -1 / 1e30, truncation, chunk deletion / duplication, splices of two seeds).
//
// What counts as a finding (the harness aborts, writing the input to OUT/crash-*.bin):
//   - any ASan / UBSan report or crash inside the state reader;
//   - an accepted state after which the next token's logits are not finite;
//   - a poisoned cache: after the attempt and removal of the restored sequence, a fresh
//     prompt into the emptied cache (or the next token of a live sequence in a busy cache)
//     gives logits that differ from the same computation before any attempt;
//   - orphan cells: after llama_memory_seq_rm(0, -1, -1), sequence 0's state is not the
//     empty one (cells of the restored sequence that removing it did not remove).
//
//   state_fuzz MODEL.gguf SEED_DIR ITERATIONS RNG_SEED OUT_DIR [--write-seeds]
//
// STATE_FUZZ_REPLAY=DIR first restores every file of DIR (earlier findings) unmutated, into
// an empty and into a busy cache, with the same checks.
#include "llama.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

namespace fs = std::filesystem;
using bytes = std::vector<uint8_t>;

static llama_context * g_ctx;
static llama_memory_t  g_mem;
static int             g_n_vocab;
static std::string     g_out;
static bytes           g_input; // the input being tried, written out on a finding
static long            g_iter = -1;
static size_t          g_set_result;
static size_t          g_empty_size; // llama_state_seq_get_size of a sequence with no cells

static void quiet(ggml_log_level, const char *, void *) {}

[[noreturn]] static void finding(const char * what) {
    const std::string path = g_out + "/crash-" + std::to_string(std::random_device{}()) + ".bin";
    std::ofstream(path, std::ios::binary).write((const char *) g_input.data(), g_input.size());
    fprintf(stderr, "state_fuzz: FINDING at execution %ld (set_data returned %zu): %s (input %s, %zu bytes)\n",
            g_iter, g_set_result, what, path.c_str(), g_input.size());
    abort();
}

// Decodes `toks` at positions p0.. on `seq`; returns the last token's logits.
static std::vector<float> decode(const std::vector<llama_token> & toks, llama_pos p0, llama_seq_id seq) {
    llama_batch b = llama_batch_init((int32_t) toks.size(), 0, 1);
    for (size_t i = 0; i < toks.size(); ++i) {
        b.token[i] = toks[i];
        b.pos[i] = p0 + (llama_pos) i;
        b.n_seq_id[i] = 1;
        b.seq_id[i][0] = seq;
        b.logits[i] = i + 1 == toks.size();
    }
    b.n_tokens = (int32_t) toks.size();
    if (llama_decode(g_ctx, b) != 0) {
        llama_batch_free(b);
        finding("llama_decode failed on a valid batch");
    }
    llama_batch_free(b);
    const float * l = llama_get_logits_ith(g_ctx, -1);
    return std::vector<float>(l, l + g_n_vocab);
}

static bool finite(const std::vector<float> & v) {
    for (float x : v) {
        if (!std::isfinite(x)) {
            return false;
        }
    }
    return true;
}

// Same computation, same answer up to float summation order (the cells a sequence lands
// in can differ between attempts, which changes flash attention's tiling).
static bool same(const std::vector<float> & a, const std::vector<float> & b) {
    float scale = 1e-6f;
    for (float x : a) {
        scale = std::max(scale, std::fabs(x));
    }
    float worst = 0.0f;
    for (size_t i = 0; i < a.size(); ++i) {
        const float d = std::fabs(a[i] - b[i]);
        worst = std::isnan(d) ? INFINITY : std::max(worst, d);
    }
    if (!(worst <= 1e-3f * scale)) {
        fprintf(stderr, "state_fuzz: logits differ by up to %g (largest |logit| %g)\n", worst, scale);
        return false;
    }
    return true;
}

static std::vector<llama_token> prompt(int n, int salt) {
    std::vector<llama_token> t(n);
    for (int i = 0; i < n; ++i) {
        t[i] = (llama_token) ((i * 7919 + salt * 104729 + 17) % (g_n_vocab - 1) + 1);
    }
    return t;
}

static bytes seq_state(llama_seq_id seq) {
    bytes s(llama_state_seq_get_size(g_ctx, seq));
    s.resize(llama_state_seq_get_data(g_ctx, s.data(), s.size(), seq));
    return s;
}

static void mutate(bytes & d, const std::vector<bytes> & seeds, std::mt19937_64 & rng) {
    static const uint32_t u32s[] = { 0, 1, 2, 0x7f, 0x80, 0xff, 0xffff, 0x10000, 0x7fffffff, 0x80000000u,
                                     0xfffffffeu, 0xffffffffu, 0x32425154, 0x324d5154, 98, 97, 96, 1, 30 };
    static const float f32s[] = { NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, -1.0f, 1e30f, -1e30f, 7.0f,
                                  8.0f, -0.875f, -0.9f, 1e-40f, 65504.0f, 3.4e38f };
    const int n = 1 + (int) (rng() % 4);
    for (int k = 0; k < n && !d.empty(); ++k) {
        const size_t at = rng() % d.size();
        switch (rng() % 8) {
            case 0: d[at] ^= (uint8_t) (1u << (rng() % 8)); break;
            case 1: d[at] = (uint8_t) rng(); break;
            case 2: if (d.size() >= 4) { uint32_t v = u32s[rng() % (sizeof(u32s) / 4)]; memcpy(&d[(at / 4 * 4) % (d.size() - 3)], &v, 4); } break;
            case 3: if (d.size() >= 4) { float v = f32s[rng() % (sizeof(f32s) / 4)]; memcpy(&d[(at / 4 * 4) % (d.size() - 3)], &v, 4); } break;
            case 4: d.resize(at); break;
            case 5: { size_t len = std::min<size_t>(1 + rng() % 64, d.size() - at); d.erase(d.begin() + at, d.begin() + at + len); } break;
            case 6: { size_t len = std::min<size_t>(1 + rng() % 64, d.size() - at); bytes c(d.begin() + at, d.begin() + at + len); d.insert(d.begin() + at, c.begin(), c.end()); } break;
            case 7: { const bytes & o = seeds[rng() % seeds.size()]; if (!o.empty()) { size_t from = rng() % o.size(); d.resize(at); d.insert(d.end(), o.begin() + from, o.end()); } } break;
        }
    }
}

int main(int argc, char ** argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s MODEL SEED_DIR ITERATIONS RNG_SEED OUT_DIR [--write-seeds]\n", argv[0]);
        return 2;
    }
    const long iters = atol(argv[3]);
    std::mt19937_64 rng(strtoull(argv[4], nullptr, 10));
    g_out = argv[5];
    const bool write_seeds = argc > 6 && std::string(argv[6]) == "--write-seeds";
    fs::create_directories(g_out);
    if (!getenv("STATE_FUZZ_VERBOSE")) {
        llama_log_set(quiet, nullptr);
    }
    setvbuf(stdout, nullptr, _IOLBF, 0); // the replay lines land even if a finding aborts
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        fprintf(stderr, "state_fuzz: cannot load %s\n", argv[1]);
        return 2;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = 512;
    cp.n_batch = 128;
    cp.n_ubatch = 128;
    cp.n_seq_max = 2;
    cp.n_threads = cp.n_threads_batch = 1;
    cp.type_k = GGML_TYPE_TURBO4;
    cp.type_v = GGML_TYPE_TURBO3;
    cp.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED;
    g_ctx = llama_init_from_model(model, cp);
    if (!g_ctx) {
        fprintf(stderr, "state_fuzz: cannot create a turbo context\n");
        return 2;
    }
    g_mem = llama_get_memory(g_ctx);
    g_n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));

    // references: a fresh 40-token prompt into an empty cache (K mean SET), and a live
    // sequence's next token in a busy cache
    const auto P = prompt(40, 1), Q = prompt(48, 2), T = prompt(1, 3);
    const auto ref_empty = decode(P, 0, 0);
    const bytes seed_set = seq_state(0);
    llama_memory_seq_rm(g_mem, 0, -1, -1);
    decode(prompt(8, 4), 0, 0); // an 8-token first ubatch: K mean ZERO
    const bytes seed_zero = seq_state(0);
    decode(prompt(40, 5), 8, 0); // and more after it (KEEP)
    const bytes seed_keep = seq_state(0);
    llama_memory_seq_rm(g_mem, 0, -1, -1);
    decode(Q, 0, 1);
    const auto ref_busy = decode(T, (llama_pos) Q.size(), 1);
    llama_memory_seq_rm(g_mem, 1, (llama_pos) Q.size(), -1);
    g_empty_size = llama_state_seq_get_size(g_ctx, 0);
    if (!finite(ref_empty) || !finite(ref_busy)) {
        finding("reference logits not finite");
    }

    std::vector<bytes> seeds = { seed_set, seed_zero, seed_keep };
    if (write_seeds) {
        const char * names[] = { "set.bin", "zero.bin", "keep.bin" };
        for (int i = 0; i < 3; ++i) {
            std::ofstream(std::string(argv[2]) + "/" + names[i], std::ios::binary).write((const char *) seeds[i].data(), seeds[i].size());
        }
    }
    for (const auto & e : fs::directory_iterator(argv[2])) {
        std::ifstream f(e.path(), std::ios::binary);
        seeds.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }

    long accepted = 0, refused = 0;
    bool q_live = true;
    // one restore attempt of g_input into seq 0 of an empty or a busy cache, and the checks
    auto attempt = [&](bool busy) {
        if (busy && !q_live) {
            decode(Q, 0, 1);
            q_live = true;
        } else if (!busy && q_live) {
            llama_memory_seq_rm(g_mem, 1, -1, -1);
            q_live = false;
        }
        const size_t r = g_set_result = llama_state_seq_set_data(g_ctx, g_input.data(), g_input.size(), 0);
        if (r > 0) {
            ++accepted;
            const llama_pos p = llama_memory_seq_pos_max(g_mem, 0);
            // 64-bit: an accepted state can hold a cell at INT32_MAX - 1 or more
            if (p >= 0 && (int64_t) p + 2 < (int64_t) cp.n_ctx / 2 && !finite(decode(T, p + 1, 0))) {
                finding("accepted state gives non-finite logits");
            }
        } else {
            ++refused;
        }
        llama_memory_seq_rm(g_mem, 0, -1, -1);
        if (llama_state_seq_get_size(g_ctx, 0) != g_empty_size) {
            finding("cells of the restored sequence survive llama_memory_seq_rm(seq, -1, -1)");
        }
        if (busy) {
            if (!same(decode(T, (llama_pos) Q.size(), 1), ref_busy)) {
                finding("busy cache: the live sequence's next token changed after a restore attempt");
            }
            llama_memory_seq_rm(g_mem, 1, (llama_pos) Q.size(), -1);
        } else {
            if (!same(decode(P, 0, 0), ref_empty)) {
                finding("empty cache: a fresh prompt's logits changed after a restore attempt (poisoned)");
            }
            llama_memory_seq_rm(g_mem, 0, -1, -1);
        }
    };

    if (const char * dir = getenv("STATE_FUZZ_REPLAY")) {
        long n = 0;
        for (const auto & e : fs::directory_iterator(dir)) {
            std::ifstream f(e.path(), std::ios::binary);
            const bytes in((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
            for (const bool busy : { false, true }) {
                g_input = in;
                const long acc = accepted;
                attempt(busy);
                printf("state_fuzz: replay %s (%s cache): %s\n", e.path().filename().c_str(),
                       busy ? "busy" : "empty", accepted > acc ? "accepted" : "refused");
                ++n;
            }
        }
        printf("state_fuzz: replayed %ld inputs from %s, 0 findings\n", n, dir);
        accepted = refused = 0;
    }

    for (long it = 0; it < iters; ++it) {
        g_input = seeds[rng() % seeds.size()];
        if (it % 16 != 0) { // every 16th input goes in unmutated
            mutate(g_input, seeds, rng);
        }
        g_iter = it;
        attempt(it % 2 == 1);
    }
    printf("state_fuzz: %ld executions, %ld accepted, %ld refused, 0 findings\n", iters, accepted, refused);
    llama_free(g_ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
