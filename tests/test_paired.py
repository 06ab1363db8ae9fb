"""The paired tests of a mode against `full` (couplet.bench.paired) on couplets made up for the purpose: the
same couplets give p = 1 everywhere; a difference on most phrases is significant, one phrase in many is not."""

from __future__ import annotations

import pytest

from couplet.bench.paired import ALPHA, mcnemar_p, paired_report, wilcoxon_p
from couplet.events import CoupletResult

LINES = ["春风送暖千家福", "瑞雪迎春万户新", "红梅报喜山河秀", "紫燕衔泥岁月新", "金龙献瑞江山丽", "彩凤呈祥日月明"]


def couplets(n: int, score: float = 0.7, lower: str = "瑞雪迎春万户新") -> list[CoupletResult]:
    return [CoupletResult(f"春{i}", LINES[i % len(LINES)], lower, "春满人间", "full",
                          {"passed": True, "parallelism": {"score": score + 0.001 * (i % 7)}}) for i in range(n)]


def test_the_same_couplets_differ_in_nothing():
    full = couplets(40)
    report = paired_report(full, full, [0.0] * 40)
    assert report["n"] == 40 and report["significant"] == []
    assert all(f["p"] == 1.0 and f["mode"] == f["full"] for f in report["figures"].values())
    assert set(report["figures"]) == {"parallelism", "nll_delta", "negation_rate", "taboo_rate", "gloom_rate",
                                      "copy_rate", "template_repeat", "rule_fail_rate"}


def test_a_difference_on_most_phrases_is_significant_and_one_in_many_is_not():
    full = couplets(40)
    worse = couplets(40, score=0.6)  # every 对仗 score 0.1 lower
    gloomy = couplets(40, lower="白发黄昏独自愁")  # a gloomy 下联 on every phrase
    assert paired_report(worse, full, [0.01 * (1 + i % 3) for i in range(40)])["significant"] == \
        ["parallelism", "nll_delta"]
    assert "gloom_rate" in paired_report(gloomy, full, [0.0] * 40)["significant"]
    one = full[:39] + gloomy[39:]  # one gloomy couplet in forty
    report = paired_report(one, full, [0.0] * 39 + [0.2])
    assert report["figures"]["gloom_rate"]["mode"] == pytest.approx(1 / 40)
    assert report["figures"]["gloom_rate"]["p"] == 1.0 and report["figures"]["nll_delta"]["p"] == 1.0
    assert report["significant"] == []


def test_the_tests_themselves():
    assert wilcoxon_p([0.0, 0.0]) == 1.0 and wilcoxon_p([0.1] * 12) < ALPHA
    assert wilcoxon_p([0.1, -0.1] * 10) > 0.9  # as many up as down
    assert mcnemar_p([True] * 10, [False] * 10) < 0.01  # 10 discordant pairs, all one way: 2 / 2**10
    assert mcnemar_p([True, False], [False, True]) == 1.0
    with pytest.raises(ValueError):
        paired_report(couplets(3), couplets(2), [0.0] * 3)
