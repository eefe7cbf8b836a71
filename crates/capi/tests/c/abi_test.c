/* C-side check of libturboquant_capi.a through turboquant.h (run by tests/c_abi.rs).
   Exits 0 on success, else prints the failed check and exits 1. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "turboquant.h"
#include "turboquant_tables.h"

#define CHECK(c)                                                        \
    do {                                                                \
        if (!(c)) {                                                     \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #c); \
            return 1;                                                   \
        }                                                               \
    } while (0)

static uint64_t rng_state = 0x1234567;
static float gauss(void) {
    /* sum of 12 uniforms - 6: roughly N(0,1), deterministic */
    float s = 0.0f;
    for (int i = 0; i < 12; i++) {
        rng_state = rng_state * 6364136223846793005ULL + 1442695040888963407ULL;
        s += (float) (rng_state >> 40) / (float) (1ULL << 24);
    }
    return s - 6.0f;
}

enum { N = 256 };

static int round_trip(int type, size_t block_size) {
    float x[N], y[N], q[N], acc[N];
    unsigned char buf[N / 64 * 34];
    for (int i = 0; i < N; i++) { x[i] = gauss(); q[i] = gauss(); }
    CHECK(tq_block_bytes(type) == (int64_t) block_size);
    CHECK(tq_block_values(type) == TQ_BLOCK_VALUES);
    CHECK(tq_quantize(type, x, buf, N) == TQ_OK);
    CHECK(tq_dequantize(type, buf, y, N) == TQ_OK);
    /* each block keeps its norm (fp16 scale), and the error is small */
    double err = 0, nrm = 0;
    for (int b = 0; b < N / 64; b++) {
        double n0 = 0, n1 = 0;
        for (int j = b * 64; j < (b + 1) * 64; j++) {
            n0 += (double) x[j] * x[j];
            n1 += (double) y[j] * y[j];
            err += ((double) x[j] - y[j]) * ((double) x[j] - y[j]);
        }
        nrm += n0;
        CHECK(fabs(sqrt(n1) - sqrt(n0)) <= 1e-3 * sqrt(n0));
    }
    CHECK(err / nrm < (type == TQ_TURBO2 ? 0.14 : type == TQ_TURBO3 ? 0.045 : 0.013));
    /* vec_dot == dot of the decoded row; the ggml hook agrees */
    float dot = 0, hook = 0;
    double want = 0, absum = 0;
    for (int j = 0; j < N; j++) { want += (double) y[j] * q[j]; absum += fabs((double) y[j] * q[j]); }
    CHECK(tq_vec_dot_f32(type, buf, q, N, &dot) == TQ_OK);
    CHECK(fabs(dot - want) <= 1e-5 * absum);
    if (type == TQ_TURBO2) tq_ggml_vec_dot_turbo2_f32(N, &hook, 0, buf, 0, q, 0, 1);
    if (type == TQ_TURBO3) tq_ggml_vec_dot_turbo3_f32(N, &hook, 0, buf, 0, q, 0, 1);
    if (type == TQ_TURBO4) tq_ggml_vec_dot_turbo4_f32(N, &hook, 0, buf, 0, q, 0, 1);
    CHECK(hook == dot);
    /* mad: acc = 0 + 1 * decode == decode */
    memset(acc, 0, sizeof acc);
    if (type == TQ_TURBO2) tq_ggml_mad_turbo2(buf, acc, N, 1.0f);
    if (type == TQ_TURBO3) tq_ggml_mad_turbo3(buf, acc, N, 1.0f);
    if (type == TQ_TURBO4) tq_ggml_mad_turbo4(buf, acc, N, 1.0f);
    CHECK(memcmp(acc, y, sizeof acc) == 0);
    CHECK(tq_ggml_validate_row(type, buf, (size_t) (N / 64) * block_size) == 1);
    return 0;
}

int main(void) {
    CHECK(sizeof(tq_block_turbo2) == 18 && sizeof(tq_block_turbo2) == (size_t) tq_block_bytes(TQ_TURBO2));
    CHECK(sizeof(tq_block_turbo3) == 26 && sizeof(tq_block_turbo3) == (size_t) tq_block_bytes(TQ_TURBO3));
    CHECK(sizeof(tq_block_turbo4) == 34 && sizeof(tq_block_turbo4) == (size_t) tq_block_bytes(TQ_TURBO4));
    CHECK(tq_block_bytes(7) == -1 && tq_block_values(7) == -1);

    if (round_trip(TQ_TURBO2, sizeof(tq_block_turbo2))) return 1;
    if (round_trip(TQ_TURBO3, sizeof(tq_block_turbo3))) return 1;
    if (round_trip(TQ_TURBO4, sizeof(tq_block_turbo4))) return 1;

    /* the generated C tables are what the library decodes with */
    float cb[16];
    CHECK(tq_codebook(TQ_TURBO2, cb, 16) == TQ_OK && memcmp(cb, TQ_CODEBOOK_2BIT, sizeof TQ_CODEBOOK_2BIT) == 0);
    CHECK(tq_codebook(TQ_TURBO3, cb, 16) == TQ_OK && memcmp(cb, TQ_CODEBOOK_3BIT, sizeof TQ_CODEBOOK_3BIT) == 0);
    CHECK(tq_codebook(TQ_TURBO4, cb, 16) == TQ_OK && memcmp(cb, TQ_CODEBOOK_4BIT, sizeof TQ_CODEBOOK_4BIT) == 0);
    CHECK(tq_codebook(TQ_TURBO4, cb, 8) == TQ_ERR_BAD_LENGTH);

    /* errors */
    float x[64] = {0};
    unsigned char b[34];
    CHECK(tq_quantize(7, x, b, 64) == TQ_ERR_UNKNOWN_TYPE);
    CHECK(tq_quantize(TQ_TURBO4, x, b, 63) == TQ_ERR_BAD_LENGTH);
    CHECK(tq_quantize(TQ_TURBO4, NULL, b, 64) == TQ_ERR_NULL_POINTER);
    CHECK(tq_rotate(48, TQ_DEFAULT_SEED, x, 48) == TQ_ERR_BAD_DIM);
    for (int c = -8; c <= 2; c++) CHECK(tq_error_string(c) != NULL);

    /* rotation: R*R = I through the dense matrix and the fast transform */
    static float m[128 * 128];
    float v[256], w[256];
    CHECK(tq_rotation_matrix(128, TQ_DEFAULT_SEED, m) == TQ_OK);
    for (int i = 0; i < 256; i++) v[i] = w[i] = gauss();
    CHECK(tq_rotate(128, TQ_DEFAULT_SEED, w, 256) == TQ_OK);
    for (int i = 0; i < 128; i++) {
        double s = 0;
        for (int j = 0; j < 128; j++) s += (double) m[i * 128 + j] * v[j];
        CHECK(fabs(s - w[i]) < 1e-4);
    }
    CHECK(tq_rotate(128, TQ_DEFAULT_SEED, w, 256) == TQ_OK);
    for (int i = 0; i < 256; i++) CHECK(fabs(w[i] - v[i]) < 1e-5);

    printf("abi_test ok (simd: %s)\n", tq_simd_name());
    return 0;
}
