"""The printable set's pieces and their geometry, shared by the PDF (`print_pdf`) and the PNG/SVG pieces
(`printing`): paper, ink and cell sizes, the pieces of a set in hanging order, the font (the shipped woff2
turned into TrueType once, cached on disk) and its glyphs' outlines and ink boxes, and where each character
sits on a strip, tiled over sheets."""

from __future__ import annotations

import hashlib
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from couplet.page.gate import FONT_PATH
from couplet.writing.text import CoupletInputError, fold_han

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


BREAK_AFTER = "，。；：、！？）」　"  # a guide-sheet line may end after these
NO_LINE_START = "，。；：、！？）」"  # and none of these may start a line (禁则)


def wrap_cjk(text: str, fits: Callable[[str], bool]) -> list[str]:
    """`text` cut into lines that each `fits`, breaking after punctuation (or a full-width space) where one
    falls in the second half of the line, else between characters, never before a closing mark. A word
    processor's rule for Chinese; reportlab's own wrapping (Paragraph) splits CJK anywhere."""
    lines: list[str] = []
    while text:
        if fits(text):
            lines.append(text)
            break
        k = max(1, next(k for k in range(1, len(text) + 1) if not fits(text[:k])) - 1)  # the most that fits
        cut = next((i + 1 for i in range(k - 1, k // 2 - 1, -1) if text[i] in BREAK_AFTER), k)
        while cut > 1 and text[cut] in NO_LINE_START:  # a closing mark stays with the character before it
            cut -= 1
        lines.append(text[:cut].rstrip("　"))
        text = text[cut:].lstrip("　")
    return lines


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
