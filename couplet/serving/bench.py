"""`python -m couplet.bench serve --backend vllm`: the same Zipf workload (`couplet.serve_bench`) against vLLM
servers at the same KV budget in bytes as the in-process modes, in the same JSON and table.

Per budget: one server per KV dtype (bf16 and fp8, prefix caching on), started by scripts/vllm_serve.sh with
`--kv-cache-memory-bytes` = the budget, and stopped after (or the one `--vllm-url` names, as it was started).
Every visitor streams its couplet under the rules (`couplet.serving.vllm_client`); TTFT counts from the
scheduled arrival to the first token, TPOT from there to the last over the tokens after the first, like
vLLM's own `bench serve`, which is then run on the same prompts (as text, the rules off: it cannot send a
per-request spec) so both tools' figures sit side by side. Concurrency is the engine's own gauge
(`num_requests_running`, read every 100 ms), the prefix hit rate its counters' difference over the run.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from couplet.generate import Prepared
from couplet.kvcache.layer import KVGeometry
from couplet.model import LoadedModel
from couplet.serving import BackendError
from couplet.serving.rules import spec_for
from couplet.serving.vllm_client import GaugePoller, VllmClient, prompt_for
from couplet.text import is_han

ROOT = Path(__file__).resolve().parent.parent.parent
SCRIPT = ROOT / "scripts" / "vllm_serve.sh"
VENV = Path(os.environ.get("COUPLET_VLLM_VENV", Path.home() / ".cache" / "couplet" / "vllm-venv"))
MB = 1024 * 1024
# our names → (the server's --dtype, its --kv-cache-dtype); f32: the weights and cache in float32, which on a CPU
# without native bf16 arithmetic (AVX2) decodes faster than bf16, at twice the bytes per token
KV_DTYPES = {"bf16": ("bfloat16", "auto"), "fp8": ("bfloat16", "fp8"), "f32": ("float32", "auto")}


@dataclass
class Visit:
    sent: float = 0.0
    first: float = 0.0
    last: float = 0.0
    tokens: int = 0
    couplet: tuple[str, str] | None = None
    error: str = ""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A vLLM server of scripts/vllm_serve.sh for one run (`with`); `url` once healthy, `refusal` if it could not
    start (the script's one line, e.g. an FP8 KV cache on a CPU without AVX-512)."""

    def __init__(self, budget_bytes: int, kv_dtype: str, max_num_seqs: int = 64) -> None:
        self.port = _free_port()
        dtype, kv = KV_DTYPES[kv_dtype]
        self.args = ["--detach", "--port", str(self.port), "--kv-bytes", str(budget_bytes), "--dtype", dtype,
                     "--kv-dtype", kv, "--max-num-seqs", str(max_num_seqs)]
        self.url, self.refusal = "", ""

    def __enter__(self) -> Server:
        done = subprocess.run(["bash", str(SCRIPT), *self.args], cwd=ROOT, capture_output=True, text=True)
        if done.returncode == 0:
            self.url = done.stdout.strip().splitlines()[-1]
        else:
            self.refusal = (done.stderr.strip().splitlines() or ["no output"])[-1 if done.returncode == 2 else 0]
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["bash", str(SCRIPT), "--stop", "--port", str(self.port)], cwd=ROOT, capture_output=True)


def run_vllm(client: VllmClient, lm: LoadedModel, typed: list[str], arrivals: list[float],
             preps: dict[str, Prepared]) -> tuple[dict, dict[str, tuple[str, str]]]:
    """Every visitor through the server at its arrival time; the row (serve_bench's keys) and the couplets."""
    visits = [Visit() for _ in typed]

    def visit(i: int, t0: float) -> None:
        v, prep = visits[i], preps[typed[i]]
        spec = spec_for(prep, lm.family)
        delay = t0 + arrivals[i] - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        v.sent = t0 + arrivals[i]  # latency counts from the scheduled arrival
        ids: list[int] = []
        try:
            for chunk in client.stream_tokens(prompt_for(lm, prep), spec, 0.0, 1.0, 0):
                v.first = v.first or time.perf_counter()
                ids += chunk
            v.last = time.perf_counter()
        except BackendError as e:
            v.error = str(e)
            return
        v.tokens = len(ids)
        text = "".join(c for c in (lm.id_to_char[t] for t in ids) if is_han(c))
        v.couplet = (spec.given_upper, text) if spec.given_upper else (text[: spec.length], text[spec.length:])

    before = client.gauges()
    with GaugePoller(client, 0.1) as poller, ThreadPoolExecutor(max_workers=min(len(typed), 256)) as pool:
        t0 = time.perf_counter()
        for f in [pool.submit(visit, i, t0) for i in range(len(typed))]:
            f.result()
        end = time.perf_counter()
    after = client.gauges()
    ok = [v for v in visits if v.couplet]
    busy = [g for g in poller.samples if g.running]
    makespan = end - t0
    chars = sum(len(u) + len(lo) for v in ok if v.couplet for u, lo in [v.couplet])
    ttft = [(v.first - v.sent) * 1e3 for v in ok]
    tpot = [(v.last - v.first) * 1e3 / max(1, v.tokens - 1) for v in ok]
    e2e = [(v.last - v.sent) * 1e3 for v in ok]
    queries = after.prefix_queries - before.prefix_queries
    hits = after.prefix_hits - before.prefix_hits
    from couplet.serve_bench import pct

    row = {
        "backend": "vllm", "kv_dtype": after.dtype_label, "kv_capacity_bytes": after.capacity_bytes,
        "num_blocks": after.num_blocks, "budget_mb": None, "visitors": len(typed), "failed": len(typed) - len(ok),
        "seconds": makespan, "requests_per_s": len(ok) / makespan, "throughput_tok_s": chars / makespan,
        "admitted_concurrency": statistics.fmean(g.running for g in poller.samples) if poller.samples else 0.0,
        "admitted_concurrency_peak": max((g.running for g in poller.samples), default=0),
        "resident_kv_peak_bytes": max((g.kv_bytes for g in poller.samples), default=0),
        # the engine's KV over the requests it ran, sample by sample: a request's share, shared blocks amortised
        "kv_per_request_bytes": statistics.fmean(g.kv_bytes / g.running for g in busy) if busy else 0.0,
        "prefix_hit_rate": hits / queries if queries else 0.0,
        "prefill_tokens_ratio": (queries - hits) / queries if queries else 1.0,
        "preemptions": after.preemptions - before.preemptions,
        "ttft_p50_ms": pct(ttft, 50), "ttft_p90_ms": pct(ttft, 90), "ttft_p99_ms": pct(ttft, 99),
        "tpot_p50_ms": pct(tpot, 50), "tpot_p90_ms": pct(tpot, 90), "tpot_p99_ms": pct(tpot, 99),
        "e2e_p50_ms": pct(e2e, 50), "e2e_p90_ms": pct(e2e, 90), "e2e_p99_ms": pct(e2e, 99),
        "pool_refs_after": None, "device_peak_bytes": None,
    }
    if len(ok) < len(typed):
        print(f"{len(typed) - len(ok)} visitors failed, e.g. {next(v.error for v in visits if v.error)}",
              file=sys.stderr)
    return row, {typed[i]: v.couplet for i, v in enumerate(visits) if v.couplet}


def vllm_bench_serve(url: str, lm: LoadedModel, typed: list[str], preps: dict[str, Prepared]) -> dict:
    """vLLM's own `bench serve` on the same prompts, in the same order, all at once (request rate inf), 2 × the
    line length + the break of output tokens with ignore_eos. The prompts go as text, which the embedded
    tokenizer maps back to the same ids (tested); vLLM's client sends no per-request spec, so the rules are off
    and the text is free: a throughput and latency figure, not a couplet. Returns its result's scalar figures."""
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "prompts.jsonl"
        data.write_text("".join(json.dumps({"prompt": "".join(lm.tokenizer.convert_ids_to_tokens(
            prompt_for(lm, preps[p]))), "output_tokens": spec_for(preps[p], lm.family).new_tokens},
            ensure_ascii=False) + "\n" for p in typed), encoding="utf-8")
        out = Path(tmp) / "result.json"
        args = ["--base-url", url, "--model", "couplet", "--served-model-name", "couplet", "--tokenizer",
                str(lm.source), "--dataset-name", "custom", "--dataset-path", str(data), "--num-prompts",
                str(len(typed)), "--custom-output-len", "-1",  # -1: each prompt's own output_tokens
                "--skip-chat-template", "--disable-shuffle", "--ignore-eos",
                "--request-rate", "inf", "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,99",
                "--save-result", "--result-dir", tmp, "--result-filename", out.name]
        done = subprocess.run([str(VENV / "bin" / "python"), "-m", "couplet.serving.vllm_bench_runner", *args],
                              cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if done.returncode != 0 or not out.exists():
            return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
        result = json.loads(out.read_text(encoding="utf-8"))
    return {k: v for k, v in result.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def geometry(lm: LoadedModel) -> KVGeometry:
    return KVGeometry.of(lm.model)


def run_backend(lm: LoadedModel, cfg, budget_mb: float, typed: list[str], arrivals: list[float],
                preps: dict[str, Prepared]) -> dict[str, dict]:
    """The vLLM rows at one budget: `vllm-bf16`, `vllm-fp8` (`cfg.vllm_kv`; servers started here), or the one at
    `cfg.vllm_url`. A server that cannot start here gets a row with its reason and no figures."""
    rows: dict[str, dict] = {}
    targets = [("url", cfg.vllm_url)] if cfg.vllm_url else [(d, None) for d in cfg.vllm_kv]
    for dtype, url in targets:
        if url:
            client = VllmClient(url, geometry(lm))
            name = f"vllm-{client.gauges().dtype_label}"
            row, couplets = run_vllm(client, lm, typed, arrivals, preps)
            row["vllm_bench_serve"] = vllm_bench_serve(url, lm, typed, preps) if cfg.vllm_bench else None
            rows[name] = {**row, "couplets": couplets}
            continue
        with Server(int(budget_mb * MB), dtype) as server:
            name = f"vllm-{dtype}"
            if not server.url:
                rows[name] = {"backend": "vllm", "kv_dtype": dtype, "unmeasured": server.refusal}
                print(f"budget {budget_mb} MB, {name}: not measured — {server.refusal}", file=sys.stderr, flush=True)
                continue
            client = VllmClient(server.url, geometry(lm))
            client.gauges()  # a warm-up read
            row, couplets = run_vllm(client, lm, typed, arrivals, preps)
            row["vllm_bench_serve"] = vllm_bench_serve(server.url, lm, typed, preps) if cfg.vllm_bench else None
            rows[name] = {**row, "couplets": couplets}
    return rows
