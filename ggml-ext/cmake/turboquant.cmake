# Included by the patched ggml/src/CMakeLists.txt right after ggml-base is defined.
#
# TQ_EXT_DIR   this ggml-ext/ folder (required; build.rs passes it)
# TQ_RUST_LIB  optional path of libturboquant_capi.a. The Rust binaries (cargo build) link the
#              codec themselves and leave this unset; set it when building llama.cpp's own
#              executables (test-backend-ops, scripts/gpu-check.sh) so they resolve tq_*.
if (NOT TQ_EXT_DIR OR NOT EXISTS "${TQ_EXT_DIR}/abi/turboquant.h")
    message(FATAL_ERROR "turboquant: set -DTQ_EXT_DIR=<repo>/ggml-ext (this tree carries turboquant patches)")
endif()

# Our folders mirror the patch series (docs/ARCHITECTURE.md): the C ABI, ggml core glue,
# ggml-cpu, llama, tools. ggml-base carries them all so that every target that links ggml
# (llama, common, the tools) finds the header its patch line includes.
foreach(tq_dir abi ggml ggml-cpu llama tools)
    target_include_directories(ggml-base PUBLIC "${TQ_EXT_DIR}/${tq_dir}")
endforeach()

# The custom nodes' functions (ggml/tq-rf-keep.h, the fused K side; ggml/tq-rot-node.h, the
# rotation): one definition each, in ggml-base, whose address tells every backend the node is ours.
target_sources(ggml-base PRIVATE "${TQ_EXT_DIR}/ggml/tq-rf-keep.cpp" "${TQ_EXT_DIR}/ggml/tq-rot-node.cpp")
# Their sums are the order every device kernel of the nodes follows; GCC and Clang contract
# a * b + c into an FMA by default where the target has one (aarch64, or x86 with -march).
if (NOT MSVC)
    set_source_files_properties("${TQ_EXT_DIR}/ggml/tq-rf-keep.cpp" "${TQ_EXT_DIR}/ggml/tq-rot-node.cpp"
                                PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
endif()

if (TQ_RUST_LIB)
    if (NOT EXISTS "${TQ_RUST_LIB}")
        message(FATAL_ERROR "turboquant: TQ_RUST_LIB=${TQ_RUST_LIB} does not exist (cargo build --release --no-default-features)")
    endif()
    # The Rust staticlib needs the usual system libraries of a Rust program.
    target_link_libraries(ggml-base PUBLIC "${TQ_RUST_LIB}" ${CMAKE_DL_LIBS} pthread m)
endif()

# Our ggml-level tests (ggml-ext/tests), built as a static library that a Rust test links.
if (TQ_BUILD_TESTS)
    add_library(tq-ggml-tests STATIC "${TQ_EXT_DIR}/tests/ggml_ops.cpp" "${TQ_EXT_DIR}/tests/sink_ops.cpp"
                                     "${TQ_EXT_DIR}/tests/contract_ops.cpp"
                                     "${TQ_EXT_DIR}/tests/backend_turbo.cpp")
    target_link_libraries(tq-ggml-tests PUBLIC ggml)
    target_compile_features(tq-ggml-tests PRIVATE cxx_std_17)
endif()

# ggml-rpc-server for cargo: upstream's tools/rpc/rpc-server.cpp as a static library whose
# `main` is renamed, so the thin Rust main (src/bin/ggml_rpc_server.rs) links it with ggml
# and the codec, like the other tools' *-impl libraries.
if (TQ_BUILD_RPC_SERVER AND GGML_RPC)
    add_library(tq-rpc-server-impl STATIC "${CMAKE_SOURCE_DIR}/tools/rpc/rpc-server.cpp")
    target_compile_definitions(tq-rpc-server-impl PRIVATE main=tq_rpc_server_main)
    target_link_libraries(tq-rpc-server-impl PUBLIC ggml)
    target_compile_features(tq-rpc-server-impl PRIVATE cxx_std_17)
endif()
