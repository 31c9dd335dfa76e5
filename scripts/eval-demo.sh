#!/usr/bin/env bash
# Regenerates docs/eval.md's tables: converts the committed demo checkpoint to f32 (the bundled
# demo/frigg-demo.gguf, checked byte for byte), bf16, q8_0 and q4_0, runs `frigg eval --task
# demo-qa` with all three arms on each, and (with the reference venv) the transformers side.
# Usage: scripts/eval-demo.sh [--no-reference]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cargo build --release --locked >/dev/null
frigg=./target/release/frigg
d="$(mktemp -d)"
for t in f32 bf16 q8_0 q4_0; do
    $frigg convert tests/fixtures/demo/ckpt -o "$d/frigg-demo-$t.gguf" --type "$t" --name frigg-demo --quiet
done
cmp "$d/frigg-demo-f32.gguf" demo/frigg-demo.gguf || { echo "demo/frigg-demo.gguf is not the f32 conversion of tests/fixtures/demo/ckpt"; exit 1; }
$frigg eval "$d"/frigg-demo-{f32,bf16,q8_0,q4_0}.gguf --threads "$(nproc)" --json docs/bench/eval-demo-qa.json --markdown docs/eval.md --key eval
if [ "${1:-}" != "--no-reference" ] && [ -x "${FRIGG_REF_VENV:-$root/../venv-ref}/bin/python" ]; then
    "${FRIGG_REF_VENV:-$root/../venv-ref}/bin/python" scripts/eval_reference.py tests/fixtures/demo/ckpt --json docs/bench/eval-reference.json --markdown docs/eval.md
fi
rm -rf "$d"
