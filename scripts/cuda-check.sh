#!/usr/bin/env bash
# Compile-only check of our CUDA code on a machine without a GPU (CI runs it every time):
#  1. a CUDA 13 toolkit from PyPI wheels (scripts/cuda-toolkit.sh, cached);
#  2. the patched llama.cpp configured with GGML_CUDA=ON for sm_90 (target/cuda-check);
#  3. compiled: the generated flash-attention instances of every turbo K/V pair, every
#     upstream CUDA file our patch hooks into (convert, getrows, set-rows, cpy, fattn,
#     ggml-cuda) and test-backend-ops.cpp with our test cases - through ccache;
#     Also: the configure-time refusal of pre-Volta architectures, tested with cmake -P;
#  4. ggml-ext/ggml-cuda/tq-parity.cu compiled and linked against libturboquant_capi.a, and run with
#     --host: the CUDA codec source, built for the CPU, must reproduce the Rust codec's
#     bytes and decoded values bit for bit (the trellis types too: tq-parity-tcq.cuh). (On a
#     GPU, scripts/gpu-check.sh runs it on the device too.) Then the trellis encoder's PTX
#     must show no f32 FMA and no local memory.
# Linking all of ggml-cuda (~15 min on 2 cores) is left to `cargo build --features cuda`
# and scripts/gpu-check.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
start=$(date +%s)

root=$(scripts/cuda-toolkit.sh --cublas)
src=${LLAMA_CPP_DIR:-$repo/vendor/llama.cpp}
if ! grep -q turboquant "$src/ggml/src/ggml-cuda/fattn.cu" 2>/dev/null; then
  echo "cuda-check: $src is not the patched llama.cpp tree (run cargo build first)" >&2
  exit 1
fi
[ -f target/release/libturboquant_capi.a ] || cargo build --release -p turboquant-capi

# The configure-time refusal of pre-Volta archs (turboquant-cuda-archs.cmake), which nvcc 13
# cannot compile for, so only this logic can be checked here.
archs=ggml-ext/cmake/turboquant-cuda-archs.cmake
for bad in "61-virtual;90" "50" "all"; do
  if cmake -DTQ_TEST_ARCHS="$bad" -DTQ_TEST_NVCC=12.8 -P "$archs" >/dev/null 2>&1; then
    echo "cuda-check: CUDA architectures \"$bad\" were not refused" >&2
    exit 1
  fi
done
msg=$(cmake -DTQ_TEST_ARCHS="61-virtual;90" -DTQ_TEST_NVCC=12.8 -P "$archs" 2>&1 || true)
grep -q 'sm_61' <<< "$msg" || { echo "cuda-check: the refusal does not name sm_61: $msg" >&2; exit 1; }
cmake -DTQ_TEST_ARCHS="70;75-virtual;86-real;90a;120a-real;native" -DTQ_TEST_NVCC=12.8 -P "$archs" >/dev/null \
  || { echo "cuda-check: Volta-or-newer architectures were refused" >&2; exit 1; }

bdir=$repo/target/cuda-check
mkdir -p "$bdir"
if ! cmake -S "$src" -B "$bdir" -G "Unix Makefiles" \
    -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_CCACHE=ON \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCUDAToolkit_ROOT="$root" -DCMAKE_CUDA_COMPILER="$root/bin/nvcc" \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
    -DTQ_EXT_DIR="$repo/ggml-ext" >"$bdir/configure.log" 2>&1; then
  tail -30 "$bdir/configure.log" >&2
  exit 1
fi

cuda_dir=$bdir/ggml/src/ggml-cuda
objs=(convert.o getrows.o set-rows.o cpy.o fattn.o ggml-cuda.o)
for f in "$cuda_dir"/tq-template-instances/*.cu; do
  objs+=("tq-template-instances/$(basename "${f%.cu}").o")
done
echo "cuda-check: compiling ${#objs[@]} CUDA objects for sm_90"
# Always recompile (ccache answers for unchanged sources): building single objects inside
# ggml-cuda's folder skips CMake's dependency scan, so an edited header (tq-cuda.cuh) would
# not make an existing object out of date and a stale one would pass the check.
for o in "${objs[@]}"; do
  rm -f "$cuda_dir/CMakeFiles/ggml-cuda.dir/${o%.o}.cu.o"
done
rm -f "$bdir/tests/CMakeFiles/test-backend-ops.dir/test-backend-ops.cpp.o"
make -s -C "$cuda_dir" -j"${NUM_JOBS:-2}" "${objs[@]}" 2>&1 | grep -v '^make' || true
for o in "${objs[@]}"; do
  [ -f "$cuda_dir/CMakeFiles/ggml-cuda.dir/${o%.o}.cu.o" ] || { echo "cuda-check: $o failed to compile" >&2; exit 1; }
done
make -s -C "$bdir/tests" test-backend-ops.o 2>&1 | grep -v '^make' || true
[ -f "$bdir/tests/CMakeFiles/test-backend-ops.dir/test-backend-ops.cpp.o" ] \
  || { echo "cuda-check: test-backend-ops.cpp failed to compile" >&2; exit 1; }

# Same fast-math flags as ggml's CUDA build; the host side without FMA contraction, as Rust.
ccache "$root/bin/nvcc" -std=c++17 -arch=sm_90 -O3 -use_fast_math -Xcompiler -ffp-contract=off \
  -I ggml-ext/abi -I ggml-ext/ggml -I ggml-ext/ggml-cuda -c ggml-ext/ggml-cuda/tq-parity.cu -o "$bdir/tq-parity.o"
"$root/bin/nvcc" -arch=sm_90 "$bdir/tq-parity.o" target/release/libturboquant_capi.a -lpthread -ldl -lm -o "$bdir/tq-parity"
"$bdir/tq-parity" --host

# The trellis encoder's device code (tq-tcq-encode.cuh, as the parity kernels instantiate it
# under ggml's -use_fast_math) must hold no f32 FMA - a contracted a*b+c would change the
# path costs' bits - and no local memory (its per-lane arrays stay in registers).
"$root/bin/nvcc" -std=c++17 -arch=sm_90 -O3 -use_fast_math -I ggml-ext/abi -I ggml-ext/ggml -I ggml-ext/ggml-cuda \
  -ptx ggml-ext/ggml-cuda/tq-parity.cu -o "$bdir/tq-parity.ptx"
for k in 2 3; do
  entry="_Z19tcq_quantize_kernelILi${k}EEvPKfPcl"
  body=$(awk -v e="$entry" 'index($0, ".entry " e "(") {on = 1} on {print} on && /^}/ {exit}' "$bdir/tq-parity.ptx")
  [ -n "$body" ] || { echo "cuda-check: $entry not found in the parity PTX" >&2; exit 1; }
  if grep -E 'fma[.a-z]*\.f32|(ld|st)\.local' <<< "$body" >&2; then
    echo "cuda-check: the trellis encoder (k = $k) has f32 FMA or local memory in its PTX (above)" >&2
    exit 1
  fi
done
echo "cuda-check: trellis encoder PTX: no f32 FMA, no local memory"
echo "cuda-check: done in $(( $(date +%s) - start )) s"
