"""Prefill → constrained decode loop, one KV-cache mode per session, per-step records flowing back.

    lm = load_model()
    result = generate(lm, CoupletRequest("龙马精神"), mode="full")
    for round in stream_modes(lm, request, ["full", "int4"]):   # modes advance in lockstep
        round.latest, round.records, round.results                 # per mode

`prepare` lays out the prompt (`couplet.writing.prompt`: the house prefix, the exemplars retrieved for the
keywords — or for the 上联 in 对下联 — then the request). The decode loop writes 上联 character by
character (对下联: feeds the given one), feeds <mid>, then writes 下联. Every step applies the constraints
(`couplet.writing.constraints`: form, tones, taboo ban, no run of 4 copied from the prompt) and the voice bias
(`couplet.writing.lexicon`) to the logits, then picks a character: greedy, or sampled with
temperature / top-p from seeded Gumbel noise that depends only on (seed, step), so every mode sees the
same noise and any difference between modes is the cache's doing.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence

import torch

from couplet.events import CoupletResult, StepRecord
from couplet.kvcache import Block, KVGeometry, PrefixPool, make_mode
from couplet.kvcache.dense import FullCache
from couplet.models.loading import LoadedModel
from couplet.serving.progress import Progress, Round, lockstep
from couplet.serving.request import LENGTHS, TASKS, CoupletRequest, Prepared, prepare
from couplet.serving.sampling import decision_scores, greedy_decision, sample, step_noise
from couplet.writing.constraints import LineConstraints
from couplet.writing.hengpi import choose_hengpi
from couplet.writing.lexicon import DEFAULT_VOICE, VoiceConfig
from couplet.writing.placement import couplet_protection
from couplet.writing.prompt import DEFAULT_PROMPT, PromptConfig
from couplet.writing.rules import check_couplet

# the request and its preparation, the choice of a character and what streams back (`progress.py`) live beside
# this loop; callers import them here
__all__ = ["LENGTHS", "TASKS", "CoupletRequest", "Decoding", "Prepared", "Progress", "Round", "decision_scores",
           "decode", "finish", "generate", "greedy_decision", "left_padded", "lockstep", "prepare", "sample",
           "step_noise", "stream_modes"]

def _device_memory(device: str) -> tuple[int | None, int | None]:
    if device.startswith("cuda"):
        return torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    return None, None


class Decoding:
    """Couplets under one KV-cache mode, one per prepared request (a batch of rows with the same line length,
    left-padded in one session): `prefill()`, then `step()` once per character until `done`.

    Every call returns one Progress per row, its StepRecord new each time; the last step's carry the
    results (with `finish_inline=False`, once the caller's `attach_result` has run). `seconds` is this
    decoding's own compute time, whatever runs between its calls (other modes interleaved, a UI redraw).
    With `follow=(upper, lower)` (one row) the loop is teacher-forced along that couplet instead of choosing,
    and each Progress carries the model's log-probability of the followed character (for NLL deltas) and, at a
    free choice, the greedy pick this cache would have made there and its margin (`Progress.decision`). Runs
    under `torch.inference_mode()` per call, never across calls. A row's couplet does not depend on the others
    in its batch (padding is masked; tested against running alone). A prefilled decoding can take in
    another's rows of its mode (`join`, the engine's continuous batching; `can_join` says whether the caches
    append): they decode on at their own steps, and a row whose couplet is written leaves with `drop` (its
    result made by `finisher(r)`, bound before).
    """

    # what is kept per row, in row order (`join` appends, `drop` selects)
    _PER_ROW = ("preps", "constraints", "keyword_positions", "lines", "records", "row_seconds", "_next",
                "_chunks_fed", "chosen_logprobs")

    def __init__(self, lm: LoadedModel, preps: Sequence[Prepared], mode: str, pool: PrefixPool | None = None,
                 follow: tuple[str, str] | None = None, finish_inline: bool = True, **mode_options) -> None:
        lengths = {p.length for p in preps}
        if len(lengths) != 1 or (follow is not None and len(preps) != 1):
            raise ValueError("a batch holds requests of one line length (and follows one couplet at most)")
        if (refusal := lm.family.mode_refusal(mode)) is not None:
            raise ValueError(refusal)
        self.lm, self.preps, self.mode, self.follow = lm, list(preps), mode, follow
        self.finish_inline = finish_inline
        self.length = lengths.pop()
        policy = make_mode(mode, **mode_options)
        self.parts = policy.compose()  # what the mode is made of: its bytes per slot (`reserve_rows`)
        self.geometry = KVGeometry.of(lm.model)
        self.session = policy.new_session(lm.model, pool=pool)
        self.constraints = [LineConstraints(lm.chars, p.placement, p.length, p.voice, p.context.borrowed,
                                           p.lower_end, [line for pair in p.context.exemplars for line in pair])
                            for p in preps]
        self.keyword_positions = [list(p.keyword_positions) for p in preps]
        # An encoder–decoder reads its input (keywords, or 对下联's 上联) in its encoder; for 对下联 its decoder
        # writes the 下联 only, the given 上联 never fed.
        self.encoder_decoder = lm.family.encoder_decoder
        tasks = {p.duixia for p in preps}
        if self.encoder_decoder and len(tasks) != 1:
            raise ValueError("an encoder–decoder batch holds one task (对下联 or keywords)")
        self.lower_only = self.encoder_decoder and tasks == {True}
        self.lines = [[p.keywords.text if self.lower_only else "", ""] for p in preps]
        self.records: list[list[StepRecord]] = [[] for _ in preps]
        self.seconds = 0.0
        self.row_seconds = [0.0] * len(preps)  # per row, the whole time of every call it took part in
        # per row, log p(character) under the model's own distribution (no bias, no mask) at each free choice it
        # made: what a reranker reads (`couplet.serving.best_of`); teacher-forced runs report theirs per Progress
        self.chosen_logprobs: list[list[float]] = [[] for _ in preps]
        self._prompt: tuple[torch.Tensor, torch.Tensor | None, int] | None = None  # (ids, mask, columns fed)
        self._chunks_fed = [0] * len(preps)  # prompt tokens fed by the prefill's earlier chunks
        self.logits: torch.Tensor | None = None  # (batch, vocab): each row's next-token distribution
        # per row, the (line, position) its next step writes: all alike in a wave; rows that joined a running
        # batch (`join`) are behind the others
        self._next = [(1, 0) if self.lower_only else (0, 0)] * len(preps)

    @property
    def done(self) -> bool:
        return all(line > 1 for line, _ in self._next)

    @property
    def finished_rows(self) -> list[int]:
        """Rows whose couplet is written (in a joined batch, before the others')."""
        return [r for r, (line, _) in enumerate(self._next) if line > 1]

    @property
    def joinable(self) -> bool:
        return self.session.joinable and self.follow is None

    def can_join(self, other: Decoding) -> bool:
        """Whether `other`, prefilled, can join this running batch now (`join`)."""
        return (other.mode == self.mode and other.length == self.length and self.joinable and other.joinable
                and self.logits is not None and other.logits is not None and self.session.can_join(other.session))

    @property
    def next(self) -> list[tuple[int, int]]:
        """Each row's next (line, position)."""
        return list(self._next)

    def reserve_rows(self, other: Decoding | None = None) -> list[int]:
        """An upper bound of the KV bytes each row holds from now until it leaves, in this batch — joined with
        `other`'s rows first, when given (theirs follow). A row holds the batch's owned width of slots (rows are
        left-padded to the widest), which grows by a slot per step, and by the line break's tokens at each step
        where some row ends its 上联 (the others are padded to it; rows at one position break together): at most
        the width now, plus its own remaining steps, plus every line break still ahead, whoever leaves meanwhile
        (a join or a leave recomputes it). The width after a join is the wider batch's, and with a prefix pool
        the blocks beyond the shorter prefix become owned slots (`Sharing.join`). A retention mode evicts
        meanwhile, so the bound holds for it too (its width stays near its cap; the couplet's growth is small).
        Slots cost the store's bytes; a quantized residual and merged slots come on top, at full precision."""
        parts, g = self.parts, self.geometry
        slot = int(parts.stored_token_bytes(g) + 0.999)
        fixed = parts.storage.residual * g.token_bytes
        if parts.retention is not None and parts.retention.merge:  # one slot per query head, and its bias
            heads = g.q_heads or g.kv_heads
            fixed += g.token_bytes * (heads // g.kv_heads) + 4 * g.layers * heads
        batches = [self] if other is None else [self, other]
        prefix = min(d._prefix_len for d in batches)
        width = max(d._owned_width + d._prefix_len - prefix for d in batches)
        rows = [nxt for d in batches for nxt in d._next]
        breaks = len(self.lm.family.line_break) * len({pos for line, pos in rows if line == 0})
        return [(width + 2 * self.length - (line * self.length + pos) + breaks) * slot + fixed for line, pos in rows]

    @property
    def _prefix_len(self) -> int:
        return self.session.cache.prefix_len

    @property
    def _owned_width(self) -> int:
        """Owned slots per row in the batch's cache (all of a plain cache's)."""
        cache = self.session.cache
        return cache.get_seq_length() if isinstance(cache, FullCache) else cache.compressed[0].store.length

    def join(self, other: Decoding) -> None:
        """Continuous batching: `other`'s rows, prefilled, join this running batch (same mode and line length)
        and decode on in its forwards, each at its own step. `other` is spent."""
        if not self.can_join(other):
            raise ValueError("only prefilled decodings of one mode, line length and cache format can join")
        assert self.logits is not None and other.logits is not None
        self.session.join(other.session)
        self.logits, other.logits = torch.cat([self.logits, other.logits]), None
        for name in self._PER_ROW:
            getattr(self, name).extend(getattr(other, name))

    def drop(self, rows: Sequence[int]) -> None:
        """These rows leave the batch: their couplets written (their results made by `finisher(r)`, bound
        before) or given up (a visitor who left)."""
        gone = set(rows)
        keep = [r for r in range(len(self.preps)) if r not in gone]
        self.session.drop(keep)
        assert self.logits is not None
        self.logits = self.logits[keep]
        for name in self._PER_ROW:
            setattr(self, name, [getattr(self, name)[r] for r in keep])

    def close(self) -> None:
        self.session.close()

    def pool_blocks(self) -> list[Block]:
        """The prefix pool's blocks this batch references, each once (none without a pool)."""
        return self.session.sharing.referenced() if self.session.sharing is not None else []

    def prefill(self, chunk: int | None = None) -> list[Progress] | None:
        """Feed the prompts (left-padded to the longest). With `chunk`, a plain cache's prefill goes at most that
        many columns per call (chunked prefill: the engine then runs the batch's steps in between); None until
        the last chunk, which returns the step-0 Progress. Other caches take the whole prompt at once (a pool
        attaches, a retention mode evicts, after the first forward)."""
        t0 = time.perf_counter()
        with torch.inference_mode():
            if self._prompt is None:
                # every token fed: the prompt, 上联 + <mid>, 下联 but its last character; retention budgets are a
                # share of this whole length (a fixed per-request cap), not of the tokens seen so far
                brk = len(self.lm.family.line_break)
                fed = self.length - 1 if self.lower_only else 2 * self.length + brk - 1
                self.session.expect([len(p.prompt) + fed for p in self.preps])
                if self.encoder_decoder:
                    self._encode()
                self._prompt = (*left_padded([p.prompt for p in self.preps], self.lm.family.pad, self.lm.device), 0)
            ids, mask, at = self._prompt
            plain = isinstance(self.session.cache, FullCache) and self.joinable
            end = ids.shape[1] if chunk is None or not plain else min(ids.shape[1], at + chunk)
            out = self.session.forward(ids[:, at:end], attention_mask=None if mask is None else mask[:, at:end],
                                       logits_to_keep=1)
            self._prompt = (ids, mask, end)
            if end < ids.shape[1]:  # more chunks to come: their time and tokens count at the last one
                for r, row in enumerate(self.session.rows):
                    self._chunks_fed[r] += row.fed
                    self.row_seconds[r] += time.perf_counter() - t0
                self.seconds += time.perf_counter() - t0
                return None
            self.logits = out[:, -1]
            # a prefix-pool hit computes only the rest: what the prefill cost each request
            return self._progress(0, [""] * len(self.preps), t0)

    def _encode(self) -> None:
        """The encoder's outputs for every row's input — its 上联 or keywords (right-padded; the mask hides the
        padding)."""
        family = self.lm.family
        assert hasattr(family, "encoder_ids")
        rows = [family.encoder_ids(p.keywords.text) for p in self.preps]
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [family.pad] * (width - len(r)) for r in rows], device=self.lm.device)
        mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows], device=self.lm.device)
        self.session.set_encoder(self.lm.model.get_encoder()(input_ids=ids, attention_mask=mask), mask)

    def step(self) -> list[Progress]:
        """Choose (or follow) each row's next character and feed them: one forward, none after the last. In a
        joined batch rows are at different steps: the one whose 上联 ends feeds the line break too (the others
        are left-padded to its width), and a row that has just finished feeds a masked pad until it is dropped."""
        t0 = time.perf_counter()
        length, lm = self.length, self.lm
        with torch.inference_mode():
            assert self.logits is not None, "prefill() first"
            chars, steps, logprob, decision = [], [], None, None
            # (batch,): log of each row's partition, for log p of a followed or a chosen character
            norm = torch.logsumexp(self.logits.float(), dim=-1)
            for r, prep in enumerate(self.preps):
                line, pos = self._next[r]
                if line > 1:
                    raise ValueError(f"row {r} has finished: drop it before the next step")
                step = line * length + pos + 1
                char = self.constraints[r].fixed(line, pos)
                if self.follow is not None:
                    if char is None:  # a free choice: what this cache would have picked here, by how much
                        pick, margin = greedy_decision(decision_scores(
                            self.logits[r], self.constraints[r].allowed(line, pos, self.lines[r]),
                            self.constraints[r].bias_at(line, pos, self.lines[r])))
                        decision = (lm.id_to_char[pick], margin)
                    char = self.follow[line][pos]
                    token = lm.vocab.get(char, lm.family.unk)
                    logprob = float(self.logits[r, token].float() - norm[r])
                elif char is None:
                    allowed = self.constraints[r].allowed(line, pos, self.lines[r])
                    token = sample(self.logits[r], allowed, prep.request, step,
                                   self.constraints[r].bias_at(line, pos, self.lines[r]))
                    self.chosen_logprobs[r].append(float(self.logits[r, token].float() - norm[r]))
                    char = lm.id_to_char[token]
                self.lines[r][line] += char
                chars.append(char)
                steps.append(step)
            before = self._next
            self._next = [(line, pos + 1) if pos + 1 < length else (line + 1, 0) for line, pos in before]
            if not self.done:
                # Structure for retention modes (others ignore it), for the character the next forward
                # writes: keywords and the 上联 so far, then the 上联 characters 下联 must mirror.
                self.session.protect([couplet_protection(kw, len(p.prompt), length, *nxt)
                                      for kw, p, nxt in zip(self.keyword_positions, self.preps, self._next,
                                                            strict=True)])
                # the line break (<mid>, or the family's) rides along with the last 上联 character
                feed = [lm.char_ids(c) + (list(lm.family.line_break) if (line, pos) == (0, length - 1) else [])
                        if nxt[0] <= 1 else [] for c, (line, pos), nxt in zip(chars, before, self._next, strict=True)]
                ids, mask = left_padded(feed, lm.family.pad, lm.device)  # a mask in a joined batch only
                self.logits = self.session.forward(ids, attention_mask=mask, logits_to_keep=1)[:, -1]
            out = self._progress(steps, chars, t0, logprob, decision)
        if self.done and self.finish_inline:
            for r, progress in enumerate(out):
                self.attach_result(r, progress)
        return out

    def attach_result(self, r: int, progress: Progress) -> None:
        """Row r's result — its 横批 chosen (a scoring forward of its own, `hengpi`), its checks — onto the last
        step's Progress; its `seconds` are the decoding's plus its own finishing. `step` does this for every row
        unless the caller finishes them itself (`finish_inline=False`: the engine, on its own thread, so that
        the model's worker decodes on meanwhile). Needs no cache: callable after `close()`."""
        self.finisher(r)(progress)

    def finisher(self, r: int) -> Callable[[Progress], None]:
        """`attach_result` for row r, bound now: callable after the row has left the batch (`drop`)."""
        prep, (upper, lower), records, seconds = self.preps[r], self.lines[r], self.records[r], self.row_seconds[r]
        logprobs = list(self.chosen_logprobs[r])

        def attach(progress: Progress) -> None:
            t0 = time.perf_counter()
            with torch.inference_mode():
                progress.result = finish(self.lm, prep, self.mode, upper, lower, records)
            progress.result.logprobs = logprobs
            progress.result.seconds = seconds + time.perf_counter() - t0

        return attach

    def _progress(self, steps: int | list[int], chars: list[str], t0: float, logprob: float | None = None,
                  decision: tuple[str, float] | None = None) -> list[Progress]:
        alloc, peak = _device_memory(self.lm.device)
        seconds = time.perf_counter() - t0
        self.seconds += seconds
        out = []
        for r, s in enumerate(self.session.stats_per_row()):
            step = steps if isinstance(steps, int) else steps[r]
            self.row_seconds[r] += seconds
            row = self.session.rows[r]  # the prefill's tokens include the pool blocks computed for it
            computed = 0 if self._next[r][0] > 1 else \
                row.fed + (row.pooled_computed + self._chunks_fed[r] if step == 0 else 0)
            rec = StepRecord(self.mode, step, chars[r], s.logical_length, s.stored_tokens, s.kv_bytes,
                             s.shared_bytes, s.full_equivalent_bytes, alloc, peak, seconds, computed)
            self.records[r].append(rec)
            out.append(Progress(self.mode, self.lines[r][0], self.lines[r][1], rec, logprob=logprob,
                                decision=decision))
        return out


def left_padded(rows: Sequence[Sequence[int]], pad: int, device: str | torch.device
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-id rows left-padded to the longest: ids (batch, width), and the attention mask (1 real, 0 padding),
    None when no row is padded."""
    width = max(len(r) for r in rows)
    ids = torch.tensor([[pad] * (width - len(r)) + list(r) for r in rows], device=device)
    if all(len(r) == width for r in rows):
        return ids, None
    return ids, torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)


def finish(lm: LoadedModel, prep: Prepared, mode: str, upper: str, lower: str,
           records: Sequence[StepRecord]) -> CoupletResult:
    """A written couplet → its result: the 横批 chosen for it (unless `prep.hengpi` is off: then none yet, see
    `crown`), the checks, the notes and the exemplars shown. Shared by the local loop and remote backends
    (`couplet.serving.backends`)."""
    result = CoupletResult(prep.keyword_text, upper, lower, "", mode, {}, list(records), list(prep.notes),
                           exemplars=[list(p) for p in prep.context.exemplars])
    return crown(lm, prep, result, choose=prep.hengpi)


def crown(lm: LoadedModel, prep: Prepared, result: CoupletResult, choose: bool = True) -> CoupletResult:
    """The 横批 chosen for a written couplet (a scoring forward of its own, `hengpi`; `choose` off: none yet), and
    the checks with it."""
    if choose:
        result.hengpi = choose_hengpi(lm, result.upper, result.lower, prep.keyword_text)
    result.checks = check_couplet(result.upper, result.lower, result.hengpi, prep.keyword_text,
                                  given_upper=prep.duixia)
    return result


def decode(lm: LoadedModel, prep: Prepared, mode: str, pool: PrefixPool | None = None,
           follow: tuple[str, str] | None = None, **mode_options) -> Iterator[Progress]:
    """Generate one couplet under one KV-cache mode, yielding the prefill and then every step, each once;
    the last Progress carries the result. See `Decoding`."""
    run = Decoding(lm, [prep], mode, pool, follow, **mode_options)
    try:
        first = run.prefill()
        assert first is not None  # the whole prompt in one call
        yield first[0]
        while not run.done:
            yield run.step()[0]
    finally:
        run.close()


def stream_modes(lm: LoadedModel, request: CoupletRequest, modes: Sequence[str],
                 pool: PrefixPool | None = None, prompt: PromptConfig = DEFAULT_PROMPT,
                 voice: VoiceConfig = DEFAULT_VOICE) -> Iterator[Round]:
    """Run several modes on the same request and seed, advancing them one step at a time together.

    Yields a Round after every round of steps; the last one has every mode's result."""
    prep = prepare(lm, request, prompt, voice)
    return lockstep({m: decode(lm, prep, m, pool) for m in modes})


def generate(lm: LoadedModel, request: CoupletRequest, mode: str = "full", pool: PrefixPool | None = None,
             prompt: PromptConfig = DEFAULT_PROMPT, voice: VoiceConfig = DEFAULT_VOICE,
             **mode_options) -> CoupletResult:
    """The finished couplet for one mode."""
    *_, last = decode(lm, prepare(lm, request, prompt, voice), mode, pool, **mode_options)
    assert last.result is not None
    return last.result
