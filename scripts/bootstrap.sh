#!/usr/bin/env bash
# Installs what building frigg needs on a fresh Debian machine, and only what is missing:
# cmake (llama-cpp-sys-2 builds ggml with it), clang + libclang (bindgen), a C/C++ compiler.
# Idempotent and quiet when everything is present.
#
# --vulkan: also what `cargo build --release --features vulkan` needs (README, "Vulkan"):
# Debian's glslc, SPIRV-Headers, Vulkan loader and Mesa's drivers (lavapipe, a software Vulkan
# device), plus Vulkan headers new enough for ggml's ggml-vulkan.cpp (>= 1.3.261 for
# vk::LayerSettingEXT; bookworm ships 1.3.239). Those come from Debian trixie's libvulkan-dev
# package, fetched through apt from Debian's archive (signature checked against the system
# keyring, with a private apt state so the system's sources are untouched) and unpacked into
# .deps/vulkan-sdk, which .cargo/config.toml names as VULKAN_SDK. A system whose own
# libvulkan-dev is new enough needs none of that: set VULKAN_SDK yourself, or leave .deps empty.
# On Debian bookworm the software device comes from bookworm-backports' Mesa (25.0, installed
# system-wide through the same private apt state): bookworm's own lavapipe (Mesa 22.3) kills
# processes running ggml-vulkan's shaders now and then (docs/parity.md, "On a GPU device").
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
vulkan=0
for arg in "$@"; do
  case "$arg" in
    --vulkan) vulkan=1 ;;
    *) echo "bootstrap: unknown argument $arg (known: --vulkan)" >&2; exit 2 ;;
  esac
done

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
# private_apt SOURCES: apt_opts for an apt with only these sources and its own lists and cache
# (signatures checked against the system keyring; the system's sources and lists untouched)
apt_dir=""
private_apt() {
  [ -n "$apt_dir" ] && rm -rf "$apt_dir"
  apt_dir="$(mktemp -d)"
  trap 'rm -rf "$apt_dir"' EXIT
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial"
  echo "$1" >"$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o Dir::Etc::SourceParts=/dev/null
            -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
            -o APT::Sandbox::User=root -qq)
  $SUDO apt-get "${apt_opts[@]}" update
}

missing=()
command -v cmake >/dev/null 2>&1 || missing+=(cmake)
command -v cc >/dev/null 2>&1 || missing+=(gcc)
command -v c++ >/dev/null 2>&1 || missing+=(g++)
command -v clang >/dev/null 2>&1 || missing+=(clang)
if ! ls /usr/lib/llvm-*/lib/libclang*.so* >/dev/null 2>&1 && ! ldconfig -p 2>/dev/null | grep -q libclang; then
  missing+=(libclang-dev)
fi
if ((vulkan)); then
  command -v glslc >/dev/null 2>&1 || missing+=(glslc)
  [ -f /usr/share/cmake/SPIRV-Headers/SPIRV-HeadersConfig.cmake ] || missing+=(spirv-headers)
  ls /usr/lib/*/libvulkan.so.1 >/dev/null 2>&1 || missing+=(libvulkan1)
  ls /usr/share/vulkan/icd.d/lvp_icd*.json >/dev/null 2>&1 || missing+=(mesa-vulkan-drivers)
fi
if ((${#missing[@]})); then
  echo "bootstrap: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi
command -v cargo >/dev/null 2>&1 || { echo "bootstrap: cargo not found; install Rust (rustup) first" >&2; exit 1; }

if ((vulkan)); then
  # lavapipe from bookworm-backports where the system is bookworm and its Mesa is older than 25
  . /etc/os-release
  mesa="$(dpkg-query -W -f='${Version}' mesa-vulkan-drivers 2>/dev/null || true)"
  if [ "${VERSION_CODENAME:-}" = bookworm ] && ! dpkg --compare-versions "$mesa" ge 25; then
    echo "bootstrap: installing lavapipe (mesa-vulkan-drivers) from bookworm-backports (was ${mesa:-none})" >&2
    private_apt "deb http://deb.debian.org/debian bookworm main
deb http://deb.debian.org/debian bookworm-updates main
deb http://deb.debian.org/debian-security bookworm-security main
deb http://deb.debian.org/debian bookworm-backports main"
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get "${apt_opts[@]}" install -y -t bookworm-backports mesa-vulkan-drivers >/dev/null
  fi
  sdk="$root/.deps/vulkan-sdk"
  if [ ! -f "$sdk/include/vulkan/vulkan.hpp" ]; then
    echo "bootstrap: fetching Vulkan headers (Debian trixie's libvulkan-dev) into $sdk" >&2
    private_apt "deb http://deb.debian.org/debian trixie main"
    (cd "$apt_dir" && apt-get "${apt_opts[@]}" download libvulkan-dev)
    deb="$(ls "$apt_dir"/libvulkan-dev_*.deb)"
    rm -rf "$sdk" && mkdir -p "$sdk/lib" "$apt_dir/x"
    dpkg-deb -x "$deb" "$apt_dir/x"
    cp -r "$apt_dir/x/usr/include" "$sdk/include"
    # Link against the system's loader (bookworm's libvulkan1 runs 1.4 headers' code: every
    # newer entry point is looked up at run time).
    multiarch="$(gcc -print-multiarch)"
    ln -sf "/usr/lib/$multiarch/libvulkan.so.1" "$sdk/lib/libvulkan.so"
    basename "$deb" >"$sdk/SOURCE"
  fi
  echo "bootstrap: Vulkan headers $(cat "$sdk/SOURCE") in $sdk" >&2
fi
