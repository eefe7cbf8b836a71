#!/usr/bin/env bash
# Regenerate ggml-ext/patches/llama.cpp.patch after editing vendor/llama.cpp by hand:
# diffs the edited tree against a fresh extraction of the pinned archive.
# Usage: ggml-ext/refresh-patch.sh   (from anywhere in the repo)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
pin() { sed -n "s/^$1 *= *//p" "$root/vendor/llama.cpp.pin"; }
cache=${TQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/turboquant}
archive="$cache/$(pin archive)"
[ -f "$archive" ] || { echo "no $archive: run cargo build once first" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
tree=$(pin tree)
tar -xzf "$archive" -C "$tmp" "$tree"
mv "$tmp/$tree" "$tmp/a"
ln -s "$root/vendor/llama.cpp" "$tmp/b"
# Only source files we touch; new files of ours belong in ggml-ext/, not in the patch.
(cd "$tmp" && diff -ruN -x .git -x .turboquant-stamp -x '*.orig' -x '*.rej' -x '__pycache__' a/ b/ || true) \
  | sed -E 's/^(\+\+\+|---) ([ab]\/[^\t]*)\t.*/\1 \2/' > "$root/ggml-ext/patches/llama.cpp.patch"
grep -c '^+++ ' "$root/ggml-ext/patches/llama.cpp.patch" | xargs echo "files patched:"
