#!/usr/bin/env bash
# The ggml-level tests (tests/ggml_ops.rs driving ggml-ext/tests/ggml_ops.cpp on real ggml
# graphs) under AddressSanitizer + UndefinedBehaviorSanitizer.
#
#   scripts/sanitize.sh [extra cargo test args, e.g. a test name filter]
#
# llama.cpp (ggml, llama, our ggml test library) is compiled with GCC's
# -fsanitize=address,undefined in its own cargo target dir (target/sanitize, so the normal
# build is untouched) by pre-configuring that build directory with llama.cpp's
# GGML_SANITIZE_* / LLAMA_SANITIZE_* options, which build.rs's own configure keeps. The
# Rust test links the GCC sanitizer runtimes; any report aborts the test (halt_on_error).
# The Rust codec itself runs under ASan in scripts/fuzz.sh. First run: a full llama.cpp
# build (~10 min on 2 cores); later runs use ccache.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${TQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/turboquant}
export CCACHE_DIR=${CCACHE_DIR:-$cache/ccache} CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
export CARGO_TARGET_DIR=${TQ_SANITIZE_TARGET_DIR:-$root/target/sanitize}
build=$CARGO_TARGET_DIR/llama.cpp-build

if [ ! -d vendor/llama.cpp ]; then
  cargo build --release --lib    # materialises and patches vendor/llama.cpp
fi
if ! grep -q '^GGML_SANITIZE_ADDRESS:BOOL=ON' "$build/CMakeCache.txt" 2>/dev/null; then
  echo "sanitize: configuring $build with ASan + UBSan"
  cmake -S vendor/llama.cpp -B "$build" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_SANITIZE_ADDRESS=ON -DGGML_SANITIZE_UNDEFINED=ON \
    -DLLAMA_SANITIZE_ADDRESS=ON -DLLAMA_SANITIZE_UNDEFINED=ON \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF \
    -DTQ_EXT_DIR="$root/ggml-ext" -DTQ_BUILD_TESTS=ON >/dev/null
fi

# The sanitizer runtimes come in through the linker driver (gcc), first on the line.
export RUSTFLAGS="${RUSTFLAGS:-} -Clink-arg=-fsanitize=address -Clink-arg=-fsanitize=undefined"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$root/scripts/lsan.supp}
start=$(date +%s)
cargo test --release --test ggml_ops "$@" -- --test-threads 1 2>&1
echo "sanitize: ggml_ops under ASan+UBSan passed in $(( $(date +%s) - start )) s"
