"""gguf-py (PyPI `gguf`, llama.cpp's own reader) reads every key and tensor frigg writes."""

import json
import os
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from safetensors.numpy import load_file

ROOT = Path(__file__).resolve().parents[2]
FRIGG = os.environ.get("FRIGG_BIN", str(ROOT / "target" / "release" / "frigg"))
FIXTURES = ROOT / "tests" / "fixtures" / "ckpt"


def convert(ckpt: str, out_type: str, out: Path) -> None:
    subprocess.run([FRIGG, "convert", str(FIXTURES / ckpt), "-o", str(out), "--type", out_type, "--quiet"], check=True)


def field_value(reader: GGUFReader, key: str):
    f = reader.fields[key]
    return f.contents()


@pytest.mark.parametrize("out_type", ["f32", "bf16", "q8_0", "q4_0", "q4_k"])
def test_gguf_py_reads_every_key_and_tensor(out_type):
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "m.gguf"
        convert("tiny-packed", out_type, out)
        r = GGUFReader(out)
        # every key decodes
        for key in r.fields:
            field_value(r, key)
        assert field_value(r, "general.architecture") == "hrm_text"
        assert field_value(r, "hrm_text.block_count") == 16
        assert field_value(r, "hrm_text.hrm.layers_per_stack") == 2
        assert field_value(r, "hrm_text.hrm.h_cycles") == 2
        assert field_value(r, "hrm_text.hrm.l_cycles") == 3
        assert field_value(r, "hrm_text.hrm.prefix_lm") is True
        assert len(field_value(r, "tokenizer.ggml.tokens")) == 1280
        tok = (FIXTURES / "tiny-packed" / "tokenizer.json").read_text()
        assert field_value(r, "tokenizer.huggingface.json") == tok
        names = {t.name for t in r.tensors}
        assert "token_embd.weight" in names and "output.weight" in names and "hrm.z_l_init" in names
        assert len(r.tensors) == 3 + 2 * 2 * 8
        for t in r.tensors:
            assert t.data.nbytes == t.n_bytes, t.name


def test_gguf_py_f32_data_equals_the_checkpoint():
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "m.gguf"
        convert("tiny-split", "f32", out)
        r = GGUFReader(out)
        src = {k.removeprefix("model."): v for k, v in load_file(FIXTURES / "tiny-split" / "model.safetensors").items()}
        by_name = {t.name: t for t in r.tensors}
        np.testing.assert_array_equal(np.asarray(by_name["token_embd.weight"].data), src["embed_tokens.weight"])
        np.testing.assert_array_equal(np.asarray(by_name["hrm.z_l_init"].data), src["z_L_init"])
        np.testing.assert_array_equal(np.asarray(by_name["blk.2.attn_q.weight"].data), src["H_module.layers.0.self_attn.q_proj.weight"])
        np.testing.assert_array_equal(np.asarray(by_name["blk.1.ffn_down.weight"].data), src["L_module.layers.1.mlp.down_proj.weight"])
        np.testing.assert_array_equal(np.asarray(by_name["output.weight"].data), src["lm_head.weight"])
