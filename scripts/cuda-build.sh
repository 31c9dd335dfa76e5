#!/usr/bin/env bash
# Builds frigg with `--features cuda` on a machine with no GPU and no CUDA install, using
# NVIDIA's CUDA 13.0 toolchain from PyPI (the cu12 `nvidia-cuda-nvcc-cu12` wheels ship only
# ptxas, no nvcc/cicc; the CUDA 13 wheels ship the whole compiler). CUDA 13 needs a driver
# >= 580 at run time; the device machine has 580.x (see /work/.library/device/KINDS.md).
#
# Run to the end on the 2-core CPU machine (no GPU) with CUDA_ARCHS=90-real: 144 nvcc jobs,
# about 70 minutes of build in two sittings (other work shared the cores), then the link. The
# binary needs libcublas.so.13 (and, through it, libcublasLt.so.13) at run time, reports
# "backends: CUDA, CPU", and without a driver ggml-cuda logs that it cannot initialize and the
# CPU backend serves. Archs "86;90" compiles every file for both archs (roughly twice the work).
#
#   scripts/cuda-build.sh                 # archs "86;90", binary for any x86-64-v3 CPU
#   CUDA_ARCHS=90-real scripts/cuda-build.sh   # H100/H200 only: about half the nvcc work and size
#
# Env: CUDA_ARCHS (default "86;90"), CUDA_WORK (venv + CUDA tree, default /tmp/cuda-work),
#      FRIGG_TARGET_CPU (default x86-64-v3; "native" = this CPU only), CMAKE_BUILD_PARALLEL_LEVEL,
#      STAGE=0 to skip copying the stripped binary to .device/frigg for the device tool,
#      DEVICE_TESTS=0 to skip building and staging tests/device.rs as .device/device-tests,
#      BEFORE_BIN=PATH to stage another CUDA frigg (an earlier commit's) as .device/frigg-before,
#      DRY_RUN=1 to set up the toolchain and print the environment without building.
#
# How linking works: llama-cpp-sys-2 0.1.161 (Linux, static ggml) emits
#   rustc-link-lib=static=cudart_static / cublas_static / cublasLt_static / culibos
# and searches find_cuda_helper::find_cuda_lib_dirs(), i.e. $CUDA_LIBRARY_PATH/lib64 and
# $CUDA_LIBRARY_PATH/lib64/stubs. The wheels ship libcudart_static.a but no static cuBLAS and no
# culibos, so empty archives stand in for those three (lib64/stubs) and cuBLAS is linked as a
# shared library through RUSTFLAGS link args. The binary then needs libcublas.so.13 and
# libcublasLt.so.13 at run time (LD_LIBRARY_PATH), and no libcuda at link time
# (cuda-no-vmm: ggml-cuda makes no driver-API calls; cudart loads libcuda.so.1 when it runs).
# The build dir under target-cuda/ is kept: a rerun with the same settings resumes where it stopped.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
start=$(date +%s)

work="${CUDA_WORK:-/tmp/cuda-work}"
venv="$work/venv"
cuda="$work/cuda"
archs="${CUDA_ARCHS:-86;90}"
target_cpu="${FRIGG_TARGET_CPU:-x86-64-v3}"
target_dir="$root/target-cuda"
# One CUDA release, matching the device machine's nvcc 13.0 (pins checked on PyPI 2026-11).
pkgs=(
    "nvidia-cuda-nvcc==13.0.88" "nvidia-nvvm==13.0.88" "nvidia-cuda-crt==13.0.88"
    "nvidia-cuda-runtime==13.0.96" "nvidia-cublas==13.0.2.14" "nvidia-cuda-cccl==13.0.85"
)

# 1. The toolchain (about 1 GB of wheels: cublasLt alone is 540 MB unpacked).
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
cu13="$("$venv/bin/python" - <<'PY' 2>/dev/null || true
import os, sysconfig
print(os.path.join(sysconfig.get_paths()["purelib"], "nvidia", "cu13"))
PY
)"
if [ ! -x "$cu13/bin/nvcc" ] || [ ! -x "$cu13/nvvm/bin/cicc" ] || [ ! -f "$cu13/lib/libcublas.so.13" ] || [ ! -d "$cu13/include/cccl/cub" ]; then
    "$venv/bin/pip" install --quiet --disable-pip-version-check "${pkgs[@]}"
fi
[ -x "$cu13/bin/nvcc" ] || { echo "nvcc not found under $cu13 after pip install" >&2; exit 1; }

# 2. A CUDA_HOME-shaped tree. bin/ must be a real directory: nvcc takes TOP from the path it was
#    started by (bin/..), and a symlinked bin/ would resolve .. to the wheel, which has lib/ not lib64/.
rm -rf "$cuda"
mkdir -p "$cuda/bin" "$cuda/lib64/stubs" "$cuda/nvvm"
for f in "$cu13"/bin/*; do ln -s "$f" "$cuda/bin/"; done
ln -s "$cu13/include" "$cuda/include"
ln -s "$cu13/nvvm/bin" "$cuda/nvvm/bin"
ln -s "$cu13/nvvm/libdevice" "$cuda/nvvm/libdevice"
for f in "$cu13"/lib/*.so* "$cu13"/lib/*.a; do ln -s "$f" "$cuda/lib64/"; done
for l in cudart cublas cublasLt; do ln -s "lib$l.so.13" "$cuda/lib64/lib$l.so"; done
for l in cublas_static cublasLt_static culibos; do ar rcs "$cuda/lib64/stubs/lib$l.a"; done  # empty archives
"$cuda/bin/nvcc" --version | tail -1

# 3. The environment llama-cpp-sys-2's build script reads (it forwards every CMAKE_* and GGML_*
#    variable to CMake as -D; it does not watch CMAKE_* for changes, hence the stamp below).
export PATH="$cuda/bin:$PATH"
export CUDA_PATH="$cuda" CUDA_HOME="$cuda" CUDAToolkit_ROOT="$cuda" CUDACXX="$cuda/bin/nvcc"
export CUDA_LIBRARY_PATH="$cuda"            # find_cuda_helper adds $it/lib64 and $it/lib64/stubs
export CMAKE_CUDA_COMPILER="$cuda/bin/nvcc"
export CMAKE_CUDA_ARCHITECTURES="$archs"    # required: GGML_NATIVE would otherwise ask for "native"
export CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-$(nproc)}"
export CARGO_TARGET_DIR="$target_dir"
# RUSTFLAGS replaces .cargo/config.toml's target-cpu=native, so say the CPU here too. With a
# non-native target-cpu llama-cpp-sys-2 turns GGML_NATIVE off and passes -march=$target_cpu;
# CFLAGS goes last on cc's command line, so it also overrides build.rs's -march=native for ggml-ext.
export RUSTFLAGS="-C target-cpu=$target_cpu -C link-arg=-L$cuda/lib64 -C link-arg=-lcublas -C link-arg=-lcublasLt"
if [ "$target_cpu" != native ]; then
    export CFLAGS="-march=$target_cpu" CXXFLAGS="-march=$target_cpu"
fi

stamp="$target_dir/cuda-build.stamp"
want="archs=$archs cpu=$target_cpu cuda=$("$cuda/bin/nvcc" --version | tail -1)"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" != "$want" ]; then
    echo "CUDA settings changed ($(cat "$stamp") -> $want): rebuilding llama-cpp-sys-2"
    cargo clean --release -p llama-cpp-sys-2
fi
mkdir -p "$target_dir"
echo "$want" > "$stamp"

if [ "${DRY_RUN:-0}" = 1 ]; then
    env | grep -E '^(CUDA|CMAKE_|RUSTFLAGS|CFLAGS|CXXFLAGS|CARGO_TARGET_DIR|PATH=)' | sort
    exit 0
fi

# 4. Build.
echo "cargo build --release --features cuda ($want, $CMAKE_BUILD_PARALLEL_LEVEL jobs)"
cargo build --release --locked --features cuda --bin frigg
bin="$target_dir/release/frigg"

# 5. Check what it links and that it starts (no GPU here: ggml-cuda logs that it found none).
readelf -d "$bin" | grep NEEDED
LD_LIBRARY_PATH="$cuda/lib64" "$bin" --version

# 6. Stage stripped copies for the device tool (carry: [".device"]; 64 MiB with the ~21 MiB
#    tree): frigg, and the device tests (tests/device.rs) as one executable, unless
#    DEVICE_TESTS=0. The tests find their fixtures through the crate directory compiled in
#    (CARGO_MANIFEST_DIR), which manifest-dir records. Over 40 MiB together, both go into one
#    xz archive (.device/bins.tar.xz): they share ggml and ggml-cuda, which one large xz
#    dictionary stores once (nvcc's fatbins are already compressed: GGML_CUDA_COMPRESSION_MODE=size).
if [ "${STAGE:-1}" = 1 ]; then
    rm -rf .device/frigg .device/frigg.xz .device/device-tests .device/frigg-before .device/bins.tar.xz
    mkdir -p .device
    objcopy --strip-all "$bin" .device/frigg
    bins=(frigg)
    if [ "${DEVICE_TESTS:-1}" = 1 ]; then
        exe="$(cargo test --release --locked --features cuda --test device --no-run --message-format=json \
            | python3 -c 'import json, sys
print([m["executable"] for m in map(json.loads, sys.stdin)
       if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "device"][-1])')"
        objcopy --strip-all "$exe" .device/device-tests
        echo "$root" > .device/manifest-dir
        bins+=(device-tests)
    fi
    if [ -n "${BEFORE_BIN:-}" ]; then
        # an earlier commit's CUDA frigg, timed beside this one by device-check.sh (step 5a)
        objcopy --strip-all "$BEFORE_BIN" .device/frigg-before
        bins+=(frigg-before)
    fi
    size=$(cd .device && cat "${bins[@]}" | wc -c)
    echo "staged .device/{${bins[*]}}: $((size / 1048576)) MiB"
    if [ "$size" -gt $((40 << 20)) ]; then
        tar -cf - -C .device "${bins[@]}" | xz -9e -T1 > .device/bins.tar.xz
        (cd .device && rm -f "${bins[@]}")
        echo "compressed: .device/bins.tar.xz $(( $(stat -c %s .device/bins.tar.xz) / 1048576 )) MiB" >&2
    fi
fi
echo "cuda-build: $(( $(date +%s) - start )) s"
