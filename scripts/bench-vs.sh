#!/usr/bin/env bash
# frigg vs llama.cpp's own hrm_text, cell by cell, on the full Mimir shape (random weights:
# scripts/make_mimir_random.py models/mimir-random, then frigg convert to models/mimir-TYPE.gguf).
# Both in one process on the same file and threads, repetitions alternated frigg, llama.cpp;
# frigg on ggml's fast (batched GEMM) kernels, as llama.cpp, and on the server's batch-invariant
# ones. Writes docs/bench/vs-MACHINE-GROUP.json (MACHINE: the CPU's model name and widest vector
# extension, e.g. intel-xeon-processor-amx; MACHINE_TAG overrides it), so each CPU keeps its own
# files, and renders every vs-*.json there into docs/benchmarks.md (bench:vs), one table per CPU.
#   every group (q8_0; bf16; q4: q4_0 and q4_k): decode at batch 1 and 4 from 512 and 1024
#   filled cells, and prefill of 128 and of 512 prompt tokens.
# Then the same files' decode matmul by column count (`frigg bench matmul`, 1, 2, 4 and 8
# columns: how far batching can go on this CPU before the arithmetic binds), into
# docs/bench/matmul-MACHINE-GROUP.json, every such file rendered into bench:matmul-columns.
# Usage: scripts/bench-vs.sh [THREADS] [GROUP...]   (default: all three; an otherwise idle machine)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
threads="${1:-$(nproc)}"
shift || true
known=(q8_0 bf16 q4)
groups=("$@")
[ ${#groups[@]} -gt 0 ] || groups=("${known[@]}")
frigg=./target/release/frigg
cargo build --release --locked >/dev/null
. scripts/machine-tag.sh
common=(--batches 1,4 --contexts 512,1024 --kernels batched,invariant --threads "$threads" --steps 8 --reps 3 --prefill 128,512 --vs llama.cpp)
for g in "${groups[@]}"; do
    case "$g" in
        q8_0) $frigg bench matrix models/mimir-q8_0.gguf "${common[@]}" --json "docs/bench/vs-$MACHINE_TAG-q8_0.json" ;;
        bf16) $frigg bench matrix models/mimir-bf16.gguf "${common[@]}" --json "docs/bench/vs-$MACHINE_TAG-bf16.json" ;;
        q4) $frigg bench matrix models/mimir-q4_0.gguf models/mimir-q4_k.gguf "${common[@]}" --json "docs/bench/vs-$MACHINE_TAG-q4.json" ;;
        *) echo "unknown group $g (q8_0, bf16, q4)" >&2; exit 2 ;;
    esac
done
for g in "${groups[@]}"; do
    case "$g" in
        q4) files=(models/mimir-q4_0.gguf models/mimir-q4_k.gguf) ;;
        *) files=("models/mimir-$g.gguf") ;;
    esac
    $frigg bench matmul "${files[@]}" --threads "$threads" --rounds 9 --json "docs/bench/matmul-$MACHINE_TAG-$g.json"
done
# every CPU's files, the q8_0 ones first, then bf16, then q4 (the renderer makes one table per
# CPU, in the order it first meets them)
shopt -s nullglob
all=()
for g in "${known[@]}"; do
    all+=(docs/bench/vs-*-"$g".json)
done
$frigg bench render --matrix "${all[@]}" --markdown docs/benchmarks.md --key vs
all=()
for g in "${known[@]}"; do
    all+=(docs/bench/matmul-*-"$g".json)
done
$frigg bench render --matmul "${all[@]}" --markdown docs/benchmarks.md --key matmul-columns
