"""Is a mode's writing significantly different from `full`'s? Paired tests on the same phrases, the article's
quality floor ("no significant difference from the original in 意境, 对仗 and 文采") made testable.

Per phrase, a mode and `full` each write one couplet (greedy, same prompt). Continuous figures (the 对仗 score,
and the NLL of `full`'s couplet under the mode's cache against `full`'s own) take the Wilcoxon signed-rank
test of the paired differences; yes/no figures (a rule broken, a gloomy or negated or copied line, a shared
template) take McNemar's exact test, a binomial test on the discordant pairs. Two-sided; scipy's
implementations. A p-value is reported with the means, never instead of them: a mode identical to `full` on
every phrase has no discordant pair and p = 1.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from couplet.bench.figures import mean, voice_flags
from couplet.events import CoupletResult

ALPHA = 0.05  # the level at which a difference is called significant


def wilcoxon_p(differences: Sequence[float]) -> float:
    """Two-sided Wilcoxon signed-rank p-value of paired differences (zeros dropped, as Wilcoxon did); 1.0 when
    every difference is zero (nothing to rank)."""
    from scipy.stats import wilcoxon

    nonzero = [d for d in differences if d != 0]
    if not nonzero:
        return 1.0
    return float(wilcoxon(nonzero, zero_method="wilcox", alternative="two-sided").pvalue)


def mcnemar_p(mode: Sequence[bool], full: Sequence[bool]) -> float:
    """McNemar's exact two-sided p-value for paired yes/no outcomes: of the pairs that disagree, are the mode's
    "yes only" as likely as `full`'s? 1.0 when no pair disagrees."""
    from scipy.stats import binomtest

    only_mode = sum(m and not f for m, f in zip(mode, full, strict=True))
    only_full = sum(f and not m for m, f in zip(mode, full, strict=True))
    if only_mode + only_full == 0:
        return 1.0
    return float(binomtest(only_mode, only_mode + only_full, 0.5).pvalue)


def paired_report(mode: list[CoupletResult], full: list[CoupletResult], nll_deltas: Sequence[float]) -> dict[str, Any]:
    """Each figure for the mode and for `full` on the same phrases (in the same order), the difference and its
    p-value, and the figures that differ at `ALPHA`."""
    if len(mode) != len(full) or len(nll_deltas) != len(full):
        raise ValueError("paired_report needs one couplet of each and one NLL delta per phrase")
    figures: dict[str, dict[str, float]] = {}
    par_mode = [r.checks["parallelism"]["score"] for r in mode]
    par_full = [r.checks["parallelism"]["score"] for r in full]
    figures["parallelism"] = {"mode": mean(par_mode), "full": mean(par_full),
                              "p": wilcoxon_p([m - f for m, f in zip(par_mode, par_full, strict=True)])}
    figures["nll_delta"] = {"mode": mean(nll_deltas), "full": 0.0, "p": wilcoxon_p(nll_deltas)}
    flags_mode, flags_full = voice_flags(mode), voice_flags(full)
    flags_mode["rule_fail_rate"] = [not r.checks["passed"] for r in mode]
    flags_full["rule_fail_rate"] = [not r.checks["passed"] for r in full]
    for name in flags_mode:
        figures[name] = {"mode": mean(flags_mode[name]), "full": mean(flags_full[name]),
                         "p": mcnemar_p(flags_mode[name], flags_full[name])}
    return {"n": len(full), "alpha": ALPHA, "figures": figures,
            "significant": [name for name, f in figures.items() if f["p"] < ALPHA]}
