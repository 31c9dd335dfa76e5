#!/usr/bin/env bash
# Aggregate decode tok/s at batch 1 and 4 for q8_0, q4_0 and bf16, with the server's
# batch-invariant decode and with --batched-kernels, on the full Mimir shape (random weights).
# Writes docs/bench/matrix-2t.json and the table in docs/benchmarks.md (bench:matrix).
# Usage: scripts/bench-batching.sh [THREADS]   (run it on an otherwise idle machine)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
threads="${1:-$(nproc)}"
frigg=./target/release/frigg
cargo build --release --locked >/dev/null
$frigg bench matrix models/mimir-q8_0.gguf models/mimir-q4_0.gguf models/mimir-bf16.gguf --batches 1,4 --contexts 512 \
    --kernels invariant,batched --threads "$threads" --steps 8 --reps 3 --prefill 0 --json docs/bench/matrix-2t.json
$frigg bench render --matrix docs/bench/matrix-2t.json --markdown docs/benchmarks.md --key matrix
