#!/usr/bin/env bash
# What the portable container image (Containerfile: ggml and the extension built for x86-64-v3)
# costs against a build for this machine's CPU (target-cpu=native), on the same files, threads
# and machine, arms alternated per file. Needs the image (scripts/container-build.sh, root) and
# models/mimir-{q8_0,bf16}.gguf. Writes docs/bench/portable-{v3,native}.json and both tables
# into docs/deploy.md (bench:portable-v3, bench:portable-native).
#   scripts/bench-portable.sh [TAG]     # default frigg:cpu
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
tag="${1:-frigg:cpu}"
frigg=./target/release/frigg
cargo build --release --locked >/dev/null
if ! podman run --rm "$tag" --version >/dev/null 2>&1; then
    # the same fallback as scripts/container-build.sh for VMs that refuse podman's defaults
    conf="$(mktemp)"
    printf '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n' > "$conf"
    export CONTAINERS_CONF="$conf"
fi
out="$(mktemp -d)"
chmod 777 "$out"
args=(--batches 1,4 --contexts 512 --steps 8 --reps 3 --prefill 128)
v3=() native=()
for f in q8_0 bf16; do
    m="$(readlink -f "models/mimir-$f.gguf")"
    podman run --rm -v "$m:/models/mimir-$f.gguf:ro" -v "$out:/out" "$tag" \
        bench matrix "/models/mimir-$f.gguf" "${args[@]}" --json "/out/v3-$f.json" >/dev/null
    $frigg bench matrix "models/mimir-$f.gguf" "${args[@]}" --json "$out/native-$f.json" >/dev/null
    v3+=("$out/v3-$f.json") native+=("$out/native-$f.json")
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
for arm in ("v3", "native"):
    cells = []
    for f in ("q8_0", "bf16"):
        cells += json.load(open(f"{out}/{arm}-{f}.json"))
    json.dump(cells, open(f"docs/bench/portable-{arm}.json", "w"), indent=2)
PY
$frigg bench render --matrix docs/bench/portable-v3.json --markdown docs/deploy.md --key portable-v3
$frigg bench render --matrix docs/bench/portable-native.json --markdown docs/deploy.md --key portable-native
rm -rf "$out"
