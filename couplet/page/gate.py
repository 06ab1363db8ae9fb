"""The palace gate (皇城大门) the couplet is shown on, as plain HTML + CSS (no Gradio here).

Layout, right to left as a gate is read: the 上联 hangs on the right door, the 下联 on the left, the 横批
across the lintel. The 横批 reads right to left, as the convention asks of a gate whose 上联 hangs on the
right (a 横批 read left to right puts the 上联 on the left; `couplet.page.printing` says the same on its sheet).
Its DOM text stays in reading order (screen readers, copy and paste); CSS reverses the characters.

Stable hooks for tests and the app::

    #gate.is-closed | .is-pending | .is-open   (data-state="closed" | "pending" | "open")
    .door-right .couplet-line                  上联 (its text is the line decoded so far)
    .door-left .couplet-line                   下联
    .lintel .hengpi                            横批
    .gate-plaque .year-label                   e.g. 丙午马年
    .gate-message                              `message`, when given

Each door is a post carrying the red paper strip plus the leaf that swings; the leaves open with a CSS
keyframe animation (a transition would not run, because the app replaces the HTML rather than toggling a
class). In the DOM the right door comes first, so text and screen readers give 上联 before 下联.

Every piece of caller text goes through `html.escape`; the SVG ornaments are our own files in `assets/`.
"""

from __future__ import annotations

import itertools
import re
from functools import cache
from html import escape
from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parents[2] / "assets"
FONT_PATH = ASSETS_DIR / "fonts" / "lxgw-wenkai-subset.woff2"
CSS_PATH = ASSETS_DIR / "gate.css"
FONT_FAMILY = "CoupletKai"  # the @font-face name in gate.css
_FONT_URL_IN_FILE = 'url("fonts/lxgw-wenkai-subset.woff2")'  # relative to gate.css, so the file works alone
# SVG ids must be unique on the page: a gradient whose first definition sits in a hidden copy of the gate
# (an old render, a closed tab) paints nothing in Chromium. Every render takes fresh ones.
_render_ids = itertools.count()


@cache
def _svg_file(name: str) -> str:
    text = (ASSETS_DIR / name).read_text(encoding="utf-8")
    return re.sub(r"<!--.*?-->", "", text, flags=re.S).strip()


def inline_svg(name: str, prefix: str) -> str:
    """An SVG file from assets/, its ids renamed `prefix-…` so several copies can share one page."""
    text = _svg_file(name)
    ids = re.findall(r'\bid="([^"]+)"', text)
    for old in ids:
        text = text.replace(f'id="{old}"', f'id="{prefix}-{old}"').replace(f"url(#{old})", f"url(#{prefix}-{old})")
        text = text.replace(f'href="#{old}"', f'href="#{prefix}-{old}"')
    return text.replace("<svg ", '<svg aria-hidden="true" focusable="false" ', 1)


def _line(text: str, growing: bool) -> str:
    """The characters of one line; while it is growing, the newest one fades in like wet ink."""
    text = text or ""
    if growing and text:
        return f'{escape(text[:-1])}<span class="ch-new">{escape(text[-1])}</span>'
    return escape(text)


def _door(side: str, line: str, label: str, growing: bool, knocker: str) -> str:
    cursor = " is-writing" if growing else ""
    post = (
        f'<div class="post post-{side}">'
        f'<div class="strip{cursor}"><span class="sr-only">{label}：</span>'
        f'<p class="couplet-line" data-line="{"upper" if side == "right" else "lower"}">{_line(line, growing)}</p>'
        "</div></div>"
    )
    leaf = (
        f'<div class="leaf leaf-{side}" aria-hidden="true"><div class="leaf-panel">'
        f'<div class="studs"></div><div class="knocker">{knocker}</div></div></div>'
    )
    # The post is on the outside: right door = leaf then post, left door = post then leaf.
    inner = leaf + post if side == "right" else post + leaf
    return f'<div class="door door-{side}">{inner}</div>'


def render_gate(upper: str, lower: str, hengpi: str, *, year_label: str, opened: bool, pending: bool = False,
                message: str = "", length: int | None = None) -> str:
    """The gate's HTML. `opened`: the couplet is complete and the doors swing open (wins over `pending`);
    `pending`: characters are still arriving (the newest one fades in, a brush cursor follows it).
    `length`: characters per line, if known before the line is (5-character lines are spaced out to fill
    the strips); otherwise taken from the 上联 once it is complete."""
    state = "open" if opened else "pending" if pending else "closed"
    upper, lower, hengpi = upper or "", lower or "", hengpi or ""
    if length is None and (lower or not pending):
        length = len(upper)
    spacing = " lines-short" if length and length <= 5 else ""
    uid = f"g{next(_render_ids)}"
    writing_lower = pending and not opened and bool(lower)
    writing_upper = pending and not opened and not lower
    msg = f'<div class="gate-message" role="status">{escape(message)}</div>' if message else ""
    return (
        f'<div id="gate" class="gate is-{state}{spacing}" data-state="{state}" lang="zh-CN">'
        '<div class="gate-scene">'
        f'<div class="gate-roof">{inline_svg("roof.svg", f"{uid}-roof")}</div>'
        f'<div class="lantern lantern-left">{inline_svg("lantern.svg", f"{uid}-lantern-l")}</div>'
        f'<div class="lantern lantern-right">{inline_svg("lantern.svg", f"{uid}-lantern-r")}</div>'
        '<div class="gate-beam" aria-hidden="true"></div>'
        f'<div class="gate-plaque"><span class="year-label">{escape(year_label)}</span></div>'
        '<div class="lintel"><div class="hengpi-paper" title="横批自右向左读"><span class="sr-only">横批：</span>'
        f'<span class="hengpi">{escape(hengpi)}</span></div></div>'
        '<div class="gate-body">'
        '<div class="doorway" aria-hidden="true"><div class="glow"></div>'
        f'<div class="fu">{inline_svg("fu.svg", f"{uid}-fu")}</div>'
        f'<div class="doorway-greeting">开门见喜<span class="greeting-year"> · {escape(year_label)}</span></div></div>'
        + _door("right", upper, "上联", writing_upper, inline_svg("knocker.svg", f"{uid}-knock-r"))
        + _door("left", lower, "下联", writing_lower, inline_svg("knocker.svg", f"{uid}-knock-l"))
        + '</div><div class="gate-base" aria-hidden="true"><div class="step"></div><div class="step"></div></div>'
        f"</div>{msg}</div>"
    )


def gate_css(font_url: str) -> str:
    """The gate's and the page's CSS, with the shipped font's @font-face pointing at `font_url`.

    In Gradio: `gr.set_static_paths([ASSETS_DIR])`, then `gate_css(f"/gradio_api/file={FONT_PATH}")`.
    """
    if any(c in font_url for c in "\"'()\\\n\r") or not font_url.strip():
        raise ValueError(f"字体地址无效 / font_url must be a plain URL without quotes or brackets: {font_url!r}")
    css = CSS_PATH.read_text(encoding="utf-8")
    if _FONT_URL_IN_FILE not in css:
        raise RuntimeError(f"{CSS_PATH} lost its @font-face url {_FONT_URL_IN_FILE}")
    return css.replace(_FONT_URL_IN_FILE, f'url("{font_url}")')
