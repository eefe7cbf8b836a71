#!/usr/bin/env bash
# Mesa 25's lavapipe (Debian bookworm-backports) in a folder of the cache, for the Vulkan tests.
#
# Debian 12's own lavapipe (22.3.6) corrupts its heap under ggml-vulkan: upstream's q4_0 flash
# attention cases, a mid-graph buffer resize and decode steps of 3-8 queries abort it at random
# (docs/VULKAN.md, "lavapipe's heap"); 25.0.7 runs the same commands without a crash and with the
# same numbers. The system's driver is left alone: the packages are fetched with apt (checked
# against Debian's signed Release files), unpacked here, and selected per process through
# VK_DRIVER_FILES and LD_LIBRARY_PATH. Prints those two as `export` lines (eval them).
#
# Needs the bookworm-backports suite in apt's sources: added as its own file when missing (root
# or sudo). Usage: eval "$(scripts/lavapipe.sh)"
set -euo pipefail

cache=${TQ_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/turboquant}
version=25.0.7-2~bpo12+1
drm=2.4.123-1~bpo12+1
dir=$cache/lavapipe-${version//[~+]/_}
pkgs=("mesa-vulkan-drivers=$version" "mesa-libgallium=$version"
      "libdrm2=$drm" "libdrm-amdgpu1=$drm" "libdrm-intel1=$drm")

if [ ! -f "$dir/lvp_icd.json" ]; then
  if [ "$(id -u)" -eq 0 ]; then sudo=(); elif command -v sudo >/dev/null; then sudo=(sudo); else sudo=(false); fi
  policy=$(apt-cache policy mesa-vulkan-drivers 2>/dev/null || true)
  if [[ $policy != *"$version"* ]]; then
    src=/etc/apt/sources.list.d/tq-bookworm-backports.sources
    echo "lavapipe.sh: adding Debian's bookworm-backports to apt's sources ($src)" >&2
    printf '%s\n' 'Types: deb' 'URIs: http://deb.debian.org/debian' 'Suites: bookworm-backports' \
      'Components: main' 'Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg' |
      "${sudo[@]}" tee "$src" >/dev/null ||
      { echo "lavapipe.sh: cannot write $src (not root, no sudo)" >&2; exit 1; }
    "${sudo[@]}" apt-get update -qq >&2
  fi
  mkdir -p "$cache"
  tmp=$(mktemp -d "$cache/lavapipe.XXXXXX")
  # as a file of the cache, which apt's sandbox user may not reach: it says so and goes on
  (cd "$tmp" && apt-get download -qq "${pkgs[@]}" 2>&1 | grep -v 'unsandboxed' >&2 || true)
  mkdir -p "$tmp/root"
  for deb in "$tmp"/*.deb; do dpkg-deb -x "$deb" "$tmp/root"; done
  lib=$tmp/root/usr/lib/x86_64-linux-gnu
  [ -f "$lib/libvulkan_lvp.so" ] || { echo "lavapipe.sh: no libvulkan_lvp.so in the packages" >&2; exit 1; }
  rm -f "$tmp"/*.deb
  rm -rf "$dir"
  mv "$tmp" "$dir"
  # the package's ICD file, naming the library by absolute path: the unpacked one, not the system's
  sed "s|\"libvulkan_lvp.so\"|\"$dir/root/usr/lib/x86_64-linux-gnu/libvulkan_lvp.so\"|" \
    "$dir/root/usr/share/vulkan/icd.d/lvp_icd.json" >"$dir/lvp_icd.json"
  grep -q "$dir/root" "$dir/lvp_icd.json" || { echo "lavapipe.sh: unexpected ICD file" >&2; exit 1; }
fi
echo "export VK_DRIVER_FILES=$dir/lvp_icd.json"
echo "export LD_LIBRARY_PATH=$dir/root/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
