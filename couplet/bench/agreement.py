"""Step agreement: a mode's cache against `full`'s along `full`'s own couplet (teacher-forced), choice by choice,
so that one early flip does not count every later character; and how close `full` itself was where they part.
Read by `couplet.bench.quality` (each mode's `step_agreement`)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from couplet.bench.figures import mean
from couplet.kvcache import PrefixPool
from couplet.models.loading import LoadedModel
from couplet.serving.generate import CoupletRequest, decode, prepare

if TYPE_CHECKING:  # the harness's config; quality imports this module
    from couplet.bench.quality import EvalConfig

NEAR_TIE = 0.1  # nats: a greedy choice `full` made by less than this is a near tie (bf16 rounding flips them)


@dataclass
class Followed:
    """(upper, lower) teacher-forced through one mode's cache."""

    nll: float  # mean NLL per character
    # per free choice (keywords aside): did this cache's greedy pick, given the followed history, equal the
    # followed character; and the margin of that pick over its runner-up (nats)
    agrees: list[bool]
    margins: list[float]


def follow(lm: LoadedModel, cfg: EvalConfig, request: CoupletRequest, mode: str, pool: PrefixPool,
           upper: str, lower: str, options: dict[str, Any]) -> Followed:
    """Teacher-force (upper, lower) through `mode`'s cache: its NLL and, at every free choice, its decision."""
    prep = prepare(lm, request, cfg.prompt, cfg.voice)
    logps, agrees, margins = [], [], []
    for p in decode(lm, prep, mode, pool, follow=(upper, lower), **options):
        if p.logprob is not None:
            logps.append(p.logprob)
        if p.decision is not None:
            agrees.append(p.decision[0] == p.record.token)
            margins.append(p.decision[1])
    return Followed(-sum(logps) / len(logps), agrees, margins)


def agreement_report(pairs: list[tuple[Followed, Followed]]) -> dict[str, Any]:
    """Per phrase (the mode's run, `full`'s run), along `full`'s couplet: how often the mode would pick `full`'s
    next character (per free choice, so one early flip does not count every later character), and how close
    `full` itself was where it would not: `flips_near_tie` is the share of those flips at which `full`'s pick
    led its runner-up by < NEAR_TIE nats."""
    flips = [ref for m, f in pairs for ok, ref in zip(m.agrees, f.margins, strict=True) if not ok]
    choices = sum(len(m.agrees) for m, _ in pairs)
    return {"step_agreement": 1.0 - len(flips) / choices if choices else 1.0,
            "flips": len(flips),
            "flips_near_tie": mean(ref < NEAR_TIE for ref in flips) if flips else None,
            "flip_margin_median": statistics.median(flips) if flips else None}
