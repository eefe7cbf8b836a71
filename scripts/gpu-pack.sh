#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh and scripts/gpu-bench.sh need on a GPU machine that can
# reach nothing (no network, no Rust): .gpu/ (git-ignored through .git/info/exclude), well
# under the 64 MiB a device call carries.
#   .gpu/llama-src.tar.xz    the patched llama.cpp tree, without docs, models, web UI, benches
#   .gpu/libturboquant_capi.a.xz  the Rust codec, built here (x86-64)
#   .gpu/tokenizer.gguf      SmolLM2's tokenizer in an otherwise empty GGUF: gpu-bench makes a
#                            random-weight Llama-8B-shaped model (2 layers) from it there (a
#                            real model does not fit; attention speed depends on the shape)
#   .gpu/gguf-*.whl          the gguf Python package for scripts/random_gguf.py
# scripts/gpu-prebuild.sh then adds the tools built here (.gpu/prebuilt-sm90.tar.xz), and
# --model makes .gpu-model/ (a trained model for gpu-bench.sh's quality step).
# Then, with a GPU lent (64 MiB travel per call): device run, carry
#   [".gpu/prebuilt-sm90.tar.xz", ".gpu/sources.md5"] (without a prebuilt archive: [".gpu"],
#   and the machine builds), command "scripts/gpu-check.sh $OUT/check"; then on the same warm
#   machine (the unpacked tools are reused) carry [".gpu-model", ".gpu/tokenizer.gguf",
#   ".gpu/gguf-0.19.0-py3-none-any.whl"], command "scripts/gpu-bench.sh $OUT/bench".
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu

cargo build --release --lib -p turboquant -p turboquant-capi
src=${LLAMA_CPP_DIR:-vendor/llama.cpp}
grep -q turboquant "$src/ggml/src/ggml-cuda/fattn.cu" || { echo "gpu-pack: $src is not patched (cargo build first)" >&2; exit 1; }
tar -C "$(dirname "$src")" -cJf .gpu/llama-src.tar.xz \
  --exclude="$(basename "$src")/docs" --exclude="$(basename "$src")/models" \
  --exclude="$(basename "$src")/benches" --exclude="$(basename "$src")/tools/ui" \
  --exclude='*.gguf' --exclude=.git "$(basename "$src")"
xz -T0 -c target/release/libturboquant_capi.a > .gpu/libturboquant_capi.a.xz
# the sources' stamp, for a call that carries the prebuilt tools without them (gpu-lib.sh)
cat .gpu/llama-src.tar.xz .gpu/libturboquant_capi.a.xz | md5sum | cut -d' ' -f1 > .gpu/sources.md5

cache=${TQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/turboquant}
model=${TQ_MODEL:-$cache/models/SmolLM2-135M-Instruct.Q4_1.gguf}
[ -f "$model" ] || cargo run --release --bin tq -- fetch smollm2-135m
python3 -m pip download -q --no-deps --only-binary=:all: -d .gpu gguf==0.19.0
python3 -c 'import gguf' 2>/dev/null || python3 -m pip install -q .gpu/gguf-*.whl
python3 scripts/random_gguf.py --tokenizer-from "$model" --head 64 --n-head 1 --n-head-kv 1 \
  --n-layer 0 -o .gpu/tokenizer.gguf
du -sh .gpu/* && du -sh .gpu

# --model: .gpu-model/, SmolLM2 cut to 10 blocks for gpu-bench.sh's CUDA-against-CPU KLD
# (carried by gpu-bench's own call: 53 MiB, which with .gpu/ would not fit one call)
if [ "${1:-}" = "--model" ]; then
  grep -qx '/.gpu-model/' .git/info/exclude || echo '/.gpu-model/' >> .git/info/exclude
  rm -rf .gpu-model && mkdir -p .gpu-model
  python3 scripts/truncate_gguf.py "$model" -o .gpu-model/smollm2-10blk.gguf --blocks 10
  du -sh .gpu-model
fi
