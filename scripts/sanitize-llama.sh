#!/usr/bin/env bash
# Our llama.cpp changes (K mean / balancing, the state reader, the server's slot handling)
# under AddressSanitizer + UndefinedBehaviorSanitizer.
#
#   scripts/sanitize-llama.sh [all]       build, then run the checks below
#   scripts/sanitize-llama.sh build       build only
#   scripts/sanitize-llama.sh build-lib   build libllama + ggml only (scripts/fuzz-state.sh)
#
# llama, common, ggml and upstream's own llama-server and llama-perplexity executables are
# built with GCC's -fsanitize=address,undefined (llama.cpp's GGML_SANITIZE_* and
# LLAMA_SANITIZE_* options) in target/sanitize/llama, linked with the release codec
# (target/release/libturboquant_capi.a, TQ_RUST_LIB). Then:
#   1. llama-perplexity, turbo4/turbo3 and turbo3/turbo3 caches, -c 512: --chunks 2 with
#      -b 512 (one sequence at a time), --chunks 4 with -b 2048 (four sequences share the
#      cache): the K mean / balancing code on its SET and KEEP ubatch modes, one and many
#      sequences;
#   2. scripts/fuzz-state.sh against this llama (TQ_SAN_FUZZ_ITERS executions, default 300);
#   3. tests/reliability_state.rs and tests/reliability_http.rs with TQ_LLAMA_BIN_DIR
#      pointing here, so their llama-server is the sanitized one.
# Any ASan or UBSan report aborts the process it is in (abort_on_error / halt_on_error), so
# a report fails the run. TQ_SAN_STEPS picks steps (default "1 2 3"). TQ_SAN_NO_CARGO=1
# skips the release `cargo build` (when vendor/llama.cpp and the codec staticlib are there).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
cache=${TQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/turboquant}
export CCACHE_DIR=${CCACHE_DIR:-$cache/ccache} CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
build=$root/target/sanitize/llama
what=${1:-all}

# the codec as a static library (the turbo types call into it) and vendor/llama.cpp
[ "${TQ_SAN_NO_CARGO:-0}" = 1 ] ||
  cargo build --release --lib -p turboquant -p turboquant-capi 2>&1 | grep -Ev '^\s+(Compiling|Blocking)' || true
lib=$root/target/release/libturboquant_capi.a
[ -f "$lib" ] && [ -d vendor/llama.cpp ] || { echo "sanitize-llama: cargo build --release failed" >&2; exit 1; }

# -mno-amx-*: the same guard as the release build (build/cmake.rs, NO_AMX_FLAGS)
noamx=
[ "$(uname -m)" = x86_64 ] && noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# -O1 (what ASan's authors recommend) instead of -O3: about half the compile time of this
# build, which has no ccache entries from the release build to start from
cmake -S vendor/llama.cpp -B "$build" -G "Unix Makefiles" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_FLAGS_RELEASE="-O1 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O1 -DNDEBUG" \
  -DGGML_SANITIZE_ADDRESS=ON -DGGML_SANITIZE_UNDEFINED=ON -DLLAMA_SANITIZE_ADDRESS=ON \
  -DLLAMA_SANITIZE_UNDEFINED=ON -DGGML_NATIVE=ON -DGGML_CCACHE=ON \
  -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" \
  -DGGML_OPENMP=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_COMMON=ON -DLLAMA_BUILD_APP=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
  -DCMAKE_PROJECT_INCLUDE="$root/ggml-ext/cmake/sanitize-build.cmake" \
  -DTQ_EXT_DIR="$root/ggml-ext" -DTQ_RUST_LIB="$lib" >/dev/null
start=$(date +%s)
targets="llama llama-server llama-perplexity"
[ "$what" = build-lib ] && targets=llama
cmake --build "$build" -j "${NUM_JOBS:-2}" --target $targets >/dev/null
echo "sanitize-llama: build of $targets took $(( $(date +%s) - start )) s"
[ "$what" = build ] || [ "$what" = build-lib ] && exit 0

bin=$build/bin
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
steps=${TQ_SAN_STEPS:-1 2 3}
log=$root/target/sanitize/logs
mkdir -p "$log"

# `tq fetch` for the model: any tq will do (without llama it builds in a minute)
[ -x target/release/tq ] || cargo build --release --no-default-features -p tq 2>&1 | tail -1

if [[ " $steps " == *" 1 "* ]]; then
  model=$(target/release/tq fetch)
  text=$log/ppl-text.txt
  cat vendor/llama.cpp/docs/*.md > "$text"
  for kv in turbo4/turbo3 turbo3/turbo3; do
    for b in 512 2048; do
      name=ppl-${kv/\//-}-b$b
      chunks=2
      [ "$b" = 2048 ] && chunks=4 # four 512-token sequences in one cache
      t0=$(date +%s)
      "$bin/llama-perplexity" -m "$model" -f "$text" -c 512 --chunks $chunks -b "$b" -fa on -t 2 \
        -ctk "${kv%/*}" -ctv "${kv#*/}" > "$log/$name.log" 2>&1 \
        || { echo "sanitize-llama: $name failed:" >&2; tail -40 "$log/$name.log" >&2; exit 1; }
      echo "sanitize-llama: $name: $(grep -o 'Final estimate: PPL = [0-9.]*' "$log/$name.log") ($(( $(date +%s) - t0 )) s)"
    done
  done
fi

if [[ " $steps " == *" 2 "* ]]; then
  scripts/fuzz-state.sh "${TQ_SAN_FUZZ_ITERS:-300}" 1
fi

if [[ " $steps " == *" 3 "* ]]; then
  # The tests' own servers run the sanitized llama-server. A report aborts the server,
  # which fails the test that started it; reports also go to files (log_path), checked
  # below, so one in a server whose exit status no test looks at is not missed. The tests
  # need no llama build of their own (--no-default-features): the server is this one.
  rm -f "$log"/asan.* "$log"/ubsan.*
  t0=$(date +%s)
  ASAN_OPTIONS=$ASAN_OPTIONS:log_path=$log/asan UBSAN_OPTIONS=$UBSAN_OPTIONS:log_path=$log/ubsan \
    TQ_LLAMA_BIN_DIR=$bin cargo test --release --no-default-features -p turboquant \
    --test reliability_state --test reliability_http
  echo "sanitize-llama: server tests passed in $(( $(date +%s) - t0 )) s"
  if ls "$log"/asan.* "$log"/ubsan.* >/dev/null 2>&1; then
    echo "sanitize-llama: sanitizer reports from the servers:" >&2
    cat "$log"/asan.* "$log"/ubsan.* >&2
    exit 1
  fi
fi
echo "sanitize-llama: steps $steps passed under ASan+UBSan"
