#!/usr/bin/env bash
# A wheel of llama-cpp-python with turbo KV caches: the pinned, sha256-checked sdist
# (vendor/llama.cpp.pin), our patch applied to its vendor/llama.cpp, the codec
# (libturboquant_capi.a) linked into libggml-base, and GGML_TYPE_TURBO2/3/4 in the Python
# package. CPU by default; TQ_CUDA=1 (or --cuda) builds ggml-cuda with our kernels.
# usage: scripts/python-wheel.sh [--cuda] [OUT_DIR]   (default OUT_DIR: target/wheels)
# Figures: docs/ECOSYSTEM.md.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
cuda=${TQ_CUDA:-0}
if [ "${1:-}" = "--cuda" ]; then cuda=1; shift; fi
out=$(realpath -m "${1:-$root/target/wheels}")
cache=${TQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/turboquant}
work=$root/target/python-wheel
pin() { sed -n "s/^$1 *= *//p" "$root/vendor/llama.cpp.pin"; }
start=$(date +%s)

# The codec alone (no llama.cpp), in its own target dir so the main build keeps its
# fingerprints; Rust staticlibs are position-independent on Linux, fit for a .so.
CARGO_TARGET_DIR=$root/target/wheel-codec cargo build --release --no-default-features -p turboquant-capi \
  --manifest-path "$root/Cargo.toml" >&2
lib=$root/target/wheel-codec/release/libturboquant_capi.a

archive=$cache/$(pin archive)
if [ ! -f "$archive" ]; then
  echo "python-wheel: fetching $(pin package)==$(pin version) (sdist) with pip" >&2
  python3 -m pip download --no-deps --no-binary "$(pin package)" \
    "$(pin package)==$(pin version)" -d "$cache" >&2
fi
echo "$(pin sha256)  $archive" | sha256sum -c --quiet - ||
  { echo "python-wheel: $archive does not match the pin; delete it to refetch" >&2; exit 1; }

# A fresh source tree every time (patching is not idempotent); the cmake build dir below
# persists, so a rebuild recompiles only what changed (and ccache covers the rest).
src=$work/src
rm -rf "$src" && mkdir -p "$src"
tar -xzf "$archive" -C "$src" --strip-components=1
rm -f "$src/vendor/llama.cpp/.git"
for p in "$root"/ggml-ext/patches/*.patch; do
  patch -d "$src/vendor/llama.cpp" -p1 --forward --batch --quiet -i "$p"
done

# The type ids from the patched ggml.h, so the Python constants cannot drift from it.
ggml_h=$src/vendor/llama.cpp/ggml/include/ggml.h
py=$src/llama_cpp/llama_cpp.py
{
  echo
  echo "# turboquant: the KV-cache types this build adds (ggml.h of the patched llama.cpp)"
  grep -oE 'GGML_TYPE_(TURBO[0-9A-Z_]*|TCQ[0-9A-Z_]*|COUNT) *= *[0-9]+' "$ggml_h" | sed 's/ *= */ = /'
} >> "$py"
grep -q '^GGML_TYPE_TURBO3 = ' "$py" || { echo "python-wheel: no GGML_TYPE_TURBO* in $ggml_h" >&2; exit 1; }

# Only what the Python package loads: libllama, libggml*. Its CMakeLists forces llama.cpp's
# common library on (only mtmd, the multimodal lib, uses it); with LLAVA_BUILD=OFF neither
# is built. (llama_cpp.mtmd_cpp is imported only by the multimodal chat handlers.)
sed -i 's/set(LLAMA_BUILD_COMMON ON CACHE BOOL "Build llama.cpp common library" FORCE)/set(LLAMA_BUILD_COMMON OFF CACHE BOOL "Build llama.cpp common library" FORCE)/' "$src/CMakeLists.txt"
grep -q 'LLAMA_BUILD_COMMON OFF' "$src/CMakeLists.txt" || { echo "python-wheel: cannot turn off common in $src/CMakeLists.txt" >&2; exit 1; }

export CCACHE_DIR=${CCACHE_DIR:-$cache/ccache} CCACHE_BASEDIR=$src CCACHE_NOHASHDIR=1
args="-DTQ_EXT_DIR=$root/ggml-ext -DTQ_RUST_LIB=$lib -DGGML_CCACHE=ON -DLLAMA_BUILD_UI=OFF"
args+=" -DLLAMA_USE_PREBUILT_UI=OFF -DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TOOLS=OFF"
args+=" -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF"
# As build/cmake.rs (NO_AMX_FLAGS): GGML_NATIVE on an AMX Xeon turns on upstream's AMX
# matmul, which crashes at the first decode of the pinned llama.cpp (issue 12).
cflags=${CFLAGS:-} cxxflags=${CXXFLAGS:-}
case $(uname -m) in x86_64|amd64)
  cflags+=" -mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
  cxxflags+=" -mno-amx-tile -mno-amx-int8 -mno-amx-bf16";;
esac
if [ "$cuda" = 1 ]; then
  args+=" -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=${TQ_CUDA_ARCHS:-native}"
  [ -n "${TQ_CUDA_ROOT:-}" ] && args+=" -DCUDAToolkit_ROOT=$TQ_CUDA_ROOT -DCMAKE_CUDA_COMPILER=$TQ_CUDA_ROOT/bin/nvcc"
fi
mkdir -p "$out"
rm -f "$out"/llama_cpp_python-*.whl
CMAKE_ARGS="$args" CMAKE_BUILD_PARALLEL_LEVEL=${NUM_JOBS:-2} CMAKE_GENERATOR="Unix Makefiles" \
  python3 -m pip wheel --no-deps --disable-pip-version-check -w "$out" \
  --config-settings=build-dir="$work/build$([ "$cuda" = 1 ] && echo -cuda)" \
  --config-settings=cmake.define.CMAKE_C_FLAGS="${cflags# }" \
  --config-settings=cmake.define.CMAKE_CXX_FLAGS="${cxxflags# }" "$src" >&2
whl=$(ls "$out"/llama_cpp_python-*.whl)
echo "python-wheel: $(du -h "$whl" | cut -f1) in $(( $(date +%s) - start )) s" >&2
echo "$whl"
