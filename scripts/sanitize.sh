#!/usr/bin/env bash
# The ggml-level tests (tests/ggml_ops.rs driving ggml-ext/tests/ggml_ops.cpp on real ggml
# graphs through the CPU backend) under AddressSanitizer + UndefinedBehaviorSanitizer.
#
#   scripts/sanitize.sh [test-name filter]
#
# ggml (base, CPU backend) and our ggml test library are built with GCC's
# -fsanitize=address,undefined (llama.cpp's GGML_SANITIZE_* options) in their own build
# directory, target/sanitize/ggml, without llama, the tools or RPC; the test is compiled
# with rustc against the release codec (target/release/libturboquant_capi.rlib) and linked with
# those libraries and the GCC sanitizer runtimes (named again after the archives: rustc
# links with --as-needed, which drops them where gcc puts them). Any report aborts. The
# Rust codec itself runs under ASan in scripts/fuzz.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${TQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/turboquant}
export CCACHE_DIR=${CCACHE_DIR:-$cache/ccache} CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
build=$root/target/sanitize/ggml

# the codec rlib and vendor/llama.cpp (materialised and patched by build.rs)
cargo build --release --lib -p turboquant -p turboquant-capi 2>&1 | grep -Ev '^\s+(Compiling|Blocking)' || true
rlib=$root/target/release/libturboquant_capi.rlib
[ -f "$rlib" ] && [ -d vendor/llama.cpp ] || { echo "sanitize: cargo build --release failed" >&2; exit 1; }

cmake -S vendor/llama.cpp -B "$build" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_SANITIZE_ADDRESS=ON -DGGML_SANITIZE_UNDEFINED=ON -DGGML_NATIVE=ON -DGGML_CCACHE=ON \
  -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_COMMON=OFF -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DTQ_EXT_DIR="$root/ggml-ext" -DTQ_BUILD_TESTS=ON >/dev/null
cmake --build "$build" -j "${NUM_JOBS:-2}" --target tq-ggml-tests >/dev/null

g=$build/ggml/src
exe=$root/target/sanitize/ggml_ops
rustc --edition 2021 --test -C opt-level=3 --cfg 'feature="llama"' \
  --extern turboquant_capi="$rlib" -L dependency="$root/target/release/deps" \
  -C link-arg="$g/libtq-ggml-tests.a" -C link-arg="$g/libggml.a" \
  -C link-arg="$g/libggml-cpu.a" -C link-arg="$g/libggml-base.a" \
  -C link-arg=-lstdc++ -C link-arg=-lm \
  -C link-arg=-fsanitize=address -C link-arg=-fsanitize=undefined \
  -C link-arg=-Wl,--no-as-needed -C link-arg=-lasan -C link-arg=-lubsan \
  tests/ggml_ops.rs -o "$exe"

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
start=$(date +%s)
# the runtime must come first: rustc's link line cannot put it there, preloading does
LD_PRELOAD=$(gcc -print-file-name=libasan.so) "$exe" --test-threads 1 "$@"
echo "sanitize: ggml_ops under ASan+UBSan passed in $(( $(date +%s) - start )) s"
