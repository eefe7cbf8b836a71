#!/usr/bin/env bash
# Compile-only check of our CUDA code on a machine without a GPU (CI runs it every time):
#  1. a CUDA 13 toolkit from PyPI wheels (scripts/cuda-toolkit.sh, cached);
#  2. the patched llama.cpp configured with GGML_CUDA=ON for sm_90 (target/cuda-check);
#  3. compiled: the generated flash-attention instances of every turbo K/V pair at head
#     size 128, and one pair per kernel (vector, GQA, trellis) at 64 and 256 in a second
#     build tree (target/cuda-check-heads), every upstream CUDA file our patch hooks into
#     (convert, getrows, set-rows, cpy, fattn, ggml-cuda) and test-backend-ops.cpp with our
#     test cases - through ccache. Only a compile check: device code as ggml builds it (-O3
#     -use_fast_math, sm_90), host code at -O0 and the fatbinary uncompressed, which take a
#     third of a cold compile and check nothing of ours (docs/CI.md);
#     Also: the configure-time refusal of pre-Volta architectures, tested with cmake -P;
#  4. ggml-ext/ggml-cuda/tq-parity.cu compiled and linked against libturboquant_capi.a, and run with
#     --host: the CUDA codec source, built for the CPU, must reproduce the Rust codec's
#     bytes and decoded values bit for bit (the trellis types too: tq-parity-tcq.cuh). (On a
#     GPU, scripts/gpu-check.sh runs it on the device too.) Then the trellis encoder's PTX
#     and the fused K side's kernel must show no f32 FMA and no local memory.
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

# configure BUILD_DIR HEAD_SIZES: the patched tree with GGML_CUDA=ON for sm_90. Device code
# gets ggml's own flags (nvcc's -O sets only the host compiler's level); the host side is
# compiled at -O0 and the fatbinary left uncompressed (GGML_CUDA_COMPRESSION_MODE), which
# this check never links or runs.
configure() {
  mkdir -p "$1"
  if ! cmake -S "$src" -B "$1" -G "Unix Makefiles" \
      -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DGGML_CCACHE=ON \
      -DCMAKE_CUDA_FLAGS_RELEASE="-O0 -DNDEBUG" -DCMAKE_CXX_FLAGS_RELEASE="-O0 -DNDEBUG" \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DGGML_CUDA_COMPRESSION_MODE=none \
      -DTQ_CUDA_FA_HEAD_SIZES="$2" \
      -DCUDAToolkit_ROOT="$root" -DCMAKE_CUDA_COMPILER="$root/bin/nvcc" \
      -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF \
      -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF \
      -DTQ_EXT_DIR="$repo/ggml-ext" >"$1/configure.log" 2>&1; then
    tail -30 "$1/configure.log" >&2
    exit 1
  fi
}

# compile BUILD_DIR OBJECT...: ggml-cuda objects (paths under ggml-cuda.dir/, e.g.
# fattn.cu.o), each recompiled (ccache answers for unchanged sources): building single objects
# skips CMake's dependency scan, so an edited header (tq-cuda.cuh) would not make an existing
# object out of date and a stale one would pass the check. The rules come from the target's
# build.make, run from the build tree's top: the per-folder Makefile that offers the same
# object targets is .NOTPARALLEL, so `make -j` there compiled one object at a time.
compile() {
  local top=$1 dir=ggml/src/ggml-cuda/CMakeFiles/ggml-cuda.dir o
  shift
  local paths=()
  for o in "$@"; do
    rm -f "$top/$dir/$o"
    paths+=("$dir/$o")
  done
  make -s -C "$top" -f "$dir/build.make" -j"${NUM_JOBS:-2}" "${paths[@]}" 2>&1 | grep -v '^make' || true
  for o in "$@"; do
    [ -f "$top/$dir/$o" ] || { echo "cuda-check: $o failed to compile" >&2; exit 1; }
  done
}

# Every pair at head size 128: what a kernel instance does with its types is checked there.
# Head size enters the kernels only as a template constant that every type meets the same
# way (its static_asserts are D % block and D % 64, shared memory sized by D), so 64 and 256
# are compiled for one pair of each kernel: scalar turbo K/V for the vector and the GQA
# kernel (turbo4 K, turbo3 V: both decoders), a trellis pair for the vector one.
bdir=$repo/target/cuda-check
configure "$bdir" 128
cuda_dir=$bdir/ggml/src/ggml-cuda
objs=(convert.cu.o getrows.cu.o set-rows.cu.o cpy.cu.o fattn.cu.o ggml-cuda.cu.o)
for f in "$cuda_dir"/tq-template-instances/*.cu; do
  objs+=("tq-template-instances/$(basename "$f").o")
done
heads=$repo/target/cuda-check-heads
configure "$heads" "64;256"
head_objs=()
for i in fattn-vec-instance-turbo4-turbo3 fattn-gqa-instance-turbo4-turbo3 fattn-vec-instance-turbo3_tcq-turbo2_tcq; do
  [ -f "$heads/ggml/src/ggml-cuda/tq-template-instances/$i.cu" ] \
    || { echo "cuda-check: $i.cu was not generated (turboquant-cuda.cmake's pair list)" >&2; exit 1; }
  head_objs+=("tq-template-instances/$i.cu.o")
done
echo "cuda-check: compiling ${#objs[@]} CUDA objects for sm_90 (head size 128), ${#head_objs[@]} at head sizes 64 and 256"
rm -f "$bdir/tests/CMakeFiles/test-backend-ops.dir/test-backend-ops.cpp.o"
compile "$bdir" "${objs[@]}"
compile "$heads" "${head_objs[@]}"
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
# The same for the fused K side's kernel (tq-cuda-rf-keep.cuh), whose values must be the CPU's.
for entry in _Z19tcq_quantize_kernelILi2EEvPKfPcl _Z19tcq_quantize_kernelILi3EEvPKfPcl \
             _Z22tq_cuda_rf_keep_kernel15tq_rf_keep_args; do
  body=$(awk -v e="$entry" 'index($0, ".entry " e "(") {on = 1} on {print} on && /^}/ {exit}' "$bdir/tq-parity.ptx")
  [ -n "$body" ] || { echo "cuda-check: $entry not found in the parity PTX" >&2; exit 1; }
  if grep -E 'fma[.a-z]*\.f32|(ld|st)\.local' <<< "$body" >&2; then
    echo "cuda-check: $entry has f32 FMA or local memory in its PTX (above)" >&2
    exit 1
  fi
done
echo "cuda-check: trellis encoder and fused K side PTX: no f32 FMA, no local memory"
echo "cuda-check: done in $(( $(date +%s) - start )) s"
