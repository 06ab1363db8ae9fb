"""Quality against N and the likelihood weight for best-of-N, from one run of 8 drafts per phrase.

    python scripts/best_of_table.py assets/dev_keywords.txt assets/outside_keywords.txt [--n 8]

Draft i of a request is the same whatever N (`couplet.serving.best_of.draft_requests`), so the first k drafts of
a best-of-8 run are best-of-k's drafts: each (N, weight) row re-picks among them by `draft_score`. Prints one
Markdown table per keyword list: 对仗, the mean log-probability per chosen character, template repeat, negation
and gloom of the picked couplets (the figures of `couplet.bench.figures`; the 横批 is not scored here).
"""

from __future__ import annotations

import argparse
import statistics
from types import SimpleNamespace

from couplet.bench.figures import template_flags, voice_flags
from couplet.bench.quality import read_lines
from couplet.models.loading import load_model
from couplet.serving.best_of import BestOf, best_of
from couplet.serving.generate import CoupletRequest

WEIGHTS = (0.0, 0.1, 0.2, 0.3, 0.5)


def pick(drafts: list[dict], n: int, weight: float | None) -> dict:
    """The best of the first n drafts; weight None ranks by likelihood alone."""
    ok = [d for d in drafts[:n] if d["passed"]] or drafts[:1]
    if weight is None:
        return max(ok, key=lambda d: d["mean_logprob"])
    return max(ok, key=lambda d: d["parallelism"] + weight * d["mean_logprob"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("keywords", nargs="+", help="keyword lists, one phrase per line")
    p.add_argument("--n", type=int, default=8)
    a = p.parse_args()
    lm = load_model(None, "cpu", "float32")
    for path in a.keywords:
        phrases = read_lines(path)
        runs = {kw: sorted(best_of(lm, CoupletRequest(kw), BestOf(n=a.n)).candidates, key=lambda d: d["draft"])
                for kw in phrases}
        print(f"\n{path} ({len(phrases)} phrases, {a.n} drafts each)\n")
        print("| N | weight | 对仗 | mean log p | template repeat | negation | gloom |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        n = 1
        while n <= a.n:
            for weight in (WEIGHTS + (None,)) if n > 1 else (0.0,):
                chosen = {kw: pick(drafts, n, weight) for kw, drafts in runs.items()}
                results = [SimpleNamespace(keywords=kw, upper=d["upper"], lower=d["lower"], exemplars=[],
                                           checks={}) for kw, d in chosen.items()]
                flags = voice_flags(results)
                row = [statistics.fmean(d["parallelism"] for d in chosen.values()),
                       statistics.fmean(d["mean_logprob"] for d in chosen.values()),
                       statistics.fmean(template_flags(results)), statistics.fmean(flags["negation_rate"]),
                       statistics.fmean(flags["gloom_rate"])]
                label = "—" if n == 1 else ("likelihood only" if weight is None else f"{weight:g}")
                print(f"| {n} | {label} | " + " | ".join(f"{v:.3f}" for v in row) + " |")
            n *= 2


if __name__ == "__main__":
    main()
