"""The real page over HTTP, as a gradio_client user sees it: `app.build_app()` queued as in production and
launched on 127.0.0.1 once for this module (conftest `live_app`), then the public `/couplet` endpoint —
couplets for several keyword sets and mode combinations, streaming, bad input, escaping, concurrent
visitors — and the static route (the shipped font yes, the repository no).

Greedy decoding (temperature 0) is deterministic, so a request must give the same couplet alone and
among concurrent ones.
"""

from __future__ import annotations

import html
import json
import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from gradio_client import Client

from couplet.kvcache import MODE_INFO, MODES
from couplet.page.gate import ASSETS_DIR, FONT_PATH
from couplet.writing.calendar import DEFAULT_YEAR, MAX_YEAR, MIN_YEAR, year_label
from couplet.writing.text import is_han

pytestmark = [
    pytest.mark.slow,  # loads the embedded model
    pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*"),  # gradio's queue on pandas 3
]

ROOT = Path(__file__).resolve().parent.parent
ALL_MODES = list(MODES)
# Modes whose own cache is smaller than full's (the registry's lossless modes, `full` and `shared`, hold
# the whole prompt while a request is the only user)
COMPRESSING = tuple(m for m, info in MODE_INFO.items() if not info.lossless)
GATE, CHECKS, KV_PLOT, MEM_PLOT, TABLE, RESULTS = range(6)
HTML_OUTPUTS = (GATE, CHECKS, TABLE)


@pytest.fixture(scope="module")
def client(live_app: str) -> Client:
    return Client(live_app, verbose=False)


def args(keywords: str, length: int = 7, acrostic: bool = False, temperature: float = 0.0, seed: int = 0,
         year: int | None = DEFAULT_YEAR, modes: list[str] | None = None) -> tuple:
    """The endpoint's inputs in order: keywords, length, acrostic, temperature, seed, year, modes."""
    return keywords, length, acrostic, temperature, seed, year, list(ALL_MODES if modes is None else modes)


def couplet(client: Client, *a, **kw) -> tuple:
    return client.predict(*args(*a, **kw), api_name="/couplet")


def _text(fragment: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", fragment))


def gate_state(gate: str) -> str:
    m = re.search(r'<div id="gate"[^>]*\bdata-state="(\w+)"', gate)
    assert m, gate[:300]
    return m.group(1)


def gate_lines(gate: str) -> tuple[str, str, str]:
    """(上联 on the right door, 下联 on the left door, 横批) as shown, tags stripped."""
    upper = re.search(r'<div class="door door-right">.*?<p class="couplet-line"[^>]*>(.*?)</p>', gate, re.S)
    lower = re.search(r'<div class="door door-left">.*?<p class="couplet-line"[^>]*>(.*?)</p>', gate, re.S)
    hengpi = re.search(r'<div class="lintel">.*?<span class="hengpi">(.*?)</span>', gate, re.S)
    assert upper and lower and hengpi, gate[:300]
    return _text(upper.group(1)), _text(lower.group(1)), _text(hengpi.group(1))


def gate_message(gate: str) -> str:
    m = re.search(r'<div class="gate-message"[^>]*>(.*?)</div>', gate, re.S)
    return _text(m.group(1)) if m else ""


def plot_traces(plot: dict) -> list[str]:
    """The `meta` (mode name) of every trace in a gr.Plot output as the client receives it."""
    figure = json.loads(plot["plot"]) if isinstance(plot.get("plot"), str) else plot["plot"]
    return [trace.get("meta") for trace in figure["data"]]


def test_the_page_writes_a_couplet_with_every_mode_as_it_starts(live_app):
    """Before any visitor: `build_app` has the start-up couplet written with every mode (the first forwards'
    one-off costs fall on no visitor), through the engine, which then holds nothing but the pool's cache."""
    import app

    assert app.warmed.wait(120) and app.warmed_modes == ALL_MODES
    assert_engine_idle()
    assert app.engine().stats().pool_bytes > 0  # the house prefix's blocks, kept for the first visitor


CASES = [  # keywords, length, acrostic, temperature, seed, modes, (head of 上联, head of 下联)
    ("龙马精神", 7, False, 0.0, 0, ALL_MODES, ("龙马", "精神")),
    ("吉祥如意", 7, True, 0.0, 0, ["full", "shared", "combo"], ("吉如", "祥意")),  # 藏头: alternate lines
    ("明月", 5, False, 0.0, 0, ["window", "int8"], ("明", "月")),  # no full: ratios against full-equivalent
    ("五福临门", 5, False, 0.8, 7, ["full", "selective", "int4"], ("五福", "临门")),  # sampled
]


@pytest.mark.parametrize("keywords,length,acrostic,temperature,seed,modes,heads", CASES,
                         ids=[f"{c[0]}-{c[1]}-{'+'.join(c[5])}" for c in CASES])
def test_couplet_for_keywords_and_modes(client, keywords, length, acrostic, temperature, seed, modes, heads):
    out = couplet(client, keywords, length, acrostic, temperature, seed, modes=modes)
    results = out[RESULTS]
    assert [r["mode"] for r in results] == modes  # one result per selected mode, in registry order
    for r in results:
        assert set(r) >= {"keywords", "upper", "lower", "hengpi", "checks", "mode", "kv"}
        assert r["keywords"] == keywords
        assert len(r["upper"]) == len(r["lower"]) == length, r
        assert all(map(is_han, r["upper"] + r["lower"] + r["hengpi"])), r
        assert r["upper"].startswith(heads[0]) and r["lower"].startswith(heads[1]), r
        assert len(r["hengpi"]) == 4
        assert r["checks"]["length"]["ok"] and r["checks"]["keywords"]["ok"], r["checks"]

    by_mode = {r["mode"]: r for r in results}
    for mode, r in by_mode.items():
        base = by_mode["full"]["kv"]["peak_bytes"] if "full" in by_mode else r["kv"]["full_equivalent_bytes"]
        if mode in COMPRESSING:
            assert r["kv"]["peak_bytes"] < base, (mode, r["kv"], base)
        else:
            assert 0 < r["kv"]["peak_bytes"] <= base, (mode, r["kv"], base)

    # the page shows the same couplet: full's if it ran, else the first mode's
    shown = by_mode.get("full", results[0])
    assert gate_state(out[GATE]) == "open"
    assert gate_lines(out[GATE]) == (shown["upper"], shown["lower"], shown["hengpi"])
    assert "字数" in out[CHECKS] and "平仄" in out[CHECKS]
    assert re.findall(r'<tr data-mode="(\w+)"', out[TABLE]) == modes
    assert plot_traces(out[KV_PLOT]) == [*modes, "full-equivalent"]  # one line per mode + the dashed reference


def test_stream_yields_step_by_step(client):
    job = client.submit(*args("龙马精神"), api_name="/couplet")
    arrivals: list[tuple[float, bool, tuple]] = []
    for update in job:  # arrives as the server yields
        arrivals.append((time.perf_counter(), job.done(), update))
    outputs = job.outputs()
    assert len(outputs) > 1 and len(arrivals) > 1
    # the first update reached us while decoding was still going on, well before the last
    assert arrivals[0][0] < arrivals[-1][0]
    first_partial = next(i for i, (_, _, u) in enumerate(arrivals) if gate_lines(u[GATE])[0])
    assert not arrivals[first_partial][1], "the first character arrived only after the job had finished"

    uppers = [gate_lines(u[GATE])[0] for u in outputs]
    lowers = [gate_lines(u[GATE])[1] for u in outputs]
    final = outputs[-1][RESULTS][0]
    assert any(0 < len(u) < 7 for u in uppers), uppers  # the 上联 grows character by character
    assert all(final["upper"].startswith(u) for u in uppers) and all(final["lower"].startswith(w) for w in lowers)
    assert [gate_state(u[GATE]) for u in outputs[:-1]] == ["pending"] * (len(outputs) - 1)
    assert gate_state(outputs[-1][GATE]) == "open"
    assert all(u[RESULTS] == [] for u in outputs[:-1]) and len(outputs[-1][RESULTS]) == len(ALL_MODES)
    steps = [len(plot_traces(u[KV_PLOT])) for u in outputs]  # every update carries every mode's line
    assert set(steps) == {len(ALL_MODES) + 1}
    # while it is written, the live line says what the engine's caches use against the same tokens stored whole
    live = [re.search(r"在用 (\d+) KB，是不压缩不共享（(\d+) KB）的 (\d+)%", u[TABLE]) for u in outputs[:-1]]
    figures = [tuple(int(g) for g in m.groups()) for m in live if m]
    assert figures and all(abs(pct - 100 * used / whole) <= 1 for used, whole, pct in figures), figures
    assert any(0 < used < whole for used, whole, _ in figures), figures  # the compressed modes use less


@pytest.mark.parametrize("keywords,message", [
    ("", "请输入 1–8 个汉字"),
    ("   ", "请输入 1–8 个汉字"),
    ("hello", "关键词里没有汉字"),
    ("一二三四五六七八九", "关键词最多 8 个汉字"),
], ids=["empty", "blank", "latin", "nine-characters"])
def test_bad_keywords_give_a_visible_chinese_message(client, keywords, message):
    out = couplet(client, keywords, modes=["full"])  # no exception: the message is part of the page
    assert out[RESULTS] == []
    assert gate_state(out[GATE]) == "closed"
    assert message in gate_message(out[GATE])
    assert message in _text(out[CHECKS])
    for i in HTML_OUTPUTS:
        assert "Traceback" not in out[i]


def test_year_picks_the_plaque_and_a_bad_year_falls_back_with_a_message(client):
    out = couplet(client, "平安", year=2025, modes=["full"])
    assert f'<span class="year-label">{year_label(2025)}</span>' in out[GATE]  # 乙巳蛇年
    assert "年份须在" not in out[CHECKS]

    out = couplet(client, "平安", year=1800, modes=["full"])  # Gradio would refuse it in English
    assert len(out[RESULTS]) == 1 and gate_state(out[GATE]) == "open"
    assert f'<span class="year-label">{year_label(DEFAULT_YEAR)}</span>' in out[GATE]
    assert f"年份须在 {MIN_YEAR}–{MAX_YEAR} 之间" in _text(out[CHECKS])


def test_user_text_is_escaped(client):
    out = couplet(client, "<img src=x onerror=alert(1)>龙", modes=["full"])
    assert out[RESULTS][0]["keywords"] == "龙"
    assert "&lt;img" in out[CHECKS]  # the note on the dropped characters shows them as text
    for i in HTML_OUTPUTS:
        assert "<img" not in out[i].lower()

    out = couplet(client, "<script>alert(1)</script>", modes=["full"])  # refused: nothing of it is echoed raw
    for i in HTML_OUTPUTS:
        assert "<script" not in out[i].lower()


def test_concurrent_visitors_each_get_their_own_couplet(client):
    keywords = ["龙马精神", "吉祥如意", "春风", "国泰民安"]
    modes = ["full", "shared", "combo"]  # shared and combo use the process-wide prefix pool
    # Put every prompt in the pool first, so that alone and together both find it there: combo's couplet
    # for 龙马精神 is not the same on a pool miss as on a hit (a cache property, not interleaving).
    for kw in keywords:
        couplet(client, kw, modes=modes)
    alone = {kw: couplet(client, kw, modes=modes)[RESULTS] for kw in keywords}

    def visit(kw: str) -> tuple[float, float, tuple]:
        job = client.submit(*args(kw, modes=modes), api_name="/couplet")
        first = None
        for _ in job:
            first = first or time.perf_counter()
        return first, time.perf_counter(), job.outputs()[-1]

    with ThreadPoolExecutor(len(keywords)) as pool:
        visits = dict(zip(keywords, pool.map(visit, keywords), strict=True))

    assert max(v[0] for v in visits.values()) < min(v[1] for v in visits.values()), "the requests did not overlap"
    for kw, (_, _, out) in visits.items():
        results = out[RESULTS]
        assert [r["mode"] for r in results] == modes
        assert all(r["keywords"] == kw for r in results)
        assert [(r["upper"], r["lower"], r["hengpi"]) for r in results] == \
            [(r["upper"], r["lower"], r["hengpi"]) for r in alone[kw]]
        assert gate_lines(out[GATE]) == (results[0]["upper"], results[0]["lower"], results[0]["hengpi"])
    assert_engine_idle()


def assert_engine_idle(seconds: float = 30.0) -> None:
    """The app's engine (same process as the live app) holds nothing once every visitor is done."""
    import app

    deadline = time.time() + seconds
    while (st := app.engine().stats()).in_flight or st.waiting:
        assert time.time() < deadline, st
        time.sleep(0.05)
    assert st.pool_refs == 0 and st.reserved_bytes == 0 and st.kv_bytes == 0, st


def test_a_visitor_who_leaves_releases_what_the_engine_held(client):
    job = client.submit(*args("五福临门", modes=["shared", "combo"]), api_name="/couplet")
    deadline = time.time() + 30
    while not job.outputs() and time.time() < deadline:  # the first step has streamed back
        time.sleep(0.01)
    job.cancel()  # the visitor closes the page: Gradio closes the handler's generator
    assert_engine_idle()
    out = couplet(client, "五福临门", modes=["full"])  # and the page still works for the next one
    assert out[RESULTS][0]["upper"].startswith("五福")


def test_static_route_serves_the_font_and_nothing_outside_assets(live_app):
    def get(path: str) -> httpx.Response:
        return httpx.get(f"{live_app}gradio_api/file={path}", timeout=10)

    font = get(str(FONT_PATH))
    assert font.status_code == 200
    assert font.content[:4] == b"wOF2" and len(font.content) == FONT_PATH.stat().st_size
    for path in (ROOT / "app.py", ROOT / "couplet" / "models" / "loading.py", ROOT / "README.md"):
        assert path.exists()
        assert get(str(path)).status_code != 200, path
    assert get("app.py").status_code != 200  # relative to the server's working directory
    assert get("/etc/passwd").status_code != 200
    # climbing out of assets/, literally and percent-encoded (httpx itself would resolve a literal "..")
    assert get(f"{ASSETS_DIR}/../app.py").status_code != 200
    assert get(quote(f"{ASSETS_DIR}/../app.py", safe="")).status_code != 200
    assert get(str(ASSETS_DIR).replace("/assets", "/assets%2F..") + "/app.py").status_code != 200


def duixia(client: Client, upper: str, temperature: float = 0.0, seed: int = 0,
           modes: list[str] | None = None) -> tuple:
    """`/duixia`: upper, temperature, seed, year, modes."""
    return client.predict(upper, temperature, seed, DEFAULT_YEAR, list(modes or ["full"]), api_name="/duixia")


@pytest.mark.parametrize("temperature,seed,note", [
    (0.7, 20_000_000_000_000, "随机种子须为 0–2147483647 的整数，已改用 0"),  # overflowed the sampler's noise
    (0.7, -5, "随机种子须为 0–2147483647 的整数，已改用 0"),  # a share link refuses it: the same couplet either way
], ids=["huge-seed", "negative-seed"])
def test_a_seed_out_of_range_is_replaced_with_a_chinese_note(client, temperature, seed, note):
    out = couplet(client, "龙马精神", temperature=temperature, seed=seed, modes=["full"])
    assert note in _text(out[CHECKS]) and gate_state(out[GATE]) == "open"
    again = couplet(client, "龙马精神", temperature=temperature, seed=0, modes=["full"])
    assert [(r["upper"], r["lower"]) for r in out[RESULTS]] == [(r["upper"], r["lower"]) for r in again[RESULTS]]


def test_the_seed_picks_the_couplet_and_every_mode_shares_it(client):
    """The page samples by default (a new seed per click, drawn in the browser): through the API, the same
    seed writes the same couplet again in every mode, other seeds write other couplets, and a lossless mode
    (`shared`) writes exactly `full`'s couplet on the same seed, so the modes are compared on one draw."""
    from couplet.page.share import DEFAULT_TEMPERATURE

    def draw(seed: int) -> list[tuple[str, str, str]]:
        out = couplet(client, "明月", temperature=DEFAULT_TEMPERATURE, seed=seed, modes=["full", "shared", "int8"])
        return [(r["upper"], r["lower"], r["hengpi"]) for r in out[RESULTS]]

    first = draw(11)
    assert draw(11) == first  # reproducible: what the share link relies on
    full, shared, _ = first
    assert shared == full
    others = {tuple(draw(seed)[0]) for seed in (12, 13, 14)}
    assert len(others | {full}) >= 3, others  # a new seed, (nearly always) a new couplet
    greedy = {tuple(couplet(client, "明月", temperature=0.0, seed=seed, modes=["full"])[RESULTS][0][k]
                    for k in ("upper", "lower")) for seed in (11, 12)}
    assert len(greedy) == 1  # temperature 0 is greedy: the seed does nothing


def test_the_api_defaults_are_the_pages(client):
    """The endpoint's documented defaults are the form's: sampled at the page's temperature, the page's
    default modes (a client that leaves them out gets what a visitor gets)."""
    from couplet.page.share import DEFAULT_MODES, DEFAULT_TEMPERATURE

    params = {p["parameter_name"]: p for p in client.view_api(print_info=False, return_format="dict")
              ["named_endpoints"]["/couplet"]["parameters"]}
    assert params["temperature"]["parameter_default"] == DEFAULT_TEMPERATURE
    assert params["modes"]["parameter_default"] == list(DEFAULT_MODES)


def test_refusals_and_notes_show_their_chinese_part_only(client):
    out = couplet(client, "hello", modes=[])  # refused: the checks show what the gate shows, no English
    assert "关键词里没有汉字" in _text(out[CHECKS]) and "(" not in _text(out[CHECKS])
    out = couplet(client, "春风", modes=[])  # no mode ticked: full, and the visitor is told
    assert [r["mode"] for r in out[RESULTS]] == ["full"]
    assert "未选择缓存模式，已用完整缓存（full）" in _text(out[CHECKS])


def test_a_character_the_print_font_lacks_is_told_when_the_couplet_appears(client):
    out = couplet(client, "囍", modes=["full"])  # unknown to the model and absent from the shipped font
    checks = _text(out[CHECKS])
    assert gate_state(out[GATE]) == "open" and "模型字表中没有「囍」" in checks
    assert "字库里没有「囍」，此联可在页面上看，但无法下载打印" in checks
    assert "字库里没有" not in _text(couplet(client, "春风", modes=["full"])[CHECKS])  # every character prints


def test_duixia_writes_the_lower_line_with_every_mode(client):
    out = duixia(client, "春回大地千山秀", modes=ALL_MODES)
    results = out[RESULTS]
    assert [r["mode"] for r in results] == ALL_MODES
    for r in results:
        assert r["upper"] == "春回大地千山秀" and len(r["lower"]) == 7 and all(is_han(c) for c in r["lower"])
        assert r["checks"]["passed"], r["checks"]["failures"]
        assert not set(r["lower"]) & set(r["upper"])
    assert gate_state(out[GATE]) == "open"
    upper, lower, _ = gate_lines(out[GATE])
    assert (upper, lower) == (results[0]["upper"], results[0]["lower"])
    assert set(plot_traces(out[KV_PLOT])) == {*ALL_MODES, "full-equivalent"}
    assert "关键词" not in _text(out[CHECKS])  # 对下联 embeds none: no keyword row
    # the exemplars the prompt showed, folded under the checks, and never copied
    assert '<details class="exemplars">' in out[CHECKS] and "参考古联" in out[CHECKS]
    for u, lo in results[0]["exemplars"]:
        assert f"{u}，{lo}。" in _text(out[CHECKS])


@pytest.mark.parametrize("upper,message", [
    ("", "请输入一句 5 字或 7 字的上联"),
    ("春风", "上联须为 5 字或 7 字"),
    ("spring", "上联里没有汉字"),
], ids=["empty", "two-characters", "latin"])
def test_duixia_bad_upper_gives_a_chinese_message(client, upper, message):
    out = duixia(client, upper)
    assert out[RESULTS] == [] and gate_state(out[GATE]) == "closed"
    assert message in gate_message(out[GATE]) and message in _text(out[CHECKS])


def test_print_returns_the_pdf_then_each_piece_as_png_and_svg(client):
    import pypdf

    files = client.predict("天增岁月人增寿", "春满乾坤福满门", "万象更新", "A3", "gold", api_name="/print")
    assert [Path(f).name for f in files] == ["chunlian.pdf", *(f"{s}.{e}" for e in ("png", "svg")
                                                               for s in ("shanglian", "xialian", "hengpi", "fu"))]
    reader = pypdf.PdfReader(files[0])
    assert len(reader.pages) == 7
    text = "".join(p.extract_text() for p in reader.pages)
    assert "上联：天增岁月人增寿" in text and "福" in text
    width, _ = (float(v) for v in reader.pages[1].mediabox.upper_right)
    assert round(width / 72 * 25.4) == 297  # A3


@pytest.mark.parametrize(("texts", "message"), [
    (("天增岁月", "春满乾坤福满门", "万象更新"), "上下联字数须相同"),
    (("<b>x</b>", "春满乾坤福满门", "万象更新"), "上联里没有汉字"),
])
def test_print_refuses_bad_texts_with_a_chinese_message(client, texts, message):
    from gradio_client.exceptions import AppError

    with pytest.raises(AppError, match=message):
        client.predict(*texts, api_name="/print")
    # and the app is still there
    assert client.predict("天增岁月人增寿", "春满乾坤福满门", "万象更新", api_name="/print")[0].endswith(".pdf")


def test_best_of_shows_the_best_draft_of_each_mode_and_its_note(client):
    """择优 ticked: each mode writes PAGE_BEST_OF.n drafts in the engine; the gate, the checks and the payload show
    the best one, the note says which draft, and a client that leaves the box out gets one draft (the default)."""
    from app import PAGE_BEST_OF
    from couplet.page.share import DEFAULT_TEMPERATURE

    one = couplet(client, "人工智能", temperature=DEFAULT_TEMPERATURE, seed=5, modes=["full", "shared"])
    out = client.predict(*args("人工智能", temperature=DEFAULT_TEMPERATURE, seed=5, modes=["full", "shared"]), True,
                         api_name="/couplet")
    assert all("candidates" not in r for r in one[RESULTS])  # the box's default: off
    full, shared = out[RESULTS]
    assert len(full["candidates"]) == PAGE_BEST_OF.n and full["checks"]["passed"]
    scores = [c["score"] for c in full["candidates"] if c["score"] is not None]
    assert full["candidates"][0]["score"] == max(scores)
    # draft 0 is the request itself: the couplet the box off writes is among the drafts
    assert (one[RESULTS][0]["upper"], one[RESULTS][0]["lower"]) in \
        {(c["upper"], c["lower"]) for c in full["candidates"]}
    assert (shared["upper"], shared["lower"]) == (full["upper"], full["lower"])  # lossless: the same drafts
    upper, lower, hengpi = gate_lines(out[GATE])
    assert (upper, lower, hengpi) == (full["upper"], full["lower"], full["hengpi"]) and gate_state(out[GATE]) == "open"
    assert f"从 {PAGE_BEST_OF.n} 副草稿中择优" in _text(out[CHECKS])
    # the table says what all the drafts held: under `full` each draft its own prompt, under `shared` the pool's
    # prefix once (the full cache's chosen draft holds what the box off holds for it)
    assert full["candidates"][0]["kv_bytes"] == full["kv"]["peak_bytes"]
    totals = [sum(c["kv_bytes"] for c in r["candidates"]) for r in (full, shared)]
    for total in totals:
        assert f"{PAGE_BEST_OF.n} 稿同写，合计自有 {total / 1024:.1f} KB" in _text(out[TABLE])
    assert totals[1] < totals[0] / 4
