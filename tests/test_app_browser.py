"""The real page in a real browser: Playwright driving Debian's Chromium (never `playwright install`)
against `app.build_app()` launched on 127.0.0.1 (conftest `live_app`).

A visitor types 龙马精神 and clicks 开门见喜: the doors open on the couplet, the KV chart has one line per
selected mode, the shipped font is what renders it; switching a mode off and writing again drops its
line; a bad keyword leaves a message on the page and the page usable. On a phone (390 × 844) the gate
comes first and the settings are folded; 下载春联 downloads the printable PDF; a share link writes the same
couplet again; a hostile query string stays text; axe-core finds nothing serious; nothing overlaps at 390 px.
Full-page screenshots go to pytest's tmp_path (the README's pictures are `scripts/screenshots.py`'s).
"""

from __future__ import annotations

import io
from pathlib import Path
from urllib.parse import quote, urlsplit

import pytest

from couplet.kvcache import MODES
from couplet.page.share import DEFAULT_MODES, DEFAULT_TEMPERATURE

CHROMIUM = "/usr/bin/chromium"
pytestmark = [
    pytest.mark.browser,
    pytest.mark.slow,  # loads the embedded model
    pytest.mark.filterwarnings("ignore:.*(no_silent_downcasting|copy keyword).*"),  # gradio's queue on pandas 3
    pytest.mark.skipif(not Path(CHROMIUM).exists(),
                       reason=f"{CHROMIUM} is absent (Debian's `chromium` package; scripts/test.sh installs it)"),
]
DESKTOP = {"width": 1366, "height": 900}
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
# Every visible run of text on the page as boxes (one per line box of an HTML text node, one per SVG text in
# the charts), outside the gate (its layers of paper and wood overlap on purpose), then: pairs of boxes that
# overlap, boxes past the screen's edges or outside the box of an ancestor that clips them, and text boxes
# (textareas) that show part of a line.
LAYOUT_FAULTS = """() => {
  const W = document.documentElement.clientWidth;
  const seen = el => el.checkVisibility({opacityProperty: true, visibilityProperty: true});
  const name = el => (el.id ? '#' + el.id : el.tagName.toLowerCase() + '.' + [...el.classList].join('.'));
  const clipper = el => {
    for (let a = el.parentElement; a; a = a.parentElement) {
      const s = getComputedStyle(a);
      if (s.overflowX !== 'visible' || s.overflowY !== 'visible') return a;
    }
    return null;
  };
  const boxes = [];
  const add = (text, el, b) => {
    if (b.width < 2 || b.height < 2) return;
    boxes.push({text: text.slice(0, 24), el: name(el), l: b.left, r: b.right, t: b.top, b: b.bottom, node: el});
  };
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!n.textContent.trim() || !el || !seen(el)) continue;
    if (el.closest('#gate, svg, script, style, [aria-hidden="true"]')) continue;
    const range = document.createRange();
    range.selectNodeContents(n);
    for (const b of range.getClientRects()) add(n.textContent.trim(), el, b);
  }
  for (const t of document.querySelectorAll('.js-plotly-plot svg text')) {
    if (!t.textContent.trim() || !seen(t) || t.closest('.hoverlayer')) continue;
    add(t.textContent.trim(), t, t.getBoundingClientRect());
  }
  const overlaps = [], cut = [];
  for (let i = 0; i < boxes.length; i++) {
    const a = boxes[i];
    if (a.l < -0.5 || a.r > W + 0.5) cut.push([a.text, a.el, 'screen']);
    const c = clipper(a.node);
    if (c) {
      const k = c.getBoundingClientRect();
      const out = a.l < k.left - 1 || a.r > k.right + 1 || a.t < k.top - 1 || a.b > k.bottom + 1;
      if (out) cut.push([a.text, a.el, name(c)]);
    }
    for (let j = i + 1; j < boxes.length; j++) {
      const b = boxes[j];
      if (Math.min(a.r, b.r) - Math.max(a.l, b.l) > 1 && Math.min(a.b, b.b) - Math.max(a.t, b.t) > 1) {
        overlaps.push([a.text, a.el, b.text, b.el]);
      }
    }
  }
  const partial = [...document.querySelectorAll('textarea')].filter(e => seen(e) && e.scrollHeight > e.clientHeight + 1)
    .map(e => name(e.closest('[id]') || e));
  return {boxes: boxes.length, overlaps, cut, partial, wide: document.documentElement.scrollWidth > W};
}"""
FONT_STATE = """async () => {
  await document.fonts.ready;
  const face = [...document.fonts].find(f => f.family.replace(/["']/g, '') === 'CoupletKai');
  return {check: document.fonts.check('32px CoupletKai', '龙'), status: face ? face.status : null,
          family: getComputedStyle(document.querySelector('.door-right .couplet-line')).fontFamily};
}"""


def axe_serious(page) -> list[dict]:
    """axe-core's serious and critical violations on the page as it is now (axe-playwright-python bundles
    axe.min.js: nothing is fetched), one dict per rule with the nodes it failed on."""
    from axe_playwright_python.sync_playwright import Axe

    found = Axe().run(page).response["violations"]
    return [v for v in found if v["impact"] in ("serious", "critical")]


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


def ready(page) -> None:
    """The fresh page settled as a visitor first sees it: the charts drawn, the fade-ins over, and past the
    first moments in which Gradio drops a click (it does so without this page's code too)."""
    page.wait_for_selector("#kv-plot .js-plotly-plot")
    page.evaluate(ANIMATIONS_DONE)
    page.wait_for_timeout(1000)


@pytest.fixture(scope="module")
def page(browser, live_app: str):
    page = open_page(browser, live_app, DESKTOP)
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
    write(page, "龙马精神", len(DEFAULT_MODES))
    upper, lower = door_text(page, "right"), door_text(page, "left")  # 上联 on the right door, 下联 on the left
    assert len(upper) == 7 and upper.startswith("龙马"), upper
    assert len(lower) == 7 and lower.startswith("精神"), lower
    assert len(page.inner_text("#gate .lintel .hengpi").strip()) == 4
    assert "字数" in page.inner_text("#checks")

    assert page.evaluate(KV_TRACES) == [*DEFAULT_MODES, "full-equivalent"]
    assert page.locator("#kv-plot .scatterlayer .trace").count() == len(DEFAULT_MODES) + 1
    assert page.locator("#mem-plot .js-plotly-plot").count() == 1

    font = page.evaluate(FONT_STATE)  # check() alone is true for a family that does not exist at all
    assert font["check"] and font["status"] == "loaded", font
    assert "CoupletKai" in font["family"]

    page.evaluate(ANIMATIONS_DONE)
    path = tmp_path / "couplet-page.png"
    size = save_screenshot(page, path)
    assert path.stat().st_size == size > 10_000
    assert page.elsewhere == []


def test_switching_a_mode_off_drops_its_line(page):
    if page.locator("#modes-table tr[data-mode]").count() != len(DEFAULT_MODES):  # run alone: write first
        write(page, "龙马精神", len(DEFAULT_MODES))
    page.locator("#modes label").filter(has_text="int4").click()
    write(page, "龙马精神", len(DEFAULT_MODES) - 1)
    traces = page.evaluate(KV_TRACES)
    assert traces == [*(m for m in DEFAULT_MODES if m != "int4"), "full-equivalent"]
    assert page.locator("#kv-plot .scatterlayer .trace").count() == len(DEFAULT_MODES)
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
    # the per-mode table is a card per mode, each cell under its column's name: nothing to scroll sideways
    assert phone.evaluate("(e => e.scrollWidth <= e.clientWidth)(document.querySelector('#modes-table'))")
    assert phone.evaluate("getComputedStyle(document.querySelector('#modes-table tr[data-mode]')).display") == "block"
    phone.evaluate(ANIMATIONS_DONE)
    path = tmp_path / "couplet-phone.png"
    assert save_screenshot(phone, path) > 10_000


def axe_report(found: list[dict]) -> str:
    return "; ".join(f"{v['id']} on " + ", ".join(" ".join(n["target"]) for n in v["nodes"]) for v in found)


@pytest.mark.parametrize("viewport", [DESKTOP, PHONE], ids=["desktop", "phone"])
def test_the_page_reads_cleanly_before_and_after_a_couplet(browser, live_app, viewport):
    """axe-core (colour contrast, keyboard reach of scrolling boxes, names, ...): nothing serious or critical,
    on the keyword tab and the 对下联 tab, on the fresh page and with a couplet, its table and charts. Then
    every run of text on the page (the checks, the table's rows or cards, the charts' titles, axes and line
    labels, the share link), at this size: no two overlap, none runs past the screen or out of a box that
    clips it, no text box shows half a line; on a phone the Plotly toolbar, which would sit on the charts'
    titles, is hidden."""
    page = open_page(browser, live_app, viewport)
    ready(page)
    for when in ("before", "after"):
        if when == "after":
            page.click("#tasks button[role=tab]:has-text('关键词写春联')")
            page.click("#open-btn")
            opened(page)
            page.wait_for_function("(document.querySelector('#share-link textarea')?.value || '').includes('seed=')")
            page.evaluate(ANIMATIONS_DONE)
        assert (found := axe_serious(page)) == [], f"keyword tab {when}: {axe_report(found)}"
        page.click("#tasks button[role=tab]:has-text('对下联')")
        page.locator("#duixia-btn").wait_for(state="visible")
        assert (found := axe_serious(page)) == [], f"对下联 tab {when}: {axe_report(found)}"

    page.click("#tasks button[role=tab]:has-text('关键词写春联')")
    page.locator("#open-btn").wait_for(state="visible")
    faults = page.evaluate(LAYOUT_FAULTS)
    assert faults["boxes"] > 80  # the check saw the page: checks, table, charts
    assert faults["overlaps"] == [] and faults["cut"] == [] and faults["partial"] == [] and not faults["wide"], faults
    titles = page.eval_on_selector_all(".js-plotly-plot .gtitle", "ts => ts.map(t => t.textContent)")
    assert any("KV 缓存" in t for t in titles) and len(titles) == 2
    assert "解码步" in page.inner_text("#charts-note") and "KV 缓存" in page.inner_text("#charts-note")
    if viewport == PHONE:
        page.hover("#kv-plot .js-plotly-plot")
        assert not page.locator("#kv-plot .modebar").is_visible()
    page.context.close()


def test_a_tap_on_a_phone_brings_the_gate_into_view(browser, live_app):
    """On a phone the form sits below the gate: after a tap on 开门见喜 (and on 对下联) the page scrolls the
    gate into view, so the couplet is written where the visitor is looking."""
    phone = open_page(browser, live_app, PHONE)
    ready(phone)
    in_view = "() => { const r = document.querySelector('#gate').getBoundingClientRect(); " \
              "return r.top >= -2 && r.top < 120 && r.bottom <= innerHeight + 2; }"
    for tab, button in (("关键词写春联", "#open-btn"), ("对下联", "#duixia-btn")):
        phone.click(f"#tasks button[role=tab]:has-text('{tab}')")
        phone.locator(button).scroll_into_view_if_needed()
        assert not phone.evaluate(in_view)  # the gate is above, off-screen
        phone.click(button)
        phone.wait_for_function(in_view)  # at once: the scroll runs in the browser before the write starts
        phone.wait_for_function("['pending', 'open'].includes(document.querySelector('#gate').dataset.state)")
        assert phone.evaluate(in_view)  # in view while it is being written
        opened(phone)
        assert phone.evaluate(in_view)
    phone.context.close()


def test_an_english_browser_still_gets_a_chinese_page(browser, live_app):
    """Gradio's own strings (the footer here) follow the page, not the browser's language."""
    context = browser.new_context(viewport=DESKTOP, locale="en-US")
    page = context.new_page()
    page.goto(live_app)
    page.wait_for_selector("#open-btn")
    assert page.evaluate("navigator.language") == "en-US"  # the browser is English
    page.wait_for_function("document.querySelector('footer')?.innerText.includes('使用 Gradio 构建')")
    footer = page.inner_text("footer")
    assert "设置" in footer and "Built with" not in footer and "Settings" not in footer and "Runs" not in footer
    assert page.evaluate("document.documentElement.lang") == "zh-CN"
    context.close()


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
    fonts = {str(f.get_object()["/BaseFont"]).split("+")[-1]: "/FontFile2" in f.get_object().get(
             "/FontDescriptor", {}) for p in reader.pages for f in p["/Resources"]["/Font"].values()}
    assert fonts == {"CoupletKai": True}  # every font the sheets name is embedded (no bare Helvetica)
    guide_sheet_reads_cleanly(reader.pages[0])
    names = [a.split("/")[-1] for a in phone.eval_on_selector_all("#print-files a", "as => as.map(a => a.href)")]
    assert names[0] == "chunlian.pdf" and {"shanglian.png", "xialian.svg", "hengpi.png", "fu.svg"} <= set(names)


def guide_sheet_reads_cleanly(page) -> None:
    """The guide sheet (张贴说明) as printed: no two runs of text overlap (the strips' characters, their
    labels, the instructions), and every wrapped line of the instructions ends at punctuation."""
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont

    from couplet.page.print_layout import BREAK_AFTER, font_ttf

    if "CoupletKai" not in pdfmetrics.getRegisteredFontNames():
        pdfmetrics.registerFont(TTFont("CoupletKai", str(font_ttf())))
    runs: list[tuple[str, float, float, float]] = []  # text, x, y (baseline), size in points

    def seen(text, cm, tm, font, size):
        if text.strip():
            a, b, c, d, e, f = tm
            ca, cb, cc, cd, ce, cf = cm
            x, y = e * ca + f * cc + ce, e * cb + f * cd + cf
            runs.append((text.strip(), x, y, size * abs(d) * abs(cd)))

    page.extract_text(visitor_text=seen)
    boxes = [(t, x, y - 0.12 * s, x + pdfmetrics.stringWidth(t, "CoupletKai", s), y + 0.88 * s) for t, x, y, s in runs]
    for i, (t1, x0, y0, x1, y1) in enumerate(boxes):
        for t2, u0, v0, u1, v1 in boxes[i + 1:]:
            assert min(x1, u1) - max(x0, u0) <= 0.5 or min(y1, v1) - max(y0, v0) <= 0.5, (t1, t2)
    lines = sorted(((y, t) for t, _, y, s in runs if 11 <= s <= 13 and len(t) > 12), reverse=True)
    assert len(lines) >= 6
    for (y, line), (below, _) in zip(lines, lines[1:], strict=False):
        if y - below < 20:  # the next line of the same paragraph (6.5 mm apart; paragraphs 8 mm)
            assert line[-1] in BREAK_AFTER, f"a line broken mid-phrase: {line}"


def shown(page) -> tuple[str, str, str]:
    return door_text(page, "right"), door_text(page, "left"), page.inner_text("#gate .lintel .hengpi").strip()


def write_again(page, new_link: bool = True) -> None:
    """Click 开门见喜 and wait for a new gate to open (the app replaces the gate's HTML as it writes, so a
    mark set on the old one tells the two apart), and for the new share link that follows it."""
    page.evaluate("""() => { document.querySelector('#gate').dataset.old = '1';
        const t = document.querySelector('#share-link textarea'); if (t) t.dataset.old = t.value; }""")
    page.click("#open-btn")
    page.wait_for_function("""fresh => {
        const g = document.querySelector('#gate'), t = document.querySelector('#share-link textarea');
        const linked = !fresh || (t && t.value && t.value !== t.dataset.old);
        return g && !g.dataset.old && g.dataset.state === 'open' && linked; }""",
                           arg=new_link, timeout=3 * TIMEOUT_MS)


def test_every_click_writes_a_fresh_couplet_that_its_share_link_writes_again(browser, live_app):
    """每次换一副 (on by default): each click draws a new seed into the form before writing, so two clicks on the
    same keywords give two couplets; the share link carries the seed, and opening it writes the same couplet.
    Unticked, the seed in the form is kept and the couplet repeats; at temperature 0 (greedy) any seed gives
    the same couplet."""
    page = open_page(browser, live_app, DESKTOP)
    ready(page)
    for mode in DEFAULT_MODES[1:]:  # `full` alone: the seeds are under test here, not the modes
        page.locator("#modes label").filter(has_text=mode).click()
    page.locator("#keywords").locator("input, textarea").first.fill("明月")
    couplets, seeds = [], []
    for _ in range(3):
        write_again(page)
        seeds.append(page.locator("#seed input").input_value())
        couplets.append(shown(page))
        assert f"seed={seeds[-1]}&" in page.eval_on_selector("#share-link textarea", "e => e.value")
    assert len(set(seeds)) == 3 and len(set(couplets)) >= 2, couplets  # three seeds; the couplets differ
    link = page.eval_on_selector("#share-link textarea", "e => e.value")
    assert "kw=明月" in link and f"t={DEFAULT_TEMPERATURE:g}&" in link and f"seed={seeds[-1]}" in link
    again = open_page(browser, link, DESKTOP)
    opened(again)
    assert shown(again) == couplets[-1]
    assert again.locator("#seed input").input_value() == seeds[-1]
    again.context.close()

    page.click("#reroll label")  # 每次换一副 off: the form's seed is kept
    write_again(page, new_link=False)  # the same seed: the same link
    assert page.locator("#seed input").input_value() == seeds[-1] and shown(page) == couplets[-1]
    page.locator("#temperature input[type=number]").fill("0")  # greedy: one setting away
    page.locator("#temperature input[type=number]").press("Enter")
    greedy = []
    for seed in ("1", "2"):
        page.locator("#seed input").fill(seed)
        page.locator("#seed input").press("Tab")
        write_again(page)
        assert f"t=0&seed={seed}&" in page.eval_on_selector("#share-link textarea", "e => e.value")
        greedy.append(shown(page))
    assert greedy[0] == greedy[1]
    page.context.close()


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


def test_best_of_settles_on_the_best_draft_and_its_link_keeps_the_box(browser, live_app):
    """择优 ticked: the doors open on the best of the drafts, the checks say which draft was kept, the share link
    carries best=1, and opening it ticks the box and writes the same couplet again."""
    page = open_page(browser, live_app, DESKTOP)
    ready(page)
    for mode in DEFAULT_MODES[1:]:  # `full` alone
        page.locator("#modes label").filter(has_text=mode).click()
    page.locator("#keywords").locator("input, textarea").first.fill("人工智能")
    page.click("#best-of label")
    write_again(page)
    assert "副草稿中择优" in page.inner_text("#checks-box")
    link = page.eval_on_selector("#share-link textarea", "e => e.value")
    assert "best=1" in link
    couplet = shown(page)
    again = open_page(browser, link, DESKTOP)
    opened(again)
    assert again.locator("#best-of input").is_checked() and shown(again) == couplet
    assert "副草稿中择优" in again.inner_text("#checks-box")
    again.context.close()
    page.context.close()
