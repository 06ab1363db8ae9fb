"""The vLLM backend's client: the same prepared request (house prefix, exemplars, keywords) sent as token ids to a
vLLM OpenAI-compatible server, streamed back one character at a time, and the engine's own gauges read from
its `/metrics`.

    client = VllmClient("http://127.0.0.1:8000", KVGeometry.of(lm.model))
    for progress in decode(client, lm, prepare(lm, CoupletRequest("龙马精神"))):   # like generate.decode
        ...
    client.gauges()      # EngineGauges: KV bytes, running / waiting requests, prefix-cache hits (engine-wide)

The rules travel with the request (`vllm_xargs`, `couplet.vllm_backend.logit_rules.RowSpec`) and are applied inside the
server by `couplet.vllm_backend.logits`; `max_tokens` is exactly the lines and the break. The records a request
streams carry the engine's gauges, which are totals over every request the server holds, not this request's:
the page and the benchmark label them so. Every failure (server down, timeout, an HTTP error, a reply that does
not parse) raises `BackendError`, whose message starts with the Chinese the page shows.
"""

from __future__ import annotations

import json
import math
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

import httpx
from prometheus_client.parser import text_string_to_metric_families

from couplet.events import CoupletResult, StepRecord
from couplet.kvcache import KVGeometry
from couplet.models.loading import LoadedModel
from couplet.serving.backends import VLLM_MODE, BackendError
from couplet.serving.generate import Prepared, Progress, finish
from couplet.vllm_backend.logit_rules import SPEC_KEY, RowSpec, spec_for
from couplet.writing.text import is_han

SERVED_MODEL = "couplet"  # scripts/vllm_serve.sh: --served-model-name


@dataclass(frozen=True)
class EngineGauges:
    """One read of the server's `/metrics`: engine-wide figures (every request it holds), not one request's."""

    kv_usage: float  # vllm:kv_cache_usage_perc, 0–1
    num_blocks: int  # KV blocks the budget holds (cache_config_info num_gpu_blocks; CPU blocks on a CPU build)
    block_size: int  # tokens per block
    cache_dtype: str  # "auto" (the model's dtype), "fp8", …
    element_bytes: int  # one key or value element in the cache (fp8: 1, bf16: 2, f32: 4)
    token_bytes: int  # one token's keys and values, all layers, in the cache dtype
    running: int
    waiting: int
    prefix_queries: float  # counters since start: tokens looked up in / found in the prefix cache
    prefix_hits: float
    preemptions: float

    @property
    def capacity_bytes(self) -> int:
        return self.num_blocks * self.block_size * self.token_bytes

    @property
    def kv_bytes(self) -> int:
        """KV bytes in use = usage × blocks × block size × bytes per token."""
        return round(self.kv_usage * self.capacity_bytes)

    @property
    def dtype_label(self) -> str:
        """The cache's element type: fp8…, or (`auto`: the model's dtype) bf16/f16 or f32 by its bytes."""
        if self.cache_dtype != "auto":
            return self.cache_dtype
        return {2: "bf16", 4: "f32"}.get(self.element_bytes, "auto")


def element_bytes(cache_dtype: str, info: dict[str, str], geometry: KVGeometry) -> int:
    """Bytes per KV element. fp8 variants: 1. `auto` is the model's dtype, which /metrics does not name: it is
    read off the budget the server reports (kv_cache_memory_bytes over blocks × block size × elements per
    token: 2.0 for bf16, 4.0 for float32), or taken as bf16 (scripts/vllm_serve.sh's default) without one."""
    if cache_dtype.startswith("fp8"):
        return 1
    named = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4}
    if cache_dtype in named:
        return named[cache_dtype]
    try:
        per_element = int(info["kv_cache_memory_bytes"]) / (
            int(info["num_gpu_blocks"]) * int(info["block_size"]) * geometry.token_bytes // geometry.dtype_bytes)
    except (KeyError, ValueError, ZeroDivisionError):
        return 2
    return 4 if per_element >= 3 else 2


# what a request can fail with on its way (httpx.InvalidURL and StreamError are not HTTPError subclasses)
FAILURES = (httpx.HTTPError, httpx.InvalidURL, httpx.StreamError, ValueError, KeyError, IndexError, TypeError)
WANTED = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting",
          "vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total",
          "vllm:cache_config_info")


def parse_metrics(text: str, geometry: KVGeometry) -> EngineGauges:
    """The gauges from Prometheus text (summed over engines when a server runs several). Raises ValueError when
    a metric the page needs is missing (an older vLLM named them `gpu_cache_usage_perc`, …)."""
    values: dict[str, float] = {}
    info: dict[str, str] = {}
    # only the lines read below go to the parser (the whole page is ~50 KB of histograms, slow to parse)
    kept = "\n".join(line for line in text.splitlines() if line.startswith(WANTED)) + "\n"
    for family in text_string_to_metric_families(kept):
        for s in family.samples:
            if s.name == "vllm:cache_config_info":
                info = dict(s.labels)
            elif s.name.startswith("vllm:") and "reason" not in s.labels:
                values[s.name] = values.get(s.name, 0.0) + s.value
    need = ("vllm:kv_cache_usage_perc", "vllm:num_requests_running", "vllm:num_requests_waiting")
    missing = [n for n in need if n not in values] + ([] if info else ["vllm:cache_config_info"])
    if missing:
        raise ValueError(f"metrics without {', '.join(missing)}")
    cache_dtype = info.get("cache_dtype", "auto")
    element = element_bytes(cache_dtype, info, geometry)
    return EngineGauges(
        values["vllm:kv_cache_usage_perc"],
        int(info.get("num_gpu_blocks", 0)), int(info.get("block_size", 0)), cache_dtype, element,
        replace(geometry, dtype_bytes=element).token_bytes,
        int(values["vllm:num_requests_running"]), int(values["vllm:num_requests_waiting"]),
        values.get("vllm:prefix_cache_queries_total", 0.0), values.get("vllm:prefix_cache_hits_total", 0.0),
        values.get("vllm:num_preemptions_total", 0.0))


class VllmClient:
    """HTTP to one vLLM server. `geometry`: the served model's KV layout (the app's copy of the same checkpoint);
    the server's cache dtype replaces its dtype."""

    def __init__(self, url: str, geometry: KVGeometry, timeout: float = 60.0, metrics_timeout: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.geometry = geometry
        self.timeout = httpx.Timeout(timeout, connect=3.0)
        self.metrics_timeout = httpx.Timeout(metrics_timeout, connect=3.0)
        self._poller_lock = threading.Lock()
        self._poller: GaugePoller | None = None
        self._pollers_users = 0

    def _error(self, e: Exception) -> BackendError:
        if isinstance(e, httpx.ConnectError):
            return BackendError(f"连不上 vLLM 服务（{self.url}）：请确认它已启动（bash scripts/vllm_serve.sh），"
                                f"或取消勾选 vLLM，改用本进程模式。 (cannot connect to {self.url}: {e})")
        if isinstance(e, httpx.TimeoutException):
            return BackendError(f"vLLM 服务响应超时，可能正忙，请稍后再试。 (timed out: {type(e).__name__})")
        if isinstance(e, httpx.HTTPStatusError):
            return self._refused(e.response.status_code, e.response.text)
        return BackendError(f"vLLM 服务的回复无法解析，请稍后再试。 ({type(e).__name__}: {e})")

    @staticmethod
    def _refused(code: object, detail: object) -> BackendError:
        """The server said no: an HTTP error status, or an error event inside a stream (how vLLM reports a
        request it refuses once streaming has begun, e.g. a malformed couplet spec: code 400)."""
        return BackendError(f"vLLM 服务返回错误（HTTP {code}），请稍后再试。 ({str(detail)[:200]})")

    def gauges(self) -> EngineGauges:
        try:
            r = httpx.get(f"{self.url}/metrics", timeout=self.metrics_timeout)
            r.raise_for_status()
            return parse_metrics(r.text, self.geometry)
        except FAILURES as e:
            raise self._error(e) from None

    @contextmanager
    def polling(self, interval: float = 0.1) -> Iterator[GaugePoller]:
        """The client's one gauge poller, shared by every request streaming at the moment (N visitors still
        make one `/metrics` read per interval); started by the first user, stopped after the last."""
        with self._poller_lock:
            if self._poller is None:
                self._poller = GaugePoller(self, interval).start()
            self._pollers_users += 1
            poller = self._poller
        try:
            yield poller
        finally:
            with self._poller_lock:
                self._pollers_users -= 1
                if self._pollers_users == 0 and self._poller is not None:
                    self._poller.stop()
                    self._poller = None

    def stream_tokens(self, prompt: list[int], spec: RowSpec, temperature: float, top_p: float, seed: int,
                      stop: threading.Event | None = None) -> Iterator[list[int]]:
        """The generated token ids, a chunk at a time, for one prompt under the couplet rules. Setting `stop`
        ends the stream between chunks and closes the connection (vLLM then aborts the request)."""
        body = {"model": SERVED_MODEL, "prompt": prompt, "max_tokens": spec.new_tokens, "temperature": temperature,
                "top_p": top_p, "seed": seed, "stream": True, "return_token_ids": True,
                "vllm_xargs": {SPEC_KEY: spec.to_json()}}
        got = 0
        try:
            with httpx.stream("POST", f"{self.url}/v1/completions", json=body, timeout=self.timeout) as r:
                if r.status_code >= 400:
                    r.read()
                    r.raise_for_status()
                for line in r.iter_lines():
                    if stop is not None and stop.is_set():
                        return
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        error = chunk["error"]
                        code = error.get("code") if isinstance(error, dict) else None
                        message = error.get("message", error) if isinstance(error, dict) else error
                        raise self._refused(code or "?", message)
                    ids = [int(t) for t in chunk["choices"][0].get("token_ids") or []]
                    got += len(ids)
                    if ids:
                        yield ids
        except FAILURES as e:
            raise self._error(e) from None
        if got != spec.new_tokens:
            raise self._error(ValueError(f"{got} tokens for {spec.new_tokens} asked"))


class GaugePoller:
    """Reads the gauges every `interval` seconds in a thread while in use (`with`): `latest` and `samples`.
    A failed read keeps the last good one (the couplet does not depend on the chart's figures). The server
    renders `/metrics` on its request loop (~15 ms idle on 2 cores): every 100 ms is a light load."""

    def __init__(self, client: VllmClient, interval: float = 0.1) -> None:
        self.client, self.interval = client, interval
        self.latest: EngineGauges | None = None
        self.samples: list[EngineGauges] = []
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def poke(self) -> None:
        """Read now (a request's first token: it is surely running then), not at the next tick."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.latest = self.client.gauges()
                self.samples.append(self.latest)
            except BackendError:
                pass
            self._wake.wait(self.interval)
            self._wake.clear()

    def start(self) -> GaugePoller:
        """One read now (so `latest` is there from the start), then the thread."""
        try:
            self.latest = self.client.gauges()
            self.samples.append(self.latest)
        except BackendError:
            pass
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the thread after its current read (at most the client's metrics timeout); does not wait."""
        self._stop.set()
        self._wake.set()

    def __enter__(self) -> GaugePoller:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


@dataclass
class RemoteProgress(Progress):
    gauges: EngineGauges | None = None  # the engine's gauges when this step arrived (engine-wide)


def prompt_for(lm: LoadedModel, prep: Prepared) -> list[int]:
    """The prompt sent: the local one; for 对下联 the given 上联 and the line break follow it (the server then
    writes the 下联 only — what the local loop computes too, character by character)."""
    if not prep.duixia:
        return list(prep.prompt)
    return [*prep.prompt, *lm.char_ids(prep.keywords.text), *lm.family.line_break]


def decode(client: VllmClient, lm: LoadedModel, prep: Prepared, mode: str = VLLM_MODE,
           poll_interval: float = 0.1) -> Iterator[RemoteProgress]:
    """One couplet through the server, as `couplet.serving.generate.decode` yields it: the prefill (when the first
    token arrives), then one Progress per character (the line break rides with the last 上联 one); the last
    carries the result. The records' KV bytes are the engine's gauge (all requests), labelled as such."""
    if lm.family.encoder_decoder:
        raise BackendError("vLLM 后端只接仅解码器模型；编码器—解码器模型请用本进程模式。 "
                           "(the vLLM backend serves decoder-only families)")
    spec = spec_for(prep, lm.family)
    prompt = prompt_for(lm, prep)
    request = prep.request
    step, finished = 0, False
    records: list[StepRecord] = []
    ids: list[int] = []
    lines = [spec.given_upper, ""]  # the lines after the tokens so far
    t0 = last = time.perf_counter()
    # The HTTP stream is read in a thread, so arrival times are the server's pace, not the consumer's (the page
    # advances this stream in lockstep with slower in-process modes). Closing this generator stops the reader.
    # (arrival time, token ids, the gauges as they stood then) — the consumer may come by much later
    arrived: queue.Queue[tuple[float, list[int], EngineGauges | None] | BackendError | None] = queue.Queue()
    stop = threading.Event()
    with client.polling(poll_interval) as poller:
        def read() -> None:
            try:
                for chunk in client.stream_tokens(prompt, spec, request.temperature, request.top_p, request.seed,
                                                  stop):
                    arrived.put((time.perf_counter(), chunk, poller.latest))
                    poller.poke()
            except Exception as e:  # noqa: BLE001 - whatever it is, the consumer gets a BackendError, never a hang
                arrived.put(e if isinstance(e, BackendError) else client._error(e))
            finally:
                arrived.put(None)

        def record(char: str, fed: int, now: float, lines: list[str], g: EngineGauges | None) -> RemoteProgress:
            nonlocal last, step
            logical = len(prompt) + fed
            block = g.block_size if g and g.block_size else 1
            # Paged: a request holds whole blocks. The KV bytes are the engine's gauge (every request it holds,
            # labelled so wherever shown); the prompt tokens the prefix cache answered are in its counters, not
            # per request, so the prefill's computed_tokens is left 0 (unknown), not the prompt's length.
            rec = StepRecord(mode, step, char, logical, math.ceil(logical / block) * block, g.kv_bytes if g else 0,
                             0, 0, None, None, now - last, 0)
            last = now
            step += 1
            records.append(rec)
            return RemoteProgress(mode, lines[0], lines[1], rec, gauges=g)

        threading.Thread(target=read, daemon=True).start()
        try:
            while (item := arrived.get()) is not None:
                if isinstance(item, BackendError):
                    raise item
                now, chunk, gauges = item
                for t in chunk:
                    if step == 0:
                        yield record("", 0, now, ["", ""], gauges)  # the prefill: what arrived first
                    before = lines
                    ids.append(t)
                    lines, line, _ = spec.split(ids, lm.id_to_char)
                    if lines == before:
                        continue  # a line-break token: it rides with the last 上联 character, as in the local loop
                    char = lines[line][-1] if lines[line] else ""
                    if not is_han(char) or len(lines[line]) > spec.length:
                        raise client._error(ValueError(f"token {t} is not a couplet character here"))
                    progress = record(char, len(ids), now, lines, gauges)
                    if line == 1 and len(lines[1]) == spec.length:
                        progress.result = finish(lm, prep, mode, lines[0], lines[1], records)
                        progress.result.seconds = now - t0  # request sent → last character arrived
                        finished = True
                    yield progress
            if not finished:
                raise client._error(ValueError("the reply ended before the couplet did"))
        finally:
            stop.set()


def generate(client: VllmClient, lm: LoadedModel, prep: Prepared) -> CoupletResult:
    """The finished couplet from the server (the CLI's `--backend vllm`)."""
    *_, last = decode(client, lm, prep)
    assert last.result is not None
    return last.result
