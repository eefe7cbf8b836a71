#!/usr/bin/env bash
# Assemble a CUDA 13 toolkit root from NVIDIA's PyPI wheels, for compiling (and linking)
# without a GPU and without NVIDIA's installer. Prints the root on stdout.
#
#   scripts/cuda-toolkit.sh            # nvcc, headers, cudart: enough to compile our .cu files
#   scripts/cuda-toolkit.sh --cublas   # + cuBLAS (444 MB), needed to link all of ggml-cuda
#
# The wheels and the unpacked root live in the cache ($TQ_CACHE_DIR or ~/.cache/turboquant),
# so a second run downloads nothing. Versions are pinned here, in one place.
set -euo pipefail

cache=${TQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/turboquant}
wheels=$cache/cuda13/wheels
root=$cache/cuda13/root

pkgs=(nvidia-cuda-nvcc==13.5.37 nvidia-nvvm==13.5.37 nvidia-cuda-crt==13.5.37
      nvidia-cuda-runtime==13.5.37 nvidia-cuda-cccl==13.3.5.0.6)
stamp=$root/.complete-base
if [ "${1:-}" = "--cublas" ]; then
  pkgs+=(nvidia-cublas==13.10.0.20)
  stamp=$root/.complete-cublas
fi

if [ ! -f "$stamp" ]; then
  mkdir -p "$wheels" "$root"
  echo "cuda-toolkit: fetching ${pkgs[*]} (cached in $wheels)" >&2
  python3 -m pip download --quiet --no-deps --only-binary :all: \
    --platform manylinux_2_27_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    --python-version 3.11 -d "$wheels" "${pkgs[@]}" >&2
  unpack=$(mktemp -d)
  trap 'rm -rf "$unpack"' EXIT
  for pkg in "${pkgs[@]}"; do
    name=${pkg%%==*}; ver=${pkg##*==}
    whl=$(ls "$wheels"/"${name//-/_}"-"$ver"-*.whl 2>/dev/null | head -1)
    [ -n "$whl" ] || { echo "cuda-toolkit: wheel for $pkg missing in $wheels" >&2; exit 1; }
    python3 -m zipfile -e "$whl" "$unpack" >&2
  done
  # Every wheel puts its files under nvidia/cu13/{bin,include,lib,nvvm,...}.
  [ -d "$unpack/nvidia/cu13" ] || { echo "cuda-toolkit: unexpected wheel layout" >&2; exit 1; }
  cp -a "$unpack/nvidia/cu13/." "$root/"
  chmod +x "$root"/bin/* "$root"/nvvm/bin/* 2>/dev/null || true
  # The wheels ship only versioned sonames; linkers want the plain names.
  for lib in "$root"/lib/*.so.13 "$root"/lib/*.so.13.*; do
    [ -e "$lib" ] || continue
    base=${lib%%.so.*}.so
    [ -e "$base" ] || ln -s "$(basename "$lib")" "$base"
  done
  # No driver library comes with the toolkit wheels: a stub that only satisfies the linker
  # (CUDA::cuda_driver), with one empty function per driver API entry point cuda.h declares
  # (names as the preprocessor leaves them, e.g. cuMemGetInfo_v2). Its soname is
  # libcuda.so.1 and no file of that name exists here, so a program linked against it loads
  # the GPU machine's real driver at run time.
  if [ ! -e "$root/lib/stubs/libcuda.so" ]; then
    mkdir -p "$root/lib/stubs"
    cc -E -I "$root/include" "$root/include/cuda.h" | grep -oE '\bcu[A-Z][A-Za-z0-9_]* *\(' \
      | sed 's/ *($//' | sort -u | sed 's/.*/void &(void) {}/' \
      | cc -shared -Wl,-soname,libcuda.so.1 -x c - -o "$root/lib/stubs/libcuda.so"
    ln -sf stubs/libcuda.so "$root/lib/libcuda.so"
  fi
  touch "$root/.complete-base" "$stamp"
fi
echo "$root"
