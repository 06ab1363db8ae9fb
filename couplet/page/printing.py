"""The printable 春联: 上联 and 下联 as vertical strips, the 横批 as a horizontal strip and a 福 diamond (斗方),
red paper with brush lettering in the shipped CoupletKai font — one PDF for home printing (A4 or A3, one
piece per page, long strips tiled across pages, with cut marks), and a PNG and an SVG of each piece.

    python -m couplet.page.printing 天增岁月人增寿 春满乾坤福满门 万象更新 --out set/ [--paper A3] [--ink gold]

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
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from couplet.page.print_layout import (
    BORDER,
    CELL_MM,
    FU_SIDE,
    INKS,
    PAD,
    PAPERS_MM,
    RED,
    Piece,
    PrintConfig,
    door_sides,
    font_ttf,
    glyphs,
    layout,
    normalize_print,
    pieces,
    tiles,
)
from couplet.page.print_pdf import write_pdf
from couplet.writing.text import CoupletInputError

DEFAULT_PRINT = PrintConfig()  # A4, black ink, the 福, the traditional right-to-left 横批

# the geometry lives in print_layout, the PDF in print_pdf; callers import the set's names here
__all__ = ["CELL_MM", "PAD", "PAPERS_MM", "PrintConfig", "PrintSet", "door_sides", "glyphs", "main", "piece_png",
           "piece_svg", "print_set", "tiles"]

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


def print_set(upper: str, lower: str, hengpi: str, cfg: PrintConfig = DEFAULT_PRINT,
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
    p = argparse.ArgumentParser(prog="python -m couplet.page.printing",
                                description="A printable 春联 set: PDF, PNG, SVG")
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
