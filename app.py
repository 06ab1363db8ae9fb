"""开门见喜 · 春联生成终端 — the Gradio page. Layout and event wiring only; the work happens in `couplet`.

    python app.py                     # http://127.0.0.1:7860
    COUPLET_MODEL=path python app.py  # another checkpoint (same format)

The endpoint `couplet` (gradio_client: `Client(url).submit(..., api_name="/couplet")`) streams one update
per decoding step: the gate HTML, the checks, two Plotly charts, the per-mode table, and a JSON list with
one object per mode (the CLI's JSON fields). `duixia` (对下联) takes a 上联 instead of keywords and streams
the same outputs.
"""

from __future__ import annotations

import html
import json
import os
import sys
import threading
from collections.abc import Iterator
from importlib.metadata import version
from pathlib import Path
from typing import Any

import gradio as gr
import torch

from couplet.events import CoupletResult, StepRecord
from couplet.kvcache import MODE_INFO, MODES, KVGeometry
from couplet.models.loading import LoadedModel, load_model_or_embedded
from couplet.page.charts import (
    KV_AXIS,
    KV_TITLE,
    MEMORY_TITLE,
    engine_figure,
    kv_figure,
    memory_figure,
    placeholder_figure,
    sweep_figure,
)
from couplet.page.gate import ASSETS_DIR, FONT_PATH, gate_css, render_gate
from couplet.page.printing import PAPERS_MM, PrintConfig, glyphs, print_set
from couplet.page.share import (
    DEFAULT_MODES,
    DEFAULT_TEMPERATURE,
    MAX_SEED,
    MAX_TEMPERATURE,
    ShareLink,
    checked_number,
    parse_query,
    share_url,
)
from couplet.page.view import (
    about_markdown,
    bench_source_html,
    charts_note_html,
    checks_html,
    mode_label,
    modes_table_html,
    peak_panel_html,
)
from couplet.serving.backends import VLLM_MODE, BackendConfig, BackendError, free_port
from couplet.serving.best_of import BestOf
from couplet.serving.engine import Engine, EngineBusy, EngineConfig
from couplet.serving.generate import CoupletRequest
from couplet.vllm_backend.client import EngineGauges, VllmClient
from couplet.vllm_backend.client import decode as remote_decode
from couplet.writing.calendar import DEFAULT_YEAR, MAX_YEAR, MIN_YEAR, year_label
from couplet.writing.exemplars import load_store
from couplet.writing.text import CoupletInputError, visitor_part

# No `spaces.GPU` (ZeroGPU) decorator: ZeroGPU attaches a GPU only for the duration of a decorated call, and
# the handlers here do no GPU work themselves; the engine's worker thread does (`couplet.serving.engine`), outside any
# such call. The page runs on a CPU Space (cpu-basic) or a Space with a dedicated GPU.

EXAMPLES = ["龙马精神", "吉祥如意", "春风", "明月", "五福临门", "梅花", "平安", "国泰民安"]
UPPER_EXAMPLES = ["春风送暖千家福", "瑞雪迎春到", "天增岁月人增寿", "万里江山添锦绣", "东风化雨山山翠"]
QUEUE_SIZE = 64  # visitors waiting before the page says "busy"
# Visitors whose handlers run at once. They do not compute: each hands its request (one per selected mode) to
# the engine, whose one worker batches them (`couplet.serving.engine`) and admits them by KV budget.
CONCURRENCY = 16
PAGE_BEST_OF = BestOf(n=4)  # 择优: the drafts per mode when the visitor ticks it (docs/results/quality.md#best-of-n)
KV_BUDGET_MB = float(os.environ.get("COUPLET_KV_BUDGET_MB", "64"))
# Intra-op threads per torch call. Decoding one character of a 6M-parameter model is far too small to split
# across cores; with several threads per call, CONCURRENCY requests (or any other busy process) oversubscribe
# the CPU and every step stalls (seven modes: 0.8 s with 1 thread, 12-15 s with 2 on a busy 2-core machine).
TORCH_THREADS = int(os.environ.get("COUPLET_TORCH_THREADS", "1"))

WARM_KEYWORDS = "春风"  # the start-up couplet (`warm_up`)
warmed = threading.Event()  # set once the start-up couplet is written (or could not be)
warmed_modes: list[str] = []  # the modes it was written with

_lm: LoadedModel | None = None
_engine: Engine | None = None
_model_notice = ""  # why the page runs on the embedded model when COUPLET_MODEL asked for another
_client: VllmClient | None = None
try:  # COUPLET_BACKEND=local|vllm, COUPLET_VLLM_URL (`couplet.serving.backends`)
    BACKEND, _backend_notice = BackendConfig.from_env(), ""
except ValueError as e:
    BACKEND, _backend_notice = BackendConfig(), f"{visitor_part(e)}已改用本进程引擎。"


def model() -> LoadedModel:
    """`COUPLET_MODEL` (a folder, a Hugging Face id, modelscope:ORG/NAME) with `COUPLET_WEIGHTS` (int8/nf4 on
    CUDA), or the embedded model with a visible notice when that cannot be had."""
    global _lm, _model_notice
    if _lm is None:
        _lm, _model_notice = load_model_or_embedded(weights=os.environ.get("COUPLET_WEIGHTS") or None)
    return _lm


def engine() -> Engine:
    """The one engine of this process: its worker owns the model's forwards and the prefix pool."""
    global _engine
    if _engine is None:
        _engine = Engine(model(), EngineConfig(kv_budget_mb=KV_BUDGET_MB, pool_mb=min(8.0, KV_BUDGET_MB / 4)))
    return _engine


def remote() -> VllmClient | None:
    """The vLLM server's client when `COUPLET_BACKEND=vllm` (it serves the same checkpoint as `model()`)."""
    global _client
    if serves_remotely() and _client is None:
        _client = VllmClient(BACKEND.vllm_url, KVGeometry.of(model().model))
    return _client


def serves_remotely() -> bool:
    """The vLLM backend is on, and the model is one it serves (decoder-only: vLLM has no T5 path here)."""
    return BACKEND.name == "vllm" and not model().family.encoder_decoder


def offered_modes() -> list[str]:
    """The modes the page offers: the vLLM server's (with that backend), then every in-process mode."""
    return ([VLLM_MODE] if serves_remotely() else []) + list(MODES)


PEAK_BENCH = ASSETS_DIR / "bench" / "serve.json"  # `python -m couplet.bench serve --json` output, committed
PEAK_SWEEP = ASSETS_DIR / "bench" / "serve_sweep.json"  # the same benchmark at several budgets (`--budgets`)


def load_bench(path: Path) -> dict | None:
    """A committed benchmark JSON, or None where it is missing or unreadable (the panel then says so)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def live_line(gauges: EngineGauges | None = None) -> str:
    """What the running app holds right now: visitors' requests in flight and waiting, and their KV bytes; with
    the vLLM backend, the server's own gauges as they last came in (engine-wide)."""
    st = engine().stats()
    lm = model()
    weights = f"{lm.weights} 量化" if lm.weights else str(lm.dtype).removeprefix("torch.")
    served = ""
    if gauges is not None:
        served = (f"<br>vLLM 服务端（{html.escape(BACKEND.vllm_url)}，{gauges.dtype_label} KV）："
                  f"运行 {gauges.running} 份、排队 {gauges.waiting} 份，KV 缓存 {gauges.kv_bytes / 1024:.0f} / "
                  f"{gauges.capacity_bytes / 1024:.0f} KB（全引擎合计）。")
    # the bytes in use (the caches and the pool blocks they reference) against the same tokens stored whole
    saved = (f'，在用 {st.in_use_bytes / 1024:.0f} KB，是不压缩不共享'
             f'（{st.full_bytes / 1024:.0f} KB）的 {st.in_use_bytes / st.full_bytes:.0%}'
             if st.full_bytes else '')
    return (f'<p class="live-line">本进程此刻在写 {st.in_flight} 份（排队 {st.waiting}），KV 缓存 '
            f'{st.kv_bytes / 1024:.0f} KB + 共享前缀池 {st.pool_bytes / 1024:.0f} KB{saved}，预算 {KV_BUDGET_MB:g} MB；'
            f'模型权重 {lm.weight_bytes / 2**20:.1f} MB（{weights}）。{served}</p>')


def _outputs(gate: str, checks: str, records: dict[str, list[StepRecord]], table: str, payload: list,
             gauges: dict[int, EngineGauges] | None = None) -> tuple:
    """The six outputs of a couplet stream. With the vLLM server's gauges (by step), the second chart shows
    them; the in-process memory chart never mixes in the server's engine-wide figures."""
    labels = {m: mode_label(m) for m in records}
    # per-request figures hold the in-process modes only: a server's KV figure is its engine's total (the table
    # row says 引擎合计), charted beside them from its own gauges
    local = {m: r for m, r in records.items() if m in MODES}
    second = engine_figure(list(gauges), list(gauges.values())) if gauges else memory_figure(local, labels)
    return gate, checks, kv_figure(local, labels), second, table, payload


def write_couplet(keywords: str, length: int, acrostic: bool, temperature: float, seed: float, year: float,
                  modes: list[str], best: bool = False) -> Iterator[tuple]:
    """Stream one couplet per selected mode, all on the same keywords and seed, step by step (`best`: each mode
    writes PAGE_BEST_OF.n drafts, the first streamed, the best shown at the end)."""
    yield from _stream(lambda t, s: CoupletRequest(keywords or "", int(length), bool(acrostic), t,
                                                   1.0 if not t else 0.9, s), temperature, seed, year, modes,
                       best=bool(best))


def write_duixia(upper: str, temperature: float, seed: float, year: float, modes: list[str],
                 best: bool = False) -> Iterator[tuple]:
    """对下联: the visitor's 上联, the model's 下联 and 横批; the same stream as `write_couplet`."""
    yield from _stream(lambda t, s: CoupletRequest("", temperature=t, top_p=1.0 if not t else 0.9, seed=s,
                                                   upper=upper or "", task="duixia"), temperature, seed, year, modes,
                       best=bool(best))


def _stream(make_request, temperature: float, seed: float, year: float, modes: list[str],
            notice: str = "", best: bool = False) -> Iterator[tuple]:
    # `notice` is shown in the checks too: gr.Warning toasts do not reach API clients
    try:
        label = year_label(int(year if year is not None else DEFAULT_YEAR))
    except (TypeError, ValueError, OverflowError):
        label = year_label(DEFAULT_YEAR)
        notice = sentences([notice, f"年份须在 {MIN_YEAR}–{MAX_YEAR} 之间，已改用 {DEFAULT_YEAR} 年。"])
        gr.Warning(notice)
    temperature, seed, fixed = _sampling_or_defaults(temperature, seed)
    if fixed:
        notice = sentences([notice, *fixed])
        gr.Warning(sentences(fixed))
    if not any(m in offered_modes() for m in modes or []):
        notice = sentences([notice, "未选择缓存模式，已用完整缓存（full）。"])
    modes = ticked(modes)
    # what this family cannot run in-process
    refusals = {m: why for m in modes if m in MODES and (why := model().family.mode_refusal(m))}
    if refusals:
        modes = [m for m in modes if m not in refusals] or ["full"]
        notice = sentences([notice, *refusals.values()])
    local = [m for m in modes if m in MODES]
    client = remote()
    failed: list[str] = []  # the vLLM stream's failure, when in-process modes carry on without it

    def served(prep):
        """The vLLM stream; when it fails beside in-process modes, it ends with a notice and they go on (alone,
        its failure is the request's, shown below)."""
        assert client is not None
        try:
            yield from remote_decode(client, model(), prep)
        except BackendError as e:
            if not local:
                raise
            failed.append(visitor_part(e))

    others = {VLLM_MODE: served} if client and VLLM_MODE in modes else {}
    gauges: dict[int, EngineGauges] = {}  # the server's gauges as the vLLM request's steps arrived
    try:
        request = make_request(temperature, seed)
        for state in engine().stream(request, local, remote=others, best=PAGE_BEST_OF if best else None):
            live = [m for m in modes if m in local or (m in others and not failed)]
            shown = "full" if "full" in live else live[0]
            results = state.results
            done = all(m in results for m in live)
            p = state.latest[shown]
            if (progress := state.latest.get(VLLM_MODE)) is not None and (g := getattr(progress, "gauges", None)):
                gauges[progress.record.step] = g
            said = sentences([notice, *failed])
            if done:  # a keyword the model does not know may be one the print font lacks too: say so now
                said = sentences([said, unprintable_note(results[shown])])
            length = len(p.upper) if request.task == "duixia" else request.length
            gate = render_gate(p.upper, p.lower, results[shown].hengpi if done else "", year_label=label,
                               opened=done, pending=not done, length=length)
            writing = f"正在落笔……（{PAGE_BEST_OF.n} 稿同写，先示第一稿，写完择优）" if best else "正在落笔……"
            checks = checks_html(results[shown], said) if done else checks_html(None, said or writing)
            last = gauges[max(gauges)] if gauges else None
            shown_results = {m: r for m, r in results.items() if m in live}
            table = (modes_table_html(shown_results) if done else modes_table_html({})) + live_line(last)
            payload = [results[m].to_json(with_steps=False) for m in live] if done else []
            yield _outputs(gate, checks, state.records, table, payload, gauges)
    except (EngineBusy, BackendError) as e:
        gr.Warning(visitor_part(e))
        yield _outputs(render_gate("", "", "", year_label=label, opened=False, message=visitor_part(e)),
                       checks_html(None, str(e)), {}, modes_table_html({}), [])
    except CoupletInputError as e:
        gr.Warning(visitor_part(e))
        yield _outputs(render_gate("", "", "", year_label=label, opened=False, message=visitor_part(e)),
                       checks_html(None, sentences([visitor_part(e), notice])), {}, modes_table_html({}), [])
    except (ValueError, OverflowError, TypeError):  # a value no widget sends (the API): never its English text
        gr.Warning("参数有误，请检查后重试。")
        yield _outputs(render_gate("", "", "", year_label=label, opened=False, message="参数有误，请检查后重试。"),
                       checks_html(None, sentences(["参数有误，请检查后重试", notice])), {}, modes_table_html({}), [])


def unprintable_note(result: CoupletResult) -> str:
    """The characters of a written couplet the print font lacks (a keyword such as U+56CD, double happiness,
    that the model does not know either), told when the couplet appears rather than when 下载春联 refuses it;
    "" when all print."""
    font = glyphs()
    missing = "".join(dict.fromkeys(c for c in result.upper + result.lower + result.hengpi if not font.has(c)))
    return f"字库里没有「{missing}」，此联可在页面上看，但无法下载打印。" if missing else ""


def default_modes() -> list[str]:
    """The modes ticked when the page opens (`DEFAULT_MODES`), and the vLLM server's when it is on."""
    return ([VLLM_MODE] if serves_remotely() else []) + list(DEFAULT_MODES)


def ticked(modes: list[str] | None) -> list[str]:
    """The ticked modes in the offered order (the vLLM server's first, then the registry's); none means `full`."""
    return [m for m in offered_modes() if m in (modes or [])] or ["full"]


SKIP6 = (gr.skip(),) * 6  # a step that leaves the six outputs of a couplet stream as they are


def _sampling_or_defaults(temperature: str | float | None, seed: str | float | None
                          ) -> tuple[float, int, list[str]]:
    """Temperature in [0, MAX_TEMPERATURE] and seed a whole number in [0, MAX_SEED] (the share link's check,
    `checked_number`, so that a link writes the couplet on screen), or their defaults with a note for the
    visitor."""
    said = []
    t, why = checked_number(temperature or 0.0, float, 0.0, MAX_TEMPERATURE)
    if why:
        said.append(f"温度须在 0–{MAX_TEMPERATURE:g} 之间，已改用 0（贪心）。")
    s, why_seed = checked_number(seed or 0, int, 0, MAX_SEED)
    if why_seed:
        said.append(f"随机种子须为 0–{MAX_SEED} 的整数，已改用 0。")
    return float(t or 0.0), int(s or 0), said


def _year_or_default(year: float) -> int:
    try:
        y = int(year)
    except (TypeError, ValueError, OverflowError):
        return DEFAULT_YEAR
    return y if MIN_YEAR <= y <= MAX_YEAR else DEFAULT_YEAR


def open_link(request: gr.Request) -> tuple:
    """A share link's query string → the form (and the tab); the link itself, for `write_from_link`."""
    link = parse_query(dict(request.query_params) if request is not None else {})
    keep = gr.skip()
    return (link.keywords if link.task == "keywords" else keep, link.length, link.acrostic, link.temperature,
            link.seed, link.year, link.modes, link.best, link.upper if link.task == "duixia" else keep,
            gr.Tabs(selected="duixia" if link.task == "duixia" else "keywords"), link.__dict__)


def write_from_link(state: dict | None) -> Iterator[tuple]:
    """Write the link's couplet at once (a refused keyword gets the form's message); no couplet: nothing."""
    link = ShareLink(**state) if state else ShareLink()
    notice = sentences(link.notes)
    if link.task == "keywords":
        yield from _stream(lambda t, s: CoupletRequest(link.keywords, link.length, link.acrostic, t,
                                                       1.0 if not t else 0.9, s),
                           link.temperature, link.seed, link.year, link.modes, notice, link.best)
    elif link.task == "duixia":
        yield from _stream(lambda t, s: CoupletRequest("", temperature=t, top_p=1.0 if not t else 0.9, seed=s,
                                                       upper=link.upper, task="duixia"),
                           link.temperature, link.seed, link.year, link.modes, notice, link.best)
    elif notice:
        yield (gr.skip(), checks_html(None, notice), *SKIP6[2:])
    else:
        yield SKIP6


def _take_home(payload: list | None, link: ShareLink, request: gr.Request | None) -> tuple:
    """Once a couplet is written: the share link and the texts the 下载春联 button prints (the shown mode's)."""
    if not payload:
        return gr.Group(visible=False), "", "", "", "", gr.File(value=None, visible=False)
    first = payload[0]  # the gate shows `full` when it ran, else the first mode: payload follows MODES order
    referer = request.headers.get("referer", "") if request is not None else ""
    return (gr.Group(visible=True), share_url(referer, link), first["upper"], first["lower"], first["hengpi"],
            gr.File(value=None, visible=False))


def take_home_keywords(payload: list | None, keywords: str, length: int, acrostic: bool, temperature: float,
                       seed: float, year: float, modes: list[str], best: bool, request: gr.Request) -> tuple:
    link = ShareLink("keywords", keywords=keywords or "", length=int(length or 7), acrostic=bool(acrostic),
                     temperature=float(temperature or 0), seed=int(seed or 0), year=_year_or_default(year),
                     modes=ticked(modes), best=bool(best))
    return _take_home(payload, link, request)


def take_home_duixia(payload: list | None, upper: str, temperature: float, seed: float, year: float,
                     modes: list[str], best: bool, request: gr.Request) -> tuple:
    link = ShareLink("duixia", upper=upper or "", temperature=float(temperature or 0), seed=int(seed or 0),
                     year=_year_or_default(year), modes=ticked(modes), best=bool(best))
    return _take_home(payload, link, request)


def take_home_link(payload: list | None, state: dict | None, request: gr.Request) -> tuple:
    return _take_home(payload, ShareLink(**state) if state else ShareLink(), request)


def print_couplet(upper: str, lower: str, hengpi: str, paper: str = "A4", ink: str = "black") -> list[str]:
    """The printable set (PDF first, then a PNG and an SVG of each piece) for a couplet; the API's `print`."""
    try:
        result = print_set(upper or "", lower or "", hengpi or "", PrintConfig(paper or "A4", ink or "black"))
    except CoupletInputError as e:
        raise gr.Error(visitor_part(e), title="无法生成打印件") from None
    return [str(f) for f in result.files]


# After 下载春联: the browser downloads the PDF at once (the list keeps the PNG/SVG links). The file links appear
# when the output renders, a moment after this runs: poll for them, briefly.
DOWNLOAD_PDF_JS = r"""() => {
  let tries = 0;
  const poll = () => {
    const a = [...document.querySelectorAll('#print-files a')].find(x => /\.pdf$/i.test(x.getAttribute('href') || ''));
    if (a) { a.click(); } else if (++tries < 40) { setTimeout(poll, 100); }
  };
  poll();
}"""
# Phone widths: fold 更多设置 and the mode list (open on desktop, where the layout stays as it was); and no
# scroll anchoring: with the columns reversed (the gate above the form), the browser anchors on the form and,
# as the written couplet's take-home box appears above it, scrolls the gate out of view to keep the form
# still. Set here, on the document: Gradio scopes the page's CSS to its container, where html is not.
FOLD_ON_PHONE_JS = """() => {
  if (!window.matchMedia('(max-width: 480px)').matches) return;
  document.documentElement.style.overflowAnchor = 'none';
  let tries = 0;
  const fold = () => {
    const open = [...document.querySelectorAll('#more-settings > .label-wrap.open, #modes-fold > .label-wrap.open')];
    open.forEach(b => b.click());
    const seen = document.querySelectorAll('#more-settings > .label-wrap, #modes-fold > .label-wrap').length;
    if (seen < 2 && ++tries < 50) setTimeout(fold, 100);
  };
  fold();
}"""


# Before every write (a click or Enter, either tab), in the browser: a fresh seed when 每次换一副 is ticked,
# so that every click writes a new couplet while all the modes still share one seed and the share link
# carries it; and on a phone, the gate scrolled into view, so the couplet is written where the visitor looks
# (on a phone the form sits below the gate). Runs as a js-only event: no round trip before the write starts.
PREPARE_WRITE_JS = f"""(reroll, seed) => {{
  if (window.matchMedia('(max-width: 480px)').matches) {{
    document.querySelector('#gate-box')?.scrollIntoView({{behavior: 'smooth', block: 'start'}});
  }}
  return reroll ? Math.floor(Math.random() * {MAX_SEED + 1}) : seed;
}}"""
# The page is Chinese whatever the browser's language. Gradio picks the language of its own strings (the
# footer, the copy button, the queue's and the upload's messages) from navigator.languages once, as it starts,
# and has no setting for it on the server (gr.I18n only adds strings of our own). Its core module exports
# `changeLocale`: importing that module again by its URL gives the same instance, whose locale store every
# component reads. Run from <head>, which Gradio adds before it mounts the components: a change made later
# (the `js` on load) re-renders them, and a click in that moment is lost. Should a Gradio release rename the
# module or the function, the page stays in the browser's language (tests/test_app_browser.py notices).
CHINESE_HEAD = """<script type="module">
const core = performance.getEntriesByType('resource').map(e => e.name)
  .find(url => /\\/assets\\/core-[^/]+\\.js$/.test(url));
if (core) {
  try {
    const gradio = await import(core);
    if (typeof gradio.changeLocale === 'function') gradio.changeLocale('zh-CN');
  } catch (e) { /* the page still works, in the browser's language */ }
}
document.documentElement.lang = 'zh-CN';
</script>"""


def _endpoint(api: str | None) -> dict[str, Any]:
    """Public under `api`, or out of the API (Enter's copy of a button's endpoint)."""
    return {"api_name": api} if api else {"api_visibility": "private"}


def vllm_choice_label() -> str:
    """The vLLM mode's toggle: its server, its KV dtype (read from the server now), what it offers."""
    client = remote()
    assert client is not None
    try:
        dtype = f"{client.gauges().dtype_label} KV"
    except BackendError:
        dtype = "暂未连上"
    return (f"{mode_label(VLLM_MODE)}：另一进程的 vLLM（{dtype}，分页 KV + 自动前缀缓存），"
            f"地址 {BACKEND.vllm_url}；图表为其全引擎合计")


def versions() -> dict[str, str]:
    return {name: version(name) for name in ("torch", "transformers", "gradio", "plotly")}


def warm_up() -> None:
    """One couplet through every in-process mode the model runs, on a thread as the page starts. The first
    forwards pay one-off costs (the allocator, oneDNN's primitives, the first 横批 scoring); here they fall on
    no visitor. Measured on the embedded model: the first couplet of a process took 1.9 s for all eight
    modes against 1.3 s after, with `full` at 291 ms against 157, so the first visitor's table compared the
    modes' times unfairly."""
    try:
        modes = [m for m in MODES if not model().family.mode_refusal(m)]
        rounds = list(engine().stream(CoupletRequest(WARM_KEYWORDS), modes))
        warmed_modes[:] = list(rounds[-1].results) if rounds else []
    except Exception as e:  # a page that cannot warm up still serves: its first visitor pays those costs instead
        print(f"warm-up skipped: {e}", file=sys.stderr)
    finally:
        warmed.set()


def build_app() -> gr.Blocks:
    torch.set_num_threads(TORCH_THREADS)
    threading.Thread(target=glyphs, daemon=True).start()  # the print font and its cmap (seconds, once)
    lm = model()
    load_store()  # the exemplar index (~5 s to build): at start-up, not on the first visitor's request
    engine()  # its worker thread waits for the first visitor
    threading.Thread(target=warm_up, daemon=True).start()
    label = year_label(DEFAULT_YEAR)
    mode_choices = [(f"{mode_label(m)}：{MODE_INFO[m].summary_zh}" + ("（本模型不可用）" if lm.family.mode_refusal(m)
                     else "（仅本进程）" if serves_remotely() else ""), m) for m in MODES]
    if serves_remotely():
        mode_choices.insert(0, (vllm_choice_label(), VLLM_MODE))
    with gr.Blocks(title="开门见喜 · 春联生成终端") as demo:
        unserved = BACKEND.name == "vllm" and not serves_remotely()
        unserved_note = "vLLM 后端只接仅解码器模型；此模型在本进程中运行。" if unserved else ""
        notices = sentences([_model_notice, _backend_notice, unserved_note])
        notice = f'<p class="model-notice" role="status">{html.escape(notices)}</p>' if notices else ""
        gr.HTML(f'<header id="masthead"><h1>开门见喜 · 春联生成终端</h1>'
                f'<p class="on-red">{label} · 输入关键词，看小模型写春联，'
                f"也看 KV 缓存压缩省下多少、又改变了什么</p>{notice}</header>")
        # On a phone (<= 480 px) the columns stack gate first (gate.css: #main-row column-reverse)
        with gr.Row(equal_height=False, elem_id="main-row"):
            with gr.Column(scale=2, min_width=300, elem_id="controls"):
                with gr.Tabs(elem_id="tasks") as tasks:
                    with gr.Tab("关键词写春联", id="keywords", elem_id="tab-keywords"):
                        keywords = gr.Textbox(label="关键词（1–8 个汉字）", value="龙马精神", max_lines=1,
                                              elem_id="keywords")
                        gr.Examples(EXAMPLES, inputs=keywords, label="试试这些", elem_id="examples")
                        with gr.Row():
                            length = gr.Radio([7, 5], value=7, label="每联字数", elem_id="length")
                            acrostic = gr.Checkbox(False, label="藏头（关键词交替作两联首字）", elem_id="acrostic")
                        button = gr.Button("开门见喜", variant="primary", elem_id="open-btn")
                    with gr.Tab("对下联", id="duixia", elem_id="tab-duixia"):
                        upper = gr.Textbox(label="上联（5 或 7 个汉字）", value="春风送暖千家福", max_lines=1,
                                           elem_id="upper")
                        gr.Examples(UPPER_EXAMPLES, inputs=upper, label="试试这些上联", elem_id="upper-examples")
                        duixia_button = gr.Button("对下联", variant="primary", elem_id="duixia-btn")
                # open on desktop; folded on a phone by FOLD_ON_PHONE_JS
                with gr.Accordion("更多设置", open=True, elem_id="more-settings"):
                    temperature = gr.Slider(0, MAX_TEMPERATURE, value=DEFAULT_TEMPERATURE, step=0.05,
                                            label="温度（越高越多变；0 为贪心：同一关键词总写同一副）",
                                            elem_id="temperature")
                    reroll = gr.Checkbox(True, label="每次点击换一副（随机种子；取消则用下面的种子）",
                                         elem_id="reroll")
                    with gr.Row():
                        seed = gr.Number(0, precision=0, label="随机种子", elem_id="seed")
                        # no minimum/maximum: Gradio would refuse an out-of-range year in English before
                        # write_couplet runs; write_couplet falls back to the default year with a Chinese message
                        year = gr.Number(DEFAULT_YEAR, precision=0, label=f"年份（{MIN_YEAR}–{MAX_YEAR}）",
                                         elem_id="year")
                    best = gr.Checkbox(False, elem_id="best-of",
                                       label=f"择优：每种模式同写 {PAGE_BEST_OF.n} 稿，留对仗与文气最佳的一副（稍慢）")
                with gr.Accordion("KV 缓存模式", open=True, elem_id="modes-fold"):
                    modes = gr.CheckboxGroup(mode_choices, value=default_modes(), elem_id="modes",
                                             label="KV 缓存模式（同一关键词、同一种子）", show_label=False)
            with gr.Column(scale=3, min_width=340, elem_id="stage"):
                gate = gr.HTML(render_gate("", "", "", year_label=label, opened=False), elem_id="gate-box")
                checks = gr.HTML(checks_html(None, "输入关键词，点「开门见喜」。"), elem_id="checks-box",
                                 container=True, padding=True)
                # take the couplet home: shown once a couplet is written
                with gr.Group(visible=False, elem_id="take-home") as take_home:
                    with gr.Row(equal_height=True):
                        paper = gr.Radio(list(PAPERS_MM), value="A4", label="纸张", elem_id="paper", min_width=120)
                        ink = gr.Radio([("墨黑", "black"), ("金色", "gold")], value="black", label="字色",
                                       elem_id="ink", min_width=120)
                        download = gr.Button("下载春联", variant="primary", elem_id="download-btn", min_width=120)
                    share = gr.Textbox(label="分享链接（打开即写出同一副春联）", interactive=False, buttons=["copy"],
                                       elem_id="share-link", lines=2, max_lines=6)
                    print_files = gr.File(label="打印件：PDF（含张贴说明，一件一页，长联分张）· 各件 PNG 与 SVG",
                                          file_count="multiple", visible=False, interactive=False,
                                          elem_id="print-files")
                # what 下载春联 prints (the API's `print` takes them as arguments)
                print_upper = gr.Textbox(visible=False, label="上联")
                print_lower = gr.Textbox(visible=False, label="下联")
                print_hengpi = gr.Textbox(visible=False, label="横批")
                link_state = gr.State(None)
        gr.HTML(charts_note_html(), elem_id="charts-note")
        with gr.Row():
            # the figures carry their own titles; the labels still name the outputs in the API
            kv_plot = gr.Plot(placeholder_figure(KV_TITLE, KV_AXIS), label="每步 KV 缓存", show_label=False,
                              elem_id="kv-plot")
            mem_plot = gr.Plot(placeholder_figure(MEMORY_TITLE, "内存"), label="每步设备内存", show_label=False,
                               elem_id="mem-plot")
        table = gr.HTML(modes_table_html({}), elem_id="table-box", container=True, padding=True)
        payload = gr.JSON(visible=False, label="结果 JSON")
        with gr.Accordion("高峰：同一 KV 预算，各模式能同时接待多少访客", open=False, elem_id="peak"):
            gr.HTML(peak_panel_html(load_bench(PEAK_BENCH)))
            sweep = load_bench(PEAK_SWEEP)
            if sweep and len(sweep.get("runs", [])) > 1:
                gr.Plot(sweep_figure(sweep, {m: mode_label(m) for m in sweep["runs"][0]["modes"]},
                                     title="预算越大，能同时接待的访客越多"),
                        label="各预算下的吞吐与同时接待人数", show_label=False, elem_id="sweep-plot")
                gr.HTML(bench_source_html(sweep))
        with gr.Accordion("关于：KV 缓存与各模式", open=False, elem_id="about"):
            gr.Markdown(about_markdown(os.path.basename(lm.source.rstrip("/")) or lm.source, lm.parameters,
                                       lm.device, str(lm.dtype).removeprefix("torch."), versions(),
                                       BACKEND.vllm_url if serves_remotely() else ""))
        inputs = [keywords, length, acrostic, temperature, seed, year, modes, best]
        outputs = [gate, checks, kv_plot, mem_plot, table, payload]
        # one concurrency group: the button and Enter share the CONCURRENCY slots (separate limits would add up);
        # Enter's copy of the endpoint stays out of the API (api_name=False is not Gradio 6's way)
        take_home_outputs = [take_home, share, print_upper, print_lower, print_hengpi, print_files]
        private: dict[str, Any] = {"api_visibility": "private", "queue": False}
        for trigger, api in ((button.click, "couplet"), (keywords.submit, None)):
            trigger(None, [reroll, seed], seed, js=PREPARE_WRITE_JS, queue=False).then(
                write_couplet, inputs, outputs, concurrency_limit=CONCURRENCY, concurrency_id="couplet",
                **_endpoint(api)).then(take_home_keywords, [payload, *inputs], take_home_outputs, **private)
        duixia_inputs = [upper, temperature, seed, year, modes, best]
        for trigger, api in ((duixia_button.click, "duixia"), (upper.submit, None)):
            trigger(None, [reroll, seed], seed, js=PREPARE_WRITE_JS, queue=False).then(
                write_duixia, duixia_inputs, outputs, concurrency_limit=CONCURRENCY, concurrency_id="couplet",
                **_endpoint(api)).then(take_home_duixia, [payload, *duixia_inputs], take_home_outputs, **private)
        download.click(print_couplet, [print_upper, print_lower, print_hengpi, paper, ink], print_files,
                       api_name="print", concurrency_limit=2
                       ).success(lambda: gr.File(visible=True), None, print_files, **private
                                 ).then(None, js=DOWNLOAD_PDF_JS)
        # a share link (?kw=…&seed=…) fills the form and writes at once
        demo.load(open_link, None, [keywords, length, acrostic, temperature, seed, year, modes, best, upper, tasks,
                                    link_state], api_visibility="private", queue=False
                  ).then(write_from_link, link_state, outputs, api_visibility="private",
                         concurrency_limit=CONCURRENCY, concurrency_id="couplet"
                  ).then(take_home_link, [payload, link_state], take_home_outputs, **private)
    return demo


def sentences(parts: list[str]) -> str:
    """Notices run together as Chinese sentences, each closed once by 。 (empty ones dropped)."""
    return "".join(p if p.endswith(("。", "！", "？")) else p + "。" for p in parts if p)


def launch_kwargs() -> dict:
    """`theme`, `css` and `head` go to launch() in Gradio 6; tests launching the app pass them too."""
    return {"css": gate_css(f"/gradio_api/file={FONT_PATH}"), "js": FOLD_ON_PHONE_JS, "head": CHINESE_HEAD,
            # the footer's links, less "Runs" (run history: a string Gradio has not translated)
            "footer_links": ["api", "gradio", "settings"],
            "theme": gr.themes.Soft(primary_hue="red", secondary_hue="amber")}


def serve(host: str = "127.0.0.1", port: int | None = None, block: bool = False) -> gr.Blocks:
    """Build, queue and launch the page as `python app.py` does; `port=0` picks a free local port (tests,
    benchmarks), `block=False` returns at once with the server running (`demo.local_url`, `demo.close()`)."""
    if port == 0:
        port = free_port(host)
    demo = build_app()
    demo.queue(max_size=QUEUE_SIZE, default_concurrency_limit=CONCURRENCY)
    demo.launch(server_name=host, server_port=port, prevent_thread_lock=not block, quiet=not block,
                **launch_kwargs())
    return demo


gr.set_static_paths([str(ASSETS_DIR)])  # only assets/ is served as static files

if __name__ == "__main__":
    serve(os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"), block=True)
