"""Plotly figures of the per-step records (`couplet.events.StepRecord`), redrawn on every decode step.

Each figure is rebuilt from scratch per update, so it is kept small: no default template (`template="none"`
plus a few layout keys, ~1 KB instead of ~7 KB), and a constant `uirevision` so the visitor's zoom and
legend toggles survive the stream of updates. The per-step figures (`kv_figure`, `memory_figure`) are written
as plain dicts and wrapped once without Plotly's property validation (`_figure`): validating every trace and
layout key took ~25 ms per figure, two figures per decode step, on the page's thread (the GIL the engine's
worker needs too) — about half a second of a four-mode couplet. The dicts are the same keys Plotly's classes
take; the tests read them back through the Figure.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import plotly.graph_objects as go
import plotly.io as pio

from couplet.events import StepRecord
from couplet.kvcache import MODE_INFO

if TYPE_CHECKING:
    from couplet.vllm_backend.client import EngineGauges

_FALLBACK_COLORS = ("#c2185b", "#00838f", "#6d4c41", "#558b2f")  # modes outside the registry (none today)
FULL_EQUIVALENT_COLOR = "#9e9e9e"
FONT_FAMILY = '"CoupletKai", "LXGW WenKai", "Noto Sans CJK SC", sans-serif'
UIREVISION = "couplet-steps"
STEP_AXIS = "解码步"
KV_AXIS = "KV 缓存 (KB)"
MEMORY_AXIS = "显存占用 (MB)"
KV_TITLE = "每写一字，各模式占多少 KV 缓存"
NO_GPU_TITLE = "各模式合计的 KV 缓存<br><sup>本机没有 GPU：不画显存，也不编造数字</sup>"
GPU_TITLE = "每写一字的显存占用<br><sup>CUDA 分配器所报</sup>"
# Several modes draw the same line (full with int8's twin combo, the three retention modes at the same
# budget): a dash and a marker of their own tell them apart where the colours overlap, and a label at the
# line's right end names every mode that ends there.
LINE_STYLES = {"full": ("solid", "circle"), "window": ("dash", "square"), "selective": ("dot", "diamond"),
               "snapkv": ("dashdot", "triangle-up"), "int8": ("solid", "x"), "int4": ("longdash", "cross"),
               "shared": ("dash", "circle-open"), "combo": ("dot", "star")}
KB, MB = 1024, 1024 * 1024
# Plotly's empty "none" template, resolved once (the validator resolves a template's name on every figure)
NO_TEMPLATE = pio.templates["none"].to_plotly_json()


def mode_color(mode: str) -> str:
    """The fixed colour of a mode (`MODE_INFO`); a name outside the registry gets a stable spare colour."""
    if mode in MODE_INFO:
        return MODE_INFO[mode].color
    return _FALLBACK_COLORS[sum(map(ord, mode)) % len(_FALLBACK_COLORS)]


def _layout_dict(title: str, y_title: str) -> dict:
    """The page's chart layout: no default template, the festive palette, a fixed `uirevision`."""
    return {
        "template": copy.deepcopy(NO_TEMPLATE),
        "title": {"text": title, "x": 0.01, "xanchor": "left", "font": {"size": 16, "color": "#7d1010"}},
        "font": {"family": FONT_FAMILY, "size": 13, "color": "#2a1410"},
        "paper_bgcolor": "#fffaf0",
        "plot_bgcolor": "#fffdf7",
        "margin": {"l": 60, "r": 16, "t": 48, "b": 136},
        "height": 400,
        "hovermode": "x unified",
        "legend": {"orientation": "h", "y": -0.4, "yanchor": "top", "x": 0, "bgcolor": "rgba(0,0,0,0)"},
        "uirevision": UIREVISION,
        # the two axes' "0" labels meet at the corner on a narrow screen: each stands a little off its axis
        "xaxis": {"title": {"text": STEP_AXIS}, "gridcolor": "#f0e2bd", "zeroline": False, "rangemode": "tozero",
                  "ticklabelstandoff": 4},
        "yaxis": {"title": {"text": y_title}, "gridcolor": "#f0e2bd", "zeroline": False, "rangemode": "tozero",
                  "ticklabelstandoff": 4},
    }


def _layout(fig: go.Figure, title: str, y_title: str) -> go.Figure:
    fig.update_layout(**_layout_dict(title, y_title))
    return fig


def _figure(traces: list[dict], layout: dict, **changes: object) -> go.Figure:
    """A Figure from trace and layout dicts, `changes` laid over the layout's top-level keys (their sub-keys
    merged), without Plotly's per-property validation (`_validate=False`, a private argument of
    `BaseFigure`; see the module docstring for why)."""
    for key, value in changes.items():
        layout[key] = {**layout[key], **value} if isinstance(value, dict) and isinstance(layout.get(key), dict) \
            else value
    return go.Figure({"data": traces, "layout": layout}, _validate=False)


def _line(mode: str, label: str, steps: Sequence[int], values: Sequence[float | None], tokens: Sequence[str],
          unit: str, extra: Sequence[str] | None = None) -> dict:
    dash, symbol = LINE_STYLES.get(mode, ("solid", "circle"))
    return {
        "type": "scatter", "x": list(steps), "y": list(values),
        "customdata": [list(c) for c in zip(tokens, extra or [""] * len(tokens), strict=True)], "name": label,
        "meta": mode, "mode": "lines+markers", "line": {"color": mode_color(mode), "width": 2.5, "dash": dash},
        "marker": {"size": 6, "symbol": symbol},
        "hovertemplate": f"{label} · 「%{{customdata[0]}}」 %{{y:.1f}} {unit}%{{customdata[1]}}<extra></extra>",
    }


def end_labels(ends: Mapping[str, tuple[int, float]], labels: Mapping[str, str], y_max: float) -> list[dict]:
    """One annotation per group of lines that end at (nearly) the same height, naming every mode in it, at the
    right end of the chart; groups closer than 9% of the y range are pushed apart so their labels never
    overlap. `ends`: mode -> (last step, last value)."""
    groups: list[tuple[float, int, list[str]]] = []  # (value, step, modes), modes that end together
    for mode, (step, value) in sorted(ends.items(), key=lambda kv: kv[1][1]):
        if groups and abs(value - groups[-1][0]) <= 0.015 * y_max:
            groups[-1][2].append(mode)
        else:
            groups.append((value, step, [mode]))
    out, floor = [], -float("inf")
    gap = 0.09 * y_max
    for value, step, modes in groups:
        y = max(value, floor + gap)
        floor = y
        out.append({"x": step, "y": y, "xref": "x", "yref": "y", "xanchor": "right", "yanchor": "bottom",
                    "yshift": 2, "showarrow": False, "text": " · ".join(labels.get(m, m) for m in modes),
                    "font": {"size": 11, "color": mode_color(modes[0])}, "bgcolor": "rgba(255,253,247,0.85)"})
    return out


def kv_figure(records_by_mode: Mapping[str, Sequence[StepRecord]], labels: Mapping[str, str]) -> go.Figure:
    """KV bytes each mode holds on its own per decode step, in KB, one line per mode, plus a dashed line for
    what the uncompressed cache would hold at the same length. A mode that shares pooled prefix blocks draws
    what this visitor owns (what one more visitor costs); the shared part is in its hover and the table.
    Lines are named at their right ends (`end_labels`): no legend to fold onto the axis on a phone."""
    traces = []
    full_equivalent: dict[int, int] = {}
    ends: dict[str, tuple[int, float]] = {}
    for mode, records in records_by_mode.items():
        steps = [r.step for r in records]
        values = [r.kv_bytes / KB for r in records]
        shared = [f"（另有共享前缀 {r.shared_bytes / KB:.0f} KB，多人共用）" if r.shared_bytes else ""
                  for r in records]
        traces.append(_line(mode, labels.get(mode, mode), steps, values, [r.token for r in records], "KB", shared))
        if records:
            ends[mode] = (steps[-1], values[-1])
        for r in records:
            full_equivalent[r.step] = max(full_equivalent.get(r.step, 0), r.full_equivalent_bytes)
    if full_equivalent:
        steps = sorted(full_equivalent)
        traces.append({
            "type": "scatter", "x": steps, "y": [full_equivalent[s] / KB for s in steps], "name": "未压缩等价",
            "meta": "full-equivalent", "mode": "lines",
            "line": {"color": FULL_EQUIVALENT_COLOR, "width": 1.5, "dash": "dash"},
            "hovertemplate": "未压缩等价 %{y:.1f} KB<extra></extra>",
        })
    y_max = max([v for _, v in ends.values()] + [full_equivalent[s] / KB for s in full_equivalent] + [1.0])
    return _figure(traces, _layout_dict(KV_TITLE, KV_AXIS), **_named_lines(ends, labels, y_max))


def placeholder_figure(title: str, y_title: str) -> go.Figure:
    """A chart before any couplet: its title and axes, and what it will show (a chart left empty would be
    Gradio's icon, which says nothing and carries an aria-label its element may not have)."""
    fig = _layout(go.Figure(), title, y_title)
    fig.add_annotation(text="点「开门见喜」，这里逐字画出", xref="paper", yref="paper", x=0.5, y=0.5,
                       showarrow=False, font={"size": 14, "color": "#7a5a50"})
    fig.update_layout(showlegend=False, margin={"b": 56, "r": 12, "t": 64}, height=380,
                      xaxis={"range": [0, 14]}, yaxis={"range": [0, 1]})
    return fig


MEMORY_TITLE = "每写一字的内存<br><sup>有 GPU 时画显存，否则画各模式合计的 KV 缓存</sup>"


def _named_lines(ends: Mapping[str, tuple[int, float]], labels: Mapping[str, str], y_max: float) -> dict:
    """The layout changes that name the lines at their right ends, in the modes' short Chinese names, instead of
    a legend."""
    short = {m: MODE_INFO[m].label_zh if m in MODE_INFO else labels.get(m, m) for m in ends}
    return {"showlegend": False, "margin": {"b": 56, "r": 12}, "height": 380,
            "annotations": end_labels(ends, short, y_max)}


def memory_figure(records_by_mode: Mapping[str, Sequence[StepRecord]], labels: Mapping[str, str]) -> go.Figure:
    """Device memory per step (CUDA allocator, MB), one line per mode. On CPU (every value None) there is
    nothing true to plot, so the figure says so and shows the KV bytes all modes hold together instead."""
    has_device = any(r.device_allocated is not None for records in records_by_mode.values() for r in records)
    if has_device:
        traces = []
        ends: dict[str, tuple[int, float]] = {}
        for mode, records in records_by_mode.items():
            values = [None if r.device_allocated is None else r.device_allocated / MB for r in records]
            traces.append(_line(mode, labels.get(mode, mode), [r.step for r in records], values,
                                [r.token for r in records], "MB"))
            known = [(r.step, v) for r, v in zip(records, values, strict=True) if v is not None]
            if known:
                ends[mode] = known[-1]
        named = _named_lines(ends, labels, max([v for _, v in ends.values()] + [1.0]))
        named["margin"] = {**named["margin"], "t": 64}
        return _figure(traces, _layout_dict(GPU_TITLE, MEMORY_AXIS), **named)

    total: dict[int, int] = {}
    for records in records_by_mode.values():
        for r in records:
            total[r.step] = total.get(r.step, 0) + r.kv_bytes + r.shared_bytes
    steps = sorted(total)
    trace = {"type": "scatter", "x": steps, "y": [total[s] / KB for s in steps], "name": "所有模式合计 KV 缓存",
             "meta": "all-modes-kv", "mode": "lines", "fill": "tozeroy", "line": {"color": "#b22222", "width": 2},
             "fillcolor": "rgba(212,175,55,0.25)", "hovertemplate": "合计 %{y:.1f} KB<extra></extra>"}
    return _figure([trace], _layout_dict(NO_GPU_TITLE, "KV 缓存合计 (KB)"), showlegend=False,
                   margin={"b": 56, "t": 64}, height=380)


def engine_figure(steps: Sequence[int], gauges: Sequence[EngineGauges]) -> go.Figure:
    """A remote engine's own gauges (`couplet.vllm_backend.client.EngineGauges`) as the request's steps arrived:
    the KV bytes it holds for all its requests, and its running and waiting requests. Engine-wide totals, not
    this request's: the title says so."""
    from plotly.subplots import make_subplots

    fig = make_subplots(specs=[[{"secondary_y": True}]])
    fig.add_trace(go.Scatter(
        x=list(steps), y=[g.kv_bytes / KB for g in gauges], name="引擎 KV 缓存 (KB)", meta="engine-kv",
        mode="lines+markers", fill="tozeroy", line={"color": "#b22222", "width": 2},
        fillcolor="rgba(212,175,55,0.25)", hovertemplate="引擎 KV %{y:.1f} KB<extra></extra>"))
    for name, key, color in (("运行中请求", "running", "#1565c0"), ("排队请求", "waiting", "#6d4c41")):
        fig.add_trace(go.Scatter(
            x=list(steps), y=[getattr(g, key) for g in gauges], name=name, meta=f"engine-{key}", mode="lines",
            line={"color": color, "width": 2, "shape": "hv"}, hovertemplate=f"{name} %{{y}}<extra></extra>"),
            secondary_y=True)
    title = "vLLM 引擎仪表（全引擎合计，非单个请求）"
    if gauges:
        g = gauges[-1]
        hit = g.prefix_hits / g.prefix_queries if g.prefix_queries else 0.0
        title += (f"<br><sup>KV 类型 {g.dtype_label} · 容量 {g.capacity_bytes / KB:.0f} KB（{g.num_blocks} 块 × "
                  f"{g.block_size} 词元）· 前缀缓存累计命中 {hit:.0%} · 抢占 {g.preemptions:.0f} 次</sup>")
    fig = _layout(fig, title, "引擎 KV 缓存 (KB)")
    fig.update_layout(margin={"t": 64})
    fig.update_yaxes(title_text="请求数", secondary_y=True, rangemode="tozero", showgrid=False)
    return fig


@dataclass(frozen=True)
class SweepText:
    """The words of `sweep_figure`: Chinese on the page; English where it is rendered without the page's
    fonts (the benchmark's PNG, drawn by a browser that may have no CJK font)."""

    throughput: str = "吞吐（字/秒）"
    concurrency: str = "同时接待（人，平均）"
    budget: str = "KV 预算 (MB)"


SWEEP_TEXT_EN = SweepText("throughput (characters/s)", "admitted concurrency (mean)", "KV budget (MB)")


def sweep_figure(bench: Mapping, labels: Mapping[str, str] | None = None, text: SweepText = SweepText(),
                 title: str = "") -> go.Figure:
    """From a `python -m couplet.bench serve` JSON run at several budgets (its `runs`): throughput and the
    mean admitted concurrency against the KV budget, one line per mode, side by side."""
    from plotly.subplots import make_subplots

    runs = sorted(bench["runs"], key=lambda run: run["budget_mb"])
    budgets = [run["budget_mb"] for run in runs]
    fig = make_subplots(rows=1, cols=2, subplot_titles=(text.throughput, text.concurrency), horizontal_spacing=0.1)
    for mode in runs[0]["modes"]:
        rows = [run["modes"].get(mode, {}) for run in runs]
        label = (labels or {}).get(mode, mode)
        for col, key, unit in ((1, "throughput_tok_s", "字/秒"), (2, "admitted_concurrency", "人")):
            fig.add_trace(go.Scatter(
                x=budgets, y=[r.get(key) for r in rows], name=label, meta=mode, legendgroup=mode,
                showlegend=col == 1, mode="lines+markers", line={"color": mode_color(mode), "width": 2.5},
                hovertemplate=f"{label} · %{{x:g}} MB · %{{y:.1f}} {unit}<extra></extra>"), row=1, col=col)
    fig = _layout(fig, title, "")
    fig.update_xaxes(title_text=text.budget, gridcolor="#f0e2bd", zeroline=False)
    fig.update_yaxes(gridcolor="#f0e2bd", zeroline=False, rangemode="tozero")
    fig.update_layout(hovermode="closest", margin={"t": 56 if title else 40}, uirevision="couplet-sweep")
    return fig
