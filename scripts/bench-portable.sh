#!/usr/bin/env bash
# What the portable container image costs against a build for this machine's CPU
# (target-cpu=native), on the same files, threads and machine, arms alternated per file:
#   v3      the image's x86-64-v3 baseline alone (FRIGG_CPU_VARIANT=baseline): what the image
#           ran before it carried the builds of deploy/cpu-variants;
#   chosen  the image as it starts: the build it chooses for this CPU (scripts/build-variants.sh;
#           the table's machine line names it, "frigg built for …");
#   native  ./target/release/frigg, built here for this CPU.
# Needs the image (scripts/container-build.sh, root), or PORTABLE, a portable install made outside a
# container (scripts/build-variants.sh PREFIX; then PORTABLE=PREFIX), and
# models/mimir-{q8_0,bf16}.gguf. Writes docs/bench/portable-{v3,chosen,native}-MACHINE.json
# (MACHINE as in scripts/bench-vs.sh) and renders every CPU's files into docs/deploy.md
# (bench:portable-v3, bench:portable-chosen, bench:portable-native), one table per CPU and build.
#   scripts/bench-portable.sh [TAG]     # default frigg:cpu
#   PORTABLE=/tmp/frigg-portable scripts/bench-portable.sh
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
variant_for() { # ARM: the FRIGG_CPU_VARIANT that arm runs with
    if [ "$1" = v3 ]; then echo baseline; else echo ""; fi
}
if [ -n "${PORTABLE:-}" ]; then
    run_portable() {
        FRIGG_CPU_VARIANT="$(variant_for "$1")" "$PORTABLE/bin/frigg" bench matrix "models/mimir-$2.gguf" "${args[@]}" --json "$out/$1-$2.json" >/dev/null
    }
else
    if ! podman run --rm "$tag" --version >/dev/null 2>&1; then
        # the same fallback as scripts/container-build.sh for VMs that refuse podman's defaults
        conf="$(mktemp)"
        printf '[containers]\ndefault_ulimits = []\n[engine]\ncgroup_manager = "cgroupfs"\nruntime = "runc"\n' > "$conf"
        export CONTAINERS_CONF="$conf"
    fi
    run_portable() {
        local m
        m="$(readlink -f "models/mimir-$2.gguf")"
        podman run --rm -e FRIGG_CPU_VARIANT="$(variant_for "$1")" -v "$m:/models/mimir-$2.gguf:ro" -v "$out:/out" "$tag" \
            bench matrix "/models/mimir-$2.gguf" "${args[@]}" --json "/out/$1-$2.json" >/dev/null
    }
fi
for f in q8_0 bf16; do
    run_portable v3 "$f"
    run_portable chosen "$f"
    $frigg bench matrix "models/mimir-$f.gguf" "${args[@]}" --json "$out/native-$f.json" >/dev/null
done
python3 - "$out" "$MACHINE_TAG" <<'PY'
import json, sys
out, machine = sys.argv[1], sys.argv[2]
for arm in ("v3", "chosen", "native"):
    cells = []
    for f in ("q8_0", "bf16"):
        cells += json.load(open(f"{out}/{arm}-{f}.json"))
    json.dump(cells, open(f"docs/bench/portable-{arm}-{machine}.json", "w"), indent=2)
PY
for arm in v3 chosen native; do
    $frigg bench render --matrix docs/bench/portable-$arm-*.json --markdown docs/deploy.md --key portable-$arm
done
rm -rf "$out"
