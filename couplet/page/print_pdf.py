"""The printable set's PDF (`write_pdf`): a guide sheet (the couplet, how to hang, print and cut it, a small
drawing of the door), then one piece per sheet, long strips tiled over balanced sheets with cut marks, in the
shipped brush font embedded as a TrueType subset (reportlab), so the sheets stay text. The pieces and their
layout: `couplet.page.printing`."""

from __future__ import annotations

import math
from pathlib import Path

from couplet.page.print_layout import (
    BORDER,
    CELL_MM,
    GLYPH,
    HEADER_MM,
    INKS,
    MARGIN_MM,
    PAD,
    PAPERS_MM,
    RED,
    PrintConfig,
    door_sides,
    font_ttf,
    glyphs,
    pieces,
    strip_size,
    tiles,
    wrap_cjk,
)


def _cut_marks(c, x: float, y: float, w: float, h: float, mm: float) -> None:
    """Corner marks just outside the rectangle (x, y, w, h): cut along them."""
    gap, length = 2 * mm, 6 * mm
    c.setStrokeColor("#555555")
    c.setLineWidth(0.3)
    for cx, sx in ((x, -1), (x + w, 1)):
        for cy, sy in ((y, -1), (y + h, 1)):
            c.line(cx + sx * gap, cy, cx + sx * (gap + length), cy)
            c.line(cx, cy + sy * gap, cx, cy + sy * (gap + length))


def _draw_chars(c, chars: str, centres: list[tuple[float, float]], size: float, ink: str) -> None:
    g = glyphs()
    c.setFillColor(ink)
    c.setFont("CoupletKai", size)
    scale = size / g.upem
    for ch, (cx, cy) in zip(chars, centres, strict=True):
        ix, iy = g.ink_centre(ch)
        c.drawString(cx - ix * scale, cy - iy * scale, ch)


def _header(c, text: str, page_w: float, page_h: float, mm: float) -> None:
    c.setFillColor("#444444")
    c.setFont("CoupletKai", 10)
    c.drawString(MARGIN_MM * mm, page_h - MARGIN_MM * mm - 4 * mm, text)


def _guide_page(c, upper: str, lower: str, hengpi: str, cfg: PrintConfig, page_w: float, page_h: float,
                mm: float) -> None:
    """The first sheet: how to hang the set, with a small drawing of the door."""
    up_side, low_side = door_sides(cfg.hengpi_rtl)
    direction = "自右向左" if cfg.hengpi_rtl else "自左向右"
    x0 = MARGIN_MM * mm
    c.setFillColor(RED)
    c.setFont("CoupletKai", 22)
    c.drawString(x0, page_h - 30 * mm, "春联张贴说明")
    c.setFillColor("#222222")
    c.setFont("CoupletKai", 12)
    paragraphs = [f"上联：{upper}　　下联：{lower}　　横批：{hengpi}",
                  f"横批{direction}读，故上联贴在门的{up_side}侧（面向大门时），下联贴在{low_side}侧，横批贴在门楣正中。",
                  "上联末字多为仄声，下联末字多为平声；贴反了，读来便不顺。",
                  "打印：选「实际大小 / 100%」，不要「适合页面」。",
                  "裁切：沿四角的裁切线裁去白边。长联分张打印，按「第 1 张、第 2 张……」自上而下（横批按读序）拼接，"
                  "接缝对齐，背面用胶带粘牢。",
                  "福字斗方贴在门心，可正贴。"]
    from reportlab.pdfbase.pdfmetrics import stringWidth

    width, y = page_w - 2 * x0, page_h - 44 * mm
    for paragraph in paragraphs:  # lines break after punctuation (wrap_cjk), a paragraph's lines close together
        for line in wrap_cjk(paragraph, lambda t: stringWidth(t, "CoupletKai", 12) <= width):
            c.drawString(x0, y, line)
            y -= 6.5 * mm
        y -= 1.5 * mm
    # the door, seen from the street: lintel with the 横批, the 上联 and 下联 on their sides, 福 in between
    dw, dh = 90 * mm, 120 * mm
    dx, dy = (page_w - dw) / 2, 40 * mm
    c.setStrokeColor("#8B5A2B")
    c.setLineWidth(1.2)
    c.rect(dx, dy, dw, dh)
    c.line(dx + dw / 2, dy, dx + dw / 2, dy + dh)
    strip_w, cell = 14 * mm, (dh - 10 * mm) / len(upper)
    sides = {"右": dx + dw + 4 * mm, "左": dx - 4 * mm - strip_w}
    for text, side in ((upper, up_side), (lower, low_side)):
        sx = sides[side]
        c.setFillColor(RED)
        c.rect(sx, dy, strip_w, dh - 4 * mm, stroke=0, fill=1)
        centres = [(sx + strip_w / 2, dy + dh - 4 * mm - 5 * mm - (i + 0.5) * cell) for i in range(len(text))]
        _draw_chars(c, text, centres, min(cell, strip_w) * 0.7, INKS["black"])
    cells = hengpi[::-1] if cfg.hengpi_rtl else hengpi
    hw = len(cells) * 16 * mm + 8 * mm
    hx, hy = (page_w - hw) / 2, dy + dh + 6 * mm
    c.setFillColor(RED)
    c.rect(hx, hy, hw, 16 * mm, stroke=0, fill=1)
    _draw_chars(c, cells, [(hx + 4 * mm + (i + 0.5) * 16 * mm, hy + 8 * mm) for i in range(len(cells))], 11 * mm,
                INKS["black"])
    c.setFillColor("#444444")
    c.setFont("CoupletKai", 9)
    c.drawCentredString(page_w / 2, hy + 18 * mm, f"横批{direction}读")
    # the 福 diamond on the door's middle
    c.saveState()
    c.translate(dx + dw / 2, dy + dh * 0.62)
    c.rotate(45)
    c.setFillColor(RED)
    c.rect(-9 * mm, -9 * mm, 18 * mm, 18 * mm, stroke=0, fill=1)
    c.restoreState()
    _draw_chars(c, "福", [(dx + dw / 2, dy + dh * 0.62)], 14 * mm, INKS["black"])
    # the strips' names under them, small (after the 福 the font is 14 mm: set it again)
    c.setFillColor("#444444")
    c.setFont("CoupletKai", 11)
    for name, side in (("上联", up_side), ("下联", low_side)):
        c.drawCentredString(sides[side] + strip_w / 2, dy - 7 * mm, name)


def write_pdf(path: Path, upper: str, lower: str, hengpi: str, cfg: PrintConfig) -> int:
    """The whole set as one PDF; returns its page count."""
    from reportlab.lib.units import mm
    from reportlab.pdfbase import pdfmetrics
    from reportlab.pdfbase.ttfonts import TTFont
    from reportlab.pdfgen import canvas

    if "CoupletKai" not in pdfmetrics.getRegisteredFontNames():
        pdfmetrics.registerFont(TTFont("CoupletKai", str(font_ttf())))
    portrait = (PAPERS_MM[cfg.paper][0] * mm, PAPERS_MM[cfg.paper][1] * mm)
    cell = CELL_MM[cfg.paper] * mm
    # the brush font from the first page on: reportlab's default, Helvetica, would be named on every page
    # without being embedded
    c = canvas.Canvas(str(path), pagesize=portrait, pageCompression=1, initialFontName="CoupletKai",
                      initialFontSize=12, lang="zh-CN")
    c.setTitle(f"春联 · {upper} / {lower} · {hengpi}")
    c.setAuthor("开门见喜 · 春联生成终端")
    c.setSubject(f"{cfg.paper}，{'金' if cfg.ink == 'gold' else '墨'}字")
    _guide_page(c, upper, lower, hengpi, cfg, *portrait, mm)
    pages = 1
    ink = INKS[cfg.ink]
    for piece in pieces(upper, lower, hengpi, cfg):
        c.showPage()
        if piece.diamond:
            page_w, page_h = portrait
            c.setPageSize(portrait)
            avail = min(page_w, page_h - HEADER_MM * mm) - 2 * MARGIN_MM * mm
            side = avail / math.sqrt(2) * 0.96
            cx, cy = page_w / 2, (page_h - HEADER_MM * mm) / 2
            _header(c, f"{piece.title} · 沿边裁下", page_w, page_h, mm)
            c.saveState()
            c.translate(cx, cy)
            c.rotate(45)
            c.setFillColor(RED)
            c.rect(-side / 2, -side / 2, side, side, stroke=0, fill=1)
            c.setStrokeColor(BORDER)
            c.setLineWidth(1.5)
            c.rect(-side * 0.45, -side * 0.45, side * 0.9, side * 0.9, stroke=1, fill=0)
            c.restoreState()
            half = side / math.sqrt(2)
            _cut_marks(c, cx - half, cy - half, 2 * half, 2 * half, mm)
            _draw_chars(c, "福", [(cx, cy)], side * GLYPH * 0.86, ink)
            pages += 1
            continue
        page_w, page_h = portrait if piece.vertical else (portrait[1], portrait[0])
        c.setPageSize((page_w, page_h))
        room = (page_h - HEADER_MM * mm if piece.vertical else page_w) - 2 * MARGIN_MM * mm
        parts = tiles(len(piece.cells), int((room - 2 * PAD * cell) // cell))
        across = strip_size(1)[1] * cell
        for k, part in enumerate(parts):
            if k:
                c.showPage()
                c.setPageSize((page_w, page_h))
            first, last = k == 0, k == len(parts) - 1
            length = len(part) * cell + (PAD * cell if first else 0) + (PAD * cell if last else 0)
            lead = PAD * cell if first else 0
            tag = f" · 第 {k + 1}/{len(parts)} 张" if len(parts) > 1 else ""
            join = f"，下接第 {k + 2} 张" if not last else ""
            _header(c, f"{piece.title}{tag}{join} · 沿角线裁切", page_w, page_h, mm)
            if piece.vertical:  # x across, y along (downwards from the top of the strip)
                w, h = across, length
                x, y = (page_w - w) / 2, (page_h - HEADER_MM * mm - h) / 2
                centres = [(x + w / 2, y + h - lead - (i + 0.5) * cell) for i in range(len(part))]
            else:
                w, h = length, across
                x, y = (page_w - w) / 2, (page_h - HEADER_MM * mm - h) / 2
                centres = [(x + lead + (i + 0.5) * cell, y + h / 2) for i in range(len(part))]
            c.setFillColor(RED)
            c.rect(x, y, w, h, stroke=0, fill=1)
            # the gold rule inside the edge: open where this sheet joins the next or the previous one
            inset, over = PAD * cell * 0.35, cell
            before, after = (0 if first else over), (0 if last else over)
            c.saveState()
            clip = c.beginPath()
            clip.rect(x, y, w, h)
            c.clipPath(clip, stroke=0, fill=0)
            c.setStrokeColor(BORDER)
            c.setLineWidth(1.2)
            if piece.vertical:  # the strip runs downwards: "before" is above
                c.rect(x + inset, y + inset - after, w - 2 * inset, h - 2 * inset + before + after)
            else:
                c.rect(x + inset - before, y + inset, w - 2 * inset + before + after, h - 2 * inset)
            c.restoreState()
            _cut_marks(c, x, y, w, h, mm)
            _draw_chars(c, "".join(piece.cells[i] for i in part), centres, GLYPH * cell, ink)
            pages += 1
    c.save()
    return pages


# --- the set --------------------------------------------------------------------------------------------
