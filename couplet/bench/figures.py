"""The figures of a set of couplets, as a reader would count them: the festive voice (negation, taboo, gloom),
copies of lines the prompt showed or the project's own 春联, templates shared between phrases, and the 横批's
variety. Shares of couplets; `couplet.bench.quality` reports them per mode."""

from __future__ import annotations

import statistics
from collections import Counter
from functools import lru_cache
from typing import Any

from couplet.events import CoupletResult
from couplet.writing.constraints import COPY_RUN
from couplet.writing.folk import FOLK_ROUND2, folk_lines, load_folk
from couplet.writing.lexicon import NEGATION, TABOO, is_gloomy
from couplet.writing.prompt import HOUSE_COUPLETS, HouseCouplet


def mean(values) -> float:
    values = [float(v) for v in values]
    return statistics.fmean(values) if values else 0.0


def chosen_text(r: CoupletResult) -> str:
    """The characters the model chose: both lines minus the keywords (and minus a given 上联)."""
    lines = "".join(written_lines(r))
    return "".join(c for c in lines if c not in r.keywords)


def runs(line: str, keywords: str = "", n: int = COPY_RUN) -> set[str]:
    """Runs of n characters of `line` that are not made of keyword characters only: sharing one with a line is
    borrowing it (the page's decoding bans the same runs, `couplet.writing.constraints.copy_runs`)."""
    return {line[i : i + n] for i in range(len(line) - n + 1) if any(c not in keywords for c in line[i : i + n])}


def written_lines(r: CoupletResult) -> tuple[str, ...]:
    """The lines the model wrote: both, or the 下联 alone where the visitor gave the 上联 (对下联)."""
    return (r.lower,) if r.checks.get("given_upper") else (r.upper, r.lower)


def copies(r: CoupletResult, house: tuple[HouseCouplet, ...] = HOUSE_COUPLETS) -> bool:
    """Does a line share a run of 4+ characters with a line the prompt showed (exemplar or house), or with a
    line of the project's own 春联 (`couplet.writing.folk`: trained on, so it could be recited)?"""
    borrowed = [line for pair in r.exemplars for line in pair] + \
        [line for h in house for line in (h.upper, h.lower)] + list(folk_lines())
    grams = set().union(*(runs(line) for line in borrowed)) if borrowed else set()
    return any(runs(line, r.keywords) & grams for line in written_lines(r))


@lru_cache(maxsize=1)
def _round2_runs() -> frozenset[str]:
    return frozenset().union(*(runs(line) for c in load_folk(FOLK_ROUND2) for line in (c.upper, c.lower)))


def round2_flags(results: list[CoupletResult]) -> list[bool]:
    """Per couplet: does a line the model wrote share a run of 4+ characters with a line of the second round of
    the project's 春联 (trained on, but not banned: `couplet.writing.folk.FOLK_ROUND2`)? A recitation check:
    compare it with a model never trained on the round, since the voice shares its common runs."""
    trained = _round2_runs()
    return [any(runs(line, r.keywords) & trained for line in written_lines(r)) for r in results]


def template_flags(results: list[CoupletResult]) -> list[bool]:
    """Per couplet: does it share a run of 4+ characters with another phrase's couplet, keyword runs aside?"""
    per_couplet = [runs(r.upper, r.keywords) | runs(r.lower, r.keywords) for r in results]
    seen: dict[str, int] = {}
    for grams in per_couplet:
        for g in grams:
            seen[g] = seen.get(g, 0) + 1
    return [any(seen[g] > 1 for g in grams) for grams in per_couplet]


def template_repeat(results: list[CoupletResult]) -> float:
    """Share of couplets sharing a run of 4+ characters with another phrase's couplet, keyword runs aside."""
    return mean(template_flags(results))


def voice_flags(results: list[CoupletResult]) -> dict[str, list[bool]]:
    """Per couplet, each festive-voice fault `voice_report` counts (what a paired test compares)."""
    return {
        "negation_rate": [any(c in NEGATION for c in chosen_text(r)) for r in results],
        "taboo_rate": [any(c in TABOO for c in chosen_text(r)) for r in results],
        "gloom_rate": [is_gloomy(chosen_text(r)) for r in results],
        "copy_rate": [copies(r) for r in results],
        "template_repeat": template_flags(results),
    }


def hengpi_report(results: list[CoupletResult]) -> dict[str, Any]:
    """The 横批: how often it is the visitor's keywords verbatim, or reordered (燕舞莺歌 → 莺歌燕舞), or words of a
    line, how varied it is (the most frequent one's share, and how many distinct ones)."""
    counts = Counter(r.hengpi for r in results)
    top, top_n = counts.most_common(1)[0] if counts else ("", 0)
    return {"hengpi_keywords_verbatim": mean(r.hengpi == r.keywords for r in results),
            "hengpi_keywords_reordered": mean(r.hengpi != r.keywords and sorted(r.hengpi) == sorted(r.keywords)
                                              for r in results),
            "hengpi_in_line": mean(r.hengpi in r.upper + r.lower for r in results),
            "hengpi_top": top, "hengpi_top_share": top_n / len(results) if results else 0.0,
            "hengpi_distinct": len(counts)}


def voice_report(results: list[CoupletResult]) -> dict[str, float]:
    """The festive-voice figures of a set of couplets (shares of couplets)."""
    return {name: mean(flags) for name, flags in voice_flags(results).items()}


def writing_report(results: list[CoupletResult]) -> dict[str, Any]:
    """What a reader counts in a set of couplets: rules kept, the 对仗 score, the voice, the 横批."""
    return {"rule_pass_rate": mean(r.checks["passed"] for r in results),
            "parallelism": mean(r.checks["parallelism"]["score"] for r in results),
            # the 对仗 of the pairs the model wrote (the keywords' own pairs aside), and how often the keywords'
            # halves face each other with one tone at a rhythm position (人工 / 智能), which no decoding mends
            "parallelism_written": mean(r.checks["parallelism"]["written"] for r in results),
            "keyword_clash_rate": mean(bool(r.checks["parallelism"]["given_clash"]) for r in results),
            **voice_report(results), "round2_run_rate": mean(round2_flags(results)), **hengpi_report(results)}


def sampled_report(sampled: list[list[CoupletResult]]) -> dict[str, Any]:
    """`writing_report` over sampled couplets (per phrase, its couplet under each seed), one seed at a time
    (each seed: one couplet per phrase, as greedy has; the same phrase's couplets under two seeds would count
    as each other's templates), averaged over the seeds; and how many of a phrase's couplets differ."""
    seeds = len(sampled[0])
    per_seed = [writing_report([drawn[s] for drawn in sampled]) for s in range(seeds)]
    out: dict[str, Any] = {"seeds": seeds, "phrases": len(sampled),
                           "distinct_per_phrase": mean(len({(r.upper, r.lower) for r in drawn}) / len(drawn)
                                                       for drawn in sampled)}
    for key, value in per_seed[0].items():
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        out[key] = statistics.fmean(seed[key] for seed in per_seed) if numeric else value
    return out
