#!/usr/bin/env bash
# One prepared run on a GPU machine (H200: 16 cores, nvcc 13, no network), from the repo
# root, with .gpu/ from scripts/gpu-pack.sh carried along:
#   1. build llama.cpp with CUDA for sm_90 only (upstream's default FA pairs + our turbo
#      pairs), with test-backend-ops and llama-bench, linked with our Rust codec;
#   2. tq-parity on the device: CUDA encoder/decoder bytes against the Rust codec;
#   3. test-backend-ops -b CUDA0 on SET_ROWS, GET_ROWS, CPY, MUL_MAT, FLASH_ATTN_EXT for turbo types
#      (CUDA against the CPU backend);
#   4. llama-bench, flash attention on, f16 / q8_0 / q4_0 / turbo4 / turbo3 / turbo2 caches
#      (and turbo4/turbo3), pp512 and tg128 at depths 0, 8192, 32768.
# Tables and logs go to $OUT (the device tool's output folder) or results/gpu-check/.
# TQ_GPU_MODEL=path.gguf benchmarks that model instead of the random SmolLM2-shaped one.
set -uo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
out=${OUT:-$repo/results/gpu-check}
mkdir -p "$out"
log() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$out/summary.txt"; }
jobs=$(nproc)
work=${TQ_GPU_WORK:-/tmp/tq-gpu}
mkdir -p "$work"

log "gpu-check on $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo 'no nvidia-smi'), $jobs cores"
nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
log "nvcc: $("$nvcc" --version | tail -1)"

# 1. sources and build
if [ ! -d "$work/llama.cpp" ]; then
  tar -C "$work" -xJf .gpu/llama-src.tar.xz || { log "FAIL: no .gpu/llama-src.tar.xz (scripts/gpu-pack.sh)"; exit 1; }
fi
xz -dc .gpu/libturboquant.a.xz > "$work/libturboquant.a"
t0=$(date +%s)
gen=Ninja; command -v ninja >/dev/null || gen="Unix Makefiles"
cmake -S "$work/llama.cpp" -B "$work/build" -G "$gen" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_NATIVE=ON -DGGML_CUDA_FA_QUANTS="q4_0-q4_0;q8_0-q8_0;f16-f16" \
  -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_UI=OFF \
  -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DTQ_EXT_DIR="$repo/ggml-ext" -DTQ_RUST_LIB="$work/libturboquant.a" > "$out/build.log" 2>&1 \
  && cmake --build "$work/build" -j "$jobs" --target test-backend-ops llama-bench >> "$out/build.log" 2>&1
rc=$?
log "build: rc=$rc in $(( $(date +%s) - t0 )) s"
[ $rc -eq 0 ] || { tail -40 "$out/build.log"; exit 1; }
bin=$work/build/bin

# 2. codec parity on the device (and the host build of the same source)
"$nvcc" -std=c++17 -arch=sm_90 -O3 -use_fast_math -Xcompiler -ffp-contract=off \
  -I ggml-ext/include -I ggml-ext/cuda ggml-ext/cuda/tq-parity.cu "$work/libturboquant.a" \
  -lpthread -ldl -lm -o "$work/tq-parity" && "$work/tq-parity" > "$out/parity.txt" 2>&1
log "parity: rc=$? $(tail -1 "$out/parity.txt")"

# 3. backend ops: CUDA against CPU
"$bin/test-backend-ops" test -b CUDA0 -o SET_ROWS,GET_ROWS,CPY,MUL_MAT,FLASH_ATTN_EXT -p turbo > "$out/backend-ops.txt" 2>&1
rc=$?
log "test-backend-ops: rc=$rc $(grep -E 'tests passed|Backend .* (OK|FAIL)' "$out/backend-ops.txt" | tr '\n' ' ')"
grep -E '\bFAIL\b' "$out/backend-ops.txt" | head -20 | tee -a "$out/summary.txt"

# 4. speed
model=${TQ_GPU_MODEL:-}
if [ -z "$model" ]; then
  model=$work/smollm2-shape.gguf
  if [ ! -f "$model" ]; then
    python3 -m pip install -q --no-index --no-deps --target "$work/site" .gpu/gguf-*.whl
    PYTHONPATH=$work/site python3 scripts/random_gguf.py --tokenizer-from .gpu/tokenizer.gguf \
      --head 64 --n-head 9 --n-head-kv 3 --n-layer 30 --n-ff 1536 -o "$model" > /dev/null
  fi
fi
log "bench model: $model"
for kv in f16,f16 q8_0,q8_0 q4_0,q4_0 turbo4,turbo4 turbo3,turbo3 turbo2,turbo2 turbo4,turbo3; do
  k=${kv%,*}; v=${kv#*,}
  "$bin/llama-bench" -m "$model" -ngl 99 -fa 1 -ctk "$k" -ctv "$v" -p 512 -n 128 -d 0,8192,32768 -r 3 -o md \
    >> "$out/bench.md" 2>> "$out/bench.err" || log "llama-bench $k/$v failed"
done
log "bench: done"
cat "$out/bench.md"
