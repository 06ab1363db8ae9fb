"""Admission: which waiting requests start now, and what each reserves (`Engine`'s scheduler).

A request reserves the KV bytes it can own (`Composition.owned_peak_bytes`: its prefill, during which the
prompt is held at full precision, then its steady peak under its mode); it is admitted when the reservation
fits beside what the admitted requests reserve, in arrival order. While other waves run, only a round of at
least `min_wave` rows starts (or every request waiting), since each wave costs one forward per step. A pool
mode's request whose very prompt at least `prefix_wave` requests are waiting with takes them all into a
cache-aware wave of their own, with a pool lease on the prompt's whole blocks.

A mixin of `Engine`'s: these methods run on its worker thread, under its lock, on the state it declares below.
"""

from __future__ import annotations

import time
from collections import deque
from typing import TypeAlias

from couplet.kvcache import KVGeometry, Lease, PrefixPool, chain_keys, make_mode, model_namespace
from couplet.models.loading import LoadedModel
from couplet.serving.generate import Decoding, Prepared
from couplet.serving.tickets import EngineConfig, Ticket, Wave
from couplet.writing.prompt import HouseCouplet

# (new waves by (mode, length, task), cache-aware waves (rows, lease, prefill, decode), ids placed, bytes reserved)
Planned: TypeAlias = tuple[dict[tuple[str, int, bool], list[Ticket]], list[tuple[list[Ticket], Lease, int, int]],
                           set[int], int]


class Admission:
    """The scheduler's half of `Engine`: admission and reservation arithmetic."""

    lm: LoadedModel
    config: EngineConfig
    pool: PrefixPool
    budget: int
    geometry: KVGeometry
    _house_tokens: dict[tuple[HouseCouplet, ...], int]
    _waiting: deque[Ticket]
    _waves: list[Wave]
    _reserved: int
    _peak_reserved: int
    _peak_in_flight: int

    def _shared_prefix(self, house: tuple[HouseCouplet, ...]) -> int:
        """Prompt tokens every request with this house prefix shares (`<bos>` + the house), tokenized once."""
        if house not in self._house_tokens:
            self._house_tokens[house] = self.lm.family.shared_prefix(house)
        return self._house_tokens[house]

    def _admit(self) -> None:
        """Admit waiting requests in arrival order while their reservation fits; those of one mode and length
        admitted in the same round share a wave. While other waves run, a round too small (`wave_floor`) waits
        for a fuller one. A wave is left-padded to its longest prompt, so each of its
        rows reserves what its largest row does (padding slots take memory too). An encoder–decoder's waves
        also hold one task. A pool mode's request whose very prompt at least `prefix_wave` requests are
        waiting with takes them all (up to `max_batch`) into a cache-aware wave of their own (`_prompt_wave`)."""
        self._sweep_cancelled()
        planned = self._plan_round()
        if planned is None:
            return  # wait for a wave to end and free room for a fuller one
        new, own, placed, reserve = planned
        self._waiting = deque(t for t in self._waiting if id(t) not in placed)
        self._reserved += reserve
        waves: list[tuple[list[Ticket], Lease | None]] = [(g, None) for g in new.values() if g]
        for rows, held, prefill, decode in own:
            for t in rows:
                t.reserve_prefill, t.reserve_decode = prefill, decode
            waves.append((rows, held))
        self._start_waves(waves)

    def _sweep_cancelled(self) -> None:
        """Visitors who left while waiting: gone, their streams ended."""
        if any(t.cancelled.is_set() for t in self._waiting):
            kept: deque[Ticket] = deque()
            for t in self._waiting:
                if t.cancelled.is_set():
                    t.events.put(None)
                else:
                    kept.append(t)
            self._waiting = kept

    def _plan_round(self) -> Planned | None:
        """This round's waves, planned before anything is admitted: per (mode, length[, task]) the waiting
        requests that fit in arrival order, and the cache-aware waves with their pool leases; with the ids of
        the requests placed and the bytes they reserve. None when the round is too small (`wave_floor`) while
        other waves run: its leases are returned."""
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
            return None
        return new, own, placed, reserve

    def _start_waves(self, waves: list[tuple[list[Ticket], Lease | None]]) -> None:
        """Each planned wave's session opened (`Decoding`), its rows' reservations set to its largest row's; a
        wave that cannot open tells its visitors and returns what they reserved."""
        now = time.perf_counter()
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

    def _whole_length(self, prep: Prepared) -> int:
        """The tokens a request's cache holds at its end: its prompt, both lines and the line break (the last
        character is never fed; a break of several tokens, as the chat families', counts whole)."""
        return len(prep.prompt) + 2 * prep.length + len(self.lm.family.line_break) - 1

    def _set_reserved(self, wave: Wave, lower_only: bool = False) -> None:
        """A joined batch's reservations, per row (`Decoding.reserve_rows`); under the lock. `lower_only` (rows left):
        a row keeps what it reserved if that is less — its batch only narrows when rows leave, and a wave that
        never joined keeps its own reservation."""
        d = wave.decoding
        for t, need in zip(wave.tickets, d.reserve_rows(), strict=True):
            need = min(need, t.reserved) if lower_only else need
            self._reserved += need - t.reserved
            t.reserved = need
            t.peak_reserved = max(t.peak_reserved, need)
        self._peak_reserved = max(self._peak_reserved, self._reserved)
