#!/usr/bin/env bash
# The end of a CI run (.ci/run, docs/CI.md): passed / failed / skipped per test binary from
# `cargo test --no-fail-fast`'s output, the skips and unrun SIMD levels the tests reported
# (TQ_TEST_REPORT: tests/support/prereq.rs, crates/codec/tests/codec_simd.rs), then one
# summary line with every step's wall time. Exits 1 when a test or a step failed.
#
#   scripts/ci-summary.sh TEST_LOG TEST_REPORT STEP:RC:SECONDS[:NOTE]... total:SECONDS
#
# A step's NOTE (its ccache hits, say) follows its time in brackets.
#
# A binary that started but printed no `test result:` (killed, crashed) counts as failed;
# a run that failed before any binary started (a build error) fails as "no test ran".
# libtest counts a skipped test as passed: each SKIPPED line moves one from passed to
# skipped; `#[ignore]`d tests count as skipped too.
set -euo pipefail
log=$1
report=$2
shift 2
[ -f "$report" ] || report=/dev/null

counts=$(mktemp)
trap 'rm -f "$counts"' EXIT
awk -v report="$report" -v counts="$counts" '
function add(name) {
  n++; bin[n] = name; started[n] = 0; done_[n] = 0
  pass[n] = 0; fail[n] = 0; skip[n] = 0; secs[n] = ""
}
/^ *Running / {
  # "Running tests/web_ui.rs (target/release/deps/web_ui-0123abcd)"
  p = $0; sub(/.*\(/, "", p); sub(/\).*/, "", p); sub(/.*\//, "", p)
  sub(/-[0-9a-f]+$/, "", p)
  add(p); started[n] = 1; next
}
/^ *Doc-tests / { add($2 "(doc)"); started[n] = 1; next }
/^test result: / && n > 0 && !done_[n] {
  done_[n] = 1
  for (i = 1; i <= NF; i++) {
    v = $(i - 1) + 0
    if ($i ~ /^passed/) pass[n] = v
    else if ($i ~ /^failed/) fail[n] = v
    else if ($i ~ /^ignored/) skip[n] = v
  }
  if (match($0, /finished in [0-9.]+s/)) secs[n] = substr($0, RSTART + 12, RLENGTH - 13)
  next
}
END {
  while ((getline line < report) > 0) {
    split(line, f, " ")
    if (f[1] == "SKIPPED") {
      found = 0
      for (i = 1; i <= n; i++) if (bin[i] == f[2]) { found = i; break }
      if (found) { skip[found]++; if (pass[found] > 0) pass[found]-- }
      sub(/^SKIPPED /, "", line); skipped_lines = skipped_lines "ci:   skipped " line "\n"
    } else if (f[1] == "SIMD" && f[2] == "ran") {
      sub(/^SIMD ran /, "", line); simd_ran = line
    } else if (f[1] == "SIMD" && f[2] == "unrun") {
      sub(/^SIMD unrun /, "", line); simd_unrun = simd_unrun (simd_unrun == "" ? "" : "; ") line
    }
  }
  tp = tf = ts = 0; failed = ""
  print "ci: test binaries (passed / failed / skipped, seconds):"
  for (i = 1; i <= n; i++) {
    note = ""
    if (!done_[i]) { fail[i]++; note = "  (no test result: killed or crashed)" }
    if (pass[i] + fail[i] + skip[i] == 0) { empty++; continue }
    printf "ci:   %-28s %5d %3d %3d %8s%s\n", bin[i], pass[i], fail[i], skip[i], secs[i], note
    tp += pass[i]; tf += fail[i]; ts += skip[i]
    if (fail[i] > 0) failed = failed (failed == "" ? "" : " ") bin[i]
  }
  if (empty) print "ci:   (and " empty " binaries with no tests: doc-tests, tool mains)"
  printf "%s", skipped_lines
  if (simd_ran != "")
    print "ci:   SIMD levels tested: " simd_ran "; unrun: " (simd_unrun == "" ? "none" : simd_unrun)
  if (n == 0) { tf = 1; failed = "no test ran (build error?)" }
  printf "%d %d %d %d %s\n%s\n", tp, tf, ts, n, failed, simd_unrun > counts
}' "$log"

{ read -r tp tf ts nbin failed; read -r simd_unrun; } <"$counts" || true
status=ok
[ "${tf:-1}" = 0 ] || status=FAILED
steps=""
for s in "$@"; do
  IFS=: read -r name rc secs note <<<"$s"
  if [ "$name" = total ]; then
    steps+=", total $rc s"
    continue
  fi
  steps+="${steps:+, }$name ${secs} s"
  [ -z "${note:-}" ] || steps+=" [$note]"
  if [ "$rc" != 0 ]; then
    status=FAILED
    steps+=" (exit $rc)"
  fi
done
line="ci: summary: $status: $tp passed, $tf failed, $ts skipped in $nbin test binaries"
[ -z "$failed" ] || line+=" (failed: $failed)"
[ -z "${simd_unrun:-}" ] || line+="; SIMD unrun: $simd_unrun"
echo "$line; $steps"
[ "$status" = ok ]
