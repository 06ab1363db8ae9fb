"""The real page in a real browser: Playwright driving Debian's Chromium (never `playwright install`)
against `app.build_app()` launched on 127.0.0.1 (conftest `live_app`).

A visitor types 龙马精神 and clicks 开门见喜: the doors open on the couplet, the KV chart has one line per
selected mode, the shipped font is what renders it; switching a mode off and writing again drops its
line; a bad keyword leaves a message on the page and the page usable. The full-page screenshot goes to
$COUPLET_SCREENSHOT (the README's picture: `COUPLET_SCREENSHOT=assets/screenshot.png pytest
tests/test_app_browser.py`) or to pytest's tmp_path.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from urllib.parse import urlsplit

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
def page(live_app: str):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        context = browser.new_context(viewport=VIEWPORT, device_scale_factor=1, locale="zh-CN")
        page = context.new_page()
        page.set_default_timeout(TIMEOUT_MS)
        page.elsewhere = []  # requests to any host but the app's: the page must work offline
        host = urlsplit(live_app).netloc
        page.on("request", lambda r: r.url.startswith("http") and urlsplit(r.url).netloc != host
                and page.elsewhere.append(r.url))
        page.goto(live_app)
        page.wait_for_selector("#open-btn")
        yield page
        browser.close()


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

