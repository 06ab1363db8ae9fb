"""The backend seam without a vLLM server: the couplet rules as an engine's logits processor sees them (driven
here by the real embedded model, token by token, as vLLM would), the spec on the wire, the metrics parser, and
the HTTP client's error handling against FAKE servers (a closed port, a server that never answers, one that
answers garbage, one that answers HTTP 500) — the only fakes in the suite, named so: the real server's
behaviour is tested in tests/test_vllm_integration.py.
"""

from __future__ import annotations

import http.server
import threading
import time
from collections.abc import Iterator

import pytest
import torch

from couplet.kvcache.layer import KVGeometry
from couplet.serving.backends import BackendConfig, BackendError, free_port
from couplet.serving.generate import CoupletRequest, generate, prepare
from couplet.vllm_backend.client import VllmClient, parse_metrics, prompt_for
from couplet.vllm_backend.client import decode as remote_decode
from couplet.vllm_backend.logit_rules import RowRules, RowSpec, spec_for
from couplet.writing.rules import check_couplet
from couplet.writing.text import is_han


def drive(lm, prep, rules: RowRules) -> list[int]:
    """What an engine does with the processor: logits of the sequence so far → rules → argmax, one token at a
    time (no KV cache: a test of the rules, not of speed)."""
    ids, out = prompt_for(lm, prep), []
    with torch.inference_mode():
        for _ in range(rules.spec.new_tokens):
            logits = lm.model(torch.tensor([ids + out])).logits[0, -1]
            out.append(int(rules(out, logits).argmax()))
    return out


def lines_of(lm, spec: RowSpec, out: list[int]) -> tuple[str, str]:
    upper, lower = spec.split(out, lm.id_to_char)[0]
    assert all(map(is_han, upper + lower))
    return upper, lower


@pytest.mark.parametrize("request_", [
    CoupletRequest("龙马精神"), CoupletRequest("春风", length=5), CoupletRequest("吉祥如意", acrostic=True),
    CoupletRequest("大吉大利"), CoupletRequest("", upper="春风送暖千家福", task="duixia"),
    CoupletRequest("", upper="瑞雪迎春到", task="duixia"),
], ids=["heads", "five", "acrostic", "repeated-keyword", "duixia7", "duixia5"])
def test_greedy_through_the_rules_is_the_local_full_couplet(embedded_lm, request_):
    """The processor keeps every rule the local loop keeps, so greedy decoding through it is `full`'s couplet,
    token for token (the line break forced in between)."""
    prep = prepare(embedded_lm, request_)
    spec = spec_for(prep, embedded_lm.family)
    out = drive(embedded_lm, prep, RowRules(embedded_lm.chars, RowSpec.from_json(spec.to_json())))
    local = generate(embedded_lm, request_, "full")
    assert lines_of(embedded_lm, spec, out) == (local.upper, local.lower)
    if not spec.given_upper:
        assert out[spec.length] == embedded_lm.family.line_break[0]  # the break between the lines is forced
    assert check_couplet(local.upper, local.lower, local.hengpi, prep.keyword_text,
                         given_upper=prep.duixia)["failures"] == []


def test_the_rules_force_keywords_and_the_break_and_bar_everything_else(embedded_lm):
    prep = prepare(embedded_lm, CoupletRequest("龙马精神"))
    rules = RowRules(embedded_lm.chars, spec_for(prep, embedded_lm.family))
    logits = torch.randn(len(embedded_lm.id_to_char))
    first = rules([], logits)
    assert torch.isfinite(first).sum() == 1 and int(first.argmax()) == embedded_lm.vocab["龙"]
    upper = embedded_lm.char_ids("龙马新随云气动")
    brk = rules(upper, logits)
    assert int(brk.argmax()) == embedded_lm.family.line_break[0] and torch.isfinite(brk).sum() == 1
    free = rules(upper[:2], logits)  # the third 上联 character: a free one, under the mask
    allowed = torch.isfinite(free)
    assert 100 < int(allowed.sum()) < len(embedded_lm.id_to_char)
    assert not allowed[embedded_lm.vocab["龙"]] and not allowed[embedded_lm.vocab["死"]]  # repeat, taboo
    assert not allowed[embedded_lm.family.line_break[0]]
    assert rules(upper + [*embedded_lm.family.line_break] + embedded_lm.char_ids("精神时见雨光浮"),
                 logits) is logits  # past the end: untouched (the engine stops at max_tokens)


@pytest.mark.parametrize("text, why", [
    ("not json", "malformed couplet spec"),
    ('{"length": 7}', "KeyError"),
    ('{"length": 7, "upper": {}, "lower": {}, "line_break": [5], "voice": {"loudness": 3}}', "TypeError"),
    ('{"length": 7, "upper": {}, "lower": {}, "line_break": [5], "given_upper": "春风"}', "given 上联"),
    ('{"length": 7, "upper": {"9": "春"}, "lower": {}, "line_break": [5]}', "fixed '春' at 9"),
    ('{"length": 7, "upper": {}, "lower": {}, "line_break": []}', "no line break"),
    ('{"length": 7, "upper": {}, "lower": {}, "line_break": [5], "lower_end": "去"}', "end tone"),
])
def test_a_malformed_spec_is_refused_with_the_reason(text, why):
    with pytest.raises(ValueError, match=why):
        RowSpec.from_json(text)


def test_backend_config_reads_the_environment_and_refuses_an_unknown_backend(monkeypatch):
    monkeypatch.setenv("COUPLET_BACKEND", "VLLM")
    monkeypatch.setenv("COUPLET_VLLM_URL", "http://10.0.0.2:8000")
    assert BackendConfig.from_env() == BackendConfig("vllm", "http://10.0.0.2:8000")
    monkeypatch.setenv("COUPLET_BACKEND", "sglang")
    with pytest.raises(ValueError, match="未知后端"):
        BackendConfig.from_env()


METRICS = """# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="couplet"} 0.5
vllm:num_requests_running{engine="0",model_name="couplet"} 3.0
vllm:num_requests_waiting{engine="0",model_name="couplet"} 2.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="couplet",reason="capacity"} 2.0
vllm:prefix_cache_queries_total{engine="0",model_name="couplet"} 1243.0
vllm:prefix_cache_hits_total{engine="0",model_name="couplet"} 576.0
vllm:num_preemptions_total{engine="0",model_name="couplet"} 1.0
vllm:cache_config_info{block_size="32",cache_dtype="fp8",engine="0",num_gpu_blocks="42"} 1.0
"""


def test_metrics_give_the_engine_kv_bytes_from_usage_blocks_block_size_and_dtype(embedded_lm):
    """The lines have the real server's names and layout (copied from a vLLM 0.32 /metrics page)."""
    geometry = KVGeometry.of(embedded_lm.model)
    g = parse_metrics(METRICS, geometry)
    token_bytes = 2 * geometry.layers * geometry.kv_heads * geometry.head_dim * 1  # fp8: one byte
    assert (g.running, g.waiting, g.num_blocks, g.block_size, g.dtype_label) == (3, 2, 42, 32, "fp8")
    assert g.capacity_bytes == 42 * 32 * token_bytes and g.kv_bytes == 21 * 32 * token_bytes
    assert (g.prefix_queries, g.prefix_hits, g.preemptions) == (1243, 576, 1)
    bf16 = parse_metrics(METRICS.replace('cache_dtype="fp8"', 'cache_dtype="auto"'), geometry)
    assert bf16.token_bytes == 2 * token_bytes and bf16.dtype_label == "bf16"
    # `auto` with a float32 model: /metrics does not name the dtype; the reported budget tells it
    f32_budget = f'kv_cache_memory_bytes="{42 * 32 * 4 * token_bytes + 1000}",'
    f32 = parse_metrics(METRICS.replace('cache_dtype="fp8",', f'cache_dtype="auto",{f32_budget}'), geometry)
    assert f32.token_bytes == 4 * token_bytes and f32.dtype_label == "f32"
    with pytest.raises(ValueError, match="kv_cache_usage_perc"):  # the pre-V1 names are gone: say what is missing
        parse_metrics(METRICS.replace("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"), geometry)


# --- FAKE servers: the client's error handling only --------------------------------------------------------


class FakeHandler(http.server.BaseHTTPRequestHandler):
    behaviour = "garbage"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_GET(self) -> None:
        self.do_POST()

    def do_POST(self) -> None:
        if self.behaviour == "slow":  # a couplet character every 0.2 s, until the client hangs up
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.end_headers()
            try:
                for _ in range(50):
                    self.wfile.write(b'data: {"choices": [{"text": "x", "token_ids": [26]}]}\n\n')
                    self.wfile.flush()
                    time.sleep(0.2)
            except (BrokenPipeError, ConnectionResetError):
                type(self).hung_up = True  # type: ignore[attr-defined]
            return
        if self.behaviour == "hang":
            time.sleep(3)
        if self.behaviour == "error":
            self.send_response(500)
            self.end_headers()
            self.wfile.write(b'{"error": "boom"}')
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        # "short": one token (26, 春 in the embedded vocabulary: a character the rules would allow), then the end
        self.wfile.write(b"data: {not json\n\n" if self.behaviour == "garbage" else
                         b'data: {"choices": [{"text": "x", "token_ids": [26]}]}\n\ndata: [DONE]\n\n')


@pytest.fixture
def fake_server() -> Iterator[type[FakeHandler]]:
    """A FAKE vLLM (http.server in a thread): set `.behaviour` to garbage, hang, error or short."""
    handler = type("Handler", (FakeHandler,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    handler.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    try:
        yield handler
    finally:
        server.shutdown()
        server.server_close()


def write_remote(lm, url: str, timeout: float = 30.0):
    client = VllmClient(url, KVGeometry.of(lm.model), timeout=timeout)
    return list(remote_decode(client, lm, prepare(lm, CoupletRequest("春风")), poll_interval=0.05))


def test_server_down_is_a_chinese_message(embedded_lm):
    with pytest.raises(BackendError, match="连不上 vLLM 服务.*vllm_serve.sh"):
        write_remote(embedded_lm, f"http://127.0.0.1:{free_port()}")


@pytest.mark.parametrize("url", ["http://127.0.0.1:80x", "127.0.0.1:8000", "ftp://host/", ""])
def test_a_bad_vllm_url_is_refused_in_chinese_up_front(url):
    with pytest.raises(ValueError, match="vLLM 服务地址.*无效"):
        BackendConfig("vllm", url)


def test_a_client_that_reaches_no_valid_url_fails_in_chinese_not_with_a_hang(embedded_lm):
    """Past the config check (a client built by hand): an invalid URL is not an httpx.HTTPError, and the
    reader thread must still hand the failure over instead of leaving the stream waiting forever."""
    with pytest.raises(BackendError, match="回复无法解析"):
        write_remote(embedded_lm, "http://127.0.0.1:80x")


@pytest.mark.parametrize("behaviour, message", [
    ("garbage", "回复无法解析.*JSONDecodeError"), ("short", "回复无法解析.*1 tokens for 15 asked"),
    ("error", r"返回错误（HTTP 500）"), ("hang", "响应超时"),
])
def test_a_bad_reply_is_a_chinese_message(embedded_lm, fake_server, behaviour, message):
    fake_server.behaviour = behaviour
    t0 = time.perf_counter()
    with pytest.raises(BackendError, match=message):
        write_remote(embedded_lm, fake_server.url, timeout=1.0)  # type: ignore[attr-defined]
    assert time.perf_counter() - t0 < 10  # a hung server costs the timeout, not forever


def test_closing_a_stream_early_hangs_up_on_the_server(embedded_lm, fake_server):
    """A visitor who leaves: closing the stream stops its reader and closes the connection, so the server
    (vLLM aborts a request whose client is gone) stops generating."""
    if embedded_lm.id_to_char[26] != "春":
        pytest.skip("the fake streams token 26 as 春 (the embedded vocabulary)")
    fake_server.behaviour = "slow"
    client = VllmClient(fake_server.url, KVGeometry.of(embedded_lm.model))  # type: ignore[attr-defined]
    stream = remote_decode(client, embedded_lm, prepare(embedded_lm, CoupletRequest("", upper="春风送暖千家福",
                                                                                   task="duixia")))
    next(stream), next(stream)  # the prefill and the first character
    stream.close()
    deadline = time.perf_counter() + 5
    while not getattr(fake_server, "hung_up", False) and time.perf_counter() < deadline:
        time.sleep(0.05)
    assert getattr(fake_server, "hung_up", False)


def test_the_page_shows_a_chinese_message_when_vllm_is_down_and_stays_usable(monkeypatch, embedded_lm):
    """The real page with the vLLM backend pointed at a closed port. Beside an in-process mode, the vLLM stream
    ends with a notice and `full` still writes; alone, the request fails with the message in the gate; the
    form is untouched either way, and the next request is written."""
    from gradio_client import Client

    import app

    monkeypatch.setattr(app, "BACKEND", BackendConfig("vllm", f"http://127.0.0.1:{free_port()}"))
    monkeypatch.setattr(app, "_client", None)
    demo = app.serve(port=0)
    try:
        client = Client(demo.local_url, verbose=False)
        gate, checks, *_, payload = client.predict("春风", 7, False, 0, 0, 2026, ["vllm", "full"],
                                                   api_name="/couplet")
        assert "连不上 vLLM 服务" in checks and [p["mode"] for p in payload] == ["full"]
        assert payload[0]["upper"] in gate and "Traceback" not in checks
        gate, checks, *_, payload = client.predict("春风", 7, False, 0, 0, 2026, ["vllm"], api_name="/couplet")
        assert "连不上 vLLM 服务" in gate and "连不上 vLLM 服务" in checks and payload == []
        *_, payload = client.predict("春风", 7, False, 0, 0, 2026, ["full"], api_name="/couplet")
        assert [p["mode"] for p in payload] == ["full"] and len(payload[0]["upper"]) == 7
    finally:
        demo.close()
        monkeypatch.setattr(app, "_client", None)
