# Included by the patched ggml/src/ggml-vulkan/CMakeLists.txt right after the ggml-vulkan
# target is defined (GGML_VULKAN=ON). Our header (ggml-ext/ggml-vulkan/tq-vulkan.h) refuses
# the turbo types in the device's supports_op until they have shaders; tq-ggml.h and the C
# ABI come with ggml-base's include directories (turboquant.cmake).
target_include_directories(ggml-vulkan PRIVATE "${TQ_EXT_DIR}/ggml-vulkan")
message(STATUS "turboquant: Vulkan device refuses the turbo types (no turbo shaders yet)")
