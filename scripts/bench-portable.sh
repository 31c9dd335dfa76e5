#!/usr/bin/env bash
# What the portable container image (Containerfile: ggml and the extension built for x86-64-v3)
# costs against a build for this machine's CPU (target-cpu=native), on the same files, threads
# and machine, arms alternated per file. Needs the image (scripts/container-build.sh, root), or
# V3_BIN, a frigg built the image's way outside a container
# (RUSTFLAGS="-C target-cpu=x86-64-v3" cargo build --release --target-dir target-v3), and
# models/mimir-{q8_0,bf16}.gguf. Writes docs/bench/portable-{v3,native}-MACHINE.json (MACHINE as
# in scripts/bench-vs.sh) and renders every CPU's files into docs/deploy.md (bench:portable-v3,
# bench:portable-native), one table per CPU.
#   scripts/bench-portable.sh [TAG]     # default frigg:cpu
#   V3_BIN=target-v3/release/frigg scripts/bench-portable.sh
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
tag="${1:-frigg:cpu}"
frigg=./target/release/frigg
cargo build --release --locked >/dev/null
. scripts/machine-tag.sh
out="$(mktemp -d)"
chmod 777 "$out"
args=(--batches 1,4 --contexts 512 --steps 8 --reps 3 --prefill 128)
if [ -n "${V3_BIN:-}" ]; then
    run_v3() { "$V3_BIN" bench matrix "models/mimir-$1.gguf" "${args[@]}" --json "$out/v3-$1.json" >/dev/null; }
else
    if ! podman run --rm "$tag" --version >/dev/null 2>&1; then
        # the same fallback as scripts/container-build.sh for VMs that refuse podman's defaults
        conf="$(mktemp)"
        printf '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n' > "$conf"
        export CONTAINERS_CONF="$conf"
    fi
    run_v3() {
        local m
        m="$(readlink -f "models/mimir-$1.gguf")"
        podman run --rm -v "$m:/models/mimir-$1.gguf:ro" -v "$out:/out" "$tag" \
            bench matrix "/models/mimir-$1.gguf" "${args[@]}" --json "/out/v3-$1.json" >/dev/null
    }
fi
for f in q8_0 bf16; do
    run_v3 "$f"
    $frigg bench matrix "models/mimir-$f.gguf" "${args[@]}" --json "$out/native-$f.json" >/dev/null
done
python3 - "$out" "$MACHINE_TAG" <<'PY'
import json, sys
out, machine = sys.argv[1], sys.argv[2]
for arm in ("v3", "native"):
    cells = []
    for f in ("q8_0", "bf16"):
        cells += json.load(open(f"{out}/{arm}-{f}.json"))
    json.dump(cells, open(f"docs/bench/portable-{arm}-{machine}.json", "w"), indent=2)
PY
for arm in v3 native; do
    $frigg bench render --matrix docs/bench/portable-$arm-*.json --markdown docs/deploy.md --key portable-$arm
done
rm -rf "$out"
