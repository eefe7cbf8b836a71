#!/usr/bin/env bash
# What a fresh Debian/Ubuntu machine needs before `cargo build` / `cargo test` (the README's
# two commands and .ci/run start here). Installs only what is missing, says what, and works
# as root (apt-get) or as a user with sudo. Rust itself comes from rustup.
set -euo pipefail

need=()
command -v cmake   >/dev/null || need+=(cmake)
command -v ccache  >/dev/null || need+=(ccache)
command -v patch   >/dev/null || need+=(patch)
command -v make    >/dev/null || need+=(make)
command -v g++     >/dev/null || need+=(g++)
python3 -m pip --version >/dev/null 2>&1 || need+=(python3-pip)
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)   # the client tests' venvs
# bindgen loads libclang.so / libclang-N.so (libclang-cpp, which some images carry alone, is not it)
compgen -G "/usr/lib/llvm-*/lib/libclang[.-][0-9s]*" >/dev/null || need+=(libclang-dev)
[ -f /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf ] || need+=(fonts-dejavu-core) # tq eval plots
# llama-server's web UI is built with npm (build/ui.rs) and tested in Debian's chromium
command -v node >/dev/null || need+=(nodejs)
command -v npm >/dev/null || need+=(npm)
[ -x /usr/bin/chromium ] || need+=(chromium)
if [ "${TQ_SETUP_VULKAN:-0}" = 1 ]; then   # cargo build --features vulkan
  [ -f /usr/include/vulkan/vulkan.hpp ] || need+=(libvulkan-dev)
  command -v glslc >/dev/null || need+=(glslc)
  [ -d /usr/include/spirv ] || need+=(spirv-headers)
  ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || need+=(mesa-vulkan-drivers)
fi

if [ ${#need[@]} -eq 0 ]; then
  echo "setup: nothing to install"
  exit 0
fi
if [ "$(id -u)" -eq 0 ]; then
  sudo=()
elif command -v sudo >/dev/null; then
  sudo=(sudo)
else
  echo "setup: missing ${need[*]}, and this user is not root and has no sudo: install them, then rerun" >&2
  exit 1
fi
echo "setup: installing ${need[*]} (apt)"
export DEBIAN_FRONTEND=noninteractive
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" apt-get install -y -qq "${need[@]}" >/dev/null
