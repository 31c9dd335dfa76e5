#!/usr/bin/env bash
# frigg vs llama.cpp's own hrm_text, cell by cell, on the full Mimir shape (random weights:
# scripts/make_mimir_random.py models/mimir-random, then frigg convert to models/mimir-TYPE.gguf).
# Both in one process on the same file and threads, repetitions alternated frigg, llama.cpp;
# frigg on ggml's fast (batched GEMM) kernels, as llama.cpp. Writes docs/bench/vs-*.json and
# the table in docs/benchmarks.md (bench:vs).
#   q8_0: batch 1 and 4, context 512 and 1024;  bf16, q4_0, q4_k: batch 1 and 4, context 512.
# Usage: scripts/bench-vs.sh [THREADS]   (run it on an otherwise idle machine)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
threads="${1:-$(nproc)}"
frigg=./target/release/frigg
cargo build --release --locked >/dev/null
common=(--batches 1,4 --kernels batched --threads "$threads" --steps 8 --reps 3 --prefill 128 --vs llama.cpp)
$frigg bench matrix models/mimir-q8_0.gguf --contexts 512,1024 "${common[@]}" --json docs/bench/vs-q8_0.json
$frigg bench matrix models/mimir-bf16.gguf models/mimir-q4_0.gguf models/mimir-q4_k.gguf --contexts 512 "${common[@]}" --json docs/bench/vs-bf16-q4.json
$frigg bench render --matrix docs/bench/vs-q8_0.json docs/bench/vs-bf16-q4.json --markdown docs/benchmarks.md --key vs
