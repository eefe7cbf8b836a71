# tq_cuda_check_archs(<archs> <nvcc version>): refuse, at configure time, a CUDA architecture
# older than Volta (sm_70). The turbo K.Q of the flash-attention vector kernel
# (ggml-ext/ggml-cuda/tq-fattn.cuh) takes the f16 path's Q layout, which before Volta
# (ggml_cuda_get_max_cpy_bytes() == 8) is 16 threads of 4 values per row instead of 8 of 8,
# a layout that was never compiled or tested (CUDA 13 cannot build for it), so it is refused
# here by name rather than failing deep inside a template instance.
# Separate from turboquant-cuda.cmake so that scripts/cuda-check.sh can test it with cmake -P.
function(tq_cuda_check_archs ARCHS NVCC_VERSION)
    foreach (ARCH IN LISTS ARCHS)
        if (ARCH STREQUAL "native")
            continue() # upstream resolved it already where a GPU was visible; else nvcc picks one
        endif()
        if (ARCH MATCHES "^all")
            if (NVCC_VERSION VERSION_LESS "13")
                message(FATAL_ERROR "turboquant: CMAKE_CUDA_ARCHITECTURES=${ARCH} includes architectures older "
                    "than Volta (sm_70) with nvcc ${NVCC_VERSION}; the turbo kernels need sm_70 or newer. "
                    "Name the architectures instead (for example 75;86;89;90).")
            endif()
            continue()
        endif()
        if (NOT ARCH MATCHES "^([0-9]+)")
            message(FATAL_ERROR "turboquant: cannot read the CUDA architecture \"${ARCH}\"")
        endif()
        if (CMAKE_MATCH_1 LESS 70)
            message(FATAL_ERROR "turboquant: CUDA architecture sm_${CMAKE_MATCH_1} (\"${ARCH}\" in "
                "CMAKE_CUDA_ARCHITECTURES=${ARCHS}) is older than Volta (sm_70), which the turbo "
                "flash-attention kernels need. Build for sm_70 or newer only (TQ_CUDA_ARCHS for cargo, "
                "CMAKE_CUDA_ARCHITECTURES for CMake).")
        endif()
    endforeach()
endfunction()

# cmake -DTQ_TEST_ARCHS="61-virtual;90" -DTQ_TEST_NVCC=12.4 -P turboquant-cuda-archs.cmake
if (CMAKE_SCRIPT_MODE_FILE AND DEFINED TQ_TEST_ARCHS)
    tq_cuda_check_archs("${TQ_TEST_ARCHS}" "${TQ_TEST_NVCC}")
    message(STATUS "turboquant: CUDA architectures ${TQ_TEST_ARCHS} accepted")
endif()
