"""The real page in a real browser: Playwright driving Debian's Chromium (never `playwright install`)
against `app.build_app()` launched on 127.0.0.1 (conftest `live_app`).

A visitor types 龙马精神 and clicks 开门见喜: the doors open on the couplet, the KV chart has one line per
selected mode, the shipped font is what renders it; switching a mode off and writing again drops its
line; a bad keyword leaves a message on the page and the page usable. On a phone (390 × 844) the gate
comes first and the settings are folded; 下载春联 downloads the printable PDF; a share link writes the same
couplet again; a hostile query string stays text. The full-page screenshot goes to
$COUPLET_SCREENSHOT (the README's picture: `COUPLET_SCREENSHOT=assets/screenshot.png pytest
tests/test_app_browser.py`) or to pytest's tmp_path.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

from couplet.kvcache import MODES

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,  # loads the embedded model
    pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*"),  # gradio's queue on pandas 3
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"{CHROMIUM} is absent (Debian's `chromium` package; scripts/test.sh installs it)"),
]
VIEWPORT = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}
SCREENSHOT_MAX_BYTES = 600 * 1024
TIMEOUT_MS = 30_000

# The meta (mode name) of each trace in the KV chart; the chart adds a dashed "full-equivalent" line.
KV_TRACES = "() => (document.querySelector('#kv-plot .js-plotly-plot')?.data ?? []).map(t => t.meta)"
# Resolves when every finite animation (the doors swinging, the 福 appearing) has finished.
ANIMATIONS_DONE = """async () => {
  const finite = document.getAnimations().filter(a => a.effect && a.effect.getComputedTiming().endTime !== Infinity);
  await Promise.all(finite.map(a => a.finished.catch(() => null)));
}"""
FONT_STATE = """async () => {
  await document.fonts.ready;
  const face = [...document.fonts].find(f => f.family.replace(/["']/g, '') === 'CoupletKai');
  return {check: document.fonts.check('32px CoupletKai', '龙'), status: face ? face.status : null,
          family: getComputedStyle(document.querySelector('.door-right .couplet-line')).fontFamily};
}"""


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


def open_page(browser, url: str, viewport: dict, wait: str = "#open-btn"):
    """A fresh context (its own downloads, dialogs recorded) at `viewport`, on `url`."""
    context = browser.new_context(viewport=viewport, device_scale_factor=1, locale="zh-CN", accept_downloads=True)
    page = context.new_page()
    page.set_default_timeout(TIMEOUT_MS)
    page.elsewhere = []  # requests to any host but the app's: the page must work offline
    page.dialogs = []  # an alert() would mean a query string ran as script
    host = urlsplit(url).netloc
    page.on("request", lambda r: r.url.startswith("http") and urlsplit(r.url).netloc != host
            and page.elsewhere.append(r.url))
    page.on("dialog", lambda d: (page.dialogs.append(d.message), d.dismiss()))
    page.goto(url)
    page.wait_for_selector(wait)
    return page


@pytest.fixture(scope="module")
def page(browser, live_app: str):
    page = open_page(browser, live_app, VIEWPORT)
    yield page
    page.context.close()


@pytest.fixture(scope="module")
def phone(browser, live_app: str):
    page = open_page(browser, live_app, PHONE)
    yield page
    page.context.close()


def write(page, keywords: str, modes: int, enter: bool = False) -> None:
    """Type `keywords`, click 开门见喜 (or press Enter), wait until this run's table (a row per selected mode)
    is up."""
    box = page.locator("#keywords").locator("input, textarea").first
    box.fill(keywords)
    if enter:
        box.press("Enter")
    else:
        page.click("#open-btn")
    page.wait_for_function(
        """n => document.querySelector('#gate')?.dataset.state === 'open'
              && document.querySelectorAll('#modes-table tr[data-mode]').length === n""", arg=modes)


def door_text(page, side: str) -> str:
    return page.inner_text(f"#gate .door-{side} .couplet-line").strip()


def save_screenshot(page, path: Path) -> int:
    """A full-page PNG at `path`; past SCREENSHOT_MAX_BYTES it is reduced to a 256-colour palette."""
    png = page.screenshot(full_page=True, type="png")
    if len(png) > SCREENSHOT_MAX_BYTES:
        from PIL import Image

        out = io.BytesIO()
        Image.open(io.BytesIO(png)).convert("RGB").quantize(256, method=Image.Quantize.FASTOCTREE).save(
            out, "PNG", optimize=True)
        png = out.getvalue()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png)
    return len(png)


def test_open_the_gate_on_a_couplet_with_every_mode_charted(page, tmp_path):
    write(page, "龙马精神", len(MODES))
    upper, lower = door_text(page, "right"), door_text(page, "left")  # 上联 on the right door, 下联 on the left
    assert len(upper) == 7 and upper.startswith("龙马"), upper
    assert len(lower) == 7 and lower.startswith("精神"), lower
    assert len(page.inner_text("#gate .lintel .hengpi").strip()) == 4
    assert "字数" in page.inner_text("#checks")

    assert page.evaluate(KV_TRACES) == [*MODES, "full-equivalent"]
    assert page.locator("#kv-plot .scatterlayer .trace").count() == len(MODES) + 1
    assert page.locator("#mem-plot .js-plotly-plot").count() == 1

    font = page.evaluate(FONT_STATE)  # check() alone is true for a family that does not exist at all
    assert font["check"] and font["status"] == "loaded", font
    assert "CoupletKai" in font["family"]

    page.evaluate(ANIMATIONS_DONE)
    path = Path(os.environ.get("COUPLET_SCREENSHOT") or tmp_path / "couplet-page.png")
    size = save_screenshot(page, path)
    assert path.stat().st_size == size > 10_000
    assert page.elsewhere == []


def test_switching_a_mode_off_drops_its_line(page):
    if page.locator("#modes-table tr[data-mode]").count() != len(MODES):  # run alone: write first
        write(page, "龙马精神", len(MODES))
    page.locator("#modes label").filter(has_text="int4").click()
    write(page, "龙马精神", len(MODES) - 1)
    traces = page.evaluate(KV_TRACES)
    assert traces == [*(m for m in MODES if m != "int4"), "full-equivalent"]
    assert page.locator("#kv-plot .scatterlayer .trace").count() == len(MODES)
    assert page.locator('#modes-table tr[data-mode="int4"]').count() == 0


def test_bad_keywords_leave_a_message_and_the_page_usable(page):
    page.locator("#keywords").locator("input, textarea").first.fill("hello")
    page.click("#open-btn")
    page.wait_for_selector("#gate[data-state=closed] .gate-message")
    assert "关键词里没有汉字" in page.inner_text("#gate .gate-message")
    assert "关键词里没有汉字" in page.inner_text("#checks")

    selected = page.locator("#modes input[type=checkbox]:checked").count()
    write(page, "春风", selected, enter=True)  # Enter in the box writes too
    assert door_text(page, "right").startswith("春") and door_text(page, "left").startswith("风")



def top(page, selector: str) -> float:
    return page.evaluate("s => document.querySelector(s).getBoundingClientRect().top", selector)


def opened(page) -> None:
    """Wait for the doors to open: every mode of a couplet, on two shared cores (allow a busy machine)."""
    page.wait_for_function("document.querySelector('#gate')?.dataset.state === 'open'", timeout=3 * TIMEOUT_MS)


def test_a_phone_shows_the_gate_first_and_folds_the_settings(phone, page, tmp_path):
    assert top(phone, "#gate") < top(phone, "#keywords") < top(phone, "#open-btn") < top(phone, "#more-settings")
    assert top(phone, "#open-btn") < top(phone, "#modes-fold") < top(phone, "#kv-plot")
    phone.wait_for_function("!document.querySelector('#more-settings > .label-wrap').classList.contains('open')")
    assert not phone.locator("#temperature").is_visible() and not phone.locator("#modes").is_visible()
    assert phone.evaluate("document.documentElement.scrollWidth") <= PHONE["width"]  # nothing wider than the phone
    phone.click("#more-settings > .label-wrap")  # unfolds on a tap
    phone.locator("#temperature").wait_for(state="visible")
    # the desktop keeps its layout: the controls beside the gate, the settings open
    assert page.locator("#temperature").is_visible() and page.locator("#modes").is_visible()
    controls, gate = (page.locator(s).bounding_box() for s in ("#controls", "#gate"))
    assert controls["x"] + controls["width"] <= gate["x"] and abs(controls["y"] - gate["y"]) < 200


def test_the_gate_text_stays_legible_on_a_phone(phone, tmp_path):
    phone.locator("#keywords").locator("input, textarea").first.fill("龙马精神")
    phone.click("#open-btn")
    opened(phone)
    sizes = phone.evaluate("""() => [...document.querySelectorAll('#gate *')]
        .filter(e => [...e.childNodes].some(n => n.nodeType === 3 && n.textContent.trim())
                     && e.getClientRects().length && getComputedStyle(e).display !== 'none' && !e.closest('.sr-only'))
        .map(e => [e.className, parseFloat(getComputedStyle(e).fontSize)])""")
    assert {name for name, _ in sizes} >= {"couplet-line", "hengpi", "year-label", "doorway-greeting"}
    assert min(size for _, size in sizes) >= 12, sizes
    # the per-mode table scrolls sideways instead of squeezing the couplets
    assert phone.evaluate("(e => e.scrollWidth > e.clientWidth)(document.querySelector('#modes-table'))")
    phone.evaluate(ANIMATIONS_DONE)
    path = Path(os.environ.get("COUPLET_PHONE_SCREENSHOT") or tmp_path / "couplet-phone.png")
    assert save_screenshot(phone, path) > 10_000


def test_download_gives_the_printed_set(phone, tmp_path):
    import pypdf

    if phone.evaluate("document.querySelector('#gate').dataset.state") != "open":
        phone.click("#open-btn")
        opened(phone)
    upper, lower = door_text(phone, "right"), door_text(phone, "left")
    hengpi = phone.inner_text("#gate .lintel .hengpi").strip()
    with phone.expect_download() as download:
        phone.click("#download-btn")
    assert download.value.suggested_filename == "chunlian.pdf"
    pdf = tmp_path / "chunlian.pdf"
    download.value.save_as(pdf)
    reader = pypdf.PdfReader(pdf)
    texts = [p.extract_text().replace("\n", "") for p in reader.pages]
    assert len(texts) == 7  # guide; 上联 and 下联 on two A4 sheets each; 横批; 福
    assert f"上联：{upper}" in texts[0] and f"下联：{lower}" in texts[0] and f"横批：{hengpi}" in texts[0]
    assert texts[1].startswith("上联") and texts[1].endswith(upper[:4]) and texts[2].endswith(upper[4:])
    assert texts[3].startswith("下联") and texts[3].endswith(lower[:4]) and texts[4].endswith(lower[4:])
    assert texts[5].startswith("横批") and texts[5].endswith(hengpi[::-1])  # read right to left
    fonts = {str(f.get_object()["/BaseFont"]).split("+")[-1] for p in reader.pages
             for f in p["/Resources"]["/Font"].values()
             if "/FontDescriptor" in f.get_object() and "/FontFile2" in f.get_object()["/FontDescriptor"].get_object()}
    assert fonts == {"CoupletKai"}
    names = [a.split("/")[-1] for a in phone.eval_on_selector_all("#print-files a", "as => as.map(a => a.href)")]
    assert names[0] == "chunlian.pdf" and {"shanglian.png", "xialian.svg", "hengpi.png", "fu.svg"} <= set(names)


def test_a_share_link_writes_the_same_couplet(browser, page):
    box = page.locator("#keywords").locator("input, textarea").first
    box.fill("明月")
    page.locator("#temperature input[type=number]").fill("0.8")
    page.locator("#temperature input[type=number]").press("Enter")
    page.locator("#seed input").fill("5")
    page.locator("#seed input").press("Tab")
    page.click("#open-btn")
    opened(page)
    page.wait_for_function("(document.querySelector('#share-link textarea')?.value || '').includes('seed=5')")
    link = page.eval_on_selector("#share-link textarea", "e => e.value")
    assert "kw=明月" in link and "t=0.8" in link and "seed=5" in link
    first = (door_text(page, "right"), door_text(page, "left"), page.inner_text("#gate .lintel .hengpi").strip())
    again = open_page(browser, link, VIEWPORT)
    opened(again)
    assert (door_text(again, "right"), door_text(again, "left"),
            again.inner_text("#gate .lintel .hengpi").strip()) == first
    assert again.locator("#seed input").input_value() == "5"
    again.context.close()


def test_a_hostile_query_string_is_shown_as_text(browser, live_app):
    hostile = "<script>alert(1)</script><img src=x onerror=alert(2)>"
    page = open_page(browser, f"{live_app}?kw={quote(hostile)}&seed=abc", PHONE)
    page.wait_for_selector("#gate .gate-message")
    assert "关键词里没有汉字" in page.inner_text("#gate .gate-message")
    checks = page.inner_text("#checks")
    assert "关键词里没有汉字" in checks and "随机种子「abc」不是数字" in checks
    assert page.locator("#keywords").locator("input, textarea").first.input_value() == hostile  # as text
    injected = "document.querySelectorAll('#gate script, #checks script, #gate img, #checks img').length"
    assert page.evaluate(injected) == 0
    assert page.dialogs == []
    page.context.close()


def test_the_peak_panel_shows_the_committed_benchmark_and_its_budget_sweep(page):
    """高峰: the committed serving benchmark (a row per mode) and, below it, its sweep over budgets as a chart
    with a line per mode in each panel, with where the figures come from."""
    import json

    bench = json.loads(Path("assets/bench/serve_sweep.json").read_text(encoding="utf-8"))
    page.click("#peak > .label-wrap")
    page.locator("#peak-panel").wait_for(state="visible")
    assert page.locator("#peak-panel tr[data-mode]").count() == len(MODES)
    page.wait_for_function("() => (document.querySelector('#sweep-plot .js-plotly-plot')?.data ?? []).length > 0")
    traces = page.evaluate("() => document.querySelector('#sweep-plot .js-plotly-plot').data"
                           ".map(t => [t.meta, t.x.length])")
    runs = len(bench["runs"])
    assert sorted(traces) == sorted([m, runs] for m in bench["runs"][0]["modes"] for _ in range(2))
    assert page.locator("#peak .bench-source").count() == 2  # the table's benchmark and the sweep's
    assert "--budgets" in page.locator("#peak .bench-source").nth(1).inner_text()
