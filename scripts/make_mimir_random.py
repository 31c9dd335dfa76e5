#!/usr/bin/env python3
"""Write a full-size, Mimir-shaped HRM-Text checkpoint with random weights.

For load/convert/memory/speed tests at the real shape (DFM-Mimir: hidden 1536, 12 heads x 128,
ffn 4096, 16 layers per stack, H_cycles 2, L_cycles 3, vocab 262,144, 4096 positions,
embedding_scale sqrt(1536), packed layout, bf16; 1,786,775,040 parameters, 131 tensors).
The weights are random (same init rules as scripts/make_fixtures.py), so outputs are
meaningless: never use this for quality checks.

Memory-bounded: tensors are generated in chunks and streamed into safetensors shards of at
most --max-shard-bytes (default 1 GB) with a model.safetensors.index.json; the safetensors
headers are written by hand, so the whole model is never in memory.

Also writes config.json (Mimir's converter form), generation_config.json and a tokenizer:
models/gemma4-tokenizer/ (scripts/fetch_gemma_tokenizer.sh) if present, else the small
fixture tokenizer with a warning.

Usage:
  python scripts/make_mimir_random.py OUTDIR            # full size, ~3.6 GB
  python scripts/make_mimir_random.py OUTDIR --scale 16 # hidden, head_dim, ffn, vocab / 16
"""

import argparse
import json
import math
import os
import shutil
import struct
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")

try:
    import torch  # noqa: E402

    torch.set_num_threads(1)
except ImportError:
    # numpy alone (the device machine has no torch): the same shapes and scales, other values.
    torch = None
    import numpy as np  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from hrm_config import BOS, EOS, PAD, TURN_END, mimir_config  # noqa: E402

MIMIR = dict(hidden=1536, heads=12, head_dim=128, ffn=4096, lps=16, H=2, L=3, max_pos=4096, vocab=262144)
MIMIR_PARAMS = 1_786_775_040
SEED = 20240612
CHUNK = 1 << 23  # elements generated at a time


def shape_for(scale: int) -> dict:
    s = dict(MIMIR)
    if scale != 1:
        for k in ("hidden", "head_dim", "ffn", "vocab"):
            assert s[k] % scale == 0, f"--scale {scale} does not divide {k}={s[k]}"
            s[k] //= scale
    assert s["heads"] * s["head_dim"] == s["hidden"]
    return s


def tensor_plan(s: dict):
    """(name, shape, std) in file order; packed layout: gqkv = [gate; q; k; v], gate_up = [gate; up]."""
    h, f, v = s["hidden"], s["ffn"], s["vocab"]
    qd = s["heads"] * s["head_dim"]
    plan = [("model.embed_tokens.weight", (v, h), 1 / math.sqrt(h)), ("model.z_L_init", (h,), 1.0)]
    for stack in ("L_module", "H_module"):
        for i in range(s["lps"]):
            p = f"model.{stack}.layers.{i}."
            plan += [
                (p + "attn.gqkv_proj.weight", (4 * qd, h), 1 / math.sqrt(h)),
                (p + "attn.o_proj.weight", (h, qd), 1 / math.sqrt(qd)),
                (p + "mlp.gate_up_proj.weight", (2 * f, h), 1 / math.sqrt(h)),
                (p + "mlp.down_proj.weight", (h, f), 1 / math.sqrt(f)),
            ]
    plan.append(("lm_head.weight", (v, h), 1 / math.sqrt(h)))
    return plan


def numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def bf16_normal(n: int, std: float, gen) -> bytes:
    """n normal values of standard deviation std as little-endian bf16 (round to nearest even)."""
    if torch is not None:
        return (torch.randn(n, generator=gen) * std).to(torch.bfloat16).view(torch.int16).numpy().tobytes()
    u = (gen.standard_normal(n, dtype=np.float32) * np.float32(std)).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype("<u2").tobytes()


def write_shard(path: Path, entries, gen) -> None:
    """entries: [(name, shape, std)], bf16. Writes a safetensors file, streaming the data."""
    header, off = {}, 0
    for name, shape, _ in entries:
        nbytes = numel(shape) * 2
        header[name] = {"dtype": "BF16", "shape": list(shape), "data_offsets": [off, off + nbytes]}
        off += nbytes
    header["__metadata__"] = {"format": "pt"}
    hjson = json.dumps(header, separators=(",", ":")).encode()
    hjson += b" " * (-len(hjson) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(hjson)))
        fh.write(hjson)
        for name, shape, std in entries:
            left = numel(shape)
            while left:
                n = min(CHUNK, left)
                fh.write(bf16_normal(n, std, gen))
                left -= n
        assert fh.tell() == 8 + len(hjson) + off


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outdir")
    ap.add_argument("--scale", type=int, default=1, help="divide hidden, head_dim, ffn and vocab by this")
    ap.add_argument("--max-shard-bytes", type=int, default=1_000_000_000)
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()

    s = shape_for(args.scale)
    plan = tensor_plan(s)
    n_params = sum(numel(shape) for _, shape, _ in plan)
    if args.scale == 1:
        assert n_params == MIMIR_PARAMS, n_params
        assert len(plan) == 131, len(plan)
    print(f"shape {s}: {len(plan)} tensors, {n_params:,} params, {2 * n_params / 1e9:.2f} GB bf16", file=sys.stderr)

    shards, cur, cur_bytes = [], [], 0
    for e in plan:
        b = numel(e[1]) * 2
        assert b <= args.max_shard_bytes, f"{e[0]} alone ({b} B) exceeds --max-shard-bytes"
        if cur and cur_bytes + b > args.max_shard_bytes:
            shards.append(cur)
            cur, cur_bytes = [], 0
        cur.append(e)
        cur_bytes += b
    shards.append(cur)

    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    gen = torch.Generator().manual_seed(args.seed) if torch is not None else np.random.default_rng(args.seed)
    weight_map = {}
    t0 = time.time()
    for i, entries in enumerate(shards, 1):
        fn = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        write_shard(out / fn, entries, gen)
        for name, _, _ in entries:
            weight_map[name] = fn
        print(f"  {fn}: {len(entries)} tensors ({time.time() - t0:.0f}s)", file=sys.stderr)
    index = {"metadata": {"total_size": 2 * n_params}, "weight_map": dict(sorted(weight_map.items()))}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=2) + "\n")

    cfg = mimir_config(s, s["vocab"])
    (out / "config.json").write_text(json.dumps(cfg, indent=2) + "\n")
    gen_cfg = {"bos_token_id": BOS, "eos_token_id": [EOS, TURN_END], "pad_token_id": PAD}
    (out / "generation_config.json").write_text(json.dumps(gen_cfg, indent=2) + "\n")

    tok_src = ROOT / "models" / "gemma4-tokenizer"
    if not (tok_src / "tokenizer.json").is_file():
        print(
            f"WARNING: {tok_src} missing (run scripts/fetch_gemma_tokenizer.sh); "
            "using the small fixture tokenizer, whose vocabulary does not match this model",
            file=sys.stderr,
        )
        tok_src = ROOT / "tests" / "fixtures" / "tokenizer"
    elif args.scale != 1:
        print(f"WARNING: --scale {args.scale}: vocab {s['vocab']} is smaller than the tokenizer's", file=sys.stderr)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        if (tok_src / f).is_file():
            shutil.copy(tok_src / f, out / f)
    print(f"wrote {out} in {time.time() - t0:.0f}s", file=sys.stderr)


if __name__ == "__main__":
    main()
