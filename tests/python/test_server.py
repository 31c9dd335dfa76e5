"""`frigg serve` against the official openai SDK: a real server process on loopback."""

import json
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import pytest
from harness import FRIGG, KEY, MSG, ROOT, Server, free_port, medium_model, metric, openai, tiny_model


@pytest.fixture(scope="module")
def server():
    s = Server("--api-key", KEY, "--slots", "4", "--queue", "16", "--max-body", "65536")
    yield s
    assert s.stop() == 0


def test_models_and_health(server):
    models = server.client().models.list()
    assert len(models.data) == 1
    assert models.data[0].id


def test_chat_non_streamed_and_streamed_agree(server):
    c = server.client()
    r = c.chat.completions.create(model="x", messages=MSG, max_tokens=20, temperature=0.9, seed=42)
    text = r.choices[0].message.content
    assert r.choices[0].finish_reason in ("stop", "length")
    assert r.usage.prompt_tokens > 0 and r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens
    chunks = list(c.chat.completions.create(model="x", messages=MSG, max_tokens=20, temperature=0.9, seed=42, stream=True))
    streamed = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert streamed == text
    assert any(ch.choices and ch.choices[0].finish_reason for ch in chunks)


def test_seed_reproducibility_and_n(server):
    c = server.client()
    a = c.chat.completions.create(model="x", messages=MSG, max_tokens=12, temperature=1.0, seed=7, n=3)
    b = c.chat.completions.create(model="x", messages=MSG, max_tokens=12, temperature=1.0, seed=7, n=3)
    assert [ch.index for ch in a.choices] == [0, 1, 2]
    assert [ch.message.content for ch in a.choices] == [ch.message.content for ch in b.choices]
    assert len({ch.message.content for ch in a.choices}) > 1, "choices should differ"
    # n streamed: every index appears and finishes
    chunks = list(c.chat.completions.create(model="x", messages=MSG, max_tokens=8, temperature=1.0, seed=7, n=3, stream=True))
    done = {ch.choices[0].index for ch in chunks if ch.choices and ch.choices[0].finish_reason}
    assert done == {0, 1, 2}


def test_completions_streamed_and_not(server):
    c = server.client()
    r = c.completions.create(model="x", prompt="Der var engang", max_tokens=16, temperature=0)
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(model="x", prompt="Der var engang", max_tokens=16, temperature=0, stream=True) if ch.choices)
    assert streamed == r.choices[0].text


def test_stop_strings_that_straddle_tokens_never_leak(server):
    c = server.client()
    full = c.completions.create(model="x", prompt="Der var engang", max_tokens=40, temperature=0).choices[0].text
    if len(full) < 12:
        pytest.skip("greedy text too short to pick a stop string")
    stop = full[5:10]
    want = full[: full.index(stop)]
    r = c.completions.create(model="x", prompt="Der var engang", max_tokens=40, temperature=0, stop=[stop])
    assert r.choices[0].text == want
    assert r.choices[0].finish_reason == "stop"
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(model="x", prompt="Der var engang", max_tokens=40, temperature=0, stop=[stop], stream=True) if ch.choices)
    assert streamed == want


def test_logprobs_in_openai_shape(server):
    c = server.client()
    r = c.chat.completions.create(model="x", messages=MSG, max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    for t in content:
        assert t.logprob <= 0 and isinstance(t.bytes, list)
        assert len(t.top_logprobs) == 3
        # greedy picks the most likely token
        assert abs(t.top_logprobs[0].logprob - t.logprob) < 1e-5


def test_include_usage_in_the_stream(server):
    chunks = list(server.client().chat.completions.create(model="x", messages=MSG, max_tokens=5, stream=True, stream_options={"include_usage": True}))
    last = chunks[-1]
    assert last.usage is not None and last.usage.completion_tokens >= 1
    assert last.choices == []


def test_errors_in_openai_shape(server):
    c = server.client()
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=MSG, extra_body={"mirostat": 2})
    assert "mirostat" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:  # a schema keyword llguidance does not enforce
        c.chat.completions.create(model="x", messages=MSG, response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": {"not": {"type": "string"}}}})
    assert "not" in str(e.value) and "response_format" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=MSG, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}})
    assert "nope" in str(e.value)
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=MSG, max_tokens=100000)
    msg = str(e.value)
    assert "context length is 256" in msg and "100000" in msg
    with pytest.raises(openai.AuthenticationError):
        server.client(key="wrong").chat.completions.create(model="x", messages=MSG, max_tokens=2)
    status, _, body = server.post("/v1/chat/completions", b"{not json")
    assert status == 400 and json.loads(body)["error"]["type"] == "invalid_request_error"
    big = json.dumps({"model": "x", "messages": [{"role": "user", "content": "a" * 100_000}]}).encode()
    status, _, _ = server.post("/v1/chat/completions", big)
    assert status == 413


def test_no_error_reveals_a_server_path(server):
    """Error bodies name the problem, never where the server's files are."""
    model_dir = str(Path(tiny_model()).parent)
    bodies = []
    for path, body in [
        ("/v1/chat/completions", b"{not json"),
        ("/v1/chat/completions", json.dumps({"model": "x", "messages": MSG, "max_tokens": 100000}).encode()),
        ("/v1/chat/completions", json.dumps({"model": "x", "messages": [{"role": "wizard", "content": "x"}]}).encode()),
        ("/v1/chat/completions", json.dumps({"model": "x", "messages": MSG, "logit_bias": {"99999999": 1}}).encode()),
        ("/v1/completions", json.dumps({"model": "x", "prompt": 5}).encode()),
        ("/detokenize", json.dumps({"tokens": [99999999]}).encode()),
        ("/tokenize", b"[]"),
        ("/v1/nothing-here", b"{}"),
    ]:
        status, _, payload = server.post(path, body)
        assert status >= 400, (path, body, status)
        bodies.append(payload.decode(errors="replace"))
    for b in bodies:
        for secret in (model_dir, str(ROOT), "/tmp/", "/root", ".gguf", "src/"):
            assert secret not in b, (secret, b)


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city"]},
        },
    },
    {"type": "function", "function": {"name": "add", "description": "Adds two numbers", "parameters": {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}},
]


def test_tools_round_trip(server):
    """A forced call comes back as OpenAI tool_calls (arguments parse as a JSON object), the
    streamed form carries id and name once then argument fragments that add up to the same
    call, and the call plus the tool's answer render back into a prompt the model continues."""
    c = server.client()
    ask = [{"role": "user", "content": "Hvordan er vejret i Aarhus?"}]
    named = {"type": "function", "function": {"name": "get_weather"}}
    r = c.chat.completions.create(model="x", messages=ask, tools=TOOLS, tool_choice=named, max_tokens=48, temperature=1.0, seed=3)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls", ch
    assert len(ch.message.tool_calls) >= 1
    call = ch.message.tool_calls[0]
    assert call.type == "function" and call.function.name == "get_weather" and call.id
    args = json.loads(call.function.arguments)
    assert isinstance(args, dict)

    chunks = list(c.chat.completions.create(model="x", messages=ask, tools=TOOLS, tool_choice=named, max_tokens=48, temperature=1.0, seed=3, stream=True))
    deltas = [tc for chk in chunks if chk.choices for tc in (chk.choices[0].delta.tool_calls or [])]
    assert deltas[0].id and deltas[0].function.name == "get_weather"
    assert all(d.id is None and d.function.name is None for d in deltas[1:] if d.index == 0)
    streamed_args = "".join(d.function.arguments or "" for d in deltas if d.index == 0)
    assert json.loads(streamed_args) == args
    assert [chk.choices[0].finish_reason for chk in chunks if chk.choices and chk.choices[0].finish_reason] == ["tool_calls"]

    # tool_choice "required" with sampling: always a well-formed call to a declared tool
    for seed in range(4):
        r = c.chat.completions.create(model="x", messages=ask, tools=TOOLS, tool_choice="required", max_tokens=24, temperature=1.0, seed=seed)
        tc = r.choices[0].message.tool_calls
        assert tc and tc[0].function.name in ("get_weather", "add")
        assert isinstance(json.loads(tc[0].function.arguments), dict)

    history = ask + [
        # the fixture model's arguments are noise; a short one keeps the prompt within 256 tokens
        {"role": "assistant", "content": None, "tool_calls": [{"id": call.id, "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Aarhus"}'}}]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sol, 21 grader"},
    ]
    r = c.chat.completions.create(model="x", messages=history, tools=TOOLS[:1], max_tokens=8, temperature=0)
    assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    assert r.usage.prompt_tokens > 0
    bad = history[:-1] + [{"role": "tool", "tool_call_id": "call_unknown", "content": "x"}]
    with pytest.raises(openai.BadRequestError) as e:
        c.chat.completions.create(model="x", messages=bad, tools=TOOLS, max_tokens=4)
    assert "call_unknown" in str(e.value)
    bad = ask + [{"role": "assistant", "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{not json"}}]}]
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="x", messages=bad, tools=TOOLS, max_tokens=4)


def test_json_object_output_parses(server):
    """response_format json_object is enforced by constrained decoding: a reply that ends with
    `stop` is one JSON object that parses; one that runs out of max_tokens ends with `length`
    and exactly that many tokens (the partial text, as OpenAI's do)."""
    c = server.client()
    ask = [{"role": "user", "content": "Giv mig et JSON-objekt med en by og et tal."}]
    reasons = set()
    for seed, max_tokens in [(1, 120), (2, 120), (3, 120), (4, 3)]:
        r = c.chat.completions.create(model="x", messages=ask, response_format={"type": "json_object"}, max_tokens=max_tokens, temperature=1.0, seed=seed)
        ch = r.choices[0]
        text = ch.message.content
        reasons.add(ch.finish_reason)
        if ch.finish_reason == "stop":
            assert isinstance(json.loads(text), dict), text
        else:
            assert ch.finish_reason == "length" and r.usage.completion_tokens == max_tokens, ch
            assert text.startswith("{"), text
        streamed = "".join(ch.choices[0].delta.content or "" for ch in c.chat.completions.create(model="x", messages=ask, response_format={"type": "json_object"}, max_tokens=max_tokens, temperature=1.0, seed=seed, stream=True) if ch.choices)
        assert streamed == text
    assert "stop" in reasons, "some reply completes within 120 tokens"


def test_tokenize_roundtrip(server):
    status, _, body = server.post("/tokenize", json.dumps({"content": "Hej verden"}).encode())
    assert status == 200
    ids = json.loads(body)["tokens"]
    status, _, body = server.post("/detokenize", json.dumps({"tokens": ids}).encode())
    assert json.loads(body)["content"] == "Hej verden"


def test_full_queue_answers_429_with_retry_after():
    s = Server("--slots", "1", "--queue", "0")
    try:
        body = json.dumps({"model": "x", "messages": MSG, "max_tokens": 200, "ignore_eos": True}).encode()
        results = []

        def fire():
            results.append(s.post("/v1/chat/completions", body, key="none"))

        threads = [threading.Thread(target=fire) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        statuses = [r[0] for r in results]
        assert 200 in statuses and 429 in statuses, statuses
        for status, headers, payload in results:
            if status == 429:
                assert headers.get("retry-after") == "1"
                assert json.loads(payload)["error"]["type"] == "rate_limit_error"
    finally:
        assert s.stop() == 0


def test_disconnect_cancels_the_request_and_frees_the_slot():
    s = Server("--slots", "1", "--queue", "4")
    try:
        c = s.client(key="none")
        before = metric(s, "frigg_generated_tokens_total")
        stream = c.chat.completions.create(model="x", messages=MSG, max_tokens=200, stream=True, extra_body={"ignore_eos": True})
        next(iter(stream))
        stream.close()
        deadline = time.time() + 30
        while metric(s, "frigg_busy_slots") != 0 and time.time() < deadline:
            time.sleep(0.05)
        assert metric(s, "frigg_busy_slots") == 0
        # Cancelled, not run to completion: far fewer than the 200 tokens asked for.
        generated = metric(s, "frigg_generated_tokens_total") - before
        assert generated < 200, generated
        r = c.chat.completions.create(model="x", messages=MSG, max_tokens=4)
        assert r.choices[0].message.content is not None
    finally:
        assert s.stop() == 0


def test_sigterm_drains_in_flight_streams():
    """SIGTERM with 8 streams in flight: every stream runs to its end with its final events,
    and the server exits 0."""
    s = Server("--slots", "8", "--queue", "8")
    got = {}
    started = [threading.Event() for _ in range(8)]

    def consume(i):
        text = []
        stream = s.client(key="none").chat.completions.create(model="x", messages=MSG, max_tokens=150, temperature=0, stream=True, extra_body={"ignore_eos": True})
        for ch in stream:
            started[i].set()
            if ch.choices:
                text.append(ch.choices[0].delta.content or "")
                if ch.choices[0].finish_reason:
                    got[i] = ch.choices[0].finish_reason
        got[(i, "text")] = "".join(text)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    assert all(e.wait(timeout=60) for e in started)
    s.proc.send_signal(signal.SIGTERM)  # while all 8 streams are in flight
    for t in threads:
        t.join(timeout=120)
    assert s.proc.wait(timeout=120) == 0
    # drained: every stream ran to its full length instead of being cut
    assert [got.get(i) for i in range(8)] == ["length"] * 8, got


def test_non_loopback_bind_without_a_key_is_refused():
    p = subprocess.run([FRIGG, "serve", "--host", "0.0.0.0", "--port", str(free_port())], capture_output=True, text=True, timeout=60)
    assert p.returncode == 2
    assert "api-key" in p.stderr


def test_replicas_behind_one_endpoint_share_the_load():
    """--devices cpu,cpu: two engine replicas behind one HTTP front; concurrent requests are
    routed to the least-loaded one, so both serve."""
    s = Server("--devices", "cpu,cpu", "--slots", "1", "--queue", "8")
    try:
        c = s.client()
        results = []

        def ask(i):
            r = c.chat.completions.create(model="x", messages=MSG, max_tokens=24, temperature=1.0, seed=i, extra_body={"ignore_eos": True})
            results.append(r.usage.completion_tokens)

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [24] * 6
        with urllib.request.urlopen(f"{s.url}/metrics", timeout=10) as r:
            metrics = r.read().decode()
        routed = [float(l.split()[-1]) for l in metrics.splitlines() if l.startswith("frigg_replica_requests_total{")]
        assert len(routed) == 2 and all(n >= 1 for n in routed) and sum(routed) == 6, metrics
        assert "frigg_replicas 2" in metrics
        # Where the engines' time went: each request prefilled once; its first token comes from
        # the prefill's logits and its last ends it, so 24 tokens take 23 decode rows.
        rows = metric(s, "frigg_decode_rows_total")
        assert rows == 6 * 23, metrics
        assert 1 <= metric(s, "frigg_decode_steps_total") <= rows, metrics
        assert metric(s, "frigg_prefill_seconds_total") > 0 and metric(s, "frigg_decode_seconds_total") > 0, metrics
    finally:
        assert s.stop() == 0


def test_bundled_demo_model_answers():
    """`frigg serve` with no model serves the trained demo model, which knows its questions."""
    s = Server(model=False)
    try:
        c = s.client()
        for q, a in [("Hvad er hovedstaden i Frankrig?", "Paris"), ("What is the opposite of hot?", "cold")]:
            r = c.chat.completions.create(model="demo", messages=[{"role": "user", "content": q}], temperature=0, max_tokens=8)
            assert r.choices[0].message.content.strip() == a and r.choices[0].finish_reason == "stop", r
    finally:
        assert s.stop() == 0


def test_n_choices_wait_for_enough_free_slots():
    """A request for n choices waits until n streams are free instead of failing when fewer
    are (found by the soak: `n = 2` failed whenever one of two slots was busy)."""
    s = Server("--slots", "2", "--queue", "4")
    try:
        c = s.client(key="none")
        started = threading.Event()
        got = {}

        def long_stream():
            stream = c.chat.completions.create(model="x", messages=MSG, max_tokens=120, stream=True, extra_body={"ignore_eos": True})
            for ch in stream:
                started.set()
                if ch.choices and ch.choices[0].finish_reason:
                    got["long"] = ch.choices[0].finish_reason

        t = threading.Thread(target=long_stream)
        t.start()
        assert started.wait(timeout=60)
        r = c.chat.completions.create(model="x", messages=MSG, max_tokens=4, n=2, temperature=1.0, seed=3)
        assert [ch.index for ch in r.choices] == [0, 1]
        assert all(ch.finish_reason in ("stop", "length") for ch in r.choices)
        t.join(timeout=120)
        assert got.get("long") == "length"
    finally:
        assert s.stop() == 0


def test_disconnect_mid_prefill_stops_the_prefill_and_frees_the_slot():
    """A client that leaves while its prompt is being prefilled stops the prefill (ggml is
    asked between graph nodes) instead of holding the slot until the prefill ends; the next
    request is unaffected."""
    import http.client

    s = Server("--slots", "1", "--queue", "4", model=medium_model(), ctx=2048)
    try:
        c = s.client(key="none")
        long_msg = [{"role": "user", "content": " ".join(["hej verden og alle de andre ord"] * 90)}]
        t0 = time.time()
        r = c.chat.completions.create(model="x", messages=long_msg, max_tokens=3, temperature=0)
        full = time.time() - t0  # prefill of the whole prompt, plus a little
        assert r.usage.prompt_tokens > 1000, r.usage
        # A long prefill sends SSE keep-alive comments; the SDK skips them and the text is the same.
        chunks = list(c.chat.completions.create(model="x", messages=long_msg, max_tokens=3, temperature=0, stream=True))
        assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == r.choices[0].message.content
        prompt_before = metric(s, "frigg_prompt_tokens_total")
        generated_before = metric(s, "frigg_generated_tokens_total")

        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=60)
        body = json.dumps({"model": "x", "messages": long_msg, "max_tokens": 50, "stream": True})
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        deadline = time.time() + 30
        while metric(s, "frigg_busy_slots") != 1 and time.time() < deadline:
            time.sleep(0.01)
        assert metric(s, "frigg_busy_slots") == 1, "the request was not admitted"
        time.sleep(full / 4)  # well inside the prefill
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        t_left = time.time()
        while metric(s, "frigg_busy_slots") != 0 and time.time() < t_left + 60:
            time.sleep(0.01)
        freed = time.time() - t_left
        assert metric(s, "frigg_busy_slots") == 0
        assert freed < full / 2, f"slot freed {freed:.2f} s after the disconnect; a whole prefill takes {full:.2f} s"
        # Stopped, not finished: no prompt tokens counted, nothing generated.
        assert metric(s, "frigg_prompt_tokens_total") == prompt_before
        assert metric(s, "frigg_generated_tokens_total") == generated_before
        r = c.chat.completions.create(model="x", messages=MSG, max_tokens=4)
        assert r.choices[0].message.content is not None
    finally:
        assert s.stop() == 0


def test_a_sequence_above_a_free_stream_moves_down_and_reads_the_same():
    """A decode step computes a row for every stream up to the highest live one. When the
    request in stream 0 ends while the one in stream 1 runs on and nothing waits, the server
    moves the survivor into stream 0 after one padded step: one padding row in all (not one per
    remaining step), and the moved request's text is that of the same seeded request run alone."""
    s = Server("--slots", "4", "--queue", "4", model=medium_model(), ctx=512)
    try:
        c = s.client(key="none")
        long_req = dict(model="x", messages=MSG, max_tokens=96, temperature=1.0, seed=11, extra_body={"ignore_eos": True})
        alone = c.chat.completions.create(**long_req).choices[0].message.content
        rows0, steps0 = metric(s, "frigg_decode_rows_total"), metric(s, "frigg_decode_steps_total")

        short = c.chat.completions.create(model="x", messages=MSG, max_tokens=48, temperature=1.0, seed=3, stream=True, extra_body={"ignore_eos": True})
        first = next(iter(short))  # the short request holds stream 0 from here
        assert first.choices
        result = {}
        t = threading.Thread(target=lambda: result.update(r=c.chat.completions.create(**long_req)))
        t.start()  # stream 1
        tail = list(short)
        t.join()
        assert tail[-1].choices[0].finish_reason == "length"
        assert result["r"].choices[0].message.content == alone
        # Both ran together for some steps (so the long one was in stream 1), and the short one
        # ended first with half the long one's steps to go; only the step right after computed
        # a row for the free stream 0.
        assert metric(s, "frigg_decode_rows_total") - rows0 > metric(s, "frigg_decode_steps_total") - steps0
        assert metric(s, "frigg_decode_padding_rows_total") == 1
    finally:
        assert s.stop() == 0


def test_running_requests_and_kv_cache_usage_gauges_follow_the_work():
    """The gauges an endpoint picker reads (docs/deploy.md): running requests count a request
    once whatever its `n`, and KV-cache usage is the live sequences' cells over all cells."""
    s = Server("--slots", "4", "--queue", "4", model=medium_model(), ctx=512)
    try:
        assert metric(s, "frigg_running_requests") == 0 and metric(s, "frigg_kv_cache_usage_ratio") == 0
        c = s.client(key="none")
        prompt = c.chat.completions.create(model="x", messages=MSG, max_tokens=1).usage.prompt_tokens
        stream = c.chat.completions.create(model="x", messages=MSG, max_tokens=200, n=2, stream=True, extra_body={"ignore_eos": True})
        chunks = iter(stream)
        for _ in range(6):  # both choices admitted and decoding
            next(chunks)
        running, usage = metric(s, "frigg_running_requests"), metric(s, "frigg_kv_cache_usage_ratio")
        assert running == 1 and metric(s, "frigg_busy_slots") == 2
        # Two sequences of (prompt + a few tokens) cells in 4 streams x 512 cells.
        assert 2 * prompt / 2048 <= usage <= 2 * (prompt + 200) / 2048, (usage, prompt)
        list(chunks)
        deadline = time.time() + 10
        while metric(s, "frigg_running_requests") != 0 and time.time() < deadline:
            time.sleep(0.05)
        assert metric(s, "frigg_running_requests") == 0 and metric(s, "frigg_kv_cache_usage_ratio") == 0
        with urllib.request.urlopen(f"{s.url}/live") as r:
            assert r.status == 200
    finally:
        assert s.stop() == 0


def test_decode_graphs_are_reused_across_requests():
    """/metrics shows graph reuse: the same request twice (one slot, one padded length) builds
    its decode graph once; every later step reuses it unchanged, and nothing grows a compute
    buffer past what load reserved."""
    s = Server("--slots", "1")
    try:
        c = s.client()

        def ask():
            r = c.chat.completions.create(model="x", messages=MSG, max_tokens=101, temperature=0, extra_body={"ignore_eos": True})
            assert r.usage.completion_tokens == 101

        ask()
        before = {k: metric(s, k) for k in ("frigg_decode_graph_reuses_total", "frigg_graph_allocations_total", "frigg_decode_steps_total")}
        builds = metric(s, 'frigg_graph_builds_total{kind="decode"}')
        assert builds == 1 and before["frigg_decode_graph_reuses_total"] == 99, before
        ask()
        assert metric(s, 'frigg_graph_builds_total{kind="decode"}') == builds
        # 100 more decode steps, all on the warm graph; one allocation, for the prompt's prefill
        assert metric(s, "frigg_decode_steps_total") - before["frigg_decode_steps_total"] == 100
        assert metric(s, "frigg_decode_graph_reuses_total") - before["frigg_decode_graph_reuses_total"] == 100
        assert metric(s, "frigg_graph_allocations_total") - before["frigg_graph_allocations_total"] == 1
        assert metric(s, "frigg_decode_graph_changes_total") == 0
        assert metric(s, "frigg_compute_buffer_growths_total") == 0
        assert metric(s, "frigg_cuda_graph_resets_total") == 0
    finally:
        assert s.stop() == 0
