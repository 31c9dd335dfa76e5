#!/usr/bin/env bash
# The README's first command: build frigg and serve the bundled demo model on
# http://127.0.0.1:8080 (OpenAI-compatible; Ctrl-C stops it). Extra arguments go to `frigg serve`.
# The bundled model (demo/frigg-demo.gguf) is a 1.2M-parameter HRM-Text trained by
# scripts/train_demo.py on small Danish/English questions (docs/eval.md). For a real model:
# frigg convert /path/to/DFM-Mimir -o mimir-q8_0.gguf --type q8_0 && frigg serve mimir-q8_0.gguf
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/bootstrap.sh
cargo build --release --locked
exec ./target/release/frigg serve "$@"
