"""`python -m couplet.bench serve --backend vllm`: the same Zipf workload (`couplet.bench.serve`) against vLLM
servers at the same KV budget in bytes as the in-process modes, in the same JSON and table.

Per budget: one server per KV dtype (bf16 and fp8, prefix caching on), started by scripts/vllm_serve.sh with
`--kv-cache-memory-bytes` = the budget, and stopped after (or the one `--vllm-url` names, as it was started).
Every visitor streams its couplet under the rules (`couplet.vllm_backend.client`); TTFT counts from the
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

from couplet.bench.latency import latency_row
from couplet.kvcache import KVGeometry
from couplet.models.loading import LoadedModel
from couplet.serving.backends import VLLM_VENV, BackendError, free_port
from couplet.serving.generate import Prepared
from couplet.vllm_backend.client import GaugePoller, VllmClient, prompt_for
from couplet.vllm_backend.logit_rules import spec_for

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "vllm_serve.sh"
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


class Server:
    """A vLLM server of scripts/vllm_serve.sh at a free port: `start()` launches the script (it returns once
    /health answers), `wait()` gives the URL or, if it could not start, leaves `url` empty and `refusal` set (the
    script's one line, e.g. an FP8 KV cache on a CPU without AVX-512); `stop()` ends it. As a context manager:
    start, wait, stop. The benchmark uses it, and the tests (started in the background while the suite runs)."""

    def __init__(self, budget_bytes: int, kv_dtype: str, max_num_seqs: int = 64) -> None:
        self.port = free_port()
        self.kv_dtype = kv_dtype
        dtype, kv = KV_DTYPES[kv_dtype]
        self.args = ["--detach", "--port", str(self.port), "--kv-bytes", str(budget_bytes), "--dtype", dtype,
                     "--kv-dtype", kv, "--max-num-seqs", str(max_num_seqs)]
        self.url, self.refusal = "", ""
        self._process: subprocess.Popen | None = None

    def start(self) -> Server:
        self._process = subprocess.Popen(["bash", str(SCRIPT), *self.args], cwd=ROOT, stdout=subprocess.PIPE,
                                         stderr=subprocess.PIPE, text=True)
        return self

    def wait(self, timeout: float = 600) -> str:
        if self._process is not None:
            out, err = self._process.communicate(timeout=timeout)
            if self._process.returncode == 0:
                self.url = out.strip().splitlines()[-1]
            else:  # exit 2: the script's own one-line refusal; otherwise its account of the crash
                lines = err.strip().splitlines() or ["no output"]
                self.refusal = lines[-1] if self._process.returncode == 2 else "\n".join(lines[-20:])
            self._process = None
        return self.url

    def stop(self) -> None:
        if self._process is not None:
            self._process.kill()
            self._process = None
        subprocess.run(["bash", str(SCRIPT), "--stop", "--port", str(self.port)], cwd=ROOT, capture_output=True)

    def __enter__(self) -> Server:
        self.start().wait()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def run_vllm(client: VllmClient, lm: LoadedModel, typed: list[str], arrivals: list[float],
             preps: dict[str, Prepared]) -> tuple[dict, dict[str, tuple[str, str]]]:
    """Every visitor through the server at its arrival time; the row (`couplet.bench.serve`'s keys) and the couplets."""
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
        upper, lower = spec.split(ids, lm.id_to_char)[0]
        v.couplet = (upper, lower)

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
        **latency_row(ttft, tpot, e2e),
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
    def as_text(ids: list[int]) -> str:
        # a character-level vocabulary's tokens are their own text (decode() would put spaces between them)
        if lm.family.byte_level:
            return str(lm.tokenizer.decode(ids))
        return "".join(lm.tokenizer.convert_ids_to_tokens(ids))

    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "prompts.jsonl"
        data.write_text("".join(json.dumps({"prompt": as_text(prompt_for(lm, preps[p])),
                                            "output_tokens": spec_for(preps[p], lm.family).new_tokens},
                                           ensure_ascii=False) + "\n" for p in typed), encoding="utf-8")
        out = Path(tmp) / "result.json"
        args = ["--base-url", url, "--model", "couplet", "--served-model-name", "couplet", "--tokenizer",
                str(lm.source), "--dataset-name", "custom", "--dataset-path", str(data), "--num-prompts",
                str(len(typed)), "--custom-output-len", "-1",  # -1: each prompt's own output_tokens
                "--skip-chat-template", "--disable-shuffle", "--ignore-eos",
                "--request-rate", "inf", "--percentile-metrics", "ttft,tpot,e2el", "--metric-percentiles", "50,99",
                "--save-result", "--result-dir", tmp, "--result-filename", out.name]
        done = subprocess.run([str(VLLM_VENV / "bin" / "python"), "-m", "couplet.vllm_backend.bench_runner", *args],
                              cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
        if done.returncode != 0 or not out.exists():
            return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
        result = json.loads(out.read_text(encoding="utf-8"))
    return {k: v for k, v in result.items() if isinstance(v, int | float) and not isinstance(v, bool)}


def run_backend(lm: LoadedModel, cfg, budget_mb: float, typed: list[str], arrivals: list[float],
                preps: dict[str, Prepared]) -> dict[str, dict]:
    """The vLLM rows at one budget: `vllm-bf16`, `vllm-fp8` (`cfg.vllm_kv`; servers started here), or the one at
    `cfg.vllm_url`. A server that cannot start here gets a row with its reason and no figures."""
    def measure(url: str) -> dict:
        client = VllmClient(url, KVGeometry.of(lm.model))
        client.gauges()  # a warm-up read (and the server's dtype for the row's name)
        row, couplets = run_vllm(client, lm, typed, arrivals, preps)
        row["vllm_bench_serve"] = vllm_bench_serve(url, lm, typed, preps) if cfg.vllm_bench else None
        return {**row, "couplets": couplets}

    if cfg.vllm_url:  # that server as it runs: its own budget (one `--budgets` value, checked by the parser)
        row = measure(cfg.vllm_url)
        return {f"vllm-{row['kv_dtype']}": row}
    rows: dict[str, dict] = {}
    for dtype in cfg.vllm_kv:
        with Server(int(budget_mb * MB), dtype) as server:
            if server.url:
                rows[f"vllm-{dtype}"] = measure(server.url)
                continue
            rows[f"vllm-{dtype}"] = {"backend": "vllm", "kv_dtype": dtype, "unmeasured": server.refusal}
            print(f"budget {budget_mb} MB, vllm-{dtype}: not measured — {server.refusal}", file=sys.stderr,
                  flush=True)
    return rows
