
import plotly.graph_objects as go

from couplet.events import StepRecord
from couplet.kvcache import MODE_INFO
from couplet.page.charts import (
    KV_AXIS,
    KV_TITLE,
    LINE_STYLES,
    STEP_AXIS,
    SWEEP_TEXT_EN,
    UIREVISION,
    kv_figure,
    memory_figure,
    mode_color,
    sweep_figure,
)

LABELS = {"full": "完整 full", "window": "窗口 window"}


def records(mode, kv, shared=0, device=None, full_per_step=1000):
    return [
        StepRecord(mode=mode, step=i, token="龙马精神"[i % 4], logical_length=10 + i, stored_tokens=10 + i,
                   kv_bytes=b, shared_bytes=shared, full_equivalent_bytes=full_per_step * (i + 1),
                   device_allocated=None if device is None else device[i], device_peak=None, seconds=0.01)
        for i, b in enumerate(kv)
    ]


def by_meta(fig, meta):
    found = [t for t in fig.data if t.meta == meta]
    assert len(found) == 1
    return found[0]


def test_kv_figure_one_line_per_mode_plus_full_equivalent():
    data = {"full": records("full", [1024, 2048, 3072]), "shared": records("shared", [1024, 2048, 2048], shared=2048)}
    fig = kv_figure(data, LABELS)
    assert isinstance(fig, go.Figure) and len(fig.data) == 3
    full, shared = by_meta(fig, "full"), by_meta(fig, "shared")
    assert list(full.y) == [1.0, 2.0, 3.0] and list(full.x) == [0, 1, 2]
    # the bytes this visitor owns; its share of the pooled prefix is told in the hover, not added to the line
    assert list(shared.y) == [1.0, 2.0, 2.0]
    assert all("共享前缀 2 KB" in extra for _, extra in shared.customdata)
    assert all(extra == "" for _, extra in full.customdata)
    assert shared.line.color == MODE_INFO["shared"].color
    eq = by_meta(fig, "full-equivalent")
    assert eq.line.dash == "dash" and list(eq.y) == [1000 / 1024, 2000 / 1024, 3000 / 1024]
    assert fig.layout.xaxis.title.text == STEP_AXIS and fig.layout.yaxis.title.text == KV_AXIS
    assert fig.layout.title.text == KV_TITLE and fig.layout.uirevision == UIREVISION


def test_lines_that_coincide_are_told_apart():
    """Modes that draw the same line differ in dash and marker, and one label at the right end names them
    all; labels of groups that end close together are pushed apart."""
    same = [1024, 2048, 2048]
    data = {m: records(m, same) for m in ("window", "selective", "snapkv")}
    data["full"] = records("full", [1024, 2048, 4096])
    data["int4"] = records("int4", [1024, 2048, 2200])  # ends 4% above the window group: a group of its own
    fig = kv_figure(data, {})
    styles = {(t.line.dash, t.marker.symbol) for t in fig.data if t.meta in data}
    assert len(styles) == len(data) and len(LINE_STYLES) == len(set(LINE_STYLES.values())) == len(MODE_INFO)
    assert not fig.layout.showlegend
    labels = {a.text: a.y for a in fig.layout.annotations}
    assert labels.keys() == {"滑动窗口 · 选择性保留 · SnapKV 提示压缩", "INT4 量化", "完整缓存"}
    assert labels["滑动窗口 · 选择性保留 · SnapKV 提示压缩"] == 2.0 and labels["完整缓存"] == 4.0
    assert labels["INT4 量化"] - 2.0 >= 0.09 * 4.0 - 1e-9  # pushed clear of the group below it
    assert all(a.x == 2 and a.xanchor == "right" for a in fig.layout.annotations)


def test_modes_of_different_lengths_and_unknown_labels():
    fig = kv_figure({"int4": records("int4", [10, 20]), "mystery": records("mystery", [5])}, {})
    assert by_meta(fig, "int4").name == "int4" and len(by_meta(fig, "mystery").y) == 1
    assert by_meta(fig, "mystery").line.color == mode_color("mystery") not in [i.color for i in MODE_INFO.values()]
    assert len(by_meta(fig, "full-equivalent").x) == 2


def test_updates_stay_small():
    data = {m: records(m, list(range(0, 40_000, 1000))) for m in MODE_INFO}
    size = len(kv_figure(data, {}).to_json())
    assert size < 16_000, size  # 7 modes x 40 steps; the default template alone would add ~7 KB


def test_memory_on_cpu_says_there_is_no_gpu_and_plots_no_vram():
    data = {"full": records("full", [1024, 2048]), "window": records("window", [1024, 1024])}
    fig = memory_figure(data, LABELS)
    assert len(fig.data) == 1 and fig.data[0].meta == "all-modes-kv"
    assert list(fig.data[0].y) == [2.0, 3.0]  # KV held by all modes together, in KB
    assert "没有 GPU" in fig.layout.title.text and "不编造" in fig.layout.title.text
    assert "MB" not in fig.layout.yaxis.title.text


def test_memory_on_gpu_plots_allocator_megabytes():
    mb = 1024 * 1024
    data = {"full": records("full", [1, 2], device=[100 * mb, 101 * mb]),
            "int8": records("int8", [1, 2], device=[None, 50 * mb])}
    fig = memory_figure(data, LABELS)
    assert len(fig.data) == 2 and "显存" in fig.layout.title.text
    assert {a.text for a in fig.layout.annotations} == {"完整缓存", "INT8 量化"}  # named at the line ends
    assert list(by_meta(fig, "full").y) == [100.0, 101.0]
    assert list(by_meta(fig, "int8").y) == [None, 50.0]  # a gap, not a made-up zero
    assert by_meta(fig, "int8").line.color == MODE_INFO["int8"].color


def test_empty_input_gives_empty_figures():
    assert len(kv_figure({}, {}).data) == 0
    fig = memory_figure({}, {})
    assert "没有 GPU" in fig.layout.title.text  # still explains itself


def test_the_sweep_plots_throughput_and_concurrency_against_the_budget() -> None:
    """One line per mode in each panel, budgets in increasing order whatever order they ran in, one legend
    entry per mode, the page's Chinese labels (or English for the benchmark's PNG)."""
    def run(budget: float, full: float, combo: float) -> dict:
        return {"budget_mb": budget, "modes": {
            "full": {"throughput_tok_s": 10 * full, "admitted_concurrency": full},
            "combo": {"throughput_tok_s": 20 * combo, "admitted_concurrency": combo}}}

    bench = {"runs": [run(14.0, 7, 40), run(7.0, 2, 20), run(28.0, 15, 80)]}
    fig = sweep_figure(bench, {"full": "完整缓存"})
    assert [(t.meta, t.xaxis) for t in fig.data] == [("full", "x"), ("full", "x2"), ("combo", "x"), ("combo", "x2")]
    assert all(list(t.x) == [7.0, 14.0, 28.0] for t in fig.data)
    assert list(fig.data[0].y) == [20, 70, 150] and list(fig.data[3].y) == [20, 40, 80]
    assert [t.showlegend for t in fig.data] == [True, False, True, False]
    assert fig.data[0].name == "完整缓存" and fig.data[2].name == "combo"
    assert fig.layout.xaxis.title.text == "KV 预算 (MB)" and fig.layout.annotations[0].text == "吞吐（字/秒）"
    english = sweep_figure(bench, text=SWEEP_TEXT_EN)
    assert english.layout.xaxis2.title.text == "KV budget (MB)"
    assert mode_color("combo") in {t.line.color for t in fig.data}
