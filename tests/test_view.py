"""The 高峰 panel renders a serving-benchmark JSON as the page shows it."""

from __future__ import annotations

import re

from couplet.page.view import peak_panel_html


def bench(modes: dict[str, float]) -> dict:
    row = {"admitted_concurrency_peak": 9, "kv_per_request_bytes": 2048, "throughput_tok_s": 100.0,
           "throughput_ratio": 1.0, "ttft_p50_ms": 1500.0, "identical_rate": 1.0}
    return {"device": "cpu", "dtype": "float32", "date": "2026-12-03", "command": "python -m couplet.bench serve <x>",
            "config": {"visitors": 40},
            "runs": [{"budget_mb": 14.0, "modes": {m: {**row, "admitted_concurrency": c} for m, c in modes.items()}}]}


def test_the_peak_panel_says_how_many_each_mode_holds_and_where_the_figures_come_from() -> None:
    data = bench({"full": 6.7, "combo": 28.1})
    data["runs"][0]["modes"]["combo"]["throughput_ratio"] = 2.6
    html = peak_panel_html(data)
    assert ("KV 预算 14 MB：完整缓存平均同时接待 6.7 位访客，组合策略 28.1 位；"
            "组合策略每秒写出的字是完整缓存的 2.60 倍。") in html
    assert re.findall(r'<tr data-mode="(\w+)"', html) == ["full", "combo"]
    widths = [float(w) for w in re.findall(r'class="bar" style="width:(\d+)%', html)]
    assert widths == [24.0, 100.0]  # bars scale with the mean concurrency
    assert "2026-12-03" in html and "&lt;x&gt;" in html  # the command is shown, escaped
    assert "尚无高峰测试结果" in peak_panel_html(None)


def result(mode: str, owned: list[int], shared: int = 0, text: str = "龙马精神春风暖"):
    from couplet.events import CoupletResult, StepRecord

    steps = [StepRecord(mode, i, "", 10 + i, 10 + i, b, shared, 1000 * (i + 1), None, None, 0.01)
             for i, b in enumerate(owned)]
    return CoupletResult("龙马", text, text, "", mode, {}, steps, seconds=0.1)


def test_the_table_shows_what_a_sharing_mode_owns_apart_from_what_it_shares() -> None:
    """`shared` alone holds as many bytes as `full`, but most are the pooled prefix every visitor uses: its
    row gives the owned bytes (and their ratio) first, the shared part beside them. Each cell carries its
    column's name for the phone's cards."""
    from couplet.page.view import MODES_COLUMNS, modes_table_html

    table = modes_table_html({"full": result("full", [2048, 4096]), "shared": result("shared", [512, 1024], 3072)})
    shared_row = re.search(r'<tr data-mode="shared">(.*?)</tr>', table).group(1)
    assert "自有 1.0 KB" in shared_row and "共享前缀 3.0 KB" in shared_row
    assert "0.25×（自有）" in shared_row  # 1 KB of full's 4 KB
    full_row = re.search(r'<tr data-mode="full">(.*?)</tr>', table).group(1)
    assert "4.0 KB" in full_row and "共享" not in full_row and "1.00×" in full_row
    assert re.findall(r'data-label="([^"]+)"', full_row) == MODES_COLUMNS
    assert 'tabindex="0"' in table  # a box that may scroll sideways takes the keyboard's focus
