"""The README's picture of a printed set: the PNG pieces `couplet.page.printing` writes, laid out as they hang on
a door (横批 on the lintel, 上联 on the right, 下联 on the left, the 福 between), plus the PDF's guide sheet.

    python scripts/print_preview.py [上联 下联 横批] [--out assets/print_set.png]
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from PIL import Image, ImageDraw

from couplet.page.printing import PrintConfig, door_sides, print_set

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("texts", nargs="*", default=["龙马新随云气动", "精神时见雨光浮", "龙马精神"])
    p.add_argument("--out", default=str(ROOT / "assets" / "print_set.png"))
    args = p.parse_args()
    cfg = PrintConfig(png_cell_px=90)
    with tempfile.TemporaryDirectory() as tmp:
        result = print_set(*args.texts, cfg, Path(tmp))
        piece = {k: Image.open(v).convert("RGB") for k, v in result.pngs.items()}
    strip_w, strip_h = piece["upper"].size
    hengpi, fu = piece["hengpi"], piece["fu"]
    gap, door_w = 30, 2 * fu.size[0]
    width = 2 * (strip_w + gap) + door_w + 40
    height = hengpi.size[1] + gap + strip_h + 40
    img = Image.new("RGB", (width, height), "#f6efe2")
    draw = ImageDraw.Draw(img)
    x_left, x_right = 20, width - 20 - strip_w
    y0 = 20 + hengpi.size[1] + gap
    draw.rectangle([x_left + strip_w + gap, y0, x_right - gap, y0 + strip_h], fill="#7a3b1e")  # the door
    draw.line([width // 2, y0, width // 2, y0 + strip_h], fill="#4a2411", width=3)
    up_side, _ = door_sides(cfg.hengpi_rtl)
    upper_x, lower_x = (x_right, x_left) if up_side == "右" else (x_left, x_right)
    img.paste(piece["upper"], (upper_x, y0))
    img.paste(piece["lower"], (lower_x, y0))
    img.paste(hengpi, ((width - hengpi.size[0]) // 2, 20))
    mask = Image.new("L", fu.size, 0)
    ImageDraw.Draw(mask).polygon([(fu.size[0] / 2, 0), (fu.size[0], fu.size[1] / 2), (fu.size[0] / 2, fu.size[1]),
                                  (0, fu.size[1] / 2)], fill=255)
    img.paste(fu, ((width - fu.size[0]) // 2, y0 + strip_h // 3 - fu.size[1] // 2), mask)
    img.save(args.out, optimize=True)
    print(f"{args.out}: {img.size[0]}x{img.size[1]}, {Path(args.out).stat().st_size:,} bytes; "
          f"set: {result.pages} PDF pages in {result.seconds:.2f} s")


if __name__ == "__main__":
    main()
