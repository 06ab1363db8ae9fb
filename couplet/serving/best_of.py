"""Best-of-N: several drafts of one request written in one batch, the best by the model's own scores shown.

    result = best_of(lm, CoupletRequest("龙马精神"), BestOf(n=4))
    result.upper, result.lower, result.hengpi      # the chosen draft, its 横批 chosen for it alone
    result.candidates                              # every draft with its scores, the chosen one first

Row 0 is the request itself (greedy unless it asks for sampling), rows 1..n-1 are sampled at `BestOf`'s
temperature (or the request's, if hotter) and top-p, each with its own seed, so the drafts differ and best-of-1
is exactly `generate`. The rows decode side by side in one `Decoding` (one forward per step for all of them; a
row's couplet does not depend on the others, tested). Each draft is scored by

    score = 对仗 (`couplet.writing.rules.parallelism`, in [0, 1]) + weight × mean log p(character)

over the characters the model chose (keywords and a given 上联 aside), the log-probability under the model's own
distribution, before the voice bias and the constraints: 对仗 rewards a draft whose lines answer each other, the
likelihood keeps the reranker from buying 对仗 with odd words. A draft that breaks a hard rule ranks last. The
weight (0.2) was chosen on the dev list and checked on the phrases outside it (`docs/results/quality.md`,
"Best-of-N"). Only the chosen draft gets a 横批 (its scoring forward is per couplet).

Why not the mutual information between the lines (log p(下联 | 上联) − log p(下联)): it needs a second forward of
every 下联 without its 上联; the likelihood here comes free with the decode.

Cost: the prompt is fed once per row (a `shared` or `combo` pool stores its blocks once), and every step is one
forward for the n rows: on two CPU cores 4 drafts take 2.5× one under `full`, 1.7× under `shared`, whose extra
drafts hold 63 KB of KV each against 1287 KB (docs/results/quality.md, "Best-of-N").
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from couplet.events import CoupletResult, peak_owned_bytes
from couplet.kvcache import PrefixPool
from couplet.models.loading import LoadedModel
from couplet.serving.generate import Decoding
from couplet.serving.progress import Progress
from couplet.serving.request import CoupletRequest, Prepared, prepare
from couplet.writing.lexicon import DEFAULT_VOICE, VoiceConfig
from couplet.writing.prompt import DEFAULT_PROMPT, PromptConfig
from couplet.writing.rules import check_couplet

MAX_DRAFTS = 16  # also spaces the drafts' seeds: (seed, draft) → seed × MAX_DRAFTS + draft, all distinct


@dataclass(frozen=True)
class BestOf:
    """How many drafts, how they are sampled, and how much the likelihood weighs against 对仗."""

    n: int = 4
    temperature: float = 0.8  # drafts 1..n-1 (draft 0 is the request as asked)
    top_p: float = 0.9
    weight: float = 0.2  # 对仗 points per nat of mean log-probability per character

    def __post_init__(self) -> None:
        if not 1 <= self.n <= MAX_DRAFTS:
            raise ValueError(f"best-of n must be in [1, {MAX_DRAFTS}], got {self.n}")
        if not 0.0 < self.temperature <= 2.0 or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"drafts need a temperature in (0, 2] and top_p in (0, 1], got {self.temperature}, "
                             f"{self.top_p}")
        if self.weight < 0:
            raise ValueError(f"the likelihood weight is >= 0, got {self.weight}")


def draft_requests(request: CoupletRequest, best: BestOf) -> list[CoupletRequest]:
    """Draft 0 is the request itself; the others sample at `best.temperature`, or at the request's own where it
    samples hotter: the drafts are there to offer the ranking other couplets (at the page's 0.45 they came back
    to the same stock runs: docs/results/quality.md, "Best-of-N")."""
    temperature = max(request.temperature, best.temperature)
    top_p = request.top_p if request.temperature else best.top_p
    # a greedy request ignores its seed, and so do its drafts: the same keywords, the same couplet (the page's
    # promise for temperature 0)
    seed = request.seed if request.temperature else 0
    return [request] + [replace(request, temperature=temperature, top_p=top_p, seed=seed * MAX_DRAFTS + i)
                        for i in range(1, best.n)]


def prepared_drafts(lm: LoadedModel, request: CoupletRequest, best: BestOf | None, prompt: PromptConfig,
                    voice: VoiceConfig) -> tuple[list[CoupletRequest], list[Prepared]]:
    """The engine's drafts (`best` None: the request alone), each request with its prepared prompt. Drafts 1..n-1
    are prepared without a 横批: only the chosen one gets one (`drafted`'s crown), a scoring forward per couplet."""
    requests = draft_requests(request, best) if best is not None else [request]
    return requests, [replace(prepare(lm, r, prompt, voice), hengpi=i == 0) for i, r in enumerate(requests)]


def draft_score(checks: dict[str, Any], logprobs: list[float], weight: float) -> float:
    """对仗 + weight × mean log p per chosen character; -inf for a draft that breaks a hard rule."""
    if not checks["passed"]:
        return float("-inf")
    mean_logprob = sum(logprobs) / len(logprobs) if logprobs else 0.0
    return checks["parallelism"]["score"] + weight * mean_logprob


def rank(drafts: Sequence[tuple[str, str, dict[str, Any], Sequence[float]]], weight: float
         ) -> tuple[int, list[dict[str, Any]]]:
    """Drafts as (上联, 下联, their checks, log p of each chosen character) → the chosen draft's index (ties: the
    earlier, greedy first) and every draft's entry for `CoupletResult.candidates`, in draft order."""
    entries, scores = [], []
    for r, (upper, lower, checks, logprobs) in enumerate(drafts):
        scores.append(draft_score(checks, list(logprobs), weight))
        entries.append({"draft": r, "upper": upper, "lower": lower, "passed": checks["passed"],
                        "parallelism": checks["parallelism"]["score"],
                        "mean_logprob": round(sum(logprobs) / len(logprobs), 4) if logprobs else 0.0,
                        "score": round(scores[-1], 4) if checks["passed"] else None})  # None: breaks a rule
    return max(range(len(entries)), key=scores.__getitem__), entries


def present(result: CoupletResult, chosen: int, entries: list[dict[str, Any]]) -> CoupletResult:
    """The chosen draft's result with every draft (the chosen first) and, for several, a note saying which."""
    result.candidates = sorted(entries, key=lambda d: d["draft"] != chosen)
    if len(entries) > 1:
        pick = entries[chosen]
        result.notes.append(f"从 {len(entries)} 副草稿中择优（第 {chosen + 1} 副）：对仗 {pick['parallelism']:.2f}，"
                            f"每字平均对数似然 {pick['mean_logprob']:.2f}")
    return result


def best_of(lm: LoadedModel, request: CoupletRequest, best: BestOf = BestOf(), mode: str = "full",
            pool: PrefixPool | None = None, prompt: PromptConfig = DEFAULT_PROMPT, voice: VoiceConfig = DEFAULT_VOICE,
            **mode_options) -> CoupletResult:
    """n drafts in one batch under one KV-cache mode; the best-scoring one's result, with every draft in
    `candidates` (the chosen first) and a note saying how it was chosen. Only the chosen draft's 横批 is scored
    (the engine's `stream(..., best=)` finishes every draft: its rows are finished as they leave)."""
    preps = [prepare(lm, r, prompt, voice) for r in draft_requests(request, best)]
    run = Decoding(lm, preps, mode, pool, finish_inline=False, **mode_options)
    try:
        last: list[Progress] | None = run.prefill()
        while not run.done:
            last = run.step()
    finally:
        run.close()
    assert last is not None
    drafts = []
    for r, prep in enumerate(preps):
        upper, lower = run.lines[r]
        checks = check_couplet(upper, lower, "", prep.keyword_text, given_upper=prep.duixia)
        drafts.append((upper, lower, checks, run.chosen_logprobs[r]))
    chosen, entries = rank(drafts, best.weight)
    for entry, records in zip(entries, run.records, strict=True):
        entry["kv_bytes"] = peak_owned_bytes(records)
    run.attach_result(chosen, last[chosen])
    result = last[chosen].result
    assert result is not None
    return present(result, chosen, entries)


def drafted(first: Iterator[Progress], rest: Callable[[], Sequence[Iterator[Progress]]], weight: float,
            crown: Callable[[int, CoupletResult], CoupletResult]) -> Iterator[Progress]:
    """Draft 0's stream, and `rest()` starting the other drafts' → one stream: draft 0's progress as it is written,
    then, once every draft is written, a last Progress with the chosen draft's lines and result (`present`).
    The others start once draft 0's prefill is in, so the first character waits for one prompt, not n: the
    engine then prefills them (from the pool's blocks draft 0 left, where the mode has a pool) and they join
    draft 0's running batch. The page streams the first draft and settles on the best when all are in.

    Draft 0 is finished with its 横批 (on the engine's finisher, while the others decode); the others end
    without one (`Prepared.hengpi` off), and `crown(k, result)` chooses draft k's only if it is chosen: a
    横批 is a scoring forward per couplet, so n − 1 of them would be thrown away."""
    finals: list[Progress] = []
    others: Sequence[Iterator[Progress]] = ()
    for step, progress in enumerate(first):
        if step == 0:
            others = rest()
        if progress.result is not None:
            finals.append(progress)
            break
        yield progress
    for stream in others:
        *_, last = stream
        finals.append(last)
    results = [p.result for p in finals if p.result is not None]
    assert len(results) == 1 + len(others), "every draft ends with its result"
    chosen, entries = rank([(r.upper, r.lower, r.checks, r.logprobs) for r in results], weight)
    for entry, r in zip(entries, results, strict=True):
        entry["kv_bytes"] = r.peak_owned_bytes
    result = results[chosen]
    if chosen:
        t0 = time.perf_counter()
        result = crown(chosen, result)
        result.seconds += time.perf_counter() - t0
    present(result, chosen, entries)
    yield Progress(finals[0].mode, result.upper, result.lower, finals[0].record, result=result)
