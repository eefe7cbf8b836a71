#!/usr/bin/env bash
# Fuzz the turbo state reader: fuzz/state/state_fuzz.cpp around llama_state_seq_set_data,
# with llama + ggml built under ASan + UBSan (target/sanitize/llama), on a tiny random-weight
# model (scripts/random_gguf.py: 2 layers, head 64), seeded with real sequence states of
# turbo caches (fuzz/corpus/state/, written by the harness with --write-seeds when empty);
# the inputs of earlier findings (fuzz/corpus/state-findings/) are replayed first.
#
#   scripts/fuzz-state.sh [ITERATIONS] [RNG_SEED]      (default 20000, 1)
#   TQ_FUZZ_STATE_RELEASE=1 scripts/fuzz-state.sh ...  (links the release llama of
#       `cargo build --release` instead: no sanitizer build, only the harness has ASan, so
#       crashes, aborts, double frees and poisoning are found, out-of-bounds reads inside
#       llama are not)
#
# Needs python3 with numpy and pyyaml for the model (TQ_PYTHON, default python3); gguf comes from the
# llama.cpp tree. A finding aborts with the input in target/sanitize/state-findings/.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
iters=${1:-20000}
seed=${2:-1}
py=${TQ_PYTHON:-python3}
"$py" -c 'import numpy, yaml' 2>/dev/null ||
  { echo "fuzz-state: $py lacks numpy or pyyaml (the random model and gguf-py need them): pip install numpy pyyaml, or set TQ_PYTHON to a python that has it" >&2; exit 1; }
cache=${TQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/turboquant}
export CCACHE_DIR=${CCACHE_DIR:-$cache/ccache} CCACHE_BASEDIR=$root CCACHE_NOHASHDIR=1
build=$root/target/sanitize/llama

if [ "${TQ_FUZZ_STATE_RELEASE:-0}" = 1 ]; then
  # the codec as a static library (the turbo types call into it) and vendor/llama.cpp
  cargo build --release --lib -p turboquant -p turboquant-capi 2>&1 | grep -Ev '^\s+(Compiling|Blocking)' || true
  build=$root/target/llama.cpp-build
else
  # llama + ggml under ASan + UBSan, the build of scripts/sanitize-llama.sh
  scripts/sanitize-llama.sh build-lib
fi
lib=$root/target/release/libturboquant_capi.a
[ -f "$lib" ] && [ -d vendor/llama.cpp ] || { echo "fuzz-state: cargo build --release failed" >&2; exit 1; }

mkdir -p "$root/target/sanitize"
exe=$root/target/sanitize/state_fuzz
g=$build/ggml/src
rpc=$(find "$g" -name libggml-rpc.a | head -1) # the release build has GGML_RPC on
g++ -std=c++17 -O1 -g -fsanitize=address,undefined -fno-omit-frame-pointer \
  -I vendor/llama.cpp/include -I vendor/llama.cpp/ggml/include fuzz/state/state_fuzz.cpp \
  "$build/src/libllama.a" "$g/libggml.a" $rpc "$g/libggml-cpu.a" "$g/libggml-base.a" "$lib" \
  -lpthread -ldl -lm -o "$exe"

model=$root/target/sanitize/state-fuzz-model.gguf
if [ ! -f "$model" ]; then
  tok=$(target/release/tq fetch)
  PYTHONPATH=vendor/llama.cpp/gguf-py "$py" scripts/random_gguf.py --tokenizer-from "$tok" \
    --head 64 --n-head 2 --n-head-kv 1 --n-layer 2 --seed 7 -o "$model" >/dev/null
fi

corpus=$root/fuzz/corpus/state
mkdir -p "$corpus"
flag=
[ -n "$(ls -A "$corpus")" ] || flag=--write-seeds
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}
start=$(date +%s)
# the inputs of earlier findings go in first, unmutated (fuzz/corpus/state-findings)
STATE_FUZZ_REPLAY=$root/fuzz/corpus/state-findings \
  "$exe" "$model" "$corpus" "$iters" "$seed" "$root/target/sanitize/state-findings" $flag
what="llama and harness under ASan+UBSan"
[ "${TQ_FUZZ_STATE_RELEASE:-0}" = 1 ] && what="release llama, harness under ASan+UBSan"
echo "fuzz-state: $iters executions in $(( $(date +%s) - start )) s ($what)"
