#!/usr/bin/env bash
# Builds here, without a GPU, the tools scripts/gpu-check.sh and scripts/gpu-bench.sh run on a
# lent GPU machine, so that machine spends its minutes on checks instead of nvcc (a build
# there took an estimated 5-10 of the 15 minutes a GPU is lent for, start included).
#
#   scripts/gpu-prebuild.sh        # after scripts/gpu-pack.sh: adds .gpu/prebuilt-sm90.tar.xz
#
# The same reduced configuration gpu-check.sh builds there (sm_90, upstream's vector FA for
# f16/q8_0 only, our pairs at head sizes 64 and 128), with the toolkit from NVIDIA's PyPI
# wheels (scripts/cuda-toolkit.sh --cublas) and the CPU code for x86-64 with AVX2/FMA/F16C
# (every H100/H200 host has them; -march=native here would tie it to this machine). The tools
# find their own libraries through an $ORIGIN rpath (linked here with -rpath-link to the
# wheels' libraries, and the driver's symbols left to libcuda.so.1 there, which no file here
# is named); the archive carries libcudart from the
# wheels (minor-version compatible with the machine's driver 580, the kernels are sm_90 SASS),
# while cuBLAS (444 MB here) and the driver come from the machine's CUDA install.
# The archive records the md5 of .gpu/llama-src.tar.xz + .gpu/libturboquant_capi.a.xz it was
# built from; tq_build_tree (gpu-lib.sh) unpacks it only when they still match, else builds.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
pack=$repo/.gpu
[ -f "$pack/llama-src.tar.xz" ] && [ -f "$pack/libturboquant_capi.a.xz" ] ||
  { echo "gpu-prebuild: run scripts/gpu-pack.sh first" >&2; exit 1; }
stamp=$(cat "$pack/llama-src.tar.xz" "$pack/libturboquant_capi.a.xz" | md5sum | cut -d' ' -f1)

root=$(scripts/cuda-toolkit.sh --cublas)
work=$repo/target/gpu-prebuilt
src=$work/src
mkdir -p "$work"
# build from exactly what was packed (the GPU machine would build the same files)
if [ "$(cat "$src/.pack" 2>/dev/null)" != "$stamp" ]; then
  rm -rf "$src" && mkdir -p "$src"
  tar -C "$src" --strip-components=1 -xJf "$pack/llama-src.tar.xz"
  xz -dc "$pack/libturboquant_capi.a.xz" > "$src/libturboquant_capi.a"
  echo "$stamp" > "$src/.pack"
fi
gen=Ninja
command -v ninja >/dev/null || gen="Unix Makefiles"
t0=$(date +%s)
cmake -S "$src" -B "$work/build" -G "$gen" -DCMAKE_BUILD_TYPE=Release \
  -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 -DCUDAToolkit_ROOT="$root" -DCMAKE_CUDA_COMPILER="$root/bin/nvcc" \
  -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_CCACHE=ON \
  -DGGML_CUDA_FA_QUANTS="q8_0-q8_0" -DTQ_CUDA_FA_HEAD_SIZES="64;128" \
  -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
  -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
  -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' \
  -DCMAKE_EXE_LINKER_FLAGS="-Wl,-rpath-link,$root/lib -Wl,--allow-shlib-undefined" \
  -DTQ_EXT_DIR="$repo/ggml-ext" -DTQ_RUST_LIB="$src/libturboquant_capi.a" > "$work/configure.log" 2>&1 ||
  { tail -30 "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" -j "${NUM_JOBS:-$(nproc)}" --target test-backend-ops llama-bench llama-perplexity
# tq-parity as gpu-check.sh builds it there (ggml's fast-math flags, sm_90)
ccache "$root/bin/nvcc" -std=c++17 -arch=sm_90 -O3 -use_fast_math -Xcompiler -ffp-contract=off \
  -I ggml-ext/abi -I ggml-ext/ggml -I ggml-ext/ggml-cuda -c ggml-ext/ggml-cuda/tq-parity.cu -o "$work/tq-parity.o"
"$root/bin/nvcc" -arch=sm_90 "$work/tq-parity.o" "$src/libturboquant_capi.a" -lpthread -ldl -lm \
  -Xlinker -rpath -Xlinker '$ORIGIN' -o "$work/build/bin/tq-parity"
echo "gpu-prebuild: built in $(( $(date +%s) - t0 )) s"

# bin/: the tools, the shared libraries they load, libcudart, and the stamp
stage=$work/stage
rm -rf "$stage" && mkdir -p "$stage/bin"
cp -a "$work/build/bin/"{test-backend-ops,llama-bench,llama-perplexity,tq-parity} "$stage/bin/"
find "$work/build/bin" -maxdepth 1 -name '*.so*' -exec cp -a {} "$stage/bin/" \;
cp -a "$root"/lib/libcudart.so* "$stage/bin/" 2>/dev/null || cp -a "$root"/lib64/libcudart.so* "$stage/bin/"
echo "$stamp" > "$stage/bin/.pack"
missing=$(LD_LIBRARY_PATH= ldd "$stage/bin/test-backend-ops" | grep 'not found' | grep -v -e libcuda.so -e libcublas || true)
[ -z "$missing" ] || { echo "gpu-prebuild: unresolved libraries besides the driver's and cuBLAS:" >&2; echo "$missing" >&2; exit 1; }
# no symbol tables (the dynamic symbols stay), then the strongest xz: the archive rides in
# every device call
strip --strip-unneeded "$stage/bin/"*.so.* "$stage/bin/"lib*-impl.so "$stage/bin/"{test-backend-ops,llama-bench,llama-perplexity,tq-parity}
tar -C "$stage" -cf - bin | xz -T0 -9e > "$pack/prebuilt-sm90.tar.xz"
echo "$stamp" > "$pack/sources.md5"
# gpu-check's call carries the archive and the stamp only (.gpu/prebuilt-sm90.tar.xz,
# .gpu/sources.md5); the sources, tokenizer and wheel would not fit beside it, and gpu-bench's
# call carries what it needs itself (docs/CUDA.md)
du -sh "$pack/prebuilt-sm90.tar.xz" "$pack"
size=$(du -cm "$pack/prebuilt-sm90.tar.xz" "$pack/sources.md5" | tail -1 | cut -f1)
[ "$size" -le 60 ] || { echo "gpu-prebuild: the check's carry is $size MiB, over the 60 MiB a device call can carry with room to spare" >&2; exit 1; }
