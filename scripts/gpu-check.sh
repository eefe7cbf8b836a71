#!/usr/bin/env bash
# GPU check 1 of 2: build and correctness, sized for a freshly started H200 machine (16
# cores, nvcc 13, CMake, ninja, compute-sanitizer, no network) in under 8 minutes.
# From the repo root, with .gpu/prebuilt-sm90.tar.xz and .gpu/sources.md5 carried
# (scripts/gpu-pack.sh, scripts/gpu-prebuild.sh), or .gpu/ with the sources to build there:
#
#   scripts/gpu-check.sh [RESULTS_DIR] [--dry-run]
#
#   1. builds llama.cpp with CUDA for sm_90 into target/gpu-build (kept while the machine
#      stays warm; scripts/gpu-bench.sh reuses it), with a reduced flash-attention instance
#      set (upstream f16-f16 and q8_0-q8_0, our turbo pairs at head sizes 64 and 128);
#   2. tq-parity on the device: the CUDA codec against the Rust codec, bit for bit, including
#      the f32 classification's double fallback on adversarial inputs;
#   3. test-backend-ops -b CUDA0 on SET_ROWS, GET_ROWS, CPY, MUL_MAT, FLASH_ATTN_EXT, turbo
#      cases only, and CUSTOM, the fused K side's cases (tq_rf_keep=1), CUDA against the CPU
#      backend; then FLASH_ATTN_EXT again with the other decode kernel (TQ_CUDA_FA=gqa, the
#      default, then vec); a case the CUDA backend declines ("not supported") fails too,
#      since supports_op claims them all;
#   4. compute-sanitizer memcheck and synccheck on a few turbo FA cases (decode and prefill,
#      symmetric and mixed pairs; memcheck with both decode kernels). Where the runtime refuses the sanitizer (gVisor:
#      "Device not supported") this is logged as SKIP, not as a pass.
#
# Results go to RESULTS_DIR, else $OUT, else results/gpu-check/, as they are produced:
# summary.txt (one line per check), details.txt (every step's output), build.log (only if
# the build failed). Exit status 1 if any check failed.
set -uo pipefail
# shellcheck source=scripts/gpu-lib.sh
. "$(dirname "$0")/gpu-lib.sh"
tq_init gpu-check "$@"
cd "$tq_repo" || exit 1

# 1. build
tq_build_tree test-backend-ops llama-bench llama-perplexity || tq_finish

# 2. codec parity on the device (and the host build of the same source)
nvcc=$(tq_nvcc)
if [ "$tq_dry" = 1 ]; then tq_log "nvcc: dry run"; else tq_log "nvcc: $("$nvcc" --version | tail -1)"; fi
if { if [ "$tq_prebuilt" = 1 ]; then cp "$tq_bin/tq-parity" "$tq_work/tq-parity"; else
       tq_run "$nvcc" -std=c++17 -arch=sm_90 -O3 -use_fast_math -Xcompiler -ffp-contract=off \
         -I ggml-ext/abi -I ggml-ext/ggml -I ggml-ext/ggml-cuda ggml-ext/ggml-cuda/tq-parity.cu "$tq_src/libturboquant_capi.a" \
         -lpthread -ldl -lm -o "$tq_work/tq-parity"; fi; } > "$tq_work/parity.txt" 2>&1 \
   && tq_run "$tq_work/tq-parity" >> "$tq_work/parity.txt" 2>&1; then
  tq_pass "tq-parity: $(tail -1 "$tq_work/parity.txt")"
else
  tq_fail "tq-parity: $(tail -3 "$tq_work/parity.txt" | tr '\n' ' ')"
fi
tq_detail "$tq_work/parity.txt" tq-parity

# 3. test-backend-ops, turbo cases, CUDA against CPU; FLASH_ATTN_EXT with each decode kernel
# (TQ_CUDA_FA: gqa, the default, and vec, upstream's vector kernel with our hooks). The
# kernel's one log line must name the one asked for, so a run never passes on the other.
for fa in gqa vec; do
  ops=SET_ROWS,GET_ROWS,CPY,MUL_MAT,FLASH_ATTN_EXT,CUSTOM pat='turbo|tq_rf_keep=1'
  [ "$fa" = vec ] && ops=FLASH_ATTN_EXT pat=turbo
  f=$tq_work/backend-ops-$fa.txt
  TQ_CUDA_FA=$fa tq_run "$tq_bin/test-backend-ops" test -b CUDA0 -o "$ops" -p "$pat" > "$f" 2>&1
  rc=$?
  tq_detail "$f" "test-backend-ops $ops turbo, TQ_CUDA_FA=$fa"
  ok=$(grep -c ': OK' "$f")
  bad=$(grep -cE ': FAIL|not supported' "$f")
  sel=$(grep -m1 -o 'decode kernel for turbo K/V: [a-z]*' "$f" | awk '{print $NF}')
  if [ $rc -eq 0 ] && [ "$bad" -eq 0 ] && { { [ "$ok" -gt 0 ] && [ "$sel" = "$fa" ]; } || [ "$tq_dry" = 1 ]; }; then
    tq_pass "test-backend-ops $ops turbo, TQ_CUDA_FA=$fa: $ok cases OK"
  else
    grep -E ': FAIL|not supported' "$f" | head -20 | tee -a "$tq_out/summary.txt"
    tq_fail "test-backend-ops $ops turbo, TQ_CUDA_FA=$fa: rc=$rc, $ok OK, $bad failed or unsupported, kernel logged: ${sel:-none}"
  fi
done

# 4. compute-sanitizer on a few flash-attention cases (small: memcheck slows kernels ~100x)
san=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
cases=(
  'hsk=128,.*nr23=\[3,1\],kv=512,nb=1,.*type_K=turbo4,type_V=turbo4'
  'hsk=64,.*nr23=\[3,1\],kv=512,nb=2,.*type_K=turbo3,type_V=q8_0'
  'hsk=128,.*nr23=\[3,1\],kv=1024,nb=35,.*type_K=turbo2,type_V=turbo2'
  'hsk=64,.*nr23=\[3,1\],kv=512,nb=5,.*type_K=turbo3,type_V=turbo2,.*mask_per_head=1'
  'hsk=128,.*nr23=\[3,1\],kv=512,nb=1,.*type_K=turbo3_tcq,type_V=turbo2_tcq'
)
probe=$tq_work/sanitizer-probe.txt
if [ "$tq_dry" = 1 ]; then
  :
elif "$san" --tool memcheck --error-exitcode 3 "$tq_work/tq-parity" > "$probe" 2>&1; then
  tq_pass "compute-sanitizer memcheck on tq-parity: $(grep -m1 'ERROR SUMMARY' "$probe")"
else
  tq_detail "$probe" "compute-sanitizer memcheck tq-parity (probe)"
  if grep -qiE 'not supported|error 999|unable to|failed to' "$probe"; then
    tq_skip "compute-sanitizer refused on this machine: $(grep -iE 'not supported|error' "$probe" | head -1)"
    cases=()
  else
    tq_fail "compute-sanitizer memcheck on tq-parity: $(tail -3 "$probe" | tr '\n' ' ')"
  fi
fi
# one run per tool over all the cases (each start of the sanitizer costs seconds)
if [ ${#cases[@]} -gt 0 ]; then
  pat=$(IFS='|'; echo "${cases[*]}")
  # memcheck and synccheck with the default (gqa) kernel, memcheck with the vec one; that
  # last run is skipped (and says so) once the script is past 6.5 minutes, to stay inside
  # the 8-minute budget on a slow build
  for run in memcheck:gqa synccheck:gqa memcheck:vec; do
    tool=${run%%:*} fa=${run##*:}
    if [ "$fa" = vec ] && [ $(( $(date +%s) - tq_t0 )) -gt "${TQ_GPU_SOFT_LIMIT_S:-390}" ]; then
      tq_skip "compute-sanitizer $tool, TQ_CUDA_FA=$fa: past ${TQ_GPU_SOFT_LIMIT_S:-390} s, left out to keep the 8-minute budget"
      continue
    fi
    f=$tq_work/sanitizer-$tool-$fa.txt
    TQ_CUDA_FA=$fa tq_run "$san" --tool "$tool" --error-exitcode 3 "$tq_bin/test-backend-ops" test -b CUDA0 -o FLASH_ATTN_EXT -p "$pat" > "$f" 2>&1
    rc=$?
    tq_detail "$f" "compute-sanitizer $tool FA /$pat/, TQ_CUDA_FA=$fa"
    n=$(grep -c ': OK' "$f")
    if [ $rc -eq 0 ] && { [ "$n" -ge ${#cases[@]} ] || [ "$tq_dry" = 1 ]; }; then
      tq_pass "compute-sanitizer $tool on $n FA cases, TQ_CUDA_FA=$fa: $(grep -m1 'ERROR SUMMARY' "$f")"
    else
      tq_fail "compute-sanitizer $tool on FA cases, TQ_CUDA_FA=$fa: rc=$rc, $n of ${#cases[@]}+ cases OK, $(grep -m1 'ERROR SUMMARY' "$f")"
    fi
  done
fi

tq_finish
