# Included by the patched ggml/src/ggml-vulkan/CMakeLists.txt right after the ggml-vulkan target
# is defined (GGML_VULKAN=ON). It compiles our shaders (ggml-ext/ggml-vulkan/shaders/*.comp: the
# turbo and trellis encoders for SET_ROWS/CPY, the decode for GET_ROWS/CPY and MUL_MAT's turbo
# K, and the turbo K terms' per-head mask of flash attention) with the glslc upstream found,
# embeds their SPIR-V in a generated tq-vulkan-shaders.cpp, and gives ggml-vulkan.cpp our glue
# (ggml-ext/ggml-vulkan/tq-vulkan.h). The flash attention decode of turbo K/V is compiled by
# upstream's vulkan-shaders-gen, which the patch points at the same folder (--tq-include).
set(TQ_VK_SHADER_DIR "${TQ_EXT_DIR}/ggml-vulkan/shaders")
set(TQ_VK_UPSTREAM_SHADER_DIR "${CMAKE_CURRENT_SOURCE_DIR}/vulkan-shaders")
set(TQ_VK_OUT "${CMAKE_CURRENT_BINARY_DIR}/tq-vulkan-shaders")
file(MAKE_DIRECTORY "${TQ_VK_OUT}")
file(GLOB TQ_VK_SHADER_DEPS CONFIGURE_DEPENDS
     "${TQ_VK_SHADER_DIR}/*.glsl" "${TQ_VK_SHADER_DIR}/*.comp" "${TQ_VK_SHADER_DIR}/*.h" "${TQ_EXT_DIR}/abi/*.h")

# name | source | defines (one variant per line)
set(_tq_vk_variants "")
foreach(_tq_bits 2 3 4)
    set(_t "turbo${_tq_bits}")
    list(APPEND _tq_vk_variants
        "set_rows_f32_${_t}_i32|tq_encode.comp|TQ_BITS=${_tq_bits},TQ_SET_ROWS=1,B_TYPE=uint,B_SIZE=32"
        "set_rows_f32_${_t}_i64|tq_encode.comp|TQ_BITS=${_tq_bits},TQ_SET_ROWS=1,B_TYPE=uvec2,B_SIZE=64"
        "cpy_f32_${_t}|tq_encode.comp|TQ_BITS=${_tq_bits}"
        "cpy_${_t}_f32|tq_decode.comp|TQ_BITS=${_tq_bits}"
        "cpy_${_t}_f16|tq_decode.comp|TQ_BITS=${_tq_bits},D_TYPE=float16_t"
        "get_rows_${_t}|tq_decode.comp|TQ_BITS=${_tq_bits},TQ_GET_ROWS=1,D_TYPE=float16_t"
        "get_rows_${_t}_f32|tq_decode.comp|TQ_BITS=${_tq_bits},TQ_GET_ROWS=1,D_TYPE=float"
        "fa_terms_${_t}|tq_fa_terms.comp|TQ_BITS=${_tq_bits}")
endforeach()
# the trellis types: their own encoder (a Viterbi search per block), the same decode interfaces
foreach(_tq_k 3 2)
    set(_t "turbo${_tq_k}_tcq")
    list(APPEND _tq_vk_variants
        "set_rows_f32_${_t}_i32|tq_tcq_encode.comp|TQ_TCQ_K=${_tq_k},TQ_SET_ROWS=1,B_TYPE=uint,B_SIZE=32"
        "set_rows_f32_${_t}_i64|tq_tcq_encode.comp|TQ_TCQ_K=${_tq_k},TQ_SET_ROWS=1,B_TYPE=uvec2,B_SIZE=64"
        "cpy_f32_${_t}|tq_tcq_encode.comp|TQ_TCQ_K=${_tq_k}"
        "cpy_${_t}_f32|tq_decode.comp|TQ_TCQ_K=${_tq_k}"
        "cpy_${_t}_f16|tq_decode.comp|TQ_TCQ_K=${_tq_k},D_TYPE=float16_t"
        "get_rows_${_t}|tq_decode.comp|TQ_TCQ_K=${_tq_k},TQ_GET_ROWS=1,D_TYPE=float16_t"
        "get_rows_${_t}_f32|tq_decode.comp|TQ_TCQ_K=${_tq_k},TQ_GET_ROWS=1,D_TYPE=float"
        "fa_terms_${_t}|tq_fa_terms.comp|TQ_TCQ_K=${_tq_k}")
endforeach()

# the fused K side of the K mean in RoPE's frame (any cache type)
list(APPEND _tq_vk_variants "rf_keep|tq_rf_keep.comp|TQ_RF_KEEP=1")
# the seeded rotation of a decode's rows (any cache type)
list(APPEND _tq_vk_variants "rot|tq_rot.comp|TQ_ROT=1")

set(_tq_vk_spvs "")
set(_tq_vk_names "")
foreach(_v ${_tq_vk_variants})
    string(REPLACE "|" ";" _parts "${_v}")
    list(GET _parts 0 _name)
    list(GET _parts 1 _src)
    list(GET _parts 2 _defs)
    string(REPLACE "," ";" _defs "${_defs}")
    set(_dflags "")
    foreach(_d ${_defs})
        list(APPEND _dflags "-D${_d}")
    endforeach()
    set(_spv "${TQ_VK_OUT}/${_name}.spv")
    add_custom_command(
        OUTPUT "${_spv}"
        COMMAND ${Vulkan_GLSLC_EXECUTABLE} -fshader-stage=compute --target-env=vulkan1.2 -O
                -I${TQ_VK_SHADER_DIR} -I${TQ_VK_UPSTREAM_SHADER_DIR} ${_dflags}
                "${TQ_VK_SHADER_DIR}/${_src}" -o "${_spv}"
        DEPENDS ${TQ_VK_SHADER_DEPS}
        COMMENT "turboquant: Vulkan shader ${_name}"
        VERBATIM)
    list(APPEND _tq_vk_spvs "${_spv}")
    list(APPEND _tq_vk_names "${_name}")
endforeach()

add_custom_command(
    OUTPUT "${TQ_VK_OUT}/tq-vulkan-shaders.cpp" "${TQ_VK_OUT}/tq-vulkan-shaders.h"
    COMMAND ${CMAKE_COMMAND} -DTQ_VK_OUT=${TQ_VK_OUT} "-DTQ_VK_NAMES=${_tq_vk_names}"
            -P "${TQ_EXT_DIR}/cmake/turboquant-vulkan-embed.cmake"
    DEPENDS ${_tq_vk_spvs} "${TQ_EXT_DIR}/cmake/turboquant-vulkan-embed.cmake"
    COMMENT "turboquant: embed the Vulkan shaders"
    VERBATIM)
target_sources(ggml-vulkan PRIVATE "${TQ_VK_OUT}/tq-vulkan-shaders.cpp" "${TQ_VK_OUT}/tq-vulkan-shaders.h")
target_include_directories(ggml-vulkan PRIVATE "${TQ_EXT_DIR}/ggml-vulkan" "${TQ_VK_OUT}")
message(STATUS "turboquant: Vulkan shaders for turbo2/3/4 and turbo3_tcq/turbo2_tcq (encode, decode, flash attention)")
