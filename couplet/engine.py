"""A serving engine: one background worker owns the model and runs batched forwards for many visitors,
admitting them by KV-memory budget.

    engine = Engine(lm, EngineConfig(kv_budget_mb=8))
    for state in engine.stream(CoupletRequest("龙马精神"), ["full", "combo"]):   # like stream_modes
        ...
    engine.close()

A request is (couplet request, mode). Requests of the same mode and line length that are admitted together
form a *wave*: one left-padded batch in one session (`generate.Decoding`), prefilled together and decoded
in lockstep — every couplet of a given length has the same number of steps, so a wave starts and ends
together. The worker advances every live wave by one step per round, so waves of different modes and
arrival times interleave. Each wave's rows stream their progress back to their own tickets.

Continuous batching (`continuous`, on by default) for the modes whose cache is plain (`full`): once prefilled,
a wave joins the running batch of its mode and line length (`Decoding.join`: the shorter cache left-padded
to the other's width), each row decoding on at its own step, and a row leaves the batch as soon as its
couplet is written or its visitor leaves — so waves that arrived at different times cost one forward per
step, not one each. A compressed mode's store (quantized groups, retention scores, pool blocks) has no join:
its waves run side by side. Measured against waves (README, engine): the same or more throughput, lower TTFT
and end-to-end latency; a joining wave's prefill stalls the batch's step, so TPOT rises at high concurrency.
`prefill_chunk` (off by default) feeds a plain-cache wave's prompts a chunk per round instead, between the
batch's steps: TPOT back down, TTFT and end-to-end latency up (measured in the README).

Admission: a request reserves the KV bytes it can own (`Composition.owned_peak_bytes`: its prefill, during
which the prompt is held at full precision — a quantized store's in its format, but for one layer — then its
steady peak under its mode); it is admitted when the reservation fits beside what the admitted requests
reserve, in arrival order — while other waves run, only as a wave of at least `min_wave` rows (or every
request waiting), since each wave costs one forward per step and small waves started in the room freed by
each prefill multiply them. Past `max_waiting` waiting
requests, `submit` refuses with `EngineBusy` (a Chinese message for the page). The prefix pool is the
engine's own, inside the total: requests get `kv_budget - pool budget`.

A cancelled request (the visitor left) stops receiving progress; its wave ends early if all its rows are
cancelled, and the wave's session is closed when it ends, releasing its pool blocks.

Finishing runs on a second thread. When a wave's last step is written, its cache is closed and its
reservation returned at once; choosing each row's 横批 (`hengpi`: the couplet's ~20-token prefix, then 12
candidates of 5 tokens each over its KV) is handed to the finisher, which delivers each
row's last Progress, with its result, as soon as that row's 横批 is chosen. The model's worker meanwhile
prefills and decodes the next waves — a pipeline, as vLLM's output processor runs beside its engine core.
When the worker has no wave to advance and nobody waiting, it takes rows from the finisher's queue too
(work stealing), so the 横批 left at the end of a burst are chosen on both cores.
"""

from __future__ import annotations

import hashlib
import queue
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from couplet.events import CoupletResult
from couplet.generate import CoupletRequest, Decoding, Prepared, Progress, Round, lockstep, prepare
from couplet.kvcache import PrefixPool, make_mode, parse_modes
from couplet.kvcache.layer import KVGeometry
from couplet.kvcache.pool import Lease, chain_keys
from couplet.kvcache.sharing import model_namespace
from couplet.lexicon import DEFAULT_VOICE, VoiceConfig
from couplet.model import LoadedModel
from couplet.prompt import DEFAULT_PROMPT, HouseCouplet, PromptConfig

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
    # for 64 (README, "GPU check"); on CPU too the waiting paid for itself (README, serving engine). 1:
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
    # False: waves only. Measured against waves in the README (serving engine).
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

    @property
    def in_use_bytes(self) -> int:
        """What the caches and the pool blocks they reference hold: the KV in use, against `full_bytes`."""
        return self.kv_bytes + self.pool_used_bytes


class Engine:
    """See the module docstring. Thread-safe: submit from any thread; one worker thread runs the model."""

    def __init__(self, lm: LoadedModel, config: EngineConfig | None = None) -> None:
        self.lm, self.config = lm, config or EngineConfig()
        self.pool = PrefixPool(max_bytes=int(self.config.pool_mb * MB))
        self.budget = int((self.config.kv_budget_mb - self.config.pool_mb) * MB)
        self.geometry = KVGeometry.of(lm.model)
        self._house_tokens: dict[tuple[HouseCouplet, ...], int] = {}
        self._waiting: deque[Ticket] = deque()
        self._waves: list[Wave] = []
        self._reserved = 0
        self._peak_reserved = 0
        self._peak_in_flight = 0
        self._forwards = self._rounds = 0
        self._finishing = 0
        self._lock = threading.Condition()
        self._closed = False
        # (the row's result maker, `Decoding.finisher`; its ticket; its last Progress) for the finisher, and for
        # the worker when it is idle; None stops the finisher
        self._to_finish: queue.Queue[tuple[Callable[[Progress], None], Ticket, Progress] | None] = queue.Queue()
        self._worker = threading.Thread(target=self._run, name="couplet-engine", daemon=True)
        self._finisher = threading.Thread(target=self._run_finisher, name="couplet-finisher", daemon=True)
        self._worker.start()
        self._finisher.start()

    # ---- the caller's side ----
    def submit(self, request: CoupletRequest, mode: str, prompt: PromptConfig = DEFAULT_PROMPT,
               voice: VoiceConfig = DEFAULT_VOICE, prep: Prepared | None = None) -> Ticket:
        """Queue one request; raises CoupletInputError for bad input, ValueError for a mode this model's family
        cannot run (the reason in Chinese), EngineBusy when the queue is full."""
        parse_modes([mode], allow_all=False)
        if (refusal := self.lm.family.mode_refusal(mode)) is not None:
            raise ValueError(refusal)
        prep = prep or prepare(self.lm, request, prompt, voice)
        total = self._whole_length(prep)
        shared = self._shared_prefix(prep.context.house)
        prefill, decode = make_mode(mode).compose().owned_peak_bytes(len(prep.prompt), total, self.geometry,
                                                                     shared_prefix=shared)
        ticket = Ticket(prep, mode, max(prefill, decode), decode)  # the prefill may be the smaller (full)
        if self.config.prefix_wave and make_mode(mode).compose().sharing is not None:
            ticket.prompt_id = hashlib.blake2b(f"{mode}|{prep.length}|{prep.duixia}".encode()
                                               + bytes(str(prep.prompt), "ascii"), digest_size=16).digest()
        if max(prefill, decode) > self.budget:
            raise EngineBusy(f"{BUSY_MESSAGE}（单个请求需 {max(prefill, decode) / MB:.1f} MB，超出总预算）")
        with self._lock:
            if self._closed:
                raise RuntimeError("engine is closed")
            if len(self._waiting) >= self.config.max_waiting:
                raise EngineBusy(BUSY_MESSAGE)
            self._waiting.append(ticket)
            self._lock.notify_all()
        return ticket

    def _shared_prefix(self, house: tuple[HouseCouplet, ...]) -> int:
        """Prompt tokens every request with this house prefix shares (`<bos>` + the house), tokenized once."""
        if house not in self._house_tokens:
            self._house_tokens[house] = self.lm.family.shared_prefix(house)
        return self._house_tokens[house]

    def stream(self, request: CoupletRequest, modes: Sequence[str], prompt: PromptConfig = DEFAULT_PROMPT,
               voice: VoiceConfig = DEFAULT_VOICE,
               remote: Mapping[str, Callable[[Prepared], Iterator[Progress]]] | None = None) -> Iterator[Round]:
        """One request under several modes, as `generate.stream_modes` yields it (a Round per step of the
        slowest mode), served by the engine; closing the iterator cancels what has not finished. `remote`:
        more streams of the same prepared request from other backends ({mode: decode(prep)}, `couplet.serving`),
        advanced in the same lockstep."""
        prep = prepare(self.lm, request, prompt, voice)
        tickets: dict[str, Ticket] = {}
        streams: dict[str, Iterator[Progress]] = {}
        try:
            # submitted one by one inside the try: a mode refused (busy, over budget, unknown) or a remote stream
            # that fails to start cancels the modes already queued, which no one would read
            for m in modes:
                tickets[m] = self.submit(request, m, prep=prep)
                streams[m] = iter(tickets[m])
            for m, make in (remote or {}).items():
                streams[m] = make(prep)
            yield from lockstep(streams)
        finally:
            for t in tickets.values():
                t.cancel()
            for m in remote or {}:  # a remote stream closed here stops its reader and its HTTP request
                close = getattr(streams.get(m), "close", None)
                if close is not None:
                    close()

    def generate(self, request: CoupletRequest, mode: str = "full") -> CoupletResult:
        """One couplet through the engine (waits for admission)."""
        *_, last = self.submit(request, mode)
        assert last.result is not None
        return last.result

    def stats(self) -> EngineStats:
        with self._lock:
            tickets = [t for w in self._waves for t in w.tickets]
            kv = sum(t.kv_bytes for t in tickets)
            # KV in use against unshared counts the waves past their prefill on both sides: an admitted wave
            # references (or leases) its pool blocks before its tokens are counted
            started = [w for w in self._waves if w.started]
            blocks = {id(b): b for w in started for b in w.decoding.pool_blocks()}  # each block once
            return EngineStats(len(tickets), len(self._waiting), self._reserved, kv, self.pool.nbytes,
                               self.pool.total_refs(), self._peak_in_flight, self._peak_reserved,
                               self._forwards, self._rounds, self._finishing,
                               sum(b.nbytes for b in blocks.values()),
                               sum(t.full_bytes for w in started for t in w.tickets))

    def close(self, timeout: float = 30.0) -> None:
        """Stop: every request not yet written ends with an error; rows already written still get their 横批.
        Waits up to `timeout` for each thread; a worker still inside a long forward stops after it, and the
        finisher after the rows that forward hands over."""
        with self._lock:
            self._closed = True
            self._lock.notify_all()
        self._worker.join(timeout=timeout)
        self._finisher.join(timeout=timeout)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- the worker ----
    def _run(self) -> None:
        try:
            self._serve()
        finally:  # the finisher's stop comes from here, after every row the worker handed over: those still end
            self._to_finish.put(None)

    def _serve(self) -> None:
        while True:
            with self._lock:
                while not self._closed and not self._waves and not self._waiting and self._to_finish.empty():
                    self._lock.wait()
                if self._closed:
                    self._fail_all(RuntimeError("engine closed"))
                    return
                idle = not self._waves and not self._waiting
                if not idle:
                    try:
                        self._admit()
                    except Exception as e:  # never a silent dead worker: everyone waiting hears of it
                        self._fail_all(e)
                        continue
                    waves = list(self._waves)
                    self._rounds += bool(waves)
            if idle:  # nothing to prefill or decode: choose a 横批 beside the finisher (a burst's tail)
                self._help_finish()
                continue
            for wave in waves:
                if wave in self._waves:  # not joined into another this round, nor ended
                    self._advance(wave)

    def _help_finish(self) -> None:
        """One row from the finisher's queue, on the worker (work stealing): only the worker puts rows there,
        so an idle worker sees all of them; the next request's arrival waits for at most this one row."""
        try:
            item = self._to_finish.get_nowait()
        except queue.Empty:  # the finisher took the last one
            return
        if item is None:  # the finisher's stop (the worker puts it only as it exits): leave it for the finisher
            self._to_finish.put(None)
            return
        self._finish_row(*item)

    def _admit(self) -> None:
        """Admit waiting requests in arrival order while their reservation fits; those of one mode and length
        admitted in the same round share a wave. While other waves run, a round too small (`wave_floor`) waits
        for a fuller one. A wave is left-padded to its longest prompt, so each of its
        rows reserves what its largest row does (padding slots take memory too). An encoder–decoder's waves
        also hold one task. A pool mode's request whose very prompt at least `prefix_wave` requests are
        waiting with takes them all (up to `max_batch`) into a cache-aware wave of their own (`_prompt_wave`)."""
        if any(t.cancelled.is_set() for t in self._waiting):  # visitors who left while waiting: gone
            kept: deque[Ticket] = deque()
            for t in self._waiting:
                if t.cancelled.is_set():
                    t.events.put(None)
                else:
                    kept.append(t)
            self._waiting = kept
        same: dict[bytes, list[Ticket]] = {}  # waiting requests by prompt (pool modes), in arrival order
        if self.config.prefix_wave:
            for t in self._waiting:
                if t.prompt_id is not None:
                    same.setdefault(t.prompt_id, []).append(t)
        new: dict[tuple[str, int, bool], list[Ticket]] = {}
        own: list[tuple[list[Ticket], Lease, int, int]] = []  # cache-aware waves: rows, lease, reservations
        placed: set[int] = set()
        by_task = self.lm.family.encoder_decoder  # its 对下联 rows feed no 上联: a wave of one task
        taken, reserve = 0, 0  # planned first: nothing is admitted if the round is too small (min_wave)
        try:
            for t in self._waiting:
                if id(t) in placed:
                    continue
                family = same.get(t.prompt_id) if t.prompt_id is not None else None
                if family is not None and len(family) >= self.config.prefix_wave:
                    rows = [x for x in family if id(x) not in placed][: self.config.max_batch]
                    planned = self._prompt_wave(rows, self.budget - self._reserved - reserve)
                    if planned is not None:
                        own.append(planned)
                        placed.update(id(x) for x in planned[0])
                        taken, reserve = taken + len(planned[0]), reserve + len(planned[0]) * planned[2]
                        continue
                group = new.setdefault((t.mode, t.prep.length, by_task and t.prep.duixia), [])
                before = len(group) * max((g.reserve_prefill for g in group), default=0)
                after = (len(group) + 1) * max([t.reserve_prefill, *(g.reserve_prefill for g in group)])
                if len(group) >= self.config.max_batch or self._reserved + reserve + after - before > self.budget:
                    break
                group.append(t)
                placed.add(id(t))
                taken, reserve = taken + 1, reserve + after - before
        except BaseException:  # nothing admitted: the leases taken for this round's cache-aware waves go back
            for planned in own:
                self.pool.end_lease(planned[1])
            raise
        if self._waves and taken < min(self.config.wave_floor, len(self._waiting)):
            for planned in own:
                self.pool.end_lease(planned[1])
            return  # wait for a wave to end and free room for a fuller one
        now = time.perf_counter()
        self._waiting = deque(t for t in self._waiting if id(t) not in placed)
        self._reserved += reserve
        waves: list[tuple[list[Ticket], Lease | None]] = [(g, None) for g in new.values() if g]
        for rows, held, prefill, decode in own:
            for t in rows:
                t.reserve_prefill, t.reserve_decode = prefill, decode
            waves.append((rows, held))
        for group, lease in waves:
            top_prefill = max(t.reserve_prefill for t in group)
            top_decode = max(t.reserve_decode for t in group)
            for t in group:
                t.admitted = now
                t.reserve_prefill, t.reserve_decode = top_prefill, top_decode
                t.reserved = t.peak_reserved = top_prefill
            try:
                decoding = Decoding(self.lm, [t.prep for t in group], group[0].mode, self.pool,
                                    finish_inline=False)
            except Exception as e:  # admitted, so no longer waiting: this wave's visitors hear of it here
                if lease is not None:
                    self.pool.end_lease(lease)
                for t in group:
                    self._reserved -= t.reserved
                    t.reserved = 0
                    t.events.put(e)
                continue
            self._waves.append(Wave(decoding, group, lease=lease))
        in_flight = sum(len(w.tickets) for w in self._waves)
        self._peak_in_flight = max(self._peak_in_flight, in_flight)
        self._peak_reserved = max(self._peak_reserved, self._reserved)

    def _prompt_wave(self, rows: list[Ticket], room: int) -> tuple[list[Ticket], Lease, int, int] | None:
        """A cache-aware wave of requests with one prompt: as many of `rows` as fit `room`, with a pool lease on
        every whole block of the prompt, and what each row reserves then (prefill, decode). None if not one row
        fits or the pool cannot lease the blocks (they then queue as any request)."""
        head = rows[0]
        parts = make_mode(head.mode).compose()
        assert parts.sharing is not None
        prompt = head.prep.prompt
        total = self._whole_length(head.prep)
        prefill, decode = parts.owned_peak_bytes(len(prompt), total, self.geometry, leased=True)
        per_row = max(prefill, decode)
        # the blocks are computed once for the wave, in a scratch cache at full precision: shared by its rows
        scratch = parts.scratch_tokens(len(prompt)) * self.geometry.token_bytes
        n = len(rows)
        while n and n * per_row + scratch > room:
            n -= 1
        if not n:
            return None
        bs = parts.sharing.block_size
        namespace = model_namespace(self.lm.model, parts.storage.codec(), bs)
        keys = chain_keys(namespace, prompt, bs)[: (len(prompt) - 1) // bs]  # one token is always computed
        lease = self.pool.lease(keys, parts.block_bytes(self.geometry))
        if lease is None:
            return None
        return rows[:n], lease, per_row + -(-scratch // n), decode

    def _advance(self, wave: Wave) -> None:
        """One call of the wave's decoding (its prefill, or one step), streamed to its tickets."""
        if all(t.cancelled.is_set() for t in wave.tickets):
            self._finish(wave, None)
            return
        prefill = not wave.started
        self._forwards += 1  # only the worker writes it; a wave whose rows all left (above) runs none
        try:
            out = wave.decoding.prefill(self.config.prefill_chunk or None) if prefill else wave.decoding.step()
        except Exception as e:  # a failure must reach this wave's visitors, not kill the worker
            self._finish(wave, e)
            return
        if out is None:  # a chunk of its prefill: the rest in the next rounds, between the other waves' steps
            return
        wave.started = True
        now = time.perf_counter()
        last = wave.decoding.done  # its Progress goes out with the result, from the finisher
        written = set(wave.decoding.finished_rows)  # a joined batch's rows finish at different steps
        for r, (t, p) in enumerate(zip(wave.tickets, out, strict=True)):
            t.kv_bytes, t.full_bytes = p.record.kv_bytes, p.record.full_equivalent_bytes
            if t.first_token is None and p.record.step == 1:
                t.first_token = now
            if not t.cancelled.is_set() and r not in written:
                t.events.put(p)
        if prefill:
            if wave.lease is not None:  # its rows reference the blocks themselves now
                self.pool.end_lease(wave.lease)
                wave.lease = None
            with self._lock:  # the prefill is over: each row now reserves its steady peak only
                for t in wave.tickets:
                    self._reserved += t.reserve_decode - t.reserved
                    t.reserved = t.reserve_decode
                    t.peak_reserved = max(t.peak_reserved, t.reserved)
            if self.config.continuous and wave.decoding.joinable:
                self._join(wave)
                return
        if last:
            self._finish(wave, None, out)
        elif self.config.continuous and wave.decoding.joinable \
                and (written or any(t.cancelled.is_set() for t in wave.tickets)):
            try:
                self._leave(wave, written, out)
            except Exception as e:  # a batch that could not drop its rows cannot step on: its visitors hear why
                self._finish(wave, e)

    def _whole_length(self, prep: Prepared) -> int:
        """The tokens a request's cache holds at its end: its prompt, both lines and the line break (the last
        character is never fed; a break of several tokens, as the chat families', counts whole)."""
        return len(prep.prompt) + 2 * prep.length + len(self.lm.family.line_break) - 1

    def _join_reserve(self, width: int, length: int, rows: Sequence[tuple[int, int]]) -> list[int]:
        """What each row of a joined batch reserves, given every row's next (line, position): it holds the
        batch's width, which grows by a slot per step, and by the line break's tokens at each step where some
        row ends its 上联 (the others are padded to it; rows at one position break together), until it leaves —
        at most the width now, plus its own remaining steps, plus every line break still ahead, whoever leaves
        meanwhile (a join recomputes it)."""
        breaks = len(self.lm.family.line_break) * len({pos for line, pos in rows if line == 0})
        return [(width + 2 * length - (line * length + pos) + breaks) * self.geometry.token_bytes
                for line, pos in rows]

    def _join(self, wave: Wave) -> None:
        """A prefilled wave joins the running batch of its mode and line length whose joined reservation fits
        (the largest), or runs on as a batch of its own. Only the worker changes waves and reservations, so the
        tensors are joined outside the lock; the tickets and reservations move under it."""
        hosts = sorted((w for w in self._waves if w is not wave and w.started and w.decoding.preps
                        and w.decoding.mode == wave.decoding.mode and w.decoding.length == wave.decoding.length
                        and w.decoding.joinable), key=lambda w: -len(w.tickets))
        for host in hosts:
            width = max(host.decoding.width, wave.decoding.width)
            need = self._join_reserve(width, wave.decoding.length, host.decoding.next + wave.decoding.next)
            held = sum(t.reserved for t in host.tickets + wave.tickets)
            if self._reserved - held + sum(need) <= self.budget:
                break
        else:
            return
        try:
            host.decoding.join(wave.decoding)
        except Exception as e:  # a half-done join (out of memory) leaves both batches unusable: both hear of it
            self._finish(host, e)
            self._finish(wave, e)
            return
        with self._lock:
            host.tickets += wave.tickets
            self._waves.remove(wave)
            self._set_reserved(host)

    def _set_reserved(self, wave: Wave, lower_only: bool = False) -> None:
        """A joined batch's reservations, per row (`_join_reserve`); under the lock. `lower_only` (rows left):
        a row keeps what it reserved if that is less — its batch only narrows when rows leave, and a wave that
        never joined keeps its own reservation."""
        d = wave.decoding
        for t, need in zip(wave.tickets, self._join_reserve(d.width, d.length, d.next), strict=True):
            need = min(need, t.reserved) if lower_only else need
            self._reserved += need - t.reserved
            t.reserved = need
            t.peak_reserved = max(t.peak_reserved, need)
        self._peak_reserved = max(self._peak_reserved, self._reserved)

    def _leave(self, wave: Wave, written: set[int], out: list[Progress]) -> None:
        """Rows leave a joined batch between steps: those whose couplet is written (to the finisher, for their
        横批) and those whose visitor left; what they reserved is returned at once. The rows are dropped from
        the batch first (outside the lock: only the worker changes it), so a failure changes no ticket."""
        gone = written | {r for r, t in enumerate(wave.tickets) if t.cancelled.is_set()}
        makers = {r: wave.decoding.finisher(r) for r in written}  # bound before the rows go
        wave.decoding.drop(sorted(gone))
        with self._lock:
            handed = self._end_rows(wave, sorted(gone), makers, out, None)
            wave.tickets = [t for r, t in enumerate(wave.tickets) if r not in gone]
            self._set_reserved(wave, lower_only=True)
        for item in handed:
            self._to_finish.put(item)

    def _end_rows(self, wave: Wave, rows: Sequence[int], makers: Mapping[int, Callable[[Progress], None]],
                  out: Sequence[Progress] | None, error: BaseException | None
                  ) -> list[tuple[Callable[[Progress], None], Ticket, Progress]]:
        """Under the lock: these rows' reservations returned; a row whose couplet is written (`makers`: its
        result maker) and still wanted is handed to the finisher (returned, to be queued outside the lock);
        every other ticket ends here, with `error`."""
        now = time.perf_counter()
        handed = []
        for r in rows:
            t = wave.tickets[r]
            self._reserved -= t.reserved
            t.reserved = t.kv_bytes = t.full_bytes = 0
            if r in makers:
                t.decoded = now
                if not t.cancelled.is_set():
                    assert out is not None
                    handed.append((makers[r], t, out[r]))
                    continue
            t.finished = now
            t.events.put(error)
        self._finishing += len(handed)
        return handed

    def _finish(self, wave: Wave, error: BaseException | None, last: list[Progress] | None = None) -> None:
        """The wave is over: its cache closed, its reservation returned. With `last` (it wrote its couplets) the
        rows still wanted go to the finisher for their 横批; every other ticket ends here, with `error`."""
        with self._lock:  # out of `stats()` first: its tickets' bytes and its pool blocks leave together
            self._waves.remove(wave)
        wave.decoding.close()
        if wave.lease is not None:  # ended before its prefill
            self.pool.end_lease(wave.lease)
            wave.lease = None
        rows = range(len(wave.tickets))
        # its couplets written (a failed or abandoned wave wrote none)
        makers = {} if last is None else {r: wave.decoding.finisher(r) for r in rows}
        with self._lock:
            handed = self._end_rows(wave, rows, makers, last, error)
        for item in handed:
            self._to_finish.put(item)

    def _run_finisher(self) -> None:
        while (item := self._to_finish.get()) is not None:
            self._finish_row(*item)

    def _finish_row(self, attach: Callable[[Progress], None], t: Ticket, progress: Progress) -> None:
        """A handed row: its result (its 横批) attached, then its last Progress and the end delivered."""
        outcome: BaseException | None = None
        if not t.cancelled.is_set():  # a visitor who left meanwhile costs no scoring
            try:
                attach(progress)
                t.events.put(progress)
            except Exception as e:  # the row's visitor hears of it; the finisher goes on
                outcome = e
        t.finished = time.perf_counter()
        t.events.put(outcome)
        with self._lock:
            self._finishing -= 1

    def _fail_all(self, error: BaseException) -> None:
        """Under the lock: every admitted and waiting request ends with `error`, and what the admitted ones held
        (caches, pool references and leases, reservations) is returned, so that the engine serves on."""
        for wave in list(self._waves):
            wave.decoding.close()
            if wave.lease is not None:
                self.pool.end_lease(wave.lease)
                wave.lease = None
            self._end_rows(wave, range(len(wave.tickets)), {}, None, error)
        for t in self._waiting:
            t.events.put(error)
        self._waves.clear()
        self._waiting.clear()

