"""The vLLM backend against real vLLM CPU servers (tests/vllm_servers.py: the embedded checkpoint, a 2 MiB KV
budget, one bf16 and one fp8 KV cache, started by scripts/vllm_serve.sh): couplets through the backend keep
every rule, the metrics the page reads exist under these names, fp8 holds twice the blocks, a second visitor
with the same keywords hits the prefix cache, and the page runs with COUPLET_BACKEND=vllm.
"""

from __future__ import annotations

import os

import httpx
import pytest
import vllm_servers

from couplet.kvcache.layer import KVGeometry
from couplet.serving.backends import VLLM_VENV
from couplet.serving.generate import CoupletRequest, prepare
from couplet.vllm_backend.client import VllmClient, decode, generate
from couplet.writing.rules import check_couplet
from couplet.writing.text import is_han


def _server(dtype: str) -> str:
    if not vllm_servers.environment_ready():
        if os.environ.get("COUPLET_VLLM_REQUIRED") == "1":
            pytest.fail(f"no vLLM environment at {VLLM_VENV}: bash scripts/vllm_serve.sh --setup-only")
        pytest.skip("no vLLM environment: run `bash scripts/vllm_serve.sh --setup-only` (the README's test "
                    "command does)")
    return vllm_servers.url(dtype)


@pytest.fixture(scope="module")
def bf16_url() -> str:
    return _server("bf16")


@pytest.fixture(scope="module")
def fp8_url() -> str:
    if not vllm_servers.fp8_kv_supported():
        pytest.skip("this CPU has neither AVX-512 nor AMX: vLLM's CPU FP8 KV cache refuses to start without them "
                    "(NotImplementedError in vllm/v1/attention/backends/cpu_attn.py); a GPU or an AVX-512 CPU runs it")
    return _server("fp8")


@pytest.fixture(scope="module")
def client(bf16_url, embedded_lm) -> VllmClient:
    return VllmClient(bf16_url, KVGeometry.of(embedded_lm.model))


METRICS = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
           "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_cached_total",
           "vllm:num_preemptions_total", "vllm:cache_config_info")


def test_the_server_exposes_the_metrics_the_page_reads(bf16_url, client):
    text = httpx.get(f"{bf16_url}/metrics", timeout=10).text
    assert [m for m in METRICS if f"\n{m}{{" not in text] == []
    g = client.gauges()
    assert g.block_size == 32 and g.cache_dtype == "auto" and g.num_blocks > 0
    # the budget is what the script was told: blocks × block size × bytes per token fits in it
    assert 0.9 * vllm_servers.KV_BYTES < g.capacity_bytes <= vllm_servers.KV_BYTES


def test_fp8_holds_twice_the_blocks_of_bf16_at_the_same_budget(client, fp8_url, embedded_lm):
    fp8 = VllmClient(fp8_url, KVGeometry.of(embedded_lm.model)).gauges()
    bf16 = client.gauges()
    assert fp8.cache_dtype.startswith("fp8") and fp8.token_bytes * 2 == bf16.token_bytes
    assert 1.8 <= fp8.num_blocks / bf16.num_blocks <= 2.2


@pytest.mark.parametrize("request_", [
    CoupletRequest("龙马精神"), CoupletRequest("吉祥如意", acrostic=True), CoupletRequest("春风", length=5),
    CoupletRequest("五福临门", temperature=0.8, top_p=0.9, seed=7),
    CoupletRequest("", upper="春风送暖千家福", task="duixia"),
], ids=["heads", "acrostic", "five", "sampled", "duixia"])
def test_a_couplet_through_the_backend_keeps_every_rule(client, embedded_lm, request_):
    prep = prepare(embedded_lm, request_)
    steps = list(decode(client, embedded_lm, prep))
    result = steps[-1].result
    assert result is not None and result.mode == "vllm"
    n = prep.length
    assert len(result.upper) == len(result.lower) == n and all(map(is_han, result.upper + result.lower))
    assert check_couplet(result.upper, result.lower, result.hengpi, prep.keyword_text,
                         given_upper=prep.duixia)["failures"] == []
    for pos, char in prep.placement.upper.items():
        assert result.upper[pos] == char
    # one record per character (and the prefill), streamed as they came, carrying the engine's gauges
    assert [s.step for s in result.steps] == list(range(len(result.steps)))
    assert len(result.steps) == 1 + (n if prep.duixia else 2 * n)
    assert steps[-1].gauges is not None and steps[-1].gauges.num_blocks > 0


def test_a_second_visitor_with_the_same_keywords_hits_the_prefix_cache(client, embedded_lm):
    prep = prepare(embedded_lm, CoupletRequest("鹏程万里"))
    before = client.gauges()
    generate(client, embedded_lm, prep)
    first = client.gauges()
    generate(client, embedded_lm, prep)
    second = client.gauges()
    prompt = len(prep.prompt)
    first_hits, second_hits = first.prefix_hits - before.prefix_hits, second.prefix_hits - first.prefix_hits
    # the second visitor finds every whole block of the prompt but (at most) the last one cached
    assert second_hits >= (prompt // 32 - 1) * 32 and second_hits > first_hits
    assert second.prefix_queries - first.prefix_queries >= prompt - 32


def test_the_page_runs_with_the_vllm_backend(bf16_url):
    """`COUPLET_BACKEND=vllm python app.py` against the script's server: the vLLM mode writes beside an
    in-process one, and the second chart shows the server's own gauges."""
    from gradio_client import Client

    with vllm_servers.page_on(bf16_url) as url:
        config = httpx.get(f"{url}config", timeout=10).text  # the page's layout: the toggles and the about panel
        assert "仅本进程" in config and "另一进程：vLLM 服务端" in config
        client = Client(url, verbose=False)
        gate, checks, kv_plot, mem_plot, table, payload = client.predict(
            "国泰民安", 7, False, 0, 0, 2026, ["vllm", "full"], api_name="/couplet")
        modes = {p["mode"]: p for p in payload}
        assert set(modes) == {"vllm", "full"} and modes["vllm"]["checks"]["failures"] == []
        assert "vLLM 引擎仪表（全引擎合计" in mem_plot["plot"] and "vLLM 服务端（引擎合计）" in table
        assert "bf16 KV" in table  # the live line names the server's cache dtype


def test_a_spec_the_server_cannot_follow_ends_that_request_and_the_server_lives_on(client, embedded_lm):
    """A character outside the vocabulary passes the spec's own checks but not the server's table: the
    processor ends that request at once (never raising inside the engine's step), the client gets its Chinese
    message, and the next visitor is served."""
    from dataclasses import replace

    from couplet.serving.backends import BackendError
    from couplet.vllm_backend.client import prompt_for
    from couplet.vllm_backend.logit_rules import RowSpec, spec_for

    prep = prepare(embedded_lm, CoupletRequest("春风"))
    spec = replace(spec_for(prep, embedded_lm.family), upper={0: "𠀀"})
    assert RowSpec.from_json(spec.to_json()) == spec  # well-formed: only the server's vocabulary refuses it
    with pytest.raises(BackendError, match="回复无法解析"):
        list(client.stream_tokens(prompt_for(embedded_lm, prep), spec, 0.0, 1.0, 0))
    with pytest.raises(BackendError, match=r"HTTP 400"):  # malformed: refused at the door, with the reason
        list(client.stream_tokens(prompt_for(embedded_lm, prep), replace(spec, line_break=()), 0.0, 1.0, 0))
    assert generate(client, embedded_lm, prep).checks["failures"] == []
