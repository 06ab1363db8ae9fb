"""The serving engine on the real embedded model: batched waves write what each request writes alone,
admission keeps reservations within the budget, a full queue refuses in Chinese, cancelled requests end
and release what they held, and the pool's reference counts return to zero when idle."""

from __future__ import annotations

import time

import pytest
import torch

from couplet.kvcache import MODES, PrefixPool
from couplet.serving.engine import BUSY_MESSAGE, Engine, EngineBusy, EngineConfig
from couplet.serving.generate import CoupletRequest, generate, prepare

pytestmark = pytest.mark.slow  # loads the embedded model
torch.set_num_threads(1)

PHRASES = ["龙马精神", "春风", "五福临门"]  # prompts of different lengths: the wave is left-padded


def wait_idle(engine: Engine, seconds: float = 30.0) -> None:
    deadline = time.time() + seconds
    while time.time() < deadline:
        st = engine.stats()
        if st.in_flight == 0 and st.waiting == 0:
            return
        time.sleep(0.01)
    raise AssertionError(f"engine still busy: {engine.stats()}")


@pytest.mark.parametrize("mode", list(MODES))
def test_a_wave_writes_what_each_request_writes_alone(embedded_lm, mode: str) -> None:
    with Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=8, continuous=False)) as engine:
        tickets = [engine.submit(CoupletRequest(p), mode) for p in PHRASES]
        results = [list(t)[-1].result for t in tickets]
        wait_idle(engine)
        st = engine.stats()
        assert st.peak_in_flight == len(PHRASES) and st.pool_refs == 0 and st.reserved_bytes == 0
    for phrase, r in zip(PHRASES, results, strict=True):
        alone = generate(embedded_lm, CoupletRequest(phrase), mode, PrefixPool())
        assert (r.upper, r.lower, r.hengpi) == (alone.upper, alone.lower, alone.hengpi), (mode, phrase)
    # what the wave holds (its rows' share of the padded batch) never exceeds what its rows reserved
    assert sum(max(s.kv_bytes for s in r.steps) for r in results) <= sum(t.reserve_decode for t in tickets)


def test_admission_keeps_reservations_within_the_budget(embedded_lm) -> None:
    prep = prepare(embedded_lm, CoupletRequest("吉祥如意"))
    probe = Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=1))
    one = probe.submit(CoupletRequest("吉祥如意"), "full", prep=prep)
    list(one)
    probe.close()
    budget_mb = 1 + 2.5 * one.reserve_prefill / 2**20  # room for two `full` requests, not three
    with Engine(embedded_lm, EngineConfig(kv_budget_mb=budget_mb, pool_mb=1)) as engine:
        tickets = [engine.submit(CoupletRequest("吉祥如意"), "full", prep=prep) for _ in range(5)]
        couplets = {(r.upper, r.lower) for r in (list(t)[-1].result for t in tickets)}
        wait_idle(engine)
        st = engine.stats()
        assert st.peak_in_flight == 2 and st.peak_reserved_bytes <= engine.budget
        assert st.pool_refs == 0 and st.reserved_bytes == 0
    assert len(couplets) == 1  # the same request, the same couplet, whoever shared the batch
    assert all(t.admitted is not None and t.first_token is not None and t.finished is not None for t in tickets)


def test_min_wave_holds_newcomers_for_a_fuller_wave_instead_of_staggered_small_ones(embedded_lm) -> None:
    """`snapkv` reserves its whole prompt for the prefill (it cuts the prompt once, after it) and about half of it
    after: the room freed after a prefill admits one newcomer as a wave of its own (two forwards per step).
    With min_wave=2 it waits for the running wave to end, and every step is one forward; the couplets are the
    same."""
    prep = prepare(embedded_lm, CoupletRequest("吉祥如意"))
    probe = Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=1))
    one = probe.submit(CoupletRequest("吉祥如意"), "snapkv", prep=prep)
    list(one)
    probe.close()
    prefill, decode = one.reserve_prefill, one.reserve_decode
    assert prefill >= 1.5 * decode  # what makes the stagger
    budget_mb = 1 + (2 * prefill + decode // 2) / 2**20  # two prefills at once; then room for one more
    runs = {}
    for min_wave in (1, 2):
        config = EngineConfig(kv_budget_mb=budget_mb, pool_mb=1, min_wave=min_wave)
        with Engine(embedded_lm, config) as engine:
            tickets = [engine.submit(CoupletRequest("吉祥如意"), "snapkv", prep=prep) for _ in range(6)]
            couplets = {(r.upper, r.lower) for r in (list(t)[-1].result for t in tickets)}
            wait_idle(engine)
            st = engine.stats()
        assert st.peak_reserved_bytes <= engine.budget and st.reserved_bytes == 0
        runs[min_wave] = (st.forwards / st.rounds, couplets)
    assert runs[1][0] > 1.0 and runs[2][0] == 1.0  # staggered waves, then one wave at a time
    assert runs[1][1] == runs[2][1] and len(runs[1][1]) == 1


def test_a_full_queue_and_an_oversized_request_are_refused_in_chinese(embedded_lm) -> None:
    prep = prepare(embedded_lm, CoupletRequest("春风"))
    with Engine(embedded_lm, EngineConfig(kv_budget_mb=1.5, pool_mb=1)) as engine:
        with pytest.raises(EngineBusy, match="超出总预算"):
            engine.submit(CoupletRequest("春风"), "full", prep=prep)  # 0.5 MB can never hold a full prompt
    # room for one prefill at a time (~1.2 MB at float32), two may wait
    with Engine(embedded_lm, EngineConfig(kv_budget_mb=3.0, pool_mb=1, max_waiting=2)) as engine:
        accepted, refused = [], 0
        for _ in range(40):
            try:
                accepted.append(engine.submit(CoupletRequest("春风"), "int4", prep=prep))
            except EngineBusy as e:
                assert str(e) == BUSY_MESSAGE
                refused += 1
        assert refused > 0
        for t in accepted:
            assert list(t)[-1].result is not None  # every accepted request still gets its couplet
        wait_idle(engine)
        assert engine.stats().pool_refs == 0


def test_cancelled_requests_end_and_release_what_they_held(embedded_lm) -> None:
    with Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=8)) as engine:
        keep, drop = (engine.submit(CoupletRequest("龙马精神"), "shared") for _ in range(2))
        first = next(iter(drop))
        assert first.record.step == 0
        drop.cancel()
        assert list(keep)[-1].result is not None
        assert all(p.result is None for p in drop)  # it stops receiving progress, and its stream ends
        alone = [engine.submit(CoupletRequest("春风"), "combo") for _ in range(2)]
        next(iter(alone[0]))
        for t in alone:  # every row of a wave cancelled: the wave ends early
            t.cancel()
        wait_idle(engine)
        st = engine.stats()
        assert st.pool_refs == 0 and st.reserved_bytes == 0 and st.kv_bytes == 0
        assert st.pool_used_bytes == 0 < st.pool_bytes and st.full_bytes == 0  # the blocks stay, as cache


def test_an_idle_engine_never_shows_bytes_held(embedded_lm, monkeypatch) -> None:
    """While waves start and end, `stats()` never shows an idle engine (nothing in flight or waiting) still
    holding reservations, KV or pool references: a wave leaves `in_flight` only once what it held is returned
    (before, it left first, and a test that waited for idle could read its reservation a moment later). Closing
    a wave's cache is made 50 ms slower, so that a watcher polling every half millisecond sees that window."""
    import threading

    from couplet.serving.generate import Decoding

    real_close = Decoding.close

    def slow_close(self: Decoding) -> None:
        time.sleep(0.05)
        real_close(self)

    monkeypatch.setattr(Decoding, "close", slow_close)
    seen: list = []
    stop = threading.Event()

    def watch(engine: Engine) -> None:
        while not stop.wait(0.0005):  # every half millisecond, leaving the engine the GIL and its lock
            st = engine.stats()
            if st.in_flight == 0 and st.waiting == 0 and (st.reserved_bytes or st.kv_bytes or st.pool_refs):
                seen.append(st)

    with Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=8)) as engine:
        watcher = threading.Thread(target=watch, args=(engine,))
        watcher.start()
        try:
            for mode in ("full", "shared", "combo"):  # one request at a time: the engine goes idle between them
                for t in [engine.submit(CoupletRequest("春风"), mode) for _ in range(2)]:
                    assert list(t)[-1].result is not None
        finally:
            stop.set()
            watcher.join()
    assert seen == []


def test_the_finisher_chooses_the_hengpi_after_the_cache_is_released(embedded_lm) -> None:
    """A wave's couplets written, its cache and reservation are returned at once; each row's 横批 is chosen on
    the finisher's thread and its last Progress arrives with the result, every step's Progress exactly once."""
    with Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=8)) as engine:
        tickets = [engine.submit(CoupletRequest(p), "int8") for p in PHRASES]
        for t in tickets:
            progress = list(t)
            steps = [p.record.step for p in progress]
            assert steps == list(range(len(steps))) and steps[-1] == 2 * t.prep.length
            assert all(p.result is None for p in progress[:-1]) and progress[-1].result is not None
            assert progress[-1].result.hengpi and t.reserved == 0  # released before the 横批 arrived
            assert t.admitted is not None and t.first_token is not None and t.decoded is not None
            assert t.admitted <= t.first_token <= t.decoded <= t.finished
        wait_idle(engine)
        st = engine.stats()
        assert st.finishing == 0 and st.reserved_bytes == 0 and st.pool_refs == 0


def test_an_idle_worker_helps_the_finisher_choose_the_hengpi(embedded_lm) -> None:
    """The rows of a wave that ended with nothing else to run: the worker takes rows from the finisher's queue
    too (work stealing), so both threads choose 横批; every row still gets its result exactly once."""
    import threading

    from couplet.serving.generate import Decoding
    from couplet.writing import hengpi

    hengpi.clear_cache()  # every couplet's 横批 is scored, none remembered
    finisher, threads = Decoding.finisher, []

    def measured(self, r):  # instrumentation of the real method, not a stand-in
        attach = finisher(self, r)

        def run(progress):
            threads.append(threading.current_thread().name)
            return attach(progress)

        return run

    phrases = ["龙马精神", "五福临门", "万象更新", "国泰民安", "春风", "花好月圆"]
    try:
        Decoding.finisher = measured
        with Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=8)) as engine:
            tickets = [engine.submit(CoupletRequest(p), "int8") for p in phrases]
            results = [list(t)[-1].result for t in tickets]
    finally:
        Decoding.finisher = finisher
    assert all(r is not None and r.hengpi for r in results)
    assert len(threads) == len(phrases) and {"couplet-engine", "couplet-finisher"} <= set(threads)


def test_requests_with_one_prompt_share_all_of_it_in_a_cache_aware_wave(embedded_lm) -> None:
    """Six visitors typing the same keywords (the same prompt: the same exemplars) and a seventh: with
    `prefix_wave` the six form a wave of their own whose rows reference every whole block of the prompt in the
    pool (leased at admission), so each reserves only the rest of its prompt and its couplet, and all six fit
    a budget that holds two prefills of requests admitted in arrival order. The couplets are what each writes alone."""
    prep = prepare(embedded_lm, CoupletRequest("龙马精神"))
    other = prepare(embedded_lm, CoupletRequest("吉祥如意"))
    probe = Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=4))
    one = probe.submit(CoupletRequest("龙马精神"), "shared", prep=prep)
    list(one)
    probe.close()
    budget_mb = 4 + 2.5 * one.reserve_prefill / 2**20  # the pool, and two requests' prefills
    alone = generate(embedded_lm, CoupletRequest("龙马精神"), "shared", PrefixPool())
    runs = {}
    for prefix_wave in (0, 4):
        with Engine(embedded_lm, EngineConfig(kv_budget_mb=budget_mb, pool_mb=4, prefix_wave=prefix_wave)) as engine:
            first = engine.submit(CoupletRequest("吉祥如意"), "shared", prep=other)
            with engine._lock:  # the six arrive together: the worker plans no round until all six wait
                tickets = [engine.submit(CoupletRequest("龙马精神"), "shared", prep=prep) for _ in range(6)]
            results = [list(t)[-1].result for t in tickets]
            assert list(first)[-1].result is not None
            wait_idle(engine)
            st = engine.stats()
            assert st.peak_reserved_bytes <= engine.budget and st.reserved_bytes == 0
            assert st.pool_refs == 0 and engine.pool.leased == 0
        assert all((r.upper, r.lower, r.hengpi) == (alone.upper, alone.lower, alone.hengpi) for r in results)
        # what a row owns at its peak, beside its share of the pool
        runs[prefix_wave] = (st.peak_in_flight, max(max(s.kv_bytes for s in r.steps) for r in results))
    # in arrival order two prefills at a time (beside the first request, decoding); cache-aware, all at once
    assert runs[0][0] <= 3 and runs[4][0] == 7
    full_prompt = len(prep.prompt) * engine.geometry.token_bytes
    assert runs[4][1] < 0.1 * full_prompt  # the rows own a partial block and their couplet


@pytest.mark.parametrize("chunk", [0, 96])
def test_continuous_batching_joins_rows_at_their_own_step_and_they_write_what_they_write_alone(embedded_lm,
                                                                                                chunk: int) -> None:
    """`continuous`: requests arriving while a batch decodes are prefilled (whole, or in chunks of 96 columns
    between the batch's steps), then join it (left-padded to its width) and decode on at their own step, one
    forward per step for all of them; each row leaves when its couplet is written. Every couplet is what the
    request writes alone, one visitor who leaves mid-way is dropped from the batch, and every reservation is
    back when idle."""
    phrases = ["龙马精神", "春风", "五福临门", "平安", "吉祥如意"]
    alone = {p: generate(embedded_lm, CoupletRequest(p), "full") for p in phrases}
    config = EngineConfig(kv_budget_mb=64, pool_mb=1, continuous=True, prefill_chunk=chunk)
    with Engine(embedded_lm, config) as engine:
        first = engine.submit(CoupletRequest(phrases[0]), "full")
        stream = iter(first)
        for _ in range(3):  # the first row is 3 characters in when the others arrive
            next(stream)
        leaver = engine.submit(CoupletRequest("梅花"), "full")
        later = [engine.submit(CoupletRequest(p), "full") for p in phrases[1:]]
        next(iter(leaver))
        leaver.cancel()
        results = [[*stream][-1].result] + [list(t)[-1].result for t in later]
        wait_idle(engine)
        st = engine.stats()
        assert st.reserved_bytes == 0 and st.peak_reserved_bytes <= engine.budget
        assert st.peak_in_flight >= 3
        # the newcomers' prefills (or each of their chunks) are forwards of their own; every step after them is
        # one forward for all
        chunks = 1 if not chunk else -(-max(len(prepare(embedded_lm, CoupletRequest(p)).prompt) for p in phrases)
                                         // chunk)
        assert st.forwards <= st.rounds + 2 * chunks
    # what each row held (its share of the joined, left-padded batch) never exceeded what it reserved
    assert all(max(s.kv_bytes for s in r.steps) <= t.peak_reserved
               for r, t in zip(results, [first, *later], strict=True))
    for phrase, r in zip(phrases, results, strict=True):
        assert (r.upper, r.lower, r.hengpi) == (alone[phrase].upper, alone[phrase].lower, alone[phrase].hengpi)
    assert leaver.finished is not None and leaver.decoded is None  # left before its couplet was written
    # rows joined at different steps: the first row's first character came before the others were admitted
    assert all(first.first_token < t.admitted for t in later)


@pytest.mark.parametrize("mode", [m for m in MODES if m != "full"])
def test_every_compressed_mode_joins_its_running_batch_and_writes_what_it_writes_alone(embedded_lm, mode: str) -> None:
    """Continuous batching beyond the plain cache: in every compressed mode (quantized groups, retention slots and
    merged slots, pool prefixes), requests arriving while a batch decodes join it after their prefill — one
    forward per step for all — and each writes the couplet it writes alone; what a row held never exceeded what
    it reserved, and every reservation and pool reference is back when idle."""
    phrases = ["龙马精神", "春风", "五福临门", "吉祥如意"]
    alone = {p: generate(embedded_lm, CoupletRequest(p), mode, pool=PrefixPool()) for p in phrases}
    with Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=4)) as engine:
        first = engine.submit(CoupletRequest(phrases[0]), mode)
        stream = iter(first)
        for _ in range(3):  # the first row is 3 characters in when the others arrive
            next(stream)
        later = [engine.submit(CoupletRequest(p), mode) for p in phrases[1:]]
        results = [[*stream][-1].result] + [list(t)[-1].result for t in later]
        wait_idle(engine)
        st = engine.stats()
        assert st.reserved_bytes == 0 and st.peak_reserved_bytes <= engine.budget and st.pool_refs == 0
        assert st.peak_in_flight >= 2
        assert st.forwards <= st.rounds + len(later)  # the newcomers' prefills; then one forward per step for all
    assert all(max(s.kv_bytes for s in r.steps) <= t.peak_reserved for r, t in zip(results, [first, *later],
                                                                                      strict=True))
    for phrase, r in zip(phrases, results, strict=True):
        assert (r.upper, r.lower, r.hengpi) == (alone[phrase].upper, alone[phrase].lower, alone[phrase].hengpi)


def test_a_failed_join_reaches_both_batches_and_the_engine_serves_on(embedded_lm, monkeypatch) -> None:
    """Fault injection (a join that runs out of memory half-way cannot be provoked on CPU): both batches'
    visitors get the error, their reservations come back, and the worker lives on to serve the next visitor."""
    import threading

    from couplet.serving.generate import Decoding

    def out_of_memory(self, other):
        raise RuntimeError("CUDA out of memory (injected)")

    step, arrived = Decoding.step, threading.Event()

    def step_after_arrival(self):  # the running batch is still decoding when the newcomer arrives, surely
        arrived.wait(30)
        return step(self)

    with Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=1)) as engine:
        monkeypatch.setattr(Decoding, "join", out_of_memory)
        monkeypatch.setattr(Decoding, "step", step_after_arrival)
        first = engine.submit(CoupletRequest("龙马精神"), "full")
        stream = iter(first)
        next(stream)  # its prefill is done: the next admission round is a later one
        second = engine.submit(CoupletRequest("春风"), "full")
        arrived.set()
        for ticket in (stream, second):
            with pytest.raises(RuntimeError, match="injected"):
                list(ticket)
        monkeypatch.undo()
        wait_idle(engine)
        assert engine.stats().reserved_bytes == 0
        assert list(engine.submit(CoupletRequest("平安"), "full"))[-1].result is not None


def test_a_failed_admission_reaches_everyone_and_gives_back_what_was_held(embedded_lm, monkeypatch) -> None:
    """Fault injection (a pool failing to lease cannot be provoked): in one admission round, the first
    cache-aware wave gets its lease and the second's lease raises. The running wave and the waiting visitors
    all hear of it; the running wave's reservation and the first wave's lease come back; the engine serves on."""
    from couplet.kvcache.pool import PrefixPool

    lease, calls = PrefixPool.lease, []

    def second_fails(self, keys, block_bytes):
        calls.append(keys)
        if len(calls) == 2:
            raise RuntimeError("lease failed (injected)")
        return lease(self, keys, block_bytes)

    with Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=8)) as engine:
        stream = iter(engine.submit(CoupletRequest("龙马精神"), "full"))
        next(stream)  # admitted and prefilled: it holds a reservation
        monkeypatch.setattr(PrefixPool, "lease", second_fails)
        with engine._lock:  # the worker waits for the lock: one admission round sees all eight
            tickets = [engine.submit(CoupletRequest(kw), "shared") for kw in ["春风"] * 4 + ["平安"] * 4]
        for t in (stream, *tickets):
            with pytest.raises(RuntimeError, match="injected"):
                list(t)
        monkeypatch.undo()
        wait_idle(engine)
        st = engine.stats()
        assert len(calls) == 2 and st.reserved_bytes == 0 and st.kv_bytes == 0
        assert st.pool_refs == 0 and engine.pool.leased == 0  # the first wave's lease pinned nothing for good
        assert list(engine.submit(CoupletRequest("平安"), "shared"))[-1].result is not None


def test_kv_in_use_counts_the_rows_past_their_prefill_and_each_pool_block_once(embedded_lm, monkeypatch) -> None:
    """`stats()`'s KV in use against unshared (the benchmark's `in_use_kv_ratio`, the page's live line): a
    cache-aware wave of four rows of a prompt the pool holds. Before its prefill it pins those blocks but has
    no tokens, so neither side counts it; at every step the pool blocks its rows all reference count once,
    not four times. (The two wrappers look at the stats, then call the real prefill and step.)"""
    from couplet.serving.generate import Decoding

    before, during = [], []
    prefill, step = Decoding.prefill, Decoding.step
    monkeypatch.setattr(Decoding, "prefill", lambda self, *a: (before.append(engine.stats()), prefill(self, *a))[1])
    monkeypatch.setattr(Decoding, "step", lambda self: (during.append(engine.stats()), step(self))[1])
    with Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=8)) as engine:
        list(engine.submit(CoupletRequest("春风"), "shared"))  # the prompt's blocks in the pool, as cache
        before.clear(), during.clear()
        with engine._lock:  # one admission round: the four make one cache-aware wave, leasing those blocks
            tickets = [engine.submit(CoupletRequest("春风"), "shared") for _ in range(4)]
        results = [list(t)[-1].result for t in tickets]
    assert all(r is not None for r in results) and len(before) == 1 and len(during) >= 10
    assert before[0].pool_used_bytes == before[0].full_bytes == 0 < before[0].reserved_bytes
    for st in during:
        assert st.in_flight == 4 and st.pool_used_bytes == st.pool_bytes > 0  # the prompt's blocks, once
        assert st.kv_bytes + st.pool_used_bytes < 0.5 * st.full_bytes  # four rows, one prompt held


def test_closing_during_a_long_last_forward_still_ends_every_stream(embedded_lm, monkeypatch) -> None:
    """`close()` gives up waiting while the worker is still inside a wave's last step (a slow forward,
    injected: it waits after the real step until released). The row that step writes is handed to the
    finisher after `close()` returned: it still gets its 横批 and its stream ends, never left waiting."""
    import threading

    from couplet.serving.generate import Decoding

    step, inside, release = Decoding.step, threading.Event(), threading.Event()

    def slow_last_step(self):
        out = step(self)
        if self.done:
            inside.set()
            release.wait(30)
        return out

    monkeypatch.setattr(Decoding, "step", slow_last_step)
    engine = Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=8))
    ticket = engine.submit(CoupletRequest("春风"), "full")
    assert inside.wait(30)
    engine.close(timeout=0.1)  # returns with the worker still in its forward
    release.set()
    got: list = []
    reader = threading.Thread(target=lambda: got.extend(ticket), daemon=True)
    reader.start()
    reader.join(30)
    assert not reader.is_alive(), "the stream was left waiting"
    assert got and got[-1].result is not None and got[-1].result.hengpi


def test_a_stream_with_a_refused_mode_cancels_the_modes_already_queued(embedded_lm) -> None:
    """`stream` submits its modes one by one: when one is refused, those already queued are cancelled before
    the error reaches the caller, and no forward is run for a visitor who was told no."""
    with Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=8)) as engine:
        with engine._lock:  # the worker cannot admit the first two before the third is refused
            with pytest.raises(ValueError, match="unknown mode"):
                list(engine.stream(CoupletRequest("龙马精神"), ["full", "int8", "no-such-mode"]))
        wait_idle(engine)
        st = engine.stats()
        assert st.forwards == 0 and st.reserved_bytes == 0 and st.peak_in_flight == 0


def test_a_visitor_leaving_a_wave_that_fills_the_budget_never_raises_what_the_others_reserve(embedded_lm) -> None:
    """A wave of 24 that fills the budget to the byte; one visitor leaves after the prefill and is dropped from
    the batch. The rows left are recounted (their line breaks fall at one step: one extra slot, not one per
    row) and keep at most what they reserved, so the total never passes the budget; they write the couplet
    they write alone."""
    prep = prepare(embedded_lm, CoupletRequest("吉祥如意"))
    probe = Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=1))
    one = probe.submit(CoupletRequest("吉祥如意"), "full", prep=prep)
    list(one)
    probe.close()
    rows = 24
    budget_mb = 1 + (rows * one.reserve_prefill + 8) / 2**20  # its prefills, and 8 bytes to spare
    with Engine(embedded_lm, EngineConfig(kv_budget_mb=budget_mb, pool_mb=1)) as engine:
        tickets = [engine.submit(CoupletRequest("吉祥如意"), "full", prep=prep) for _ in range(rows)]
        streams = [iter(t) for t in tickets]
        next(streams[0])
        tickets[0].cancel()
        results = [list(s)[-1].result for s in streams[1:]]
        wait_idle(engine)
        st = engine.stats()
    assert st.peak_in_flight == rows and st.peak_reserved_bytes <= engine.budget and st.reserved_bytes == 0
    alone = generate(embedded_lm, CoupletRequest("吉祥如意"), "full")
    assert all((r.upper, r.lower) == (alone.upper, alone.lower) for r in results)


def test_a_visitor_leaving_a_sliding_window_models_wave_leaves_the_others_writing(tmp_path, monkeypatch) -> None:
    """A model with sliding-window layers (its cache cannot join or drop rows): continuous batching leaves its
    waves as waves, so a visitor who leaves a wave of two mid-way is skipped, as in any wave, and the other
    still gets its couplet (not the error of a drop the cache cannot do)."""
    import threading
    from collections import Counter

    from tiny_model import TINY_CHARS
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from couplet.models.loading import load_model
    from couplet.models.tokenizer import build_tokenizer
    from couplet.serving.generate import Decoding
    from couplet.writing.phrases import HENGPI_PHRASES

    tok = build_tokenizer(Counter({c: 100 - i for i, c in enumerate(TINY_CHARS)}), vocab_size=len(TINY_CHARS) + 8,
                          must_include=HENGPI_PHRASES)
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok.get_vocab()), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         use_sliding_window=True, sliding_window=64, max_window_layers=0)
    Qwen2ForCausalLM(config).save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    lm = load_model(str(tmp_path), device="cpu", dtype="float32")
    preps = {p: prepare(lm, CoupletRequest(p)) for p in ("春风", "明月", "山水")}
    # The tiny model writes a couplet in milliseconds: gates hold the real methods until the test has acted.
    prefill, step, ready, left = Decoding.prefill, Decoding.step, threading.Event(), threading.Event()

    def prefill_when_ready(self, chunk=None):
        ready.wait(30)
        return prefill(self, chunk)

    def step_after_leaving(self):
        if any(p is preps["明月"] for p in self.preps):
            left.wait(30)
        return step(self)

    monkeypatch.setattr(Decoding, "prefill", prefill_when_ready)
    monkeypatch.setattr(Decoding, "step", step_after_leaving)
    with Engine(lm, EngineConfig(kv_budget_mb=64, pool_mb=1)) as engine:
        first = engine.submit(CoupletRequest("春风"), "full", prep=preps["春风"])  # a wave of its own
        leaver, stayer = (engine.submit(CoupletRequest(p), "full", prep=preps[p]) for p in ("明月", "山水"))
        ready.set()  # the two arrived together: one wave of two
        next(iter(leaver))
        leaver.cancel()
        left.set()
        results = [list(t)[-1].result for t in (first, stayer)]
        wait_idle(engine)
        assert engine.stats().reserved_bytes == 0
    assert all(r is not None and len(r.upper) == 7 for r in results)
