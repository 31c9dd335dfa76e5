#!/usr/bin/env bash
# The test command (README): installs what is missing, builds, runs every test.
#   Rust: cargo test --release (converter, engine parity, llama.cpp interop, tokenizer, sampler)
#   Python: tests/python with gguf-py and the openai SDK (a small venv; the torch/transformers
#   oracle is not needed: goldens are committed).
#   Fuzzing: a 60-second libFuzzer smoke per target (scripts/fuzz.sh; FRIGG_FUZZ=0 skips it).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

scripts/bootstrap.sh

venv="${FRIGG_TEST_VENV:-$root/venv-test}"
if [ ! -x "$venv/bin/python" ]; then
    python3 -m venv "$venv"
fi
if ! "$venv/bin/python" -c "import gguf, numpy, safetensors, pytest, openai" 2>/dev/null; then
    "$venv/bin/python" -m pip install -q -r scripts/requirements-test.txt
fi

# The real Gemma-4 vocabulary for the tokenizer tests (licence forbids committing it); the
# tests that need it skip when it cannot be fetched.
if [ ! -f models/gemma4-tokenizer/tokenizer.json ]; then
    scripts/fetch_gemma_tokenizer.sh || echo "test: Gemma-4 tokenizer unavailable; its tests will skip"
fi

cargo build --release --locked
cargo test --release --locked
FRIGG_BIN="$root/target/release/frigg" "$venv/bin/python" -m pytest -q tests/python

# Security advisories: cargo audit reads the RustSec advisory database from GitHub. Where that
# is reachable, cargo-audit is installed and any advisory fails the run; where it is not (this
# project's machines reach only the package registries), the run says so.
if timeout 20 git ls-remote https://github.com/rustsec/advisory-db HEAD >/dev/null 2>&1; then
    cargo audit --version >/dev/null 2>&1 || cargo install cargo-audit --locked
    cargo audit
else
    echo "test: cargo audit not run: the RustSec advisory database (github.com) is unreachable from here"
fi

# Fuzzing smoke: 60 s per cargo-fuzz target (installs a nightly toolchain and cargo-fuzz when
# missing). FRIGG_FUZZ=0 skips it (a quick local run); CI runs it.
if [ "${FRIGG_FUZZ:-1}" != 0 ]; then
    scripts/fuzz.sh 60
fi
