#!/usr/bin/env bash
# The README's first command: build frigg, convert the bundled tiny HRM-Text checkpoint to GGUF,
# inspect it and generate from it. (The server and a trained demo model come with later work;
# the bundled checkpoint has random weights, so its text is noise — the point is the pipeline.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
scripts/bootstrap.sh
cargo build --release --locked
mkdir -p models
./target/release/frigg convert tests/fixtures/ckpt/tiny-packed -o models/tiny-q8_0.gguf --type q8_0
./target/release/frigg inspect models/tiny-q8_0.gguf | head -8
./target/release/frigg run models/tiny-q8_0.gguf -p "Hvad er hovedstaden i Danmark?" --max-tokens 24
echo "To use a real checkpoint: ./target/release/frigg convert /path/to/DFM-Mimir -o mimir-q8_0.gguf --type q8_0"
