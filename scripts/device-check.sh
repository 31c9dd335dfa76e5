#!/usr/bin/env bash
# The GPU check, for a session that holds the device machine (one H200, 16 cores, no network,
# no Rust toolchain, 15 minutes of device time in all, the machine's start included). Nothing is
# built there: scripts/cuda-build.sh (run here first, CUDA_ARCHS=90-real keeps the binary small)
# stages a stripped CUDA frigg in .device/, which is git-excluded and so must be carried:
#   run(command="bash scripts/device-check.sh", carry=[".device"], timeout_s=540)
# It uses the machine's own cuBLAS 13 and python3 (numpy) for the random Mimir checkpoint.
# Leaves in $OUT log.txt and, packed into results.tar.gz at exit: env.json, parity-gpu.json, parity-cpu.json, device-tests.json, bench-gpu.json,
# bench-gpu-vs.json, reuse-gpu.json (graph reuse per batch size), load-gpu-1.json and load-gpu-4.json (with the servers' logs); copy the JSON
# to docs/bench/ and render it into docs/benchmarks.md ("On a GPU": `frigg bench render --matrix …
# --key gpu`, `gpu-vs`, `gpu-reuse`; `--load load-gpu-1.json load-gpu-4.json --key load-gpu`;
# scripts/ncu_summary.py for PROFILE=1's ncu-b*.csv).
# First run on an H200 (2026-12-04): every step ran in 165 s of the 480 s budget; the only fix it
# needed was the device tests' CUDA bounds. Without a GPU (FRIGG_BIN=target-cuda/release/frigg
# SKIP_BENCH=1 SKIP_LOAD=1) steps 1-2 pass and the smoke, parity and device tests fail as they
# must; step 6 runs on the CPU with LOAD_DEVICES=cpu MIMIR_GGUF=demo/frigg-demo.gguf
# LOAD_CTX=256 LOAD_S=5.
#
# Env: FRIGG_BIN (default: the frigg staged in .device), BUDGET_S (default 480, the script's own
#      deadline), SKIP_PARITY=1, SKIP_PARITY_CPU=1, SKIP_BENCH=1, SKIP_LEVERS=1, SKIP_LOAD=1, LOAD_S (default 30), MIMIR_GGUF (a
#      Mimir-shaped GGUF already there: skips making one), LOAD_DEVICES (default 0; `cpu` to try
#      step 6 on a machine without a GPU), LOAD_CTX (default 512), PROFILE=1 (step 7: ncu).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
OUT="${OUT:-/tmp/frigg-device-out}"
mkdir -p "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
t0=$(date +%s)
budget="${BUDGET_S:-480}"
threads="$(nproc)"
tmp="$(mktemp -d /tmp/frigg-dev.XXXXXX)"
# The device tool brings back at most 8 files from $OUT: at exit everything but log.txt goes into
# results.tar.gz (unpack it into a folder, then copy the JSON to docs/bench/).
pack() {
    rm -rf "$tmp"
    tar -czf "$tmp.tar.gz" -C "$OUT" --exclude=log.txt . \
        && find "$OUT" -mindepth 1 -maxdepth 1 ! -name log.txt -exec rm -rf {} + \
        && mv "$tmp.tar.gz" "$OUT/results.tar.gz"
    echo "device-check: $(( $(date +%s) - t0 )) s; $OUT: $(ls "$OUT" | tr '\n' ' ')"
}
trap pack EXIT

# step NAME MAX_SECONDS CMD…: CMD under a timeout capped by the time left, with rc and seconds.
step() {
    local name=$1 max=$2 left s rc; shift 2
    left=$(( budget - ($(date +%s) - t0) ))
    [ "$left" -lt "$max" ] && max=$left
    if [ "$max" -le 5 ]; then echo "== $name: skipped, out of time"; return 1; fi
    echo "== $name (limit ${max}s, at $(( $(date +%s) - t0 ))s)"
    s=$(date +%s)
    timeout --kill-after=5 "$max" "$@"; rc=$?
    echo "== $name: rc=$rc in $(( $(date +%s) - s ))s"
    return $rc
}

# unpack ARCHIVE DIR: a .tar.xz staged in .device (python's tarfile: the machine may lack xz)
unpack() { python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$1" "$2"; }

# 1. The binary (xz-compressed when the build was large) and the cuBLAS 13 it links.
#    cuda-build.sh stages .device/frigg and .device/device-tests, or both in .device/bins.tar.xz.
if [ -f .device/bins.tar.xz ]; then
    unpack .device/bins.tar.xz "$tmp"
else
    cp .device/frigg .device/device-tests .device/frigg-before "$tmp"/ 2>/dev/null
fi
bin="${FRIGG_BIN:-$tmp/frigg}"
[ -x "$bin" ] || { echo "no frigg binary at $bin: run scripts/cuda-build.sh first and carry .device"; exit 2; }
bin="$(realpath "$bin")"
cublas=""
for d in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
         $(python3 -c 'import glob, site; [print(p) for s in site.getsitepackages() for p in glob.glob(s + "/nvidia/cu13/lib")]' 2>/dev/null); do
    [ -e "$d/libcublasLt.so.13" ] && { cublas="$d"; break; }
done
[ -z "$cublas" ] && cublas="$(dirname "$(timeout 30 find / -xdev -name 'libcublasLt.so.13*' -print -quit 2>/dev/null)")"
export LD_LIBRARY_PATH="$cublas${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if ldd "$bin" | grep 'not found'; then echo "missing libraries (cuBLAS searched: '$cublas')"; exit 3; fi

# 2. The machine and what the binary sees (132 = SIGILL: rebuild with FRIGG_TARGET_CPU=x86-64-v2).
version="$("$bin" --version 2>&1)" || { echo "frigg --version failed: $version"; exit 4; }
echo "$version"
python3 - "$OUT/env.json" "$version" "$cublas" <<'PY'
import json, os, subprocess, sys
sh = lambda c: subprocess.run(c, shell=True, capture_output=True, text=True).stdout.strip()
json.dump({"frigg": sys.argv[2], "cublas": sys.argv[3], "nproc": os.cpu_count(),
           "gpu": sh("nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader"),
           "cpu": sh("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2"), "kernel": sh("uname -r")},
          open(sys.argv[1], "w"), indent=1)
PY
case "$version" in *CUDA*) ;; *) echo "this frigg has no CUDA backend"; exit 4 ;; esac

# 3. Smoke: the bundled demo model answers on the GPU (its answer, and where ggml ran the nodes).
GGML_SCHED_DEBUG=1 step smoke 60 "$bin" run demo/frigg-demo.gguf --device gpu -p "Hvad er hovedstaden i Frankrig?" --max-tokens 16 2> "$tmp/smoke.err"
grep -oE 'CUDA0|CPU' "$tmp/smoke.err" | sort | uniq -c

# 4. Parity of every tier against the transformers goldens, on the GPU and (for comparison) the CPU.
if [ "${SKIP_PARITY:-0}" != 1 ]; then
    step parity-gpu 120 "$bin" parity --device gpu --threads "$threads" --json "$OUT/parity-gpu.json"
    [ "${SKIP_PARITY_CPU:-0}" != 1 ] && step parity-cpu 120 "$bin" parity --threads "$threads" --json "$OUT/parity-cpu.json"
fi

# 4b. The device tests (tests/device.rs, staged by cuda-build.sh as .device/device-tests):
#     every tier against the goldens and against the CPU, a sequence alone and beside three
#     others, a cancelled prefill, on the GPU, each held to the bounds measured for its backend
#     (tests/device.rs); what the GPU measured lands in device-tests.json either way. The fixtures are found through the crate
#     directory compiled in (.device/manifest-dir), linked to this tree when it is elsewhere.
if [ "${SKIP_PARITY:-0}" != 1 ] && [ -x "$tmp/device-tests" ]; then
    built_in="$(cat .device/manifest-dir 2>/dev/null || true)"
    if [ -n "$built_in" ] && [ ! -e "$built_in" ]; then mkdir -p "$(dirname "$built_in")" && ln -s "$root" "$built_in"; fi
    step device-tests 150 env FRIGG_DEVICE_REPORT="$OUT/device-tests.json" "$tmp/device-tests" --test-threads 1
fi

# 5. Speed at the full Mimir shape (random weights, generated here: the GGUFs cannot travel).
#    Targets: bf16 one stream >= 150 tok/s, >= 5,000 tok/s aggregate at 64 streams. Then, if time
#    is left, the same file through llama.cpp alternated with frigg (best effort: without
#    models/gemma4-tokenizer carried, the file's tokenizer is the small fixture one, whose
#    vocabulary llama.cpp may refuse to pair with the model's 262,144 rows).
if [ ! -f models/gemma4-tokenizer/tokenizer.json ] && [ -f .device/gemma4-tokenizer.tar.xz ]; then
    # staged here by: tar -cJf .device/gemma4-tokenizer.tar.xz -C models gemma4-tokenizer
    unpack .device/gemma4-tokenizer.tar.xz models
fi
mimir="${MIMIR_GGUF:-$tmp/mimir-bf16.gguf}"
if [ ! -f "$mimir" ] && { [ "${SKIP_BENCH:-0}" != 1 ] || [ "${SKIP_LOAD:-0}" != 1 ] || [ "${PROFILE:-0}" = 1 ]; }; then
    step mimir-random 180 python3 scripts/make_mimir_random.py "$tmp/mimir" \
        && step convert-bf16 120 "$bin" convert "$tmp/mimir" -o "$mimir" --type bf16
    rm -rf "$tmp/mimir"
fi
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -f "$mimir" ]; then
    step bench-gpu 200 "$bin" bench matrix "$mimir" --device gpu \
        --batches 1,8,64 --contexts 512 --kernels batched --steps 32 --reps 3 --prefill 512 \
        --threads "$threads" --json "$OUT/bench-gpu.json" \
    && step bench-gpu-vs 150 "$bin" bench matrix "$mimir" --device gpu --vs llama.cpp \
        --batches 1,8 --contexts 512 --kernels batched --steps 32 --reps 3 --prefill 512 \
        --threads "$threads" --json "$OUT/bench-gpu-vs.json"
fi

# 5a. Levers, each in its own process right after step 5, the same command: the binary with
#     stacked attention projections off (FRIGG_STACKED_PROJECTIONS=0: gate, q, k and v as four
#     matmuls) → bench-gpu-unstacked.json; and, when cuda-build.sh staged one (BEFORE_BIN=…),
#     the build of an earlier commit (.device/frigg-before) → bench-gpu-before.json.
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -f "$mimir" ] && [ "${SKIP_LEVERS:-0}" != 1 ]; then
    bench=(bench matrix "$mimir" --device gpu --batches 1,8,64 --contexts 512 --kernels batched
           --steps 32 --reps 3 --prefill 512 --threads "$threads")
    step bench-gpu-unstacked 120 env FRIGG_STACKED_PROJECTIONS=0 "$bin" "${bench[@]}" --json "$OUT/bench-gpu-unstacked.json"
    if [ -x "$tmp/frigg-before" ]; then
        "$tmp/frigg-before" --version 2>&1 | tail -1
        step bench-gpu-before 120 "$tmp/frigg-before" "${bench[@]}" --json "$OUT/bench-gpu-before.json"
    fi
fi

# 5b. Graph reuse at every batch size: a few decode steps per batch after one warm-up step; each
#    cell's graphs_timed must show no rebuild, no allocation, no node change (frigg's counters)
#    and no CUDA graph reset, with CUDA graphs replayed (ggml-cuda's own log lines, counted).
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -f "$mimir" ]; then
    step reuse-gpu 90 "$bin" bench matrix "$mimir" --device gpu --batches 1,2,3,4,8,16,32,64 --contexts 512 \
        --kernels batched --steps 8 --reps 1 --prefill 0 --threads "$threads" --json "$OUT/reuse-gpu.json" \
    && python3 - "$OUT/reuse-gpu.json" <<'PY'
import json, sys
bad = 0
for c in json.load(open(sys.argv[1])):
    g = c.get("graphs_timed") or {}
    cuda = g.get("cuda", {})
    ok = g.get("decode_builds") == 0 and g.get("allocations") == 0 and g.get("decode_changes") == 0 and cuda.get("resets") == 0 and cuda.get("reuses", 0) > 0
    bad += not ok
    print(f"reuse batch {c['batch']:3}: {'captured, replayed' if ok else 'NOT REUSED'} {g}")
print("reuse: every batch size replays its CUDA graph" if bad == 0 else f"reuse: {bad} batch size(s) rebuilt or re-captured")
sys.exit(1 if bad else 0)
PY
fi

# 6. Serving on the GPU through `--devices 0` (one CUDA replica behind the HTTP front): the
#    load test's 16 streaming clients with 1 slot, then 4 slots, LOAD_S seconds each (default
#    30; the CPU table's runs are 120). Target: 4 slots >= 2.5x one slot's aggregate. Render
#    with `frigg bench render --load load-gpu-1.json load-gpu-4.json --key load-gpu`.
if [ "${SKIP_LOAD:-0}" != 1 ] && [ -f "$mimir" ]; then
    for slots in 1 4; do
        port=$((20000 + RANDOM % 20000))
        "$bin" serve "$mimir" --devices "${LOAD_DEVICES:-0}" --slots "$slots" --queue 16 --ctx "${LOAD_CTX:-512}" \
            --port "$port" --threads "$threads" 2> "$OUT/serve-gpu-$slots.log" &
        pid=$!
        python3 - "$port" "$pid" <<'PY' || { echo "serve did not become healthy: $OUT/serve-gpu-$slots.log"; kill $pid 2>/dev/null; break; }
import os, sys, time, urllib.request
for _ in range(240):
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/health", timeout=2)
        sys.exit(0)
    except Exception:
        os.kill(int(sys.argv[2]), 0)  # raises (exit 1) once the server has exited
        time.sleep(0.5)
sys.exit(1)
PY
        step "load-gpu-$slots" 120 "$bin" bench load --url "http://127.0.0.1:$port" --streams 16 \
            --duration "${LOAD_S:-30}" --max-tokens 16,32 --label "Mimir shape, bf16, GPU, $slots slot(s)" \
            --json "$OUT/load-gpu-$slots.json"
        kill -TERM $pid
        wait $pid
    done
fi

# 7. Where a decode step's time goes (PROFILE=1): Nsight Compute's duration of every kernel over
#    a warm-up and 2 decode steps at batch 1 and at 64, summed per kernel name by
#    scripts/ncu_summary.py (ncu-b*.csv is the raw list).
ncu="$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu /usr/local/cuda/bin/ncu 2>/dev/null | head -1)"
if [ "${PROFILE:-0}" = 1 ] && [ -n "$ncu" ] && [ -f "$mimir" ]; then
    for b in 1 64; do
        step "profile-b$b" 150 "$ncu" --clock-control none --metrics gpu__time_duration.sum --csv \
            --launch-count 40000 --log-file "$OUT/ncu-b$b.csv" \
            "$bin" bench matrix "$mimir" --device gpu --batches "$b" --contexts 512 --kernels batched \
            --steps 2 --reps 1 --prefill 0 --threads "$threads" --json "$OUT/profile-b$b.json"
        python3 scripts/ncu_summary.py "$OUT/ncu-b$b.csv"
    done
fi
