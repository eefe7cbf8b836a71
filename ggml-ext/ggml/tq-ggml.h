/*
 * tq-ggml.h - how ggml and llama.cpp see the turbo types.
 *
 * The patches under ggml-ext/patches/ add a handful of upstream lines that include this
 * header and expand the macros below; everything else about the types lives here and in
 * the Rust codec (turboquant.h).
 *
 * Enum values: upstream appends new ggml types right after the last one (43 at the pin)
 * and bumps GGML_TYPE_COUNT. We take 96..98, far from that frontier, so a type upstream
 * adds next never lands on ours; the gap 43..95 stays unnamed, which ggml already copes
 * with (it has holes at 4, 5, 31-33 and 36-38).
 */
#ifndef TQ_GGML_H
#define TQ_GGML_H

#include "ggml.h"
#include "ggml-backend.h"
#include "turboquant.h"
#include "tq-switch.h"

#include <stdlib.h>
#include <string.h>

/* Every type comes from TQ_FOR_EACH_TYPE (turboquant_types.h, generated from the codec's
   type table): X(name, STEM, bits, block_bytes, trellis). */

/* Entries for ggml.c's type_traits table. */
#define TQ_GGML_TYPE_TRAIT(name, STEM, bits, bytes, trellis)                     \
    [GGML_TYPE_##STEM] = {                                                       \
        .type_name      = #name,                                                 \
        .blck_size      = TQ_BLOCK_VALUES,                                       \
        .type_size      = sizeof(tq_block_##name),                               \
        .is_quantized   = true,                                                  \
        .to_float       = (ggml_to_float_t) tq_ggml_dequantize_row_##name,       \
        .from_float_ref = (ggml_from_float_t) tq_ggml_quantize_row_##name,       \
    },
#define TQ_GGML_TYPE_TRAITS TQ_FOR_EACH_TYPE(TQ_GGML_TYPE_TRAIT)

/* Entries for ggml-cpu.c's type_traits_cpu table: K.Q dots against the f32 query
   directly (vec_dot_type F32), so flash attention never rounds Q to q8_0. */
#define TQ_GGML_CPU_TRAIT(name, STEM, bits, bytes, trellis)                      \
    [GGML_TYPE_##STEM] = {                                                       \
        .from_float   = (ggml_from_float_t) tq_ggml_quantize_row_##name,         \
        .vec_dot      = (ggml_vec_dot_t) tq_ggml_vec_dot_##name##_f32,           \
        .vec_dot_type = GGML_TYPE_F32,                                           \
        .nrows        = 1,                                                       \
    },
#define TQ_GGML_CPU_TYPE_TRAITS TQ_FOR_EACH_TYPE(TQ_GGML_CPU_TRAIT)

/* `case` labels for ggml switches that list every quantized type (CPU and core). */
#define TQ_GGML_CASE(name, STEM, bits, bytes, trellis) case GGML_TYPE_##STEM:
#define TQ_GGML_CASES TQ_FOR_EACH_TYPE(TQ_GGML_CASE)

/* Any of our types (96..100): what the CPU backend and llama's cache treat as turbo (the
   seeded rotation, the K mean, K/Q balancing, the tiled decode). */
#define TQ_GGML_IS_TURBO(t) \
    ((int) (t) >= (int) GGML_TYPE_TURBO2 && (int) (t) <= (int) GGML_TYPE_TURBO2_TCQ)
/* The trellis-coded ones. */
#define TQ_GGML_IS_TCQ(t) ((int) (t) == (int) GGML_TYPE_TURBO3_TCQ || (int) (t) == (int) GGML_TYPE_TURBO2_TCQ)

/* The turbo type called `name` (its type_name), or GGML_TYPE_COUNT. */
static inline enum ggml_type tq_ggml_type_from_name(const char *name) {
#define TQ_GGML_TYPE_ENUM(n, STEM, bits, bytes, trellis) GGML_TYPE_##STEM,
    const enum ggml_type types[] = { TQ_FOR_EACH_TYPE(TQ_GGML_TYPE_ENUM) };
#undef TQ_GGML_TYPE_ENUM
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); ++i) {
        if (strcmp(name, ggml_type_name(types[i])) == 0) return types[i];
    }
    return GGML_TYPE_COUNT;
}

/* The codec type id of a ggml type (TQ_TURBO2..4, TQ_TURBO3_TCQ, TQ_TURBO2_TCQ), or -1. */
static inline int tq_ggml_codec_type(int ggml_type) {
    switch (ggml_type) {
        case GGML_TYPE_TURBO2:     return TQ_TURBO2;
        case GGML_TYPE_TURBO3:     return TQ_TURBO3;
        case GGML_TYPE_TURBO4:     return TQ_TURBO4;
        case GGML_TYPE_TURBO3_TCQ: return TQ_TURBO3_TCQ;
        case GGML_TYPE_TURBO2_TCQ: return TQ_TURBO2_TCQ;
        default:                   return -1;
    }
}

/* ggml_validate_row_data for our types: 1 if every block scale is finite and non-negative. */
static inline int tq_ggml_validate(int ggml_type, const void *x, size_t nbytes) {
    return tq_ggml_validate_row(tq_ggml_codec_type(ggml_type), x, nbytes);
}

/* Flash-attention V accumulation, y += v * decode(x), or NULL for non-turbo types. */
typedef void (*tq_ggml_mad_t)(const void *x, float *y, int64_t k, float v);
static inline tq_ggml_mad_t tq_ggml_mad_fn(int ggml_type) {
    switch (ggml_type) {
#define TQ_GGML_MAD_CASE(name, STEM, bits, bytes, trellis) case GGML_TYPE_##STEM: return tq_ggml_mad_##name;
        TQ_FOR_EACH_TYPE(TQ_GGML_MAD_CASE)
#undef TQ_GGML_MAD_CASE
        default: return NULL;
    }
}

/* The largest head ggml-cpu's turbo flash-attention tiles take (TQ_FA_GQA_DMAX, tq-ggml-fa.h);
   llama's graph sends a prefill to them only up to it (tq-ggml-graph.h). */
#define TQ_GGML_CPU_TILES_DMAX 256

#endif /* TQ_GGML_H */
