#!/usr/bin/env bash
# The README's first command: build frigg and serve the bundled demo model on
# http://127.0.0.1:8080 (OpenAI-compatible; Ctrl-C stops it). Extra arguments go to `frigg serve`.
# The bundled model is a tiny HRM-Text with random weights: its replies are noise — the point is
# the pipeline. For a real model: frigg convert /path/to/DFM-Mimir -o mimir-q8_0.gguf --type q8_0
# and then frigg serve mimir-q8_0.gguf.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/bootstrap.sh
cargo build --release --locked
exec ./target/release/frigg serve "$@"
