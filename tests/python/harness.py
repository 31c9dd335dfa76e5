"""The server under test: a real `frigg serve` process on loopback, the fixture models it
serves, and small helpers the server suites share."""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

openai = pytest.importorskip("openai")

ROOT = Path(__file__).resolve().parents[2]
FRIGG = os.environ.get("FRIGG_BIN", str(ROOT / "target" / "release" / "frigg"))
KEY = "test-key-123"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_TINY = None


def tiny_model() -> str:
    """The tiny random-weight fixture as a GGUF (the server's behaviour is under test, not a
    model's answers; the bundled demo model is trained and answers too predictably for that)."""
    global _TINY
    if _TINY is None:
        import tempfile

        out = Path(tempfile.mkdtemp(prefix="frigg-test-")) / "tiny-q8_0.gguf"
        subprocess.run([FRIGG, "convert", str(ROOT / "tests/fixtures/ckpt/tiny-packed"), "-o", str(out), "--type", "q8_0", "--quiet"], check=True)
        _TINY = str(out)
    return _TINY


_MEDIUM = None


def medium_model() -> str:
    """A random-weight HRM-Text with the tiny fixture's tokenizer but hidden 256, ffn 512 and
    2,048 positions (split layout, written with numpy): a long prompt takes seconds to prefill
    on one thread, long enough to disconnect in the middle of it."""
    global _MEDIUM
    if _MEDIUM is None:
        import shutil
        import tempfile

        import numpy as np
        from safetensors.numpy import save_file

        tiny = ROOT / "tests/fixtures/ckpt/tiny-packed"
        d = Path(tempfile.mkdtemp(prefix="frigg-medium-"))
        cfg = json.loads((tiny / "config.json").read_text())
        h, f, heads, hd, lps = 256, 512, 4, 64, 2
        cfg.update(hidden_size=h, intermediate_size=f, num_attention_heads=heads, num_key_value_heads=heads, head_dim=hd, num_hidden_layers=lps, max_position_embeddings=2048, initializer_range=h**-0.5, embedding_scale=h**0.5)
        (d / "config.json").write_text(json.dumps(cfg, indent=2))
        for name in ("chat_template.jinja", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(tiny / name, d / name)
        rng = np.random.default_rng(7)
        w = lambda *shape: (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)  # noqa: E731
        v = cfg["vocab_size"]
        t = {"model.embed_tokens.weight": w(v, h), "model.z_L_init": rng.standard_normal(h).astype(np.float32), "lm_head.weight": w(v, h)}
        for stack in ("L_module", "H_module"):
            for i in range(lps):
                p = f"model.{stack}.layers.{i}."
                for n in ("gate", "q", "k", "v"):
                    t[p + f"self_attn.{n}_proj.weight"] = w(heads * hd, h)
                t[p + "self_attn.o_proj.weight"] = w(h, heads * hd)
                t[p + "mlp.gate_proj.weight"] = w(f, h)
                t[p + "mlp.up_proj.weight"] = w(f, h)
                t[p + "mlp.down_proj.weight"] = w(h, f)
        save_file(t, str(d / "model.safetensors"))
        out = d / "medium-f32.gguf"
        subprocess.run([FRIGG, "convert", str(d), "-o", str(out), "--type", "f32", "--quiet"], check=True)
        _MEDIUM = str(out)
    return _MEDIUM


# FRIGG_TEST_DEVICE=gpu: every server the suite starts runs its engine on ggml's first GPU
# device (scripts/test-vulkan.sh: lavapipe), unless the test places replicas itself (--devices).
DEVICE_ARGS = ["--device", "gpu"] if os.environ.get("FRIGG_TEST_DEVICE") == "gpu" else []


class Server:
    def __init__(self, *args: str, model=None, ctx: int = 256):  # model None: the tiny fixture, False: no model (the bundled demo)
        self.port = free_port()
        device = [] if "--devices" in args else DEVICE_ARGS
        self.proc = subprocess.Popen(
            [FRIGG, "serve", *([] if model is False else [model or tiny_model()]), "--port", str(self.port), "--threads", "1", "--ctx", str(ctx), *device, *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.time() + 120
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"frigg serve exited: {self.proc.stderr.read()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError):
                pass
            time.sleep(0.2)
        raise RuntimeError("frigg serve did not become healthy")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def client(self, key: str = KEY) -> "openai.OpenAI":
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key=key, max_retries=0, timeout=120)

    def post(self, path: str, body: bytes, key: str = KEY):
        req = urllib.request.Request(f"{self.url}{path}", data=body, headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
        except urllib.error.HTTPError as e:
            return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=120)


MSG = [{"role": "user", "content": "Hvad er hovedstaden i Danmark?"}]


def metric(server, name: str) -> float:
    with urllib.request.urlopen(f"{server.url}/metrics") as r:
        for line in r.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise KeyError(name)
