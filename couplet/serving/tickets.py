"""What the engine hands out and keeps: its configuration, a visitor's `Ticket` (one request's stream and
reservation), a `Wave` (rows decoded in one batch), and `EngineStats` (what it holds now)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from couplet.kvcache import Lease
from couplet.serving.generate import Decoding, Prepared, Progress

MB = 2**20
BUSY_MESSAGE = "此刻拜年的人太多，门前已排起长队，请稍候片刻再来。"


class EngineBusy(RuntimeError):
    """The waiting queue is full (or one request could never fit the budget)."""


@dataclass(frozen=True)
class EngineConfig:
    kv_budget_mb: float = 64.0  # everything the engine's KV caches may hold: requests + prefix pool
    pool_mb: float = 8.0  # the prefix pool's own budget, inside the total
    # Rows in one wave. A forward's fixed cost (Python, per-layer operations; on a GPU, launches) is paid per
    # wave per step: on CPU, 100 visitors at 14.05 MB, `combo` wrote 1.41x and 1.54x `full` with 64 against
    # 1.27x and 1.18x with 16 (two runs each way; 1.3 forwards per step against 3.75).
    max_batch: int = 64
    max_waiting: int = 256  # requests waiting for admission before `submit` refuses
    # While other waves run, a new wave starts only with at least this many rows (or with every request
    # waiting); None: half of max_batch. Every wave is one forward per step, and a request's prefill
    # reservation is larger than its steady one, so admitting whatever fits lets the room freed after each
    # prefill start a small wave of its own: the waves multiply (4-11 forwards per step at the default
    # budget on CPU, against 1.3 for `full`). A GPU's forward at this size costs about the same for 1 row as
    # for 64 (docs/results/gpu.md); on CPU too the waiting paid for itself (docs/results/serving.md). 1:
    # admit whatever fits at once.
    min_wave: int | None = None
    # Cache-aware waves (SGLang's longest-prefix-match scheduling, in waves): a pool mode's waiting requests
    # with the very same prompt (popular keywords: the same exemplars), at least this many, are admitted
    # together as a wave of their own, pulled forward from wherever they wait. Every whole block of their
    # prompt is then shared — a mixed wave shares only the house prefix — and since the pool leases room
    # for those blocks (`PrefixPool.lease`), each row reserves only the rest of its prompt and its couplet,
    # so many more fit the budget. 0: off (arrival order only).
    prefix_wave: int = 4
    # Continuous batching for the modes whose cache is plain (`full`): a wave, once prefilled, joins the running
    # batch of its mode and line length (`Decoding.join`: left-padded to one width), each row decoding on at
    # its own step and leaving when its couplet is written. Admission keeps the `min_wave` rule: joining in
    # groups stalls the batch for fewer prefills (min_wave=1: each newcomer joins as soon as it fits; on CPU,
    # 200 visitors at 12/s and 42 MB: 147 tok/s and TPOT p50 144 ms, against 154 and 101 with the rule).
    # False: waves only. Measured against waves in docs/results/serving.md.
    continuous: bool = True
    # Chunked prefill for the plain cache (Sarathi-Serve, vLLM's chunked prefill, one chunk per round): a new
    # wave's prompt is fed at most this many columns per forward, so the running batch steps between its
    # chunks instead of waiting for the whole prefill. 0: the whole prompt in one forward.
    prefill_chunk: int = 0

    def __post_init__(self) -> None:
        if not 0 <= self.pool_mb < self.kv_budget_mb:
            raise ValueError(f"pool_mb must be in [0, kv_budget_mb), got {self.pool_mb} of {self.kv_budget_mb}")
        if self.max_batch < 1 or self.max_waiting < 0 or (self.min_wave is not None and self.min_wave < 1) \
                or self.prefix_wave < 0 or self.prefill_chunk < 0:
            raise ValueError("max_batch and min_wave must be >= 1, max_waiting, prefix_wave and prefill_chunk >= 0")

    @property
    def wave_floor(self) -> int:
        """The rows a new wave needs while others run (`min_wave`, at most `max_batch`)."""
        return min(self.max_batch, self.min_wave if self.min_wave is not None else max(1, self.max_batch // 2))


@dataclass(eq=False)
class Ticket:
    """One submitted request: iterate it for its Progress, the last one with the result."""

    prep: Prepared
    mode: str
    reserve_prefill: int  # bytes reserved until the prefill ends
    reserve_decode: int  # and from then on
    submitted: float = field(default_factory=time.perf_counter)
    admitted: float | None = None
    first_token: float | None = None
    finished: float | None = None
    events: queue.Queue = field(default_factory=queue.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)
    decoded: float | None = None  # its couplet written (and its cache released); `finished`: the 横批 too
    reserved: int = 0  # bytes reserved now
    peak_reserved: int = 0  # the most it reserved at once (a joined row's reservation follows its batch's width)
    kv_bytes: int = 0  # what its cache holds, as of its last step
    full_bytes: int = 0  # the same tokens in a `full` cache, unshared (`StepRecord.full_equivalent_bytes`)
    prompt_id: bytes | None = None  # a pool mode's (mode, length, prompt) digest: who may share its whole prompt

    def cancel(self) -> None:
        self.cancelled.set()

    def __iter__(self) -> Iterator[Progress]:
        while True:
            item = self.events.get()
            if item is None:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


@dataclass(eq=False)
class Wave:
    decoding: Decoding
    tickets: list[Ticket]
    started: bool = False
    lease: Lease | None = None  # a cache-aware wave's pool room, held until its prefill has referenced the blocks


@dataclass(frozen=True)
class EngineStats:
    in_flight: int  # requests admitted and not finished
    waiting: int
    reserved_bytes: int  # what the admitted requests reserve
    kv_bytes: int  # what their caches hold now
    pool_bytes: int
    pool_refs: int
    peak_in_flight: int
    peak_reserved_bytes: int
    forwards: int = 0  # wave advances (one forward each: a prefill or a step)
    rounds: int = 0  # worker rounds that advanced at least one wave; forwards / rounds = waves per step
    finishing: int = 0  # couplets written (caches released) whose 横批 the finisher is still choosing
    pool_used_bytes: int = 0  # the pool blocks that requests past their prefill reference, each counted once
    full_bytes: int = 0  # those requests' tokens as unshared `full` caches would hold them
    steps: int = 0  # forwards that were decode steps (the rest of `forwards` are prefills)
    step_rounds: int = 0  # rounds with at least one decode step; steps / step_rounds = forwards per decode step

    @property
    def in_use_bytes(self) -> int:
        """What the caches and the pool blocks they reference hold: the KV in use, against `full_bytes`."""
        return self.kv_bytes + self.pool_used_bytes
