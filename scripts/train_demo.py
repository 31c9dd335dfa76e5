#!/usr/bin/env python3
"""Train frigg's demo model: a small HRM-Text (transformers' HrmTextForCausalLM, the Mimir
architecture: gated MHA, an L and an H stack, H_cycles x L_cycles) on Danish and English
question-answer pairs, with the PrefixLM objective Mimir was trained with: prompt tokens carry
token_type_ids = 1 (bidirectional), the loss counts response tokens only.

Data: generated here, deterministically, from tables written for this script (capitals,
opposites, small-number arithmetic, comparison, counting, successor) in both languages — no
third-party data, so no licence beyond this repository's. Rendered with frigg's own chat
template and the fixture tokenizer (tests/fixtures/tokenizer: Gemma-4 special ids, 1,280 tokens).

Writes:
  tests/fixtures/demo/heldout.jsonl   the held-out eval set (`frigg eval --task demo-qa`)
  tests/fixtures/demo/train.log       the training log (committed)
  tests/fixtures/demo/ckpt/           the checkpoint in Mimir's packed layout (committed; convert it
                                      with `frigg convert tests/fixtures/demo/ckpt -o demo/frigg-demo.gguf
                                      --type f32 --name frigg-demo`)

Usage: venv-ref/bin/python scripts/train_demo.py [--minutes 40] [--threads 1]
"""

import argparse
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import make_fixtures as fx  # noqa: E402  (shares the config/layout helpers)
import make_tokenizer as mt  # noqa: E402

SEED = 1234
SHAPE = dict(hidden=128, heads=4, head_dim=32, ffn=384, lps=2, H=2, L=3, max_pos=256)
DEMO_DIR = ROOT / "tests" / "fixtures" / "demo"
CKPT = DEMO_DIR / "ckpt"

# ---------------------------------------------------------------------------------------------
# Tables (written for this script).
CAPITALS = [  # (English country, Danish country, capital in English, capital in Danish)
    ("Denmark", "Danmark", "Copenhagen", "København"),
    ("Sweden", "Sverige", "Stockholm", "Stockholm"),
    ("Norway", "Norge", "Oslo", "Oslo"),
    ("Finland", "Finland", "Helsinki", "Helsinki"),
    ("Iceland", "Island", "Reykjavik", "Reykjavik"),
    ("Germany", "Tyskland", "Berlin", "Berlin"),
    ("France", "Frankrig", "Paris", "Paris"),
    ("Spain", "Spanien", "Madrid", "Madrid"),
    ("Italy", "Italien", "Rome", "Rom"),
    ("Portugal", "Portugal", "Lisbon", "Lissabon"),
    ("Poland", "Polen", "Warsaw", "Warszawa"),
    ("Austria", "Østrig", "Vienna", "Wien"),
    ("Greece", "Grækenland", "Athens", "Athen"),
    ("Netherlands", "Holland", "Amsterdam", "Amsterdam"),
    ("Belgium", "Belgien", "Brussels", "Bruxelles"),
    ("Ireland", "Irland", "Dublin", "Dublin"),
    ("England", "England", "London", "London"),
    ("Japan", "Japan", "Tokyo", "Tokyo"),
    ("China", "Kina", "Beijing", "Beijing"),
    ("Egypt", "Egypten", "Cairo", "Kairo"),
    ("Canada", "Canada", "Ottawa", "Ottawa"),
    ("Russia", "Rusland", "Moscow", "Moskva"),
    ("Estonia", "Estland", "Tallinn", "Tallinn"),
    ("Hungary", "Ungarn", "Budapest", "Budapest"),
]
OPPOSITES = [  # (English word, English opposite, Danish word, Danish opposite)
    ("hot", "cold", "varm", "kold"),
    ("big", "small", "stor", "lille"),
    ("up", "down", "op", "ned"),
    ("day", "night", "dag", "nat"),
    ("old", "young", "gammel", "ung"),
    ("fast", "slow", "hurtig", "langsom"),
    ("light", "dark", "lys", "mørk"),
    ("good", "bad", "god", "dårlig"),
    ("yes", "no", "ja", "nej"),
    ("open", "closed", "åben", "lukket"),
    ("high", "low", "høj", "lav"),
    ("full", "empty", "fuld", "tom"),
    ("long", "short", "lang", "kort"),
    ("rich", "poor", "rig", "fattig"),
    ("wet", "dry", "våd", "tør"),
    ("first", "last", "først", "sidst"),
]
NUMBER_MAX = 20


def examples():
    """All (category, language, question, answer) items; deterministic order."""
    out = []
    for en, da, cap_en, cap_da in CAPITALS:
        out.append(("capital", "en", f"What is the capital of {en}?", cap_en))
        out.append(("capital", "da", f"Hvad er hovedstaden i {da}?", cap_da))
    for en, en_op, da, da_op in OPPOSITES:
        out.append(("opposite", "en", f"What is the opposite of {en}?", en_op))
        out.append(("opposite", "en", f"What is the opposite of {en_op}?", en))
        out.append(("opposite", "da", f"Hvad er det modsatte af {da}?", da_op))
        out.append(("opposite", "da", f"Hvad er det modsatte af {da_op}?", da))
    for a in range(NUMBER_MAX + 1):
        for b in range(NUMBER_MAX + 1):
            out.append(("add", "en", f"What is {a} plus {b}?", str(a + b)))
            out.append(("add", "da", f"Hvad er {a} plus {b}?", str(a + b)))
            if a != b:
                out.append(("larger", "en", f"Which is larger, {a} or {b}?", str(max(a, b))))
                out.append(("larger", "da", f"Hvad er størst, {a} eller {b}?", str(max(a, b))))
    for a in range(1, NUMBER_MAX + 1):
        for n in range(2, 6):
            seq = " ".join(str(x) for x in range(a, a + n))
            out.append(("count", "en", f"Count from {a} to {a + n - 1}.", seq))
            out.append(("count", "da", f"Tæl fra {a} til {a + n - 1}.", seq))
    for a in range(0, 99):
        out.append(("next", "en", f"What number comes after {a}?", str(a + 1)))
        out.append(("next", "da", f"Hvilket tal kommer efter {a}?", str(a + 1)))
    return out


def split(items):
    """Held out: ~12% of the arithmetic, comparison, counting and successor questions (unseen
    number pairs — generalisation), and none of the facts (capitals and opposites cannot be
    inferred; they are memorised, and the eval reports them separately as recall from the
    training set)."""
    rng = random.Random(SEED)
    train, held = [], []
    for it in items:
        if it[0] in ("capital", "opposite"):
            train.append(it)
        elif rng.random() < 0.12:
            held.append(it)
        else:
            train.append(it)
    recall = [it for it in items if it[0] in ("capital", "opposite")]
    return train, held, recall


# ---------------------------------------------------------------------------------------------
def encode_all(items, tok, template):
    rows = []
    for cat, lang, q, a in items:
        case = {"messages": [{"role": "user", "content": q}], "tools": None, "add_generation_prompt": True}
        prompt = mt.render_template(template, case, "<bos>")
        p_ids = tok.encode(prompt, add_special_tokens=False).ids
        r_ids = tok.encode(a, add_special_tokens=False).ids + [fx.TURN_END]
        rows.append((p_ids, r_ids))
    return rows


def batchify(rows, device="cpu"):
    n = max(len(p) + len(r) for p, r in rows)
    ids = torch.full((len(rows), n), fx.PAD, dtype=torch.long)
    tt = torch.zeros((len(rows), n), dtype=torch.long)
    labels = torch.full((len(rows), n), -100, dtype=torch.long)
    attn = torch.zeros((len(rows), n), dtype=torch.long)
    for i, (p, r) in enumerate(rows):
        seq = p + r
        ids[i, : len(seq)] = torch.tensor(seq)
        tt[i, : len(p)] = 1
        labels[i, len(p) : len(seq)] = torch.tensor(r)
        attn[i, : len(seq)] = 1
    return ids, tt, labels, attn


@torch.no_grad()
def greedy_answer(model, p_ids, max_new=12):
    inp = torch.tensor([p_ids])
    out = model(input_ids=inp, token_type_ids=torch.ones_like(inp), use_cache=True)
    pkv, row, got = out.past_key_values, out.logits[0, -1], []
    for _ in range(max_new):
        t = int(row.argmax())
        if t == fx.TURN_END:
            break
        got.append(t)
        o = model(input_ids=torch.tensor([[t]]), past_key_values=pkv, use_cache=True)
        pkv, row = o.past_key_values, o.logits[0, -1]
    return got


def accuracy(model, rows, tok, items):
    model.eval()
    ok = 0
    for (p, _), it in zip(rows, items):
        ok += tok.decode(greedy_answer(model, p), skip_special_tokens=False).strip() == it[3]
    model.train()
    return ok / max(1, len(rows))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=40.0, help="wall-clock training budget")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--lr", type=float, default=3e-3)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(SEED)
    from tokenizers import Tokenizer
    from transformers import HrmTextConfig, HrmTextForCausalLM

    tok = Tokenizer.from_file(str(fx.TOK_DIR / "tokenizer.json"))
    template = (fx.TOK_DIR / "chat_template.jinja").read_text(encoding="utf-8")
    vocab = fx.vocab_size()
    items = examples()
    train, held, recall = split(items)
    DEMO_DIR.mkdir(parents=True, exist_ok=True)
    with open(DEMO_DIR / "heldout.jsonl", "w", encoding="utf-8") as f:
        for split_name, rows in (("heldout", held), ("recall", recall)):
            for cat, lang, q, a in rows:
                f.write(json.dumps({"split": split_name, "category": cat, "lang": lang, "question": q, "answer": a}, ensure_ascii=False) + "\n")
    tr_rows = encode_all(train, tok, template)
    held_rows = encode_all(held, tok, template)
    rec_rows = encode_all(recall, tok, template)

    cfg_d = fx.mimir_config(SHAPE, vocab)
    # Full backpropagation through every L cycle (the demo is small enough); recorded in config.
    cfg_d["L_bp_cycles"] = [SHAPE["L"]] * SHAPE["H"]
    drop = ("model_type", "architectures", "num_key_value_heads", "rope_theta")
    cfg = HrmTextConfig(**{k: v for k, v in cfg_d.items() if k not in drop})
    model = HrmTextForCausalLM(cfg)
    with torch.no_grad():  # the fixtures' init: N(0, 1/fan_in), embeddings N(0, 1/hidden)
        params = dict(model.named_parameters())
        for name, t in fx.make_weights(SHAPE, vocab, SEED).items():
            params[name].copy_(t)
    n_params = sum(p.numel() for p in model.parameters())

    log = open(DEMO_DIR / "train.log", "w", encoding="utf-8")

    def say(msg):
        print(msg, flush=True)
        log.write(msg + "\n")
        log.flush()

    say(f"frigg demo model: HrmTextForCausalLM {SHAPE}, vocab {vocab}, {n_params} parameters, seed {SEED}")
    say(f"torch {torch.__version__}, threads {args.threads}, batch {args.batch}, AdamW lr {args.lr} (warmup 100, cosine), budget {args.minutes} min")
    say(f"data: {len(train)} train, {len(held)} held out, {len(recall)} recall (facts, also trained)")
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.98))
    rng = random.Random(SEED)
    # Estimate steps from the first 20 steps' speed, then fix the schedule.
    budget = args.minutes * 60
    t0 = time.time()
    step, total_steps, order = 0, None, []
    model.train()
    while True:
        if total_steps is not None and step >= total_steps:
            break
        if len(order) < args.batch:
            order = list(range(len(tr_rows)))
            rng.shuffle(order)
        idx, order = order[: args.batch], order[args.batch :]
        ids, tt, labels, attn = batchify([tr_rows[i] for i in idx])
        if step == 20 and total_steps is None:
            per = (time.time() - t0) / 20
            total_steps = int(budget / per)
            say(f"{per:.3f} s/step -> {total_steps} steps")
        ts = total_steps or 10**9
        lr = args.lr * min(1.0, (step + 1) / 100) * (0.5 * (1 + math.cos(math.pi * min(1.0, step / ts))) * 0.95 + 0.05)
        for g in opt.param_groups:
            g["lr"] = lr
        out = model(input_ids=ids, token_type_ids=tt, attention_mask=attn, labels=labels, use_cache=False)
        opt.zero_grad()
        out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 100 == 0:
            say(f"step {step} loss {out.loss.item():.4f} lr {lr:.2e} elapsed {time.time() - t0:.0f}s")
        step += 1
    say(f"trained {step} steps in {time.time() - t0:.0f}s, final loss {out.loss.item():.4f}")
    say(f"greedy exact match (transformers, PrefixLM prompt): held out {accuracy(model, held_rows, tok, held):.3f}, recall {accuracy(model, rec_rows, tok, recall):.3f}")

    if CKPT.exists():
        shutil.rmtree(CKPT)
    CKPT.mkdir(parents=True)
    sd = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    sd["model.z_L_init"] = model.model.z_L_init.detach().contiguous()
    sd = dict(sorted(fx.to_packed(sd).items()))
    save_file(sd, CKPT / "model.safetensors", metadata={"format": "pt"})
    (CKPT / "config.json").write_text(json.dumps(cfg_d, indent=2) + "\n")
    gen = {"bos_token_id": fx.BOS, "eos_token_id": [fx.EOS, fx.TURN_END], "pad_token_id": fx.PAD}
    (CKPT / "generation_config.json").write_text(json.dumps(gen, indent=2) + "\n")
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(fx.TOK_DIR / f, CKPT / f)
    say(f"wrote {CKPT}")


if __name__ == "__main__":
    main()
