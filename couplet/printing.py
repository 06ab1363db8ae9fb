"""The printable 春联: 上联 and 下联 as vertical strips, the 横批 as a horizontal strip and a 福 diamond (斗方),
red paper with brush lettering in the shipped CoupletKai font — one PDF for home printing (A4 or A3, one
piece per page, long strips tiled across pages, with cut marks), and a PNG and an SVG of each piece.

    python -m couplet.printing 天增岁月人增寿 春满乾坤福满门 万象更新 --out set/ [--paper A3] [--ink gold]

Libraries, and why:
- reportlab writes the PDF. It embeds the TrueType font (subset) with a ToUnicode map, so the sheets stay
  text: `pdftotext`/`pypdf` read the couplet back, and a print shop's preflight finds the font embedded.
  cairosvg was the other candidate; it needs the system cairo library and draws text as outlines only.
- fontTools turns the shipped woff2 into the TrueType file reportlab and Pillow read (once, cached on disk),
  and gives each glyph's outline and ink box: the SVGs draw the glyphs as paths, which every viewer, editor
  and print shop renders the same (an SVG `@font-face` with a woff2 is honoured by browsers only), and all
  three formats centre a character by its ink, not its em box.
- Pillow draws the PNGs.

Hanging convention (张贴): the 横批 is read in the direction the couplet is hung. Read right to left, as
traditionally written, the 上联 goes on the right of the door (as one faces it) and the 下联 on the left;
read left to right, the modern page direction, the 上联 goes on the left. The set follows
`PrintConfig.hengpi_rtl` (default: the traditional right-to-left 横批, so 上联 on the right — as on the gate),
lays the 横批's characters out accordingly, and says so on its first sheet.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import sys
import tempfile
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from couplet.gate import FONT_PATH
from couplet.text import CoupletInputError, fold_han

RED = "#C8161D"  # 中国红 paper
INKS = {"black": "#1A1A1A", "gold": "#E8B730"}
BORDER = "#E8B730"  # the gold rule inside the paper's edge
PAPERS_MM = {"A4": (210.0, 297.0), "A3": (297.0, 420.0)}
CELL_MM = {"A4": 55.0, "A3": 85.0}  # one character's square: a 7-character strip spans two sheets
PAD = 0.22  # paper margin around the characters, in cells
GLYPH = 0.8  # character size, in cells
MARGIN_MM = 12.0  # unprintable edge of a home printer, and room for the cut marks
HEADER_MM = 12.0  # the line of small print at the top of each sheet
LINE_LENGTHS = range(3, 12)  # 上联/下联 characters a printed couplet may have
HENGPI_LENGTHS = range(2, 9)
FILE_STEMS = {"upper": "shanglian", "lower": "xialian", "hengpi": "hengpi", "fu": "fu"}


@dataclass(frozen=True)
class PrintConfig:
    paper: str = "A4"  # A4 or A3
    ink: str = "black"  # black or gold
    fu: bool = True  # add the 福 diamond
    hengpi_rtl: bool = True  # the 横批 read right to left (traditional): 上联 on the right
    png_cell_px: int = 200  # PNG resolution: pixels per character

    def __post_init__(self) -> None:
        if self.paper not in PAPERS_MM:
            raise CoupletInputError(f"纸张只能是 A4 或 A3，收到「{self.paper}」。 (Paper must be A4 or A3.)")
        if self.ink not in INKS:
            raise CoupletInputError(f"字色只能是 black（墨黑）或 gold（金色），收到「{self.ink}」。 "
                                    "(Ink: black or gold.)")
        if not 50 <= self.png_cell_px <= 1000:
            raise CoupletInputError(f"PNG 每字像素须在 50–1000 之间，收到 {self.png_cell_px}。")


@dataclass(frozen=True)
class Piece:
    """One piece of paper. `cells` are its characters in layout order: top to bottom, or left to right."""

    key: str  # upper | lower | hengpi | fu
    title: str  # 上联 …, printed on its sheets
    text: str  # reading order
    cells: str
    vertical: bool
    diamond: bool = False

    @property
    def stem(self) -> str:
        return FILE_STEMS[self.key]


def door_sides(rtl: bool) -> tuple[str, str]:
    """Where the 上联 and the 下联 hang, as one faces the door."""
    return ("右", "左") if rtl else ("左", "右")


def pieces(upper: str, lower: str, hengpi: str, cfg: PrintConfig) -> list[Piece]:
    up_side, low_side = door_sides(cfg.hengpi_rtl)
    direction = "自右向左读" if cfg.hengpi_rtl else "自左向右读"
    out = [Piece("upper", f"上联 · 贴门{up_side}侧", upper, upper, True),
           Piece("lower", f"下联 · 贴门{low_side}侧", lower, lower, True),
           Piece("hengpi", f"横批 · {direction} · 贴门楣正中", hengpi, hengpi[::-1] if cfg.hengpi_rtl else hengpi,
                 False)]
    if cfg.fu:
        out.append(Piece("fu", "福 · 斗方 · 贴门心", "福", "福", False, diamond=True))
    return out


# --- the font -----------------------------------------------------------------------------------------


@lru_cache(maxsize=1)
def font_ttf() -> Path:
    """The shipped woff2 as a TrueType file: decompressing it takes seconds, so it is done once per font
    version and kept in the temp directory (keyed by the woff2's hash)."""
    digest = hashlib.sha256(FONT_PATH.read_bytes()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / "couplet-fonts" / f"CoupletKai-{digest}.ttf"
    if not path.exists():
        from fontTools.ttLib import TTFont

        font = TTFont(FONT_PATH)
        font.flavor = None
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{time.time_ns()}.tmp")
        font.save(tmp)
        tmp.replace(path)  # atomic: two processes may race to write it
    return path


@dataclass
class Glyphs:
    """Outlines and ink boxes of the characters, in font units (y up), from the TrueType file."""

    upem: int
    cmap: dict[int, str]
    glyph_set: object
    _cache: dict[str, tuple[str, tuple[float, float, float, float]]] = field(default_factory=dict)

    def has(self, ch: str) -> bool:
        return ord(ch) in self.cmap

    def outline(self, ch: str) -> tuple[str, tuple[float, float, float, float]]:
        """(SVG path data, ink box (x0, y0, x1, y1)) of a character."""
        if ch not in self._cache:
            from fontTools.pens.boundsPen import BoundsPen
            from fontTools.pens.svgPathPen import SVGPathPen

            glyph = self.glyph_set[self.cmap[ord(ch)]]  # type: ignore[index]
            pen, bounds = SVGPathPen(self.glyph_set), BoundsPen(self.glyph_set)
            glyph.draw(pen)
            glyph.draw(bounds)
            self._cache[ch] = (pen.getCommands(), bounds.bounds or (0, 0, self.upem, self.upem))
        return self._cache[ch]

    def ink_centre(self, ch: str) -> tuple[float, float]:
        x0, y0, x1, y1 = self.outline(ch)[1]
        return (x0 + x1) / 2, (y0 + y1) / 2


@lru_cache(maxsize=1)
def glyphs() -> Glyphs:
    from fontTools.ttLib import TTFont

    font = TTFont(font_ttf())
    return Glyphs(font["head"].unitsPerEm, font.getBestCmap(), font.getGlyphSet())


# --- validation -----------------------------------------------------------------------------------------


def normalize_print(upper: str, lower: str, hengpi: str) -> tuple[str, str, str]:
    """The three texts folded like keywords (NFKC, traditional → simplified, Han only), or a clear refusal."""
    parts = []
    for name, raw, lengths in (("上联", upper, LINE_LENGTHS), ("下联", lower, LINE_LENGTHS),
                               ("横批", hengpi, HENGPI_LENGTHS)):
        han = fold_han(raw or "")
        if not han:
            raise CoupletInputError(f"{name}里没有汉字：请先写好春联，再下载。 (The {name} has no Chinese characters.)")
        if len(han) not in lengths:
            raise CoupletInputError(f"{name}须为 {lengths.start}–{lengths.stop - 1} 个汉字，收到 {len(han)} 个。 "
                                    f"(The {name} must have {lengths.start}-{lengths.stop - 1} characters.)")
        parts.append(han)
    if len(parts[0]) != len(parts[1]):
        raise CoupletInputError(f"上下联字数须相同：上联 {len(parts[0])} 字，下联 {len(parts[1])} 字。 "
                                "(Both lines must have the same length.)")
    missing = "".join(dict.fromkeys(c for c in "".join(parts) if not glyphs().has(c)))
    if missing:
        raise CoupletInputError(f"字库里没有「{missing}」，无法印出。 (The font lacks {missing}.)")
    return parts[0], parts[1], parts[2]


# --- the layout, shared by the three formats (units: cells) ---------------------------------------------


def strip_size(n: int) -> tuple[float, float]:
    """(along, across) of a strip of n characters, in cells."""
    return n + 2 * PAD, 1 + 2 * PAD


def char_centres(n: int) -> list[float]:
    """Centre of each character along the strip, in cells from its start."""
    return [PAD + i + 0.5 for i in range(n)]


def tiles(n: int, fits: int) -> list[range]:
    """Split n characters into as few pages as hold `fits` each, balanced (7 over 4 a page: 4 + 3)."""
    count = math.ceil(n / max(1, fits))
    sizes = [n // count + (i < n % count) for i in range(count)]
    starts = [sum(sizes[:i]) for i in range(count)]
    return [range(a, a + k) for a, k in zip(starts, sizes, strict=True)]


# --- SVG and PNG: one file per piece --------------------------------------------------------------------

FU_SIDE = 2.2  # the 福 diamond's side, in cells
FU_GLYPH = 1.9  # the 福 fills its diamond: its size against a strip character's


@dataclass(frozen=True)
class Layout:
    """A piece drawn whole, in the caller's units: its size, each character's centre, the glyph size."""

    width: float
    height: float
    centres: list[tuple[float, float]]
    glyph: float


def layout(piece: Piece, unit: float, snap=lambda v: v) -> Layout:
    """The piece at `unit` per cell; `snap` rounds its outer size (to whole pixels for a PNG)."""
    if piece.diamond:
        size = snap(FU_SIDE * unit * math.sqrt(2))
        return Layout(size, size, [(size / 2, size / 2)], GLYPH * unit * FU_GLYPH)
    along, across = (snap(v * unit) for v in strip_size(len(piece.cells)))
    w, h = (across, along) if piece.vertical else (along, across)
    mid = across / 2
    centres = [((mid, t * unit) if piece.vertical else (t * unit, mid)) for t in char_centres(len(piece.cells))]
    return Layout(w, h, centres, GLYPH * unit)


def piece_svg(piece: Piece, cfg: PrintConfig) -> str:
    """The piece at print size (width/height in mm; 1 cell = 100 user units), glyphs as paths."""
    from html import escape

    g, ink, unit = glyphs(), INKS[cfg.ink], 100.0
    box = layout(piece, unit)
    w, h, scale = box.width, box.height, box.glyph / g.upem
    if piece.diamond:
        side, c = unit * FU_SIDE, w / 2
        paper = (f'<rect x="{c - side / 2:.1f}" y="{c - side / 2:.1f}" width="{side:.1f}" height="{side:.1f}" '
                 f'fill="{RED}" transform="rotate(45 {c:.1f} {c:.1f})"/>'
                 f'<rect x="{c - side * 0.45:.1f}" y="{c - side * 0.45:.1f}" width="{side * 0.9:.1f}" '
                 f'height="{side * 0.9:.1f}" fill="none" stroke="{BORDER}" stroke-width="3" '
                 f'transform="rotate(45 {c:.1f} {c:.1f})"/>')
    else:
        inset = PAD * unit * 0.35
        paper = (f'<rect width="{w:.1f}" height="{h:.1f}" fill="{RED}"/>'
                 f'<rect x="{inset:.1f}" y="{inset:.1f}" width="{w - 2 * inset:.1f}" height="{h - 2 * inset:.1f}" '
                 f'fill="none" stroke="{BORDER}" stroke-width="2"/>')
    body = []
    for ch, (cx, cy) in zip(piece.cells, box.centres, strict=True):
        d, _ = g.outline(ch)
        ix, iy = g.ink_centre(ch)
        body.append(f'<path d="{d}" transform="translate({cx - ix * scale:.2f} {cy + iy * scale:.2f}) '
                    f'scale({scale:.5f} {-scale:.5f})"/>')
    mm = CELL_MM[cfg.paper] / unit
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{w * mm:.1f}mm" height="{h * mm:.1f}mm" '
            f'viewBox="0 0 {w:.1f} {h:.1f}" role="img" aria-label="{escape(piece.text)}">'
            f'<title>{escape(piece.title)}：{escape(piece.text)}</title>{paper}'
            f'<g fill="{ink}">{"".join(body)}</g></svg>\n')


def piece_png(piece: Piece, cfg: PrintConfig, path: Path) -> tuple[int, int]:
    """Draw the piece with Pillow at `png_cell_px` per character; returns (width, height)."""
    from PIL import Image, ImageDraw, ImageFont

    g, px = glyphs(), cfg.png_cell_px
    box = layout(piece, px, snap=round)
    w, h = int(box.width), int(box.height)
    if piece.diamond:
        size = w
        img = Image.new("RGB", (size, size), "white")
        draw = ImageDraw.Draw(img)
        c = size / 2
        draw.polygon([(c, 0), (size - 1, c), (c, size - 1), (0, c)], fill=RED)
        r = c * 0.9
        draw.polygon([(c, c - r), (c + r, c), (c, c + r), (c - r, c)], outline=BORDER, width=max(2, px // 60))
    else:
        img = Image.new("RGB", (w, h), RED)
        draw = ImageDraw.Draw(img)
        inset = round(PAD * px * 0.35)
        draw.rectangle([inset, inset, w - 1 - inset, h - 1 - inset], outline=BORDER, width=max(2, px // 100))
    font = ImageFont.truetype(str(font_ttf()), round(box.glyph))
    scale = round(box.glyph) / g.upem
    for ch, (cx, cy) in zip(piece.cells, box.centres, strict=True):
        ix, iy = g.ink_centre(ch)
        draw.text((cx - ix * scale, cy + iy * scale), ch, font=font, fill=INKS[cfg.ink], anchor="ls")
    img.save(path, optimize=True)
    return img.size


# --- PDF: every piece at print size, tiled over sheets ----------------------------------------------------


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
    lines = [f"上联：{upper}　　下联：{lower}　　横批：{hengpi}",
             f"横批{direction}读，故上联贴在门的{up_side}侧（面向大门时），下联贴在{low_side}侧，横批贴在门楣正中。",
             "上联末字多为仄声，下联末字多为平声；贴反了，读来便不顺。",
             "打印：选「实际大小 / 100%」，不要「适合页面」。",
             "裁切：沿四角的裁切线裁去白边。长联分张打印，按「第 1 张、第 2 张……」自上而下（横批按读序）拼接，",
             "接缝对齐，背面用胶带粘牢。福字斗方贴在门心，可正贴。"]
    from reportlab.pdfbase.pdfmetrics import stringWidth

    width, y = page_w - 2 * x0, page_h - 44 * mm
    for line in lines:  # wrapped by width: Chinese breaks between any two characters
        while line:
            cut = next((k for k in range(1, len(line) + 1) if stringWidth(line[:k], "CoupletKai", 12) > width),
                       len(line) + 1) - 1
            c.drawString(x0, y, line[:cut])
            line, y = line[cut:], y - 7 * mm
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
    c.drawCentredString(sides[up_side] + strip_w / 2, dy - 6 * mm, "上联")
    c.drawCentredString(sides[low_side] + strip_w / 2, dy - 6 * mm, "下联")


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
    c = canvas.Canvas(str(path), pagesize=portrait, pageCompression=1)
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


@dataclass(frozen=True)
class PrintSet:
    upper: str
    lower: str
    hengpi: str
    pdf: Path
    pngs: dict[str, Path]
    svgs: dict[str, Path]
    png_sizes: dict[str, tuple[int, int]]
    pages: int
    seconds: float

    @property
    def files(self) -> list[Path]:
        """The PDF first, then the PNGs and SVGs in piece order."""
        return [self.pdf, *self.pngs.values(), *self.svgs.values()]


def print_set(upper: str, lower: str, hengpi: str, cfg: PrintConfig = PrintConfig(),
              out_dir: Path | None = None) -> PrintSet:
    """Validate the texts and write the set into `out_dir` (a fresh temporary folder by default)."""
    t0 = time.perf_counter()
    upper, lower, hengpi = normalize_print(upper, lower, hengpi)
    out = Path(out_dir) if out_dir is not None else Path(tempfile.mkdtemp(prefix="chunlian-"))
    out.mkdir(parents=True, exist_ok=True)
    pdf = out / "chunlian.pdf"
    pages = write_pdf(pdf, upper, lower, hengpi, cfg)
    pngs, svgs, sizes = {}, {}, {}
    for piece in pieces(upper, lower, hengpi, cfg):
        pngs[piece.key] = out / f"{piece.stem}.png"
        sizes[piece.key] = piece_png(piece, cfg, pngs[piece.key])
        svgs[piece.key] = out / f"{piece.stem}.svg"
        svgs[piece.key].write_text(piece_svg(piece, cfg), encoding="utf-8")
    return PrintSet(upper, lower, hengpi, pdf, pngs, svgs, sizes, pages, time.perf_counter() - t0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m couplet.printing", description="A printable 春联 set: PDF, PNG, SVG")
    p.add_argument("upper")
    p.add_argument("lower")
    p.add_argument("hengpi")
    p.add_argument("--out", default="chunlian", help="output folder")
    p.add_argument("--paper", default="A4", choices=sorted(PAPERS_MM))
    p.add_argument("--ink", default="black", choices=sorted(INKS))
    p.add_argument("--no-fu", action="store_true", help="no 福 diamond")
    p.add_argument("--ltr", action="store_true", help="横批 read left to right (上联 then hangs on the left)")
    args = p.parse_args(argv)
    try:
        result = print_set(args.upper, args.lower, args.hengpi,
                           PrintConfig(args.paper, args.ink, not args.no_fu, not args.ltr), Path(args.out))
    except CoupletInputError as e:
        print(f"错误 error: {e}", file=sys.stderr)
        return 2
    for f in result.files:
        print(f"{f}  {f.stat().st_size:,} bytes")
    print(f"{result.pages} pages, {result.seconds:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
