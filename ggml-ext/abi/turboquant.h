/*
 * turboquant.h - C ABI of the turboquant Rust codec (libturboquant_capi.a).
 *
 * TurboQuant KV-cache blocks: 64 values per block, each block stores an fp16
 * scale and one Lloyd-Max codebook index per value. The codebook is optimal for
 * the coordinates of a uniformly random unit vector in R^64, which is what one
 * block of a randomly rotated K/V head looks like once divided by its norm.
 *
 *   type    bits/value  bytes/block  layout (see crates/codec/src/block.rs for the exact packing)
 *   turbo2  2.25        18           u16 d; u8 qs[16]
 *   turbo3  3.25        26           u16 d; u8 qs[24]   (16 bytes low 2 bits, 8 bytes high bit)
 *   turbo4  4.25        34           u16 d; u8 qs[32]
 *
 * Decoding value j of a block: y[j] = fp16_to_f32(d) * codebook[idx[j]] (one f32
 * multiply). A stored scale that is NaN, infinite or negative (never written by the
 * encoder) decodes as 0, so decoding never yields NaN; tq_ggml_validate_row rejects it.
 * Encoding: n = ||x||; idx[j] = nearest centroid of x[j]/(n f) (ties go to the lower
 * centroid) for the gain f of a 9-candidate search (TQ_GAIN_*) whose codes lie closest
 * in direction to x; d = n / ||codebook[idx]|| rounded to fp16, so the decoded block
 * keeps the original norm. The bit-exact rule (sanitising, double precision, the search
 * order, the zero block) is normative in docs/CODEC.md; the CUDA port reproduces it.
 * Packing of idx[j] into qs:
 *   turbo4: qs[i] = idx[i] | idx[i+32] << 4, i < 32;
 *   turbo2: qs[i] = idx[i] | idx[i+16] << 2 | idx[i+32] << 4 | idx[i+48] << 6, i < 16;
 *   turbo3: qs[0..16) = the low 2 bits in the turbo2 layout; bit j%8 of qs[16 + j/8]
 *           is idx[j] >> 2.
 * Codebooks and thresholds: turboquant_tables.h (generated from the Rust solver).
 *
 * Every function is safe to call with bad input: it returns a negative error code
 * (see tq_error_string) and never aborts or unwinds into C. Checks run in this order:
 * type (or rotation dim), then pointers (NULL is an error even when n == 0), then
 * lengths.
 * The tq_ggml_* row functions are the hot paths ggml calls; they trust ggml's
 * invariants (non-null, k a multiple of 64) and do no allocation.
 */
#ifndef TURBOQUANT_H
#define TURBOQUANT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Type ids of the checked functions below: the scalar turbo types and the trellis-coded
   ones (docs/TCQ.md), which every checked function takes except tq_codebook. */
typedef enum tq_type {
    TQ_TURBO2 = 2, TQ_TURBO3 = 3, TQ_TURBO4 = 4,
    TQ_TURBO2_TCQ = 12, TQ_TURBO3_TCQ = 13
} tq_type;

/* Values per block (TQ_BLOCK_VALUES), bits and block bytes of every type. */
#include "turboquant_types.h"

/* Error codes (all negative). */
#define TQ_OK                 0
#define TQ_ERR_UNKNOWN_TYPE  -1
#define TQ_ERR_BAD_LENGTH    -2
#define TQ_ERR_NULL_POINTER  -3
#define TQ_ERR_BAD_DIM       -4
#define TQ_ERR_PANIC         -5

/* The seed of the rotation that llama.cpp uses for turbo caches. */
#define TQ_DEFAULT_SEED 0x5475726271756174ULL /* "Turbquat" */

/* Block layouts, as ggml stores them, from the type table; sizes asserted below (and the
   Rust structs against the same table). */
typedef struct { uint16_t d; uint8_t qs[TQ_TURBO2_QS_BYTES]; } tq_block_turbo2;
typedef struct { uint16_t d; uint8_t qs[TQ_TURBO3_QS_BYTES]; } tq_block_turbo3;
typedef struct { uint16_t d; uint8_t qs[TQ_TURBO4_QS_BYTES]; } tq_block_turbo4;

int64_t tq_block_values(int type);   /* values per block; -1 for an unknown type */
int64_t tq_block_bytes(int type);    /* bytes per block;  -1 for an unknown type */

/* Encode/decode n values (n a multiple of tq_block_values) exactly as the GGML type
   stores them. Return 0, or a negative error code, checked in this order: unknown type,
   null pointer (even when n == 0), bad length (n < 0 or not a multiple of 64); nothing is
   written on error. Inputs are sanitized (NaN -> 0, +-Inf -> +-65504). A trellis type is
   encoded with a Viterbi scratch of the calling thread (about 72 KB, made on its first
   call), giving the bytes of its ggml hook. */
int tq_quantize(int type, const float *x, void *out, int64_t n);
int tq_dequantize(int type, const void *in, float *y, int64_t n);

/* Dot product of n encoded values with an f32 vector; result in *out. */
int tq_vec_dot_f32(int type, const void *x, const float *y, int64_t n, float *out);

/* Checked y[0..n) += v * decode(x); same errors as tq_dequantize. */
int tq_mad(int type, const void *x, float *y, int64_t n, float v);

/* The seeded rotation as a dense dim x dim row-major orthogonal matrix.
   R = D H D / sqrt(dim) with H the Sylvester Walsh-Hadamard matrix and D = diag(+-1)
   drawn from the seed: R is symmetric and R*R = I, so applying it twice undoes it
   (llama.cpp relies on that to rotate the attention output and shifted keys back).
   dim: a power of two, 2..=65536. */
int tq_rotation_matrix(int64_t dim, uint64_t seed, float *out);

/* The same map applied in place to n/dim consecutive vectors of length dim, O(dim log dim). */
int tq_rotate(int64_t dim, uint64_t seed, float *x, int64_t n);

/* Codebook centroids (ascending, 2^bits of them) that type `type` decodes with.
   capacity < 2^bits: TQ_ERR_BAD_LENGTH. Returns 0. A trellis type has no codebook (its
   reconstruction table is in turboquant_tcq_tables.h): TQ_ERR_UNKNOWN_TYPE. */
int tq_codebook(int type, float *out, int64_t capacity);

/* A static, human-readable message for an error code. Never NULL. */
const char *tq_error_string(int code);

/* Name of the CPU code path the kernels dispatch to ("avx512", "avx2", "scalar";
   TQ_SIMD=scalar|avx2 in the environment caps it). Static, never NULL. */
const char *tq_simd_name(void);

/* --- ggml hooks: exact ggml signatures, no checks beyond ggml's own invariants --- */
void tq_ggml_quantize_row_turbo2(const float *x, void *y, int64_t k);
void tq_ggml_quantize_row_turbo3(const float *x, void *y, int64_t k);
void tq_ggml_quantize_row_turbo4(const float *x, void *y, int64_t k);

void tq_ggml_dequantize_row_turbo2(const void *x, float *y, int64_t k);
void tq_ggml_dequantize_row_turbo3(const void *x, float *y, int64_t k);
void tq_ggml_dequantize_row_turbo4(const void *x, float *y, int64_t k);

/* ggml_vec_dot_t: s[0] = dot(x (turbo), y (f32)) over n values; nrc must be 1. */
void tq_ggml_vec_dot_turbo2_f32(int n, float *s, size_t bs, const void *x, size_t bx,
                                const void *y, size_t by, int nrc);
void tq_ggml_vec_dot_turbo3_f32(int n, float *s, size_t bs, const void *x, size_t bx,
                                const void *y, size_t by, int nrc);
void tq_ggml_vec_dot_turbo4_f32(int n, float *s, size_t bs, const void *x, size_t bx,
                                const void *y, size_t by, int nrc);

/* Flash-attention V accumulation: y[0..k) += v * decode(x). */
void tq_ggml_mad_turbo2(const void *x, float *y, int64_t k, float v);
void tq_ggml_mad_turbo3(const void *x, float *y, int64_t k, float v);
void tq_ggml_mad_turbo4(const void *x, float *y, int64_t k, float v);

/* Flash-attention decode tiles: nrows rows of k values each, row r at x + r*stride bytes.
   dot_rows: scores[r] = dot(decode(row r), q) (as the vec_dot hooks, up to rounding order).
   mad_rows: y[0..k) += w[r] * decode(row r) for r = 0..nrows-1 in order (bit-exact with
   nrows calls of the mad hook). nrows <= 0 does nothing. */
void tq_ggml_dot_rows_turbo2(const void *x, size_t stride, int64_t nrows, const float *q, int64_t k,
                             float *scores);
void tq_ggml_dot_rows_turbo3(const void *x, size_t stride, int64_t nrows, const float *q, int64_t k,
                             float *scores);
void tq_ggml_dot_rows_turbo4(const void *x, size_t stride, int64_t nrows, const float *q, int64_t k,
                             float *scores);
void tq_ggml_mad_rows_turbo2(const void *x, size_t stride, int64_t nrows, const float *w, float *y,
                             int64_t k);
void tq_ggml_mad_rows_turbo3(const void *x, size_t stride, int64_t nrows, const float *w, float *y,
                             int64_t k);
void tq_ggml_mad_rows_turbo4(const void *x, size_t stride, int64_t nrows, const float *w, float *y,
                             int64_t k);

/* ggml's CPU flash-attention decode (tq-ggml-fa.h): 0 per key, 1 tiles per query head, 2 tiles
   shared by a GQA group (default); TQ_FA_TILE=0/1 (read once) or tq_ggml_set_fa_tile sets it. */
int tq_ggml_fa_tile(void);
void tq_ggml_set_fa_tile(int on);

/* --- trellis-coded types turbo3_tcq / turbo2_tcq (docs/TCQ.md) ---
   64 values per block: u16 d (fp16 scale) + a circular string of 64*k trellis bits
   (k = 3 / 2, MSB-first). Value t decodes to fp16_to_f32(d) * TQ_TCQ<k>_TABLE[s_t],
   s_t the L-bit window of bits [k t + k - L, k t + k) mod 64 k (turboquant_tcq_tables.h).
   The encoder is a Viterbi search (bit-exact rule in docs/TCQ.md); it keeps one
   scratch per thread and type (72 / 80 KB for k = 3 / 2), made on the thread's first
   call. Same ggml signatures and conventions as the hooks above. */
typedef struct { uint16_t d; uint8_t qs[TQ_TURBO3_TCQ_QS_BYTES]; } tq_block_turbo3_tcq;
typedef struct { uint16_t d; uint8_t qs[TQ_TURBO2_TCQ_QS_BYTES]; } tq_block_turbo2_tcq;

#ifdef __cplusplus
#define TQ_STATIC_ASSERT(c, m) static_assert(c, m)
#else
#define TQ_STATIC_ASSERT(c, m) _Static_assert(c, m)
#endif
#define TQ_ASSERT_BLOCK(name, STEM, bits, bytes, trellis) \
    TQ_STATIC_ASSERT(sizeof(tq_block_##name) == TQ_##STEM##_BLOCK_BYTES, "tq_block_" #name " size");
TQ_FOR_EACH_TYPE(TQ_ASSERT_BLOCK)
#undef TQ_ASSERT_BLOCK

void tq_ggml_quantize_row_turbo3_tcq(const float *x, void *y, int64_t k);
void tq_ggml_quantize_row_turbo2_tcq(const float *x, void *y, int64_t k);
void tq_ggml_dequantize_row_turbo3_tcq(const void *x, float *y, int64_t k);
void tq_ggml_dequantize_row_turbo2_tcq(const void *x, float *y, int64_t k);
void tq_ggml_vec_dot_turbo3_tcq_f32(int n, float *s, size_t bs, const void *x, size_t bx,
                                    const void *y, size_t by, int nrc);
void tq_ggml_vec_dot_turbo2_tcq_f32(int n, float *s, size_t bs, const void *x, size_t bx,
                                    const void *y, size_t by, int nrc);
void tq_ggml_mad_turbo3_tcq(const void *x, float *y, int64_t k, float v);
void tq_ggml_mad_turbo2_tcq(const void *x, float *y, int64_t k, float v);

/* ggml_validate_row_data: 1 if every block scale is finite and non-negative; 0 otherwise,
   also when nbytes is not a whole number of blocks, the type is unknown, or x is NULL
   with nbytes > 0. */
int tq_ggml_validate_row(int type, const void *x, size_t nbytes);

/* --- trellis-coded types: flash-attention tiles (crates/capi/src/tcq_abi.rs) --- */

/* Flash-attention decode tiles, same signatures and semantics as tq_ggml_dot_rows_turbo3 /
   tq_ggml_mad_rows_turbo3: dot_rows within 1e-5 * sum|terms| of the vec_dot hook,
   mad_rows bit-exact with nrows calls of the mad hook; nrows <= 0 does nothing. */
void tq_ggml_dot_rows_turbo3_tcq(const void *x, size_t stride, int64_t nrows, const float *q,
                                 int64_t k, float *scores);
void tq_ggml_dot_rows_turbo2_tcq(const void *x, size_t stride, int64_t nrows, const float *q,
                                 int64_t k, float *scores);
void tq_ggml_mad_rows_turbo3_tcq(const void *x, size_t stride, int64_t nrows, const float *w,
                                 float *y, int64_t k);
void tq_ggml_mad_rows_turbo2_tcq(const void *x, size_t stride, int64_t nrows, const float *w,
                                 float *y, int64_t k);

#ifdef __cplusplus
}
#endif

#endif /* TURBOQUANT_H */
