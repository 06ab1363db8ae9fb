"""Prefill → constrained decode loop, one KV-cache mode per session, per-step records flowing back.

    lm = load_model()
    result = generate(lm, CoupletRequest("龙马精神"), mode="full")
    for progress in stream_modes(lm, request, ["full", "int4"]):   # modes advance in lockstep
        ...

The decode loop writes 上联 character by character, feeds <mid>, then writes 下联. Every step applies
the constraints (`couplet.constraints`) to the logits, then picks a character: greedy, or sampled with
temperature / top-p from seeded Gumbel noise that depends only on (seed, step), so every mode sees the
same noise and any difference between modes is the cache's doing.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from couplet.constraints import LineConstraints
from couplet.events import CoupletResult, StepRecord
from couplet.hengpi import choose_hengpi
from couplet.kvcache import PrefixPool, couplet_protection, make_mode
from couplet.model import LoadedModel
from couplet.placement import Placement, place_keywords
from couplet.rules import check_couplet
from couplet.text import Keywords, normalize_keywords
from couplet.tokenizer import char_ids, prompt_ids

LENGTHS = (5, 7)


@dataclass(frozen=True)
class CoupletRequest:
    """What a visitor asks for. `temperature == 0` means greedy."""

    keywords: str
    length: int = 7
    acrostic: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.length not in LENGTHS:
            raise ValueError(f"length must be one of {LENGTHS}, got {self.length}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class Prepared:
    """A request after normalisation: keywords, their placement and the prompt ids."""

    request: CoupletRequest
    keywords: Keywords
    placement: Placement
    prompt: list[int]


def prepare(lm: LoadedModel, request: CoupletRequest) -> Prepared:
    """Normalise the keywords (raises CoupletInputError for bad input) and lay out the prompt."""
    kw = normalize_keywords(request.keywords, lm.vocab)
    placement = place_keywords(kw.text, request.length, "acrostic" if request.acrostic else "heads")
    return Prepared(request, kw, placement, prompt_ids(lm.tokenizer, kw.text, request.length))


@dataclass
class Progress:
    """A mode's state after one step: the text so far and the step's record."""

    mode: str
    upper: str
    lower: str
    record: StepRecord
    result: CoupletResult | None = None  # set on the last step
    logprob: float | None = None  # teacher-forced runs only: log p(followed character)


def step_noise(seed: int, step: int, vocab_size: int) -> torch.Tensor:
    """Gumbel noise that depends only on (seed, step): identical across modes and devices."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    uniform = torch.rand(vocab_size, generator=gen).clamp_(1e-10, 1 - 1e-10)
    return -torch.log(-torch.log(uniform))


def sample(logits: torch.Tensor, allowed: torch.Tensor, request: CoupletRequest, step: int) -> int:
    """Pick one token id from (vocab,) logits restricted to `allowed` (bool, vocab)."""
    scores = logits.float().cpu().masked_fill(~allowed, float("-inf"))
    if request.temperature == 0.0:
        return int(scores.argmax())
    scores = scores / request.temperature
    if request.top_p < 1.0:
        probs = torch.softmax(scores, dim=-1)
        sorted_p, order = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least the best token)
        drop = sorted_p.cumsum(0) - sorted_p >= request.top_p
        scores[order[drop]] = float("-inf")
    return int((scores + step_noise(request.seed, step, scores.numel())).argmax())


def _device_memory(device: str) -> tuple[int | None, int | None]:
    if device.startswith("cuda"):
        return torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
    return None, None


def decode(lm: LoadedModel, prep: Prepared, mode: str, pool: PrefixPool | None = None,
           follow: tuple[str, str] | None = None, **mode_options) -> Iterator[Progress]:
    """Generate one couplet under one KV-cache mode, yielding after the prefill and every step.

    With `follow=(upper, lower)` the loop is teacher-forced along that couplet instead of choosing, and
    each Progress carries the model's log-probability of the followed character (for NLL deltas).
    """
    request, length = prep.request, prep.request.length
    policy = make_mode(mode, **mode_options)
    constraints = LineConstraints(lm, prep.placement, length)
    keyword_positions = list(range(2, 2 + len(prep.keywords.text)))
    upper_start = len(prep.prompt)
    lines = ["", ""]
    records: list[StepRecord] = []
    t_start = time.perf_counter()

    def record(step: int, token: str, t0: float) -> StepRecord:
        s = session.stats()
        alloc, peak = _device_memory(lm.device)
        rec = StepRecord(mode, step, token, s.logical_length, s.stored_tokens, s.kv_bytes, s.shared_bytes,
                         s.full_equivalent_bytes, alloc, peak, time.perf_counter() - t0)
        records.append(rec)
        return rec

    with torch.inference_mode(), policy.new_session(lm.model, pool=pool) as session:
        # every token fed: the prompt, 上联 + <mid>, 下联 but its last character; retention budgets are a
        # share of this whole length (a fixed per-request cap), not of the tokens seen so far
        session.expect([len(prep.prompt) + 2 * length])
        t0 = time.perf_counter()
        logits = session.forward(torch.tensor([prep.prompt], device=lm.device))[0, -1]
        yield Progress(mode, "", "", record(0, "", t0))
        step = 0
        for line in (0, 1):
            for pos in range(length):
                step += 1
                t0 = time.perf_counter()
                char = constraints.fixed(line, pos)
                logprob = None
                if follow is not None:
                    char = follow[line][pos]
                    token = lm.vocab.get(char, lm.ids.unk)
                    logprob = float(torch.log_softmax(logits.float(), dim=-1)[token])
                elif char is None:
                    allowed = constraints.allowed(line, pos, lines)
                    char = lm.id_to_char[sample(logits, allowed, request, step)]
                lines[line] += char
                last = line == 1 and pos == length - 1
                if not last:
                    # Structure for `selective`/`combo` (others ignore it), for the character the next
                    # forward writes: keywords and the 上联 so far, then the 上联 characters 下联 must mirror.
                    nxt = (line, pos + 1) if pos + 1 < length else (1, 0)  # what the next forward writes
                    session.protect([couplet_protection(keyword_positions, upper_start, length, *nxt)])
                    feed = char_ids(lm.tokenizer, char)
                    if line == 0 and pos == length - 1:
                        feed.append(lm.ids.mid)  # the line break rides along with the last 上联 character
                    logits = session.forward(torch.tensor([feed], device=lm.device))[0, -1]
                yield Progress(mode, lines[0], lines[1], record(step, char, t0), logprob=logprob)
        hengpi = choose_hengpi(lm, lines[0], lines[1])
        checks = check_couplet(lines[0], lines[1], hengpi, prep.keywords.text)
        result = CoupletResult(prep.keywords.text, lines[0], lines[1], hengpi, mode, checks, records,
                               list(prep.keywords.notes), time.perf_counter() - t_start)
    yield Progress(mode, lines[0], lines[1], records[-1], result)


def stream_modes(lm: LoadedModel, request: CoupletRequest, modes: Sequence[str],
                 pool: PrefixPool | None = None) -> Iterator[dict[str, Progress]]:
    """Run several modes on the same request and seed, advancing them one step at a time together.

    Yields a dict {mode: latest Progress} after every round; the last one has `result` set for all.
    """
    prep = prepare(lm, request)
    runs = {m: decode(lm, prep, m, pool) for m in modes}
    latest: dict[str, Progress] = {}
    while runs:
        for m in list(runs):
            try:
                latest[m] = next(runs[m])
            except StopIteration:
                del runs[m]
        if runs:
            yield dict(latest)


def generate(lm: LoadedModel, request: CoupletRequest, mode: str = "full", pool: PrefixPool | None = None,
             **mode_options) -> CoupletResult:
    """The finished couplet for one mode."""
    *_, last = decode(lm, prepare(lm, request), mode, pool, **mode_options)
    assert last.result is not None
    return last.result
