#!/usr/bin/env bash
# Bounded coverage-guided fuzzing of the codec's C ABI (fuzz/fuzz_targets/*.rs) with
# libFuzzer + AddressSanitizer, without needing cargo-fuzz: it builds the fuzz crate with
# the same flags `cargo fuzz build` passes. Uses the nightly toolchain when rustup has one,
# else the stable one with RUSTC_BOOTSTRAP=1 (for -Zsanitizer=address).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET=60] [TARGET...]     (default: every target)
#
# Seeds: fuzz/corpus/<target>/ (read only). New inputs go to $TQ_FUZZ_CORPUS/<target>
# (default: ~/.cache/turboquant/fuzz-corpus), so runs accumulate; a crash leaves its input
# in fuzz/target/artifacts/<target>/ and makes the script fail. TQ_FUZZ_ASAN=0 drops ASan
# (about 2x more executions, only panics/aborts are caught); TQ_FUZZ_STABLE=1 uses stable
# even where nightly exists; TQ_FUZZ_TARGET_DIR moves the build. With cargo-fuzz installed,
# `cd fuzz && cargo +nightly fuzz run c_abi` runs the same targets.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"

secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
  targets=($(sed -n 's/^name = "\(.*\)"/\1/p' Cargo.toml | grep -v '^turboquant-fuzz$'))
fi

cache=${TQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/turboquant}
corpus_root=${TQ_FUZZ_CORPUS:-$cache/fuzz-corpus}
host=$(rustc -vV | sed -n 's/^host: //p')

cargo=(cargo)
if [ "${TQ_FUZZ_STABLE:-0}" = 0 ] && rustup toolchain list 2>/dev/null | grep -q '^nightly'; then
  cargo=(cargo +nightly)
else
  export RUSTC_BOOTSTRAP=1   # stable rustc, unstable -Z flag: sanitizer runtimes ship with it
fi
flags="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4"
flags+=" -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table"
flags+=" -Cllvm-args=-sanitizer-coverage-trace-compares -Cllvm-args=-sanitizer-coverage-stack-depth"
flags+=" -Cdebug-assertions -Coverflow-checks -Cforce-frame-pointers"
if [ "${TQ_FUZZ_ASAN:-1}" != 0 ]; then
  flags+=" -Zsanitizer=address"
fi
# --target keeps build scripts and proc macros uninstrumented, as cargo-fuzz does.
tdir=${TQ_FUZZ_TARGET_DIR:-target/fuzz-build}
mkdir -p target
if ! RUSTFLAGS="$flags" "${cargo[@]}" build --release --bins --target "$host" --target-dir "$tdir" \
    >target/fuzz-build.log 2>&1; then
  tail -40 target/fuzz-build.log >&2
  echo "fuzz: build failed (fuzz/target/fuzz-build.log)" >&2
  exit 1
fi
bin=$tdir/$host/release

status=0
for t in "${targets[@]}"; do
  [ -x "$bin/$t" ] || { echo "fuzz: $t was not built" >&2; exit 1; }
  work=$corpus_root/$t
  art=target/artifacts/$t/
  mkdir -p "$work" "$art"
  log=target/fuzz-$t.log
  echo "fuzz: $t for ${secs}s (corpus $work, seeds corpus/$t)"
  if ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1} \
     "$bin/$t" "$work" "corpus/$t" -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 \
       -artifact_prefix="$art" -print_final_stats=1 >"$log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log")
    cov=$(grep -Eo 'cov: [0-9]+' "$log" | tail -1)
    echo "fuzz: $t ok: ${execs:-?} executions, ${cov:-cov ?}, corpus $(ls "$work" | wc -l) inputs"
  else
    status=1
    echo "fuzz: $t FAILED; log $PWD/$log, input in $PWD/$art" >&2
    grep -A30 -E 'panicked|ERROR: AddressSanitizer|deadly signal|SUMMARY' "$log" | head -60 >&2
  fi
done
exit $status
