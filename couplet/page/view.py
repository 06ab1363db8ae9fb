"""HTML fragments the page shows beside the gate: the rules check, the per-mode table, the about panel.

Pure functions of results (no Gradio, no tensors); every piece of text that came from a visitor or the
model goes through `html.escape`.
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from html import escape

from couplet.events import CoupletResult
from couplet.kvcache import MODE_INFO
from couplet.page.charts import mode_color
from couplet.serving.backends import VLLM_MODE

CHECK_LABELS = {"length": "字数", "tones": "平仄", "keywords": "关键词", "same_position": "同位不重",
                "han_only": "汉字"}


# Modes of other backends (`couplet.serving.backends`): their KV figures are the engine's gauges, all requests together
REMOTE_LABELS = {VLLM_MODE: "vLLM 服务端（引擎合计）"}


def mode_label(mode: str) -> str:
    """`完整缓存 full` — Chinese label first, the registry name after it."""
    info = MODE_INFO.get(mode)
    if info is None:
        return f"{REMOTE_LABELS[mode]} {mode}" if mode in REMOTE_LABELS else mode
    return f"{info.label_zh} {mode}"


def checks_html(result: CoupletResult | None, message: str = "") -> str:
    """The rules check in plain Chinese beneath the gate; `message` for notes or a refusal."""
    parts = []
    if message:
        parts.append(f'<p class="check-message">{escape(message)}</p>')
    if result is not None:
        c = result.checks
        items = "".join(
            f'<li class="{"ok" if c[k]["ok"] else "bad"}"><b>{label}</b> {"✓" if c[k]["ok"] else "✗"} '
            f'{escape(c[k]["message"])}</li>'
            for k, label in CHECK_LABELS.items() if c[k].get("applies", True)  # 对下联 has no keywords to embed
        )
        par = c["parallelism"]
        items += f'<li class="score"><b>对仗</b> {escape(par["message"])}</li>'
        parts.append(f'<ul class="checks">{items}</ul>')
        parts += [f'<p class="check-note">{escape(n)}</p>' for n in result.notes]
        parts.append(exemplars_html(result.exemplars))
    return f'<div id="checks">{"".join(parts)}</div>'


def exemplars_html(exemplars: list[list[str]]) -> str:
    """The exemplars the prompt showed the model, folded by default (参考古联)."""
    if not exemplars:
        return ""
    items = "".join(f"<li>{escape(u)}，{escape(lo)}。</li>" for u, lo in exemplars)
    return (f'<details class="exemplars"><summary>参考古联（提示中给模型看的 {len(exemplars)} 副古人对句，'
            f"新联不照抄其中任何四字）</summary><ol>{items}</ol></details>")


def highlight_diff(text: str, reference: str) -> str:
    """Escaped `text` with the characters that differ from `reference` (same position) in <mark>."""
    out = []
    for i, ch in enumerate(text):
        same = i < len(reference) and reference[i] == ch
        out.append(escape(ch) if same else f'<mark class="diff">{escape(ch)}</mark>')
    return "".join(out)


def _row(mode: str, cells: list[tuple[str, str]], classes: Mapping[int, str] | None = None) -> str:
    """A table row whose cells carry their column's name (`data-label`): on a phone the CSS stacks each row
    as a card and prints the name before the value, instead of a table cut off at the screen's edge."""
    classes = classes or {}
    tds = "".join(f'<td data-label="{escape(label)}"' + (f' class="{classes[i]}"' if i in classes else "")
                  + f'><span class="v">{value}</span></td>' for i, (label, value) in enumerate(cells))
    return f'<tr data-mode="{escape(mode)}">{tds}</tr>'


def _head(labels: list[str]) -> str:
    return "<tr>" + "".join(f"<th>{escape(label)}</th>" for label in labels) + "</tr>"


# A box that may scroll sideways (a tablet's width) takes the keyboard's focus, so it can be scrolled without a
# mouse (axe-core: scrollable-region-focusable); a phone stacks its rows instead (gate.css)
SCROLLABLE = 'tabindex="0" role="region"'
MODES_COLUMNS = ["模式", "KV 峰值", "相对完整缓存", "用时", "与完整缓存一致", "春联（红底为不同之字）"]


def modes_table_html(results: Mapping[str, CoupletResult]) -> str:
    """One row per mode: peak KV, ratio to full, its own decoding time, identical to full?, the couplet with
    differences marked.

    A mode that keeps the prompt's prefix in the shared pool shows the bytes this visitor owns apart from its
    share of the pool: the pooled prefix is stored once for every visitor who writes with it, so what one
    more visitor costs the machine is the owned part (the ratio column is of that part).
    Ratios are against `full` when it ran, else against each mode's own full-precision equivalent.
    """
    if not results:
        return '<div id="modes-table"></div>'
    full = results.get("full")
    rows = []
    for mode, r in results.items():
        base = full.peak_bytes if full else r.full_equivalent_bytes
        owned, pooled = r.peak_owned_bytes, r.peak_shared_bytes
        if pooled:
            kv = (f'自有 {owned / 1024:.1f} KB<span class="kv-shared">+ 共享前缀 {pooled / 1024:.1f} KB'
                  "（多位访客共用一份）</span>")
            ratio = f"{owned / base:.2f}×（自有）" if base else "—"
        else:
            kv, ratio = f"{r.peak_bytes / 1024:.1f} KB", f"{r.peak_bytes / base:.2f}×" if base else "—"
        if len(r.candidates) > 1:  # 择优: the charts follow one draft; every draft held its own KV beside it
            total = sum(d.get("kv_bytes", 0) for d in r.candidates)
            kv += f'<span class="kv-drafts">{len(r.candidates)} 稿同写，合计自有 {total / 1024:.1f} KB</span>'
        if mode in REMOTE_LABELS:  # its gauge covers every request the engine holds: no per-request ratio
            kv, ratio = f"引擎合计 {r.peak_bytes / 1024:.1f} KB", "—"
        same = full is not None and (r.upper, r.lower) == (full.upper, full.lower)
        ident = "—" if full is None or mode == "full" else ("✓ 相同" if same else "✗ 不同")
        upper, lower = (highlight_diff(r.upper, full.upper), highlight_diff(r.lower, full.lower)) if full else \
            (escape(r.upper), escape(r.lower))
        couplet = f'<span class="line">{upper}</span> / <span class="line">{lower}</span>'  # lines unbroken
        name = f'<span class="swatch" style="background:{mode_color(mode)}"></span>{escape(mode_label(mode))}'
        rows.append(_row(mode, list(zip(MODES_COLUMNS, [name, kv, ratio, f"{r.seconds * 1000:.0f} ms", ident,
                                                          couplet], strict=True)), {5: "couplet-cell"}))
    return (f'<div id="modes-table" {SCROLLABLE} aria-label="各模式对比">'
            f'<table class="modes">{_head(MODES_COLUMNS)}{"".join(rows)}</table></div>')


def charts_note_html() -> str:
    """What the two charts beside it show, for a visitor who has never heard of a KV cache."""
    return ('<p class="charts-note"><b>KV 缓存</b>是模型为读过的每个字记下的“键”和“值”，写每个新字都要回看一遍，'
            "所以字越多、占的内存越多；<b>解码步</b>就是模型写出一个字（第 0 步是读入提示）。"
            "左图每条线是一种模式：线越低，每位访客占的内存越少；重合的线用线型和右端的名字区分。"
            "共享前缀、组合策略画的是本访客自有的部分，与他人共用的前缀写在下表。</p>")


def about_markdown(model_name: str, parameters: int, device: str, dtype: str, versions: Mapping[str, str],
                   vllm_url: str = "") -> str:
    """The 'about' panel: what the KV cache is, what each mode does, what is running, and (with the vLLM
    backend) what the server offers and what only this process does."""
    modes = "\n".join(f"- **{escape(info.label_zh)}** `{name}`：{escape(info.summary_zh)}"
                      for name, info in MODE_INFO.items())
    vers = "，".join(f"{k} {v}" for k, v in versions.items())
    return f"""
### KV 缓存是什么？

模型每写一个字，都要回头看一遍前面所有的字。为了不每次从头重算，它把每个字算好的「键」和「值」（K、V）记在一本**便签本**上，
这就是 KV 缓存。字越多、同时写春联的人越多，便签本就越厚、越占显存。压缩 KV 缓存，就是想办法让便签本变薄：
只留要紧的几页、把字写小一点（量化），或者大家共用同一份开头（共享前缀）——代价是可能写出不一样的字。

{modes}

图表中每种模式的曲线随解码一步步增长；表格给出峰值、相对完整缓存的比例，以及写出的春联与完整缓存是否一致（不同的字以红底标出）。
所有模式使用同一关键词、同一随机种子。
{_vllm_about(vllm_url)}
### 运行环境

- 模型：`{escape(model_name)}`（{parameters / 1e6:.1f}M 参数，{escape(dtype)}）
- 设备：{escape(device)}；Python {platform.python_version()}
- 版本：{escape(vers)}
"""


def _vllm_about(url: str) -> str:
    if not url:
        return ""
    return f"""
### 另一进程：vLLM 服务端

本页还连着一台 vLLM 服务（`{escape(url)}`），用同一份提示、同样的格律规则（在服务端逐字施加）写春联。
它的 KV 缓存分页存放，相同的开头（门面春联与参考古联）自动跨访客共用；KV 精度（bf16、fp8 或 f32）由服务启动时决定。
滑动窗口、选择性保留、SnapKV、INT8/INT4 与组合模式只在本进程中实现，vLLM 中没有对应模式。
图表与表格中 vLLM 的 KV 数字读自它自己的监控指标，是**整个引擎**此刻为所有请求持有的合计，不是单个请求的。
"""


def peak_panel_html(bench: Mapping | None) -> str:
    """The 高峰 panel: from a `python -m couplet.bench serve` JSON, how many visitors each mode holds at once
    at the same KV budget, with its throughput and latency; the command, date and device it came from."""
    if not bench:
        return '<div id="peak-panel"><p>尚无高峰测试结果（运行 <code>python -m couplet.bench serve</code>）。</p></div>'
    run = bench["runs"][0]
    rows = run["modes"]
    top = max(r["admitted_concurrency"] for r in rows.values()) or 1.0
    columns = ["模式", "同时接待（同一预算）", "每人 KV", "吞吐（相对完整缓存）", "首字等待（中位）", "与完整缓存一致"]
    bars = []
    for mode, r in rows.items():
        width = 100 * r["admitted_concurrency"] / top
        bar = (f'<span class="bar" style="width:{width:.0f}%;background:{mode_color(mode)}"></span>'
               f' 平均 {r["admitted_concurrency"]:.1f} 人（最多 {r["admitted_concurrency_peak"]}）')
        bars.append(_row(mode, list(zip(columns, [
            escape(mode_label(mode)), bar, f'{r["kv_per_request_bytes"] / 1024:.0f} KB',
            f'{r["throughput_tok_s"]:.0f} 字/秒（{r["throughput_ratio"]:.2f}×）', f'{r["ttft_p50_ms"] / 1000:.1f} 秒',
            f'{r["identical_rate"]:.0%}'], strict=True)), {1: "bar-cell"}))
    head = _head(columns)
    full, combo = rows.get("full"), rows.get("combo")
    lead = ""
    if full and combo:
        lead = (f"<p>KV 预算 {run['budget_mb']:g} MB：完整缓存平均同时接待 {full['admitted_concurrency']:.1f} 位访客，"
                f"组合策略 {combo['admitted_concurrency']:.1f} 位；组合策略每秒写出的字是完整缓存的 "
                f"{combo['throughput_ratio']:.2f} 倍。</p>")
    table = f'<table class="modes peak">{head}{"".join(bars)}</table>'
    return f'<div id="peak-panel" {SCROLLABLE} aria-label="高峰测试">{lead}{table}{bench_source_html(bench)}</div>'


def bench_source_html(bench: Mapping) -> str:
    """Where a benchmark's figures come from: visitors, device, dtype, date and the command that printed them."""
    where = escape(f"{bench['device']}，{bench['dtype']}，{bench['date']}")
    command = escape(bench.get("command", ""))
    return (f'<p class="bench-source">{bench["config"]["visitors"]} 位访客（关键词按齐夫分布），{where}；'
            f"命令：<code>{command}</code></p>")
