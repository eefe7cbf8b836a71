# shellcheck shell=bash disable=SC2034  # variables are used by the scripts that source this
# gpu-lib.sh - what scripts/gpu-check.sh and scripts/gpu-bench.sh share (sourced, not run):
# the results folder, logging, pass/fail bookkeeping, a dry-run mode, and the CUDA build.
#
# The build goes to target/gpu-build (git-ignored: a device machine keeps it between calls
# while it stays warm, so the second script, or a rerun after a timeout, only relinks).
# It needs .gpu/ from scripts/gpu-pack.sh (the patched llama.cpp tree and libturboquant_capi.a).
#
# Dry run (TQ_GPU_DRY_RUN=1 or --dry-run): every command that needs the GPU, nvcc or the
# build is printed instead of run, so the control flow, the argument handling and the
# result parsing can be checked on a machine without a GPU.

tq_repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tq_fails=0
tq_prebuilt=0
tq_dry=${TQ_GPU_DRY_RUN:-0}

# tq_init <script name> <args...>: parses --dry-run and the results folder (first other
# argument, else $OUT, else results/<script name>).
tq_init() {
  local name=$1; shift
  local dir=""
  for a in "$@"; do
    case $a in
      --dry-run) tq_dry=1 ;;
      -h|--help) sed -n '2,/^set /p' "$0" | sed '$d'; exit 0 ;;
      -*) echo "$name: unknown option $a" >&2; exit 2 ;;
      *) [ -z "$dir" ] || { echo "$name: one results folder only" >&2; exit 2; }; dir=$a ;;
    esac
  done
  tq_out=${dir:-${OUT:-$tq_repo/results/$name}}
  mkdir -p "$tq_out"
  tq_out=$(cd "$tq_out" && pwd)
  tq_build=${TQ_GPU_BUILD:-$tq_repo/target/gpu-build}
  tq_src=$tq_repo/target/gpu-src
  tq_bin=$tq_build/bin
  tq_work=${TQ_GPU_WORK:-$tq_repo/target/gpu-work}
  mkdir -p "$tq_work"
  tq_t0=$(date +%s)
  : > "$tq_out/summary.txt"
  : > "$tq_out/details.txt"
  rm -f "$tq_out/dry-run.txt"
  tq_log "$name on $(tq_gpu_name), $(nproc) cores$([ "$tq_dry" = 1 ] && echo ', DRY RUN')"
}

tq_log() { echo "[$(date +%H:%M:%S) +$(( $(date +%s) - tq_t0 ))s] $*" | tee -a "$tq_out/summary.txt"; }
tq_pass() { tq_log "PASS $*"; }
tq_fail() { tq_log "FAIL $*"; tq_fails=$((tq_fails + 1)); }
tq_skip() { tq_log "SKIP $*"; }
# tq_detail <file> <title>: appends a step's full output to details.txt (the device tool
# brings back at most 8 files, so the steps share one).
tq_detail() { { echo "===== $2"; cat "$1"; echo; } >> "$tq_out/details.txt"; }

tq_gpu_name() {
  if [ "$tq_dry" = 1 ]; then echo "no GPU (dry run)"; return; fi
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || echo "no nvidia-smi"
}

# tq_run <cmd...>: runs it, or prints it in a dry run (status 0), with the decode kernel
# selection (TQ_CUDA_FA) when the caller set one.
tq_run() {
  if [ "$tq_dry" = 1 ]; then
    echo "+ ${TQ_CUDA_FA:+TQ_CUDA_FA=$TQ_CUDA_FA }$*" >> "$tq_out/dry-run.txt"
    return 0
  fi
  "$@"
}

# tq_finish: the verdict and the exit status (1 if any check failed).
tq_finish() {
  if [ "$tq_fails" -gt 0 ]; then
    tq_log "RESULT: $tq_fails check(s) failed"
    exit 1
  fi
  tq_log "RESULT: all checks passed"
  exit 0
}

tq_nvcc() { command -v nvcc || echo /usr/local/cuda/bin/nvcc; }

# tq_use_prebuilt <what>: run the unpacked prebuilt tools, with cuBLAS and the driver from this
# machine's CUDA install and the rest beside the tools.
tq_use_prebuilt() {
  local cuda
  cuda=$(dirname "$(dirname "$(tq_nvcc)")")
  export LD_LIBRARY_PATH="$tq_bin:$cuda/lib64:$cuda/targets/x86_64-linux/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  tq_prebuilt=1
  tq_pass "build: prebuilt for sm_90 elsewhere $1"
}

# tq_build_tree <targets...>: unpacks .gpu/ (once per pack), configures and builds.
# Reduced for a short visit: sm_90 only (TQ_CUDA_ARCHS), upstream's f16-f16 and q8_0-q8_0
# vector kernels only (GGML_CUDA_FA_QUANTS), our 21 turbo pairs at head sizes 64 and 128
# (TQ_CUDA_FA_HEAD_SIZES); tests and tools, no examples or server.
tq_build_tree() {
  if [ "${TQ_GPU_PREBUILT:-0}" = 1 ]; then # tests of the scripts' logic, with stand-in tools
    tq_log "build: skipped (TQ_GPU_PREBUILT=1, tools in $tq_bin)"
    return 0
  fi
  local pack=${TQ_GPU_PACK:-$tq_repo/.gpu}
  if [ "$tq_dry" != 1 ]; then
    # the sources' stamp: their md5 where they were carried, else the one gpu-pack.sh recorded
    # (a call that carries only the prebuilt tools: the sources would not fit beside them)
    local stamp have_src=0
    if [ -f "$pack/llama-src.tar.xz" ] && [ -f "$pack/libturboquant_capi.a.xz" ]; then
      have_src=1
      stamp=$(cat "$pack/llama-src.tar.xz" "$pack/libturboquant_capi.a.xz" | md5sum | cut -d' ' -f1)
    elif [ -f "$pack/sources.md5" ]; then
      stamp=$(cat "$pack/sources.md5")
    else
      tq_fail "build: no .gpu/llama-src.tar.xz and .gpu/libturboquant_capi.a.xz, nor .gpu/sources.md5 with a prebuilt archive (run scripts/gpu-pack.sh here and carry them)"
      return 1
    fi
    # tools built elsewhere by scripts/gpu-prebuild.sh from these very sources: no nvcc here
    local pre=$pack/prebuilt-sm90.tar.xz
    if [ -f "$pre" ] && [ -z "${TQ_CUDA_ARCHS:-}" ]; then
      if [ "$(cat "$tq_bin/.pack" 2>/dev/null)" != "$stamp" ]; then
        rm -rf "$tq_bin" && mkdir -p "$tq_build" && xz -dc "$pre" | tar -C "$tq_build" -xf -
      fi
      if [ "$(cat "$tq_bin/.pack" 2>/dev/null)" = "$stamp" ]; then
        tq_use_prebuilt "(.gpu/prebuilt-sm90.tar.xz, sources $stamp)"
        return 0
      fi
      rm -rf "$tq_bin"
      tq_log "build: .gpu/prebuilt-sm90.tar.xz is from other sources than .gpu/llama-src.tar.xz; building here"
    elif [ -f "$tq_bin/.pack" ] && [ "$(cat "$tq_bin/.pack")" = "$stamp" ]; then
      # unpacked by an earlier call on this warm machine (the archive is not carried again)
      tq_use_prebuilt ", unpacked by an earlier call (sources $stamp)"
      return 0
    fi
    [ "$have_src" = 1 ] || {
      tq_fail "build: no prebuilt tools of sources $stamp here, and no sources to build (carry .gpu/llama-src.tar.xz and .gpu/libturboquant_capi.a.xz)"
      return 1
    }
    if [ "$(cat "$tq_src/.pack" 2>/dev/null)" != "$stamp" ]; then
      rm -rf "$tq_src" && mkdir -p "$tq_src"
      tar -C "$tq_src" --strip-components=1 -xJf "$pack/llama-src.tar.xz" || { tq_fail "build: unpacking the sources"; return 1; }
      xz -dc "$pack/libturboquant_capi.a.xz" > "$tq_src/libturboquant_capi.a"
      echo "$stamp" > "$tq_src/.pack"
    fi
  fi
  local gen=Ninja t0
  command -v ninja >/dev/null || gen="Unix Makefiles"
  t0=$(date +%s)
  tq_run cmake -S "$tq_src" -B "$tq_build" -G "$gen" -DCMAKE_BUILD_TYPE=Release \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${TQ_CUDA_ARCHS:-90}" -DGGML_NATIVE=ON \
    -DGGML_CUDA_FA_QUANTS="q8_0-q8_0" -DTQ_CUDA_FA_HEAD_SIZES="64;128" \
    -DLLAMA_BUILD_TESTS=ON -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_CURL=OFF \
    -DTQ_EXT_DIR="$tq_repo/ggml-ext" -DTQ_RUST_LIB="$tq_src/libturboquant_capi.a" > "$tq_work/build.log" 2>&1 \
    && tq_run cmake --build "$tq_build" -j "$(nproc)" --target "$@" >> "$tq_work/build.log" 2>&1
  local rc=$?
  if [ $rc -ne 0 ]; then
    cp "$tq_work/build.log" "$tq_out/build.log"
    tail -40 "$tq_work/build.log"
    tq_fail "build ($*): rc=$rc after $(( $(date +%s) - t0 )) s, log in build.log"
    return 1
  fi
  tq_pass "build ($*) in $(( $(date +%s) - t0 )) s"
}
