#!/usr/bin/env bash
# The fleet test (docs/deploy.md): 3 frigg replicas in network namespaces behind HAProxy, a
# SIGKILL and a rolling restart under `frigg bench load`. Needs root (namespaces).
#   scripts/fleet-test.sh [--json docs/bench/fleet.json] [--markdown docs/deploy.md] [--duration 120]
# Installs haproxy and iproute2 when missing; builds frigg.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
[ "$(id -u)" = 0 ] || { echo "fleet-test: needs root (network namespaces)" >&2; exit 1; }
missing=()
command -v haproxy >/dev/null 2>&1 || missing+=(haproxy)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
if ((${#missing[@]})); then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
fi
scripts/bootstrap.sh
cargo build --release --locked
exec python3 scripts/fleet_test.py "$@"
