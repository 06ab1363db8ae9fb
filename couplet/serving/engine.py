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

Continuous batching (`continuous`, on by default), in every mode: once prefilled, a wave joins the running batch
of its mode and line length (`Decoding.join`: the narrower cache left-padded to the other's width; quantized
groups, retention scores and merged slots carried per row; with a prefix pool, the batch keeps the shorter
prefix and the longer's blocks beyond it become its rows' own slots), each row decoding on at its own step, and
a row leaves the batch as soon as its couplet is written or its visitor leaves — so waves that arrived at
different times cost one forward per step, not one each. Caches that cannot append (keys quantized per channel,
a sliding-window model's layers, quantized residuals of different lengths) run side by side. Measured against
waves (docs/results/serving.md): the same or more throughput, lower TTFT and end-to-end latency; a joining
wave's prefill stalls the batch's step, so TPOT rises at high concurrency.
`prefill_chunk` (off by default) feeds a plain-cache wave's prompts a chunk per round instead, between the
batch's steps: TPOT back down, TTFT and end-to-end latency up (docs/results/serving.md).

Admission (`admission.py`): a request reserves the KV bytes it can own, its prefill and then its steady peak
under its mode, and is admitted when that fits beside what the admitted requests reserve, in arrival order.
Past `max_waiting` waiting requests, `submit` refuses with `EngineBusy` (a Chinese message for the page). The
prefix pool is the engine's own, inside the total: requests get `kv_budget - pool budget`.

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

from couplet.events import CoupletResult
from couplet.kvcache import KVGeometry, PrefixPool, make_mode, parse_modes
from couplet.models.loading import LoadedModel
from couplet.serving.admission import Admission
from couplet.serving.best_of import BestOf, drafted, prepared_drafts
from couplet.serving.generate import CoupletRequest, Prepared, crown, prepare
from couplet.serving.progress import Progress, Round, lockstep
from couplet.serving.tickets import BUSY_MESSAGE, MB, EngineBusy, EngineConfig, EngineStats, Ticket, Wave
from couplet.writing.lexicon import DEFAULT_VOICE, VoiceConfig
from couplet.writing.prompt import DEFAULT_PROMPT, HouseCouplet, PromptConfig

__all__ = ["BUSY_MESSAGE", "Engine", "EngineBusy", "EngineConfig", "EngineStats", "Ticket"]

class Engine(Admission):
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
        self._forwards = self._rounds = self._steps = self._step_rounds = 0
        self._finishing = 0
        self._closing = 0  # rows of waves out of `_waves` not yet returned (cache, pool, reservation): in flight
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
        parts = make_mode(mode).compose()
        prefill, decode = parts.owned_peak_bytes(len(prep.prompt), total, self.geometry, shared_prefix=shared)
        ticket = Ticket(prep, mode, max(prefill, decode), decode)  # the prefill may be the smaller (full)
        if self.config.prefix_wave and parts.sharing is not None:
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

    def stream(self, request: CoupletRequest, modes: Sequence[str], prompt: PromptConfig = DEFAULT_PROMPT,
               voice: VoiceConfig = DEFAULT_VOICE,
               remote: Mapping[str, Callable[[Prepared], Iterator[Progress]]] | None = None,
               best: BestOf | None = None) -> Iterator[Round]:
        """One request under several modes, as `generate.stream_modes` yields it (a Round per step of the
        slowest mode), served by the engine; closing the iterator cancels what has not finished. `remote`:
        more streams of the same prepared request from other backends ({mode: decode(prep)},
        `couplet.serving.backends`), advanced in the same lockstep. `best` (n > 1): each in-process mode writes
        n drafts: draft 0 first, the others submitted once it is prefilled (they join its running batch and,
        with a pool, share the prompt's blocks, as vLLM's parallel sampling `n` does); the mode's stream is
        draft 0's, and its last Progress the best draft's (`best_of.drafted`)."""
        requests, preps = prepared_drafts(self.lm, request, best, prompt, voice)
        tickets: list[Ticket] = []
        streams: dict[str, Iterator[Progress]] = {}
        try:
            # submitted one by one inside the try: a mode refused (busy, over budget, unknown) or a remote stream
            # that fails to start cancels the modes already queued, which no one would read
            for m in modes:
                tickets.append(self.submit(request, m, prep=preps[0]))
                streams[m] = iter(tickets[-1])
                if best is not None and best.n > 1:
                    def rest(m: str = m) -> list[Iterator[Progress]]:  # once draft 0 is prefilled (`drafted`)
                        more = [self.submit(r, m, prep=p) for r, p in zip(requests[1:], preps[1:], strict=True)]
                        tickets.extend(more)
                        return [iter(t) for t in more]

                    streams[m] = drafted(streams[m], rest, best.weight,
                                         lambda k, result: crown(self.lm, preps[k], result))
            for m, make in (remote or {}).items():
                streams[m] = make(preps[0])
            yield from lockstep(streams)
        finally:
            for t in tickets:
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
            return EngineStats(len(tickets) + self._closing, len(self._waiting), self._reserved, kv, self.pool.nbytes,
                               self.pool.total_refs(), self._peak_in_flight, self._peak_reserved,
                               self._forwards, self._rounds, self._finishing,
                               sum(b.nbytes for b in blocks.values()),
                               sum(t.full_bytes for w in started for t in w.tickets), self._steps, self._step_rounds)

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
            steps = self._steps
            for wave in waves:
                if wave in self._waves:  # not joined into another this round, nor ended
                    self._advance(wave)
            self._step_rounds += self._steps > steps

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

    def _advance(self, wave: Wave) -> None:
        """One call of the wave's decoding (its prefill, or one step), streamed to its tickets."""
        if all(t.cancelled.is_set() for t in wave.tickets):
            self._finish(wave, None)
            return
        prefill = not wave.started
        self._forwards += 1  # only the worker writes these; a wave whose rows all left (above) runs none
        self._steps += not prefill
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

    def _join(self, wave: Wave) -> None:
        """A prefilled wave joins the running batch of its mode and line length whose joined reservation fits
        (the largest), or runs on as a batch of its own. Only the worker changes waves and reservations, so the
        tensors are joined outside the lock; the tickets and reservations move under it."""
        hosts = sorted((w for w in self._waves if w is not wave and w.started and w.decoding.preps
                        and w.decoding.can_join(wave.decoding)), key=lambda w: -len(w.tickets))
        for host in hosts:
            need = host.decoding.reserve_rows(wave.decoding)
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
            self._closing += len(wave.tickets)
        wave.decoding.close()
        if wave.lease is not None:  # ended before its prefill
            self.pool.end_lease(wave.lease)
            wave.lease = None
        rows = range(len(wave.tickets))
        # its couplets written (a failed or abandoned wave wrote none)
        makers = {} if last is None else {r: wave.decoding.finisher(r) for r in rows}
        with self._lock:
            handed = self._end_rows(wave, rows, makers, last, error)
            self._closing -= len(wave.tickets)
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

