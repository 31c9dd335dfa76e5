#!/usr/bin/env bash
# One lever in isolation: frigg's decode with an environment switch off and on, one process per
# arm, in ABBA order over 4 pairs so drift cancels. Writes docs/bench/ab-KEY-PAIR-ARM.json and
# the table between the bench:KEY markers of docs/benchmarks.md; the rows say which arm they are
# (the "in 2 MiB pages" column, or "flash attention" in the kernels column).
#   scripts/bench-ab.sh hugepages FRIGG_HUGE_PAGES 0 1
#   scripts/bench-ab.sh attention FRIGG_DECODE_ATTENTION flash ext
# Env: MODEL (default models/mimir-q8_0.gguf), CONTEXTS (default 512,1024), BATCHES (default
# 1,4), KERNELS (frigg's --kernels, default batched), PREFILL (prompt tokens, default 0: none).
# An idle machine.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ $# -eq 4 ] || { echo "usage: $0 KEY VAR OFF_VALUE ON_VALUE" >&2; exit 2; }
key=$1 var=$2 off=$3 on=$4
frigg=./target/release/frigg
cargo build --release --locked >/dev/null
files=()
for pair in 1 2 3 4; do
    if [ $((pair % 2)) = 1 ]; then order="$off $on"; else order="$on $off"; fi
    for value in $order; do
        f="docs/bench/ab-$key-$pair-$([ "$value" = "$on" ] && echo on || echo off).json"
        env "$var=$value" $frigg bench matrix "${MODEL:-models/mimir-q8_0.gguf}" --batches "${BATCHES:-1,4}" --contexts "${CONTEXTS:-512,1024}" \
            --kernels "${KERNELS:-batched}" --threads 2 --steps 8 --reps 3 --prefill "${PREFILL:-0}" --json "$f"
        files+=("$f")
    done
done
$frigg bench render --matrix "${files[@]}" --markdown docs/benchmarks.md --key "$key"
