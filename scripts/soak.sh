#!/usr/bin/env bash
# The soak: 32 concurrent streaming clients with mixed lengths and parameters (bench load
# --mix: greedy+stop, top_p/top_k+penalties, logprobs, n=2, non-streamed, json_object,
# logit_bias) against a real `frigg serve` for DURATION seconds (default 600), then every
# request in flight finishes. The server's resident memory is sampled every 2 s (baseline after
# a 60 s warm-up) and its busy slots and queue are read from /metrics at the end. Runs:
#   mimir  the full Mimir shape at q8_0 (models/mimir-q8_0.gguf), 8 slots, ctx 512
#   tiny   the tiny random-weight fixture (q8_0), 16 slots, ctx 256: many more requests
# Writes docs/bench/soak-*.json and the table in docs/reliability.md (bench:soak). Fails if any
# request failed, memory grew more than 5% after warm-up, a slot stayed busy, or the server did
# not exit 0 on SIGTERM.
# Usage: scripts/soak.sh [DURATION] [RUN...]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
dur="${1:-600}"
shift || true
runs=("$@")
[ ${#runs[@]} -gt 0 ] || runs=(mimir tiny)
. scripts/serve-lib.sh

one() {  # label model slots ctx max_tokens json
    start_server "$2" --slots "$3" --queue 32 --ctx "$4"
    local pid=$server_pid
    local rc=0
    $frigg bench load --url "$server_url" --streams 32 --duration "$dur" --max-tokens "$5" --mix \
        --server-pid "$pid" --warmup 60 --label "$1" --json "$6" || rc=$?
    kill -TERM $pid
    local exit_code=0
    wait $pid || exit_code=$?
    echo "server exit code on SIGTERM: $exit_code"
    python3 - "$6" "$exit_code" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); s = r["soak"]
bad = []
if r["errors"]: bad.append(f"{r['errors']} failed requests: {r['error_samples']}")
if not s["rss_growth_pct"] <= 5: bad.append(f"resident memory grew {s['rss_growth_pct']:.1f}% after warm-up")
if s["busy_slots_end"] != 0: bad.append(f"{s['busy_slots_end']} slots busy at the end")
if sys.argv[2] != "0": bad.append(f"server exited {sys.argv[2]} on SIGTERM")
print("soak:", "; ".join(bad) if bad else "ok")
sys.exit(1 if bad else 0)
PY
    [ $rc = 0 ] || exit $rc
}

for r in "${runs[@]}"; do
    case "$r" in
        mimir) one "Mimir shape, q8_0, 8 slots, ctx 512" models/mimir-q8_0.gguf 8 512 "8,16,32" docs/bench/soak-mimir-q8_0.json ;;
        tiny) one "tiny fixture, q8_0, 16 slots, ctx 256" "$tiny" 16 256 "8,16,32,64" docs/bench/soak-tiny.json ;;
        *) echo "unknown run $r"; exit 2 ;;
    esac
done
all=()
for f in docs/bench/soak-mimir-q8_0.json docs/bench/soak-tiny.json; do
    [ -f "$f" ] && all+=("$f")
done
$frigg bench render --load "${all[@]}" --markdown docs/reliability.md --key soak
