# CMAKE_PROJECT_INCLUDE of the sanitizer build (scripts/sanitize-llama.sh), which has no
# ccache entries from the release build to start from, so it is cut to what the checks need:
# - ggml and libllama (our changes: the turbo types, K mean / balancing, the state reader)
#   keep -O1 and ASan + UBSan;
# - common and the tools' own code (server, perplexity) keep ASan + UBSan at -O0: about
#   half the compile time of -O1, and their run time is small next to ggml's;
# - mtmd, the multimodal library llama-server links, is compiled without the sanitizers
#   (none of our changes touch it, no check uses it, and it is a quarter of the sources);
#   the ASan runtime still tracks its heap at the allocator.
include_guard(GLOBAL)
function(tq_sanitize_build_tune)
    foreach(t llama-common llama-common-base server-context llama-server-impl llama-server
              llama-perplexity-impl llama-perplexity)
        if (TARGET ${t})
            target_compile_options(${t} PRIVATE -O0)
        endif()
    endforeach()
    if (TARGET mtmd)
        target_compile_options(mtmd PRIVATE -O0 -fno-sanitize=address,undefined)
    endif()
endfunction()
cmake_language(DEFER DIRECTORY "${CMAKE_SOURCE_DIR}" CALL tq_sanitize_build_tune)
