"""Subset Debian's LXGW WenKai to the characters this project can show, as a web font in `assets/fonts/`.

    python scripts/subset_font.py            # writes assets/fonts/lxgw-wenkai-subset.woff2, OFL.txt, README.md
    python scripts/subset_font.py --check    # exit 1 if the shipped subset misses a character it should hold

It also draws the ornaments whose characters are brush glyphs (`assets/fu.svg`, `assets/lantern.svg`):
the glyphs are outlines from LXGW WenKai Bold turned into SVG paths, so they need no font at all.

The page may run on a machine with no CJK font at all, so every character it can display must be in
the shipped font: the model's vocabulary (`assets/model/tokenizer.json`; until the first checkpoint
exists, the 横批 phrases plus GB2312 level 1 as a placeholder), every Han character in the sources
(UI labels), ASCII and common CJK punctuation. Re-run after the vocabulary or the UI text changes;
the output is byte-for-byte reproducible, and an unchanged font is not rewritten.

The subset is a Modified Version under the SIL OFL 1.1, and "LXGW"/"霞鹜" are Reserved Font Names, so
the subset's internal family name is changed to "CoupletKai"; the copyright and licence names stay.
"""

from __future__ import annotations

import argparse
import io
import json
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

from fontTools import subset
from fontTools.pens.boundsPen import BoundsPen
from fontTools.pens.svgPathPen import SVGPathPen
from fontTools.ttLib import TTFont
from fontTools.ttLib.scaleUpem import scale_upem

ROOT = Path(__file__).resolve().parent.parent
FONT_DIRS = (Path("/usr/share/fonts"), Path("/usr/local/share/fonts"))
# Regular is the most brush-like weight that still reads well small; Bold blots at 14 px.
FONT_FILE = "LXGWWenKai-Regular.ttf"
ORNAMENT_FONT_FILE = "LXGWWenKai-Bold.ttf"  # big ornament glyphs want the heavier brush
COPYRIGHT_FILE = Path("/usr/share/doc/fonts-lxgw-wenkai/copyright")
# 1000 → 400 units per em: outlines keep 1/400 em precision (0.2 px at 80 px, invisible) and the woff2
# shrinks by ~13% (7,000 characters: 1.73 → 1.50 MiB).
UNITS_PER_EM = 400
FAMILY = "CoupletKai"  # the subset's own name: OFL Reserved Font Names may not be used by modified versions
HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0003134f]")
PUNCTUATION = "，。：；！？「」『』《》〈〉·—…、（）【】〔〕“”‘’～　"
FULLWIDTH_DIGITS = "０１２３４５６７８９"
# Where UI text lives; scanned for Han characters so labels render without a system CJK font.
SOURCE_GLOBS = ("couplet/*.py", "couplet/**/*.py", "app.py", "assets/*.css", "assets/*.svg")


@dataclass
class SubsetConfig:
    font: Path | None = None  # None: look for FONT_FILE under FONT_DIRS
    vocab: Path = ROOT / "assets/model/tokenizer.json"
    out_dir: Path = ROOT / "assets/fonts"
    out_name: str = "lxgw-wenkai-subset.woff2"
    extra_globs: tuple[str, ...] = field(default=SOURCE_GLOBS)


def find_font(name: str = FONT_FILE) -> Path:
    for base in FONT_DIRS:
        hits = sorted(base.rglob(name)) if base.is_dir() else []
        if hits:
            return hits[0]
    raise FileNotFoundError(f"{name} not found under {', '.join(map(str, FONT_DIRS))}; "
                            "install Debian's fonts-lxgw-wenkai (apt-get install fonts-lxgw-wenkai)")


def vocab_chars(path: Path) -> set[str] | None:
    """Characters of a `tokenizers` WordLevel vocabulary (single-character tokens); None if no file yet."""
    if not path.is_file():
        return None
    vocab = json.loads(path.read_text(encoding="utf-8"))["model"]["vocab"]
    return {tok for tok in vocab if len(tok) == 1 and not tok.isspace()}


def placeholder_chars() -> set[str]:
    """GB2312 level 1 (the 3,755 most common characters): stands in for the vocabulary until it exists."""
    chars = set()
    for hi in range(0xB0, 0xD8):
        for lo in range(0xA1, 0xFF):
            try:
                chars.add(bytes((hi, lo)).decode("gb2312"))
            except UnicodeDecodeError:
                pass
    return chars


def source_chars(globs: tuple[str, ...], root: Path = ROOT) -> set[str]:
    chars: set[str] = set()
    for pattern in globs:
        for path in root.glob(pattern):
            if path.is_file():
                chars |= set(HAN.findall(path.read_text(encoding="utf-8", errors="ignore")))
    return chars


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def wanted_chars(cfg: SubsetConfig) -> tuple[set[str], str]:
    """The characters to keep, and a note saying where the model's characters came from."""
    sys.path.insert(0, str(ROOT))
    from couplet.writing.phrases import HENGPI_PHRASES

    chars = {chr(c) for c in range(0x20, 0x7F)} | set(PUNCTUATION) | set(FULLWIDTH_DIGITS)
    chars |= set("".join(HENGPI_PHRASES)) | source_chars(cfg.extra_globs)
    vocab = vocab_chars(cfg.vocab)
    if vocab is None:
        chars |= placeholder_chars()
        note = f"a placeholder (GB2312 level 1): {_rel(cfg.vocab)} does not exist yet"
    else:
        chars |= vocab
        note = f"the model vocabulary ({len(vocab)} characters from {_rel(cfg.vocab)})"
    return chars, note


def rename(font: TTFont, family: str) -> None:
    """Replace the Reserved Font Names in the family/full/PostScript names; keep copyright and licence."""
    name = font["name"]
    version = name.getDebugName(5) or ""
    for rec in list(name.names):
        if rec.nameID in (1, 4, 16):
            rec.string = family
        elif rec.nameID == 3:
            rec.string = f"{family}:{version}"
        elif rec.nameID == 6:
            rec.string = family
        elif rec.nameID == 17:
            rec.string = "Regular"


def build(cfg: SubsetConfig) -> tuple[bytes, set[str], str, str]:
    """Returns (woff2 bytes, characters the source font lacks, version string, source note)."""
    src = cfg.font or find_font()
    chars, note = wanted_chars(cfg)
    font = TTFont(src, recalcTimestamp=False)  # keep head.modified: reproducible bytes
    cmap = font.getBestCmap()
    missing = {c for c in chars if ord(c) not in cmap}
    options = subset.Options()
    options.flavor = "woff2"
    options.hinting = False  # browsers ignore TrueType hints for CJK at these sizes; saves ~15%
    options.layout_features = ["vert", "vrt2", "vkna", "vrtr", "ccmp", "locl", "kern", "calt", "liga"]
    options.name_IDs = [0, 1, 2, 3, 4, 5, 6, 13, 14]  # copyright, names, version, licence
    options.name_languages = [0x409]
    options.notdef_outline = True
    options.recalc_timestamp = False
    subsetter = subset.Subsetter(options)
    subsetter.populate(unicodes=sorted(ord(c) for c in chars if ord(c) in cmap))
    subsetter.subset(font)
    scale_upem(font, UNITS_PER_EM)
    rename(font, FAMILY)
    buf = io.BytesIO()
    font.flavor = "woff2"
    font.save(buf, reorderTables=True)
    version = (font["name"].getDebugName(5) or "").split(";")[0]
    return buf.getvalue(), missing, version, note


def ofl_text() -> str:
    """The SIL OFL 1.1 text from Debian's copyright file (debian/control paragraph format undone)."""
    text = COPYRIGHT_FILE.read_text(encoding="utf-8")
    block = text.split("License: OFL-1.1\n", 2)[-1]  # the last one is the stand-alone licence paragraph
    lines = []
    for line in block.splitlines():
        if line and not line.startswith(" "):
            break
        line = line[1:] if line.startswith(" ") else line
        lines.append("" if line == "." else line)
    return "\n".join(lines).strip() + "\n"


def glyph_path(font: TTFont, char: str, size: float, cx: float = 0, cy: float = 0) -> str:
    """An SVG <path> of `char`'s outline, scaled so its larger side is `size`, centred on (cx, cy).

    Font units are y-up; the transform flips them into SVG's y-down space.
    """
    glyphs = font.getGlyphSet()
    name = font.getBestCmap()[ord(char)]
    pen, bounds = SVGPathPen(glyphs, ntos=lambda v: f"{v:g}"), BoundsPen(glyphs)
    glyphs[name].draw(pen)
    glyphs[name].draw(bounds)
    x0, y0, x1, y1 = bounds.bounds
    k = size / max(x1 - x0, y1 - y0)
    mx, my = (x0 + x1) / 2, (y0 + y1) / 2
    return (f'<path transform="translate({cx:g} {cy:g}) scale({k:.5f} {-k:.5f}) translate({-mx:g} {-my:g})" '
            f'd="{pen.getCommands()}"/>')


FU_SVG = """<svg xmlns="http://www.w3.org/2000/svg" viewBox="-100 -100 200 200" role="img" aria-label="福">
  <!-- 福 on a diamond of red paper (斗方). The glyph is LXGW WenKai Bold's outline (SIL OFL 1.1, see
       assets/fonts/OFL.txt), drawn by scripts/subset_font.py; upright, as on a main gate. -->
  <defs>
    <linearGradient id="fu-paper" x1="0" y1="0" x2="1" y2="1">
      <stop offset="0" stop-color="#e0342a"/><stop offset="0.55" stop-color="#c41e1e"/>
      <stop offset="1" stop-color="#99121a"/>
    </linearGradient>
    <linearGradient id="fu-gold" x1="0" y1="0" x2="0.6" y2="1">
      <stop offset="0" stop-color="#fff4c2"/><stop offset="0.35" stop-color="#f0cd6a"/>
      <stop offset="0.7" stop-color="#d4af37"/><stop offset="1" stop-color="#a97c1f"/>
    </linearGradient>
  </defs>
  <polygon points="0,-97 97,0 0,97 -97,0" fill="url(#fu-paper)" stroke="#8a0f14" stroke-width="2"/>
  <polygon points="0,-88 88,0 0,88 -88,0" fill="none" stroke="url(#fu-gold)" stroke-width="3.2"/>
  <polygon points="0,-81 81,0 0,81 -81,0" fill="none" stroke="#f0cd6a" stroke-width="0.8" stroke-dasharray="2 3"/>
  <g fill="url(#fu-gold)">
    <circle cx="0" cy="-88" r="4.5"/><circle cx="88" cy="0" r="4.5"/>
    <circle cx="0" cy="88" r="4.5"/><circle cx="-88" cy="0" r="4.5"/>
  </g>
  <g fill="#5c0a0e" opacity="0.55">{shadow}</g>
  <g fill="url(#fu-gold)" stroke="#7a5512" stroke-width="6">{glyph}</g>
</svg>
"""

LANTERN_SVG = """<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 120 190" role="img" aria-label="灯笼">
  <!-- A red palace lantern; the 春 is LXGW WenKai Bold's outline (SIL OFL 1.1), drawn by
       scripts/subset_font.py. -->
  <defs>
    <radialGradient id="lantern-body" cx="0.42" cy="0.4" r="0.65">
      <stop offset="0" stop-color="#ff6a3d"/><stop offset="0.45" stop-color="#d9261c"/>
      <stop offset="1" stop-color="#8c0f12"/>
    </radialGradient>
    <linearGradient id="lantern-gold" x1="0" y1="0" x2="1" y2="0">
      <stop offset="0" stop-color="#a97c1f"/><stop offset="0.45" stop-color="#fff0b0"/>
      <stop offset="1" stop-color="#b8892b"/>
    </linearGradient>
  </defs>
  <line x1="60" y1="0" x2="60" y2="22" stroke="#3b2a10" stroke-width="2.5"/>
  <rect x="38" y="20" width="44" height="12" rx="3" fill="url(#lantern-gold)"/>
  <ellipse cx="60" cy="88" rx="56" ry="58" fill="url(#lantern-body)"/>
  <g fill="none" stroke="#f0cd6a" stroke-opacity="0.55" stroke-width="1.6">
    <ellipse cx="60" cy="88" rx="40" ry="58"/><ellipse cx="60" cy="88" rx="21" ry="58"/>
    <line x1="60" y1="30" x2="60" y2="146"/>
  </g>
  <g fill="#f7d774" stroke="#7a1010" stroke-width="10">{glyph}</g>
  <rect x="38" y="143" width="44" height="12" rx="3" fill="url(#lantern-gold)"/>
  <rect x="55" y="155" width="10" height="8" fill="#d4af37"/>
  <g stroke="#e0342a" stroke-width="2.2" stroke-linecap="round">
    <line x1="52" y1="163" x2="50" y2="188"/><line x1="56" y1="163" x2="55" y2="189"/>
    <line x1="60" y1="163" x2="60" y2="190"/><line x1="64" y1="163" x2="65" y2="189"/>
    <line x1="68" y1="163" x2="70" y2="188"/>
  </g>
</svg>
"""


def ornaments(font: TTFont) -> dict[str, str]:
    """The SVG files drawn from glyph outlines: {file name: text}."""
    return {
        "fu.svg": FU_SVG.replace("{shadow}", glyph_path(font, "福", 104, 3, 4))
                        .replace("{glyph}", glyph_path(font, "福", 104)),
        "lantern.svg": LANTERN_SVG.replace("{glyph}", glyph_path(font, "春", 50, 60, 88)),
    }


def write_if_changed(path: Path, data: bytes) -> bool:
    if path.is_file() and path.read_bytes() == data:
        return False
    path.write_bytes(data)
    return True


def main(cfg: SubsetConfig) -> int:
    src = cfg.font or find_font()
    cfg.font = src
    data, missing, version, note = build(cfg)
    cfg.out_dir.mkdir(parents=True, exist_ok=True)
    out = cfg.out_dir / cfg.out_name
    changed = write_if_changed(out, data)
    font = TTFont(io.BytesIO(data))
    copyright_line = TTFont(src, lazy=True)["name"].getDebugName(0) or "Copyright 2021-2023 LXGW"
    ofl = (f"{copyright_line}\n\nReserved Font Names: \"霞鹜\" and \"LXGW\". This subset is a Modified Version and is\n"
           f"therefore named \"{FAMILY}\" internally.\n\n{ofl_text()}")
    write_if_changed(cfg.out_dir / "OFL.txt", ofl.encode("utf-8"))
    readme = (
        f"# Fonts\n\n`{cfg.out_name}` is a subset of LXGW WenKai Regular (霞鹜文楷) {version}, from Debian's "
        f"`fonts-lxgw-wenkai` ({src.name}), made by `python scripts/subset_font.py`. It holds "
        f"{len(font.getBestCmap())} characters: ASCII, CJK punctuation, every Han character in the sources "
        f"and {note.split(':')[0]}; hints dropped, outlines rescaled to {UNITS_PER_EM} units per em. "
        f"{len(missing)} wanted characters are not in the source font and fall back to system fonts. "
        f"Licence: SIL Open Font License 1.1 (`OFL.txt`); as a Modified Version its "
        f"internal family name is `{FAMILY}` (\"LXGW\" and \"霞鹜\" are Reserved Font Names).\n"
    )
    write_if_changed(cfg.out_dir / "README.md", readme.encode("utf-8"))
    ornament_font = TTFont(src.with_name(ORNAMENT_FONT_FILE) if src.with_name(ORNAMENT_FONT_FILE).is_file() else src)
    for name, svg in ornaments(ornament_font).items():
        write_if_changed(cfg.out_dir.parent / name, svg.encode("utf-8"))
    print(f"{out.relative_to(ROOT)}: {len(data) / 1024:.0f} KiB, {len(font.getBestCmap())} characters "
          f"({'written' if changed else 'unchanged'}); model characters from {note}")
    if missing:
        shown = "".join(sorted(missing))[:80]
        print(f"note: {len(missing)} wanted characters are not in {src.name} and fall back to system fonts: {shown}")
    return 0


def check(cfg: SubsetConfig) -> int:
    out = cfg.out_dir / cfg.out_name
    if not out.is_file():
        print(f"{out} does not exist; run python scripts/subset_font.py")
        return 1
    chars, _ = wanted_chars(cfg)
    have = TTFont(out).getBestCmap()
    try:
        source = TTFont(cfg.font or find_font(), lazy=True).getBestCmap()
        chars = {c for c in chars if ord(c) in source}
    except FileNotFoundError:
        pass
    lacking = sorted(c for c in chars if ord(c) not in have)
    if lacking:
        print(f"{out.name} lacks {len(lacking)} characters ({''.join(lacking[:40])}); re-run scripts/subset_font.py")
        return 1
    print(f"{out.name} covers all {len(chars)} characters")
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--font", type=Path, default=None,
                        help=f"source font (default: {FONT_FILE} under /usr/share/fonts)")
    parser.add_argument("--vocab", type=Path, default=SubsetConfig.vocab)
    parser.add_argument("--out-dir", type=Path, default=SubsetConfig.out_dir)
    parser.add_argument("--check", action="store_true", help="only verify the shipped subset's coverage")
    args = parser.parse_args()
    config = SubsetConfig(font=args.font, vocab=args.vocab.resolve(), out_dir=args.out_dir.resolve())
    sys.exit(check(config) if args.check else main(config))
