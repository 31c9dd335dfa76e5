#!/usr/bin/env bash
# The huge-pages lever in isolation: frigg's decode with FRIGG_HUGE_PAGES=0 (4 KiB pages) and
# with huge pages (the default), one process per arm, in ABBA order over 4 pairs so drift
# cancels. Writes docs/bench/hugepages-*.json and the table in docs/benchmarks.md
# (bench:hugepages); the "in 2 MiB pages" column says which arm a row is.
# Usage: scripts/bench-hugepages.sh [MODEL]   (default models/mimir-q8_0.gguf; an idle machine)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
model="${1:-models/mimir-q8_0.gguf}"
frigg=./target/release/frigg
cargo build --release --locked >/dev/null
files=()
for pair in 1 2 3 4; do
    if [ $((pair % 2)) = 1 ]; then order="0 1"; else order="1 0"; fi
    for huge in $order; do
        f="docs/bench/hugepages-$pair-$([ "$huge" = 1 ] && echo on || echo off).json"
        FRIGG_HUGE_PAGES=$huge $frigg bench matrix "$model" --batches 1,4 --contexts 512 --kernels batched \
            --threads 2 --steps 8 --reps 3 --prefill 0 --json "$f"
        files+=("$f")
    done
done
$frigg bench render --matrix "${files[@]}" --markdown docs/benchmarks.md --key hugepages
