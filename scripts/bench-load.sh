#!/usr/bin/env bash
# The server load test: 16 streaming clients for DURATION seconds (default 120) against a real
# `frigg serve` on loopback, then every request still in flight finishes. Runs:
#   tiny     the tiny random-weight fixture (q8_0), 16 slots
#   mimir-1  the full Mimir shape at q8_0 (models/mimir-q8_0.gguf), 1 slot
#   mimir-4  the same, 4 slots
# and writes docs/bench/load-*.json and the table in docs/benchmarks.md (bench:load).
# Usage: scripts/bench-load.sh [DURATION] [RUN...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
dur="${1:-120}"
shift || true
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(tiny mimir-1 mimir-4)
. scripts/serve-lib.sh

one() {  # label model slots max_tokens json ctx
    start_server "$2" --slots "$3" --queue 16 --ctx "$6"
    local pid=$server_pid
    $frigg bench load --url "$server_url" --streams 16 --duration "$dur" --max-tokens "$4" --label "$1" --json "$5" || { kill -TERM $pid; exit 1; }
    kill -TERM $pid
    wait $pid
}

files=()
for r in "${runs[@]}"; do
    case "$r" in
        tiny) one "tiny fixture, q8_0, 16 slots" "$tiny" 16 "16,32,64" docs/bench/load-tiny.json 256; files+=(docs/bench/load-tiny.json) ;;
        mimir-1) one "Mimir shape, q8_0, 1 slot" models/mimir-q8_0.gguf 1 "16,32" docs/bench/load-mimir-q8_0-1slot.json 512; files+=(docs/bench/load-mimir-q8_0-1slot.json) ;;
        mimir-4) one "Mimir shape, q8_0, 4 slots" models/mimir-q8_0.gguf 4 "16,32" docs/bench/load-mimir-q8_0-4slots.json 512; files+=(docs/bench/load-mimir-q8_0-4slots.json) ;;
        *) echo "unknown run $r"; exit 2 ;;
    esac
done
all=()
for f in docs/bench/load-tiny.json docs/bench/load-mimir-q8_0-1slot.json docs/bench/load-mimir-q8_0-4slots.json; do
    [ -f "$f" ] && all+=("$f")
done
$frigg bench render --load "${all[@]}" --markdown docs/benchmarks.md --key load
