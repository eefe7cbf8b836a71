// tq_fa_types.glsl - the turbo types in upstream's flash attention type switches. Included by
// fa_types.glsl (patch 0106); TQ_FA_BLOCK_ELEMS_CASES goes into its fa_block_elems().
#if !defined(TQ_FA_TYPES_GLSL)
#define TQ_FA_TYPES_GLSL

#include "tq_common.glsl"

#define TQ_FA_BLOCK_ELEMS_CASES                      \
    case uint(TQ_TURBO2_GGML_TYPE):                  \
    case uint(TQ_TURBO3_GGML_TYPE):                  \
    case uint(TQ_TURBO4_GGML_TYPE):                  \
    case uint(TQ_TURBO3_TCQ_GGML_TYPE):              \
    case uint(TQ_TURBO2_TCQ_GGML_TYPE):              \
        return uint(TQ_BLOCK_VALUES);

#endif
