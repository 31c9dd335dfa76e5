#!/usr/bin/env bash
# Installs what building frigg needs on a fresh Debian machine, and only what is missing:
# cmake (llama-cpp-sys-2 builds ggml with it), clang + libclang (bindgen), a C/C++ compiler.
# Idempotent and quiet when everything is present.
set -euo pipefail

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v clang >/dev/null 2>&1 || missing+=(clang)
if ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q libclang; then
  missing+=(libclang-dev)
fi
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}" >&2
  SUDO=""
  if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "bootstrap: cargo not found; install Rust (rustup) first" >&2; exit 1; }
