"""The printable 春联 (`couplet.page.printing`), read back: the PDF with pypdf (pages, text, embedded font), the
PNGs with Pillow (sizes), the SVGs as XML (one glyph path per character) — and the refusals."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pypdf
import pytest
from PIL import Image

from couplet.page.printing import CELL_MM, PAD, PrintConfig, glyphs, print_set, tiles
from couplet.writing.text import CoupletInputError

UPPER, LOWER, HENGPI = "天增岁月人增寿", "春满乾坤福满门", "万象更新"
SVG = "{http://www.w3.org/2000/svg}"


@pytest.fixture(scope="module")
def a4(tmp_path_factory) -> object:
    return print_set(UPPER, LOWER, HENGPI, PrintConfig(), tmp_path_factory.mktemp("a4"))


def page_texts(pdf: Path) -> list[str]:
    return [p.extract_text().replace("\n", "") for p in pypdf.PdfReader(pdf).pages]


def test_tiles_are_balanced_and_cover_every_character():
    assert [len(t) for t in tiles(7, 4)] == [4, 3]
    assert [len(t) for t in tiles(5, 4)] == [3, 2]
    assert [len(t) for t in tiles(11, 4)] == [4, 4, 3]
    assert [len(t) for t in tiles(4, 4)] == [4]
    assert [i for t in tiles(9, 2) for i in t] == list(range(9))


def test_the_pdf_holds_the_guide_then_each_piece_tiled_with_the_font_embedded(a4):
    texts = page_texts(a4.pdf)
    # guide, 上联 4+3, 下联 4+3, 横批, 福: a 7-character strip spans two A4 sheets
    assert a4.pages == len(texts) == 7
    assert "春联张贴说明" in texts[0] and "上联贴在门的右侧" in texts[0]
    assert texts[1].startswith("上联") and texts[1].endswith("天增岁月") and texts[2].endswith("人增寿")
    assert texts[3].startswith("下联") and texts[3].endswith("春满乾坤") and texts[4].endswith("福满门")
    # the 横批 reads right to left: laid out (and extracted, left to right) reversed
    assert "自右向左" in texts[5] and texts[5].endswith(HENGPI[::-1])
    assert texts[6].endswith("福")
    reader = pypdf.PdfReader(a4.pdf)
    embedded = set()
    for page in reader.pages:
        for font in page["/Resources"]["/Font"].values():
            font = font.get_object()
            descriptor = font.get("/FontDescriptor")
            if descriptor is not None and "/FontFile2" in descriptor.get_object():
                embedded.add(str(font["/BaseFont"]).split("+")[-1])
    assert embedded == {"CoupletKai"}
    width, height = (float(v) for v in reader.pages[1].mediabox.upper_right)
    assert round(width / 72 * 25.4) == 210 and round(height / 72 * 25.4) == 297  # A4 portrait
    width, height = (float(v) for v in reader.pages[5].mediabox.upper_right)
    assert width > height  # the 横批 on a landscape sheet


def test_pngs_are_each_piece_at_the_asked_resolution(a4):
    px = PrintConfig().png_cell_px
    along, across = round((7 + 2 * PAD) * px), round((1 + 2 * PAD) * px)
    sizes = {key: Image.open(path).size for key, path in a4.pngs.items()}
    assert sizes == a4.png_sizes
    assert sizes["upper"] == sizes["lower"] == (across, along)
    assert sizes["hengpi"] == (round((4 + 2 * PAD) * px), across)
    assert sizes["fu"][0] == sizes["fu"][1] > 2 * px
    # red paper, and ink: the strip's middle column is not all one colour
    strip = Image.open(a4.pngs["upper"]).convert("RGB")
    assert strip.getpixel((2, 2)) == (0xC8, 0x16, 0x1D)
    column = {strip.getpixel((across // 2, y)) for y in range(0, along, 5)}
    assert (0x1A, 0x1A, 0x1A) in column


def test_svgs_draw_one_glyph_path_per_character_at_print_size(a4):
    for key, text in (("upper", UPPER), ("lower", LOWER), ("hengpi", HENGPI), ("fu", "福")):
        root = ET.parse(a4.svgs[key]).getroot()
        assert root.get("aria-label") == text
        assert text in root.find(f"{SVG}title").text
        glyph_paths = root.findall(f"{SVG}g/{SVG}path")
        assert len(glyph_paths) == len(text) and all(p.get("d") for p in glyph_paths)
    upper = ET.parse(a4.svgs["upper"]).getroot()
    assert float(upper.get("height").removesuffix("mm")) == pytest.approx((7 + 2 * PAD) * CELL_MM["A4"], abs=0.1)


def test_a3_gold_without_fu_and_a_left_to_right_hengpi(tmp_path):
    result = print_set("瑞雪迎春到", "和风送福来", "吉祥如意", PrintConfig("A3", "gold", fu=False, hengpi_rtl=False),
                       tmp_path)
    texts = page_texts(result.pdf)
    assert result.pages == len(texts) == 1 + 2 + 2 + 1  # guide, 上联 3+2, 下联 3+2, 横批; no 福
    assert "上联贴在门的左侧" in texts[0]  # a left-to-right 横批 puts the 上联 on the left
    assert texts[-1].endswith("吉祥如意")
    assert set(result.pngs) == {"upper", "lower", "hengpi"}
    width, height = (float(v) for v in pypdf.PdfReader(result.pdf).pages[1].mediabox.upper_right)
    assert round(width / 72 * 25.4) == 297 and round(height / 72 * 25.4) == 420
    strip = Image.open(result.pngs["upper"]).convert("RGB")
    w, h = strip.size
    assert (0xE8, 0xB7, 0x30) in {strip.getpixel((w // 2, y)) for y in range(0, h, 3)}  # gold ink


def test_traditional_characters_are_folded_like_keywords(tmp_path):
    result = print_set("天增歲月人增壽", "春滿乾坤福滿門", "萬象更新", PrintConfig(fu=False), tmp_path)
    assert (result.upper, result.lower, result.hengpi) == (UPPER, LOWER, HENGPI)


def _missing_glyph() -> str:
    g = glyphs()
    return next(chr(cp) for cp in range(0x4E00, 0x9FFF) if not g.has(chr(cp)))


@pytest.mark.parametrize(("upper", "lower", "hengpi", "message"), [
    ("", LOWER, HENGPI, "上联里没有汉字"),
    (UPPER, "hello", HENGPI, "下联里没有汉字"),
    (UPPER, LOWER, "<script>", "横批里没有汉字"),
    ("天增岁月", LOWER, HENGPI, "上下联字数须相同"),
    ("天" * 12, "春" * 12, HENGPI, "上联须为 3–11 个汉字"),
    (UPPER, LOWER, "万", "横批须为 2–8 个汉字"),
])
def test_bad_texts_are_refused_in_chinese(upper, lower, hengpi, message, tmp_path):
    with pytest.raises(CoupletInputError, match=message):
        print_set(upper, lower, hengpi, out_dir=tmp_path)
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_a_character_the_font_lacks_is_refused():
    rare = _missing_glyph()
    with pytest.raises(CoupletInputError, match=f"字库里没有「{rare}」"):
        print_set(UPPER[:-1] + rare, LOWER, HENGPI)


@pytest.mark.parametrize("cfg", [{"paper": "B5"}, {"ink": "red"}, {"png_cell_px": 5}])
def test_bad_print_options_are_refused(cfg):
    with pytest.raises(CoupletInputError):
        PrintConfig(**cfg)


def test_cli_writes_the_set_and_refuses_bad_input_with_one_line(tmp_path):
    ok = subprocess.run([sys.executable, "-m", "couplet.page.printing", UPPER, LOWER, HENGPI, "--out", str(tmp_path),
                         "--no-fu"], capture_output=True, text=True, check=False)
    assert ok.returncode == 0, ok.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["chunlian.pdf", *(f"{s}.{e}" for s in ("shanglian", "xialian", "hengpi") for e in ("png", "svg"))])
    bad = subprocess.run([sys.executable, "-m", "couplet.page.printing", "天增岁月", LOWER, HENGPI, "--out",
                          str(tmp_path / "bad")], capture_output=True, text=True, check=False)
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and "上下联字数须相同" in bad.stderr


def test_guide_lines_break_after_punctuation_and_never_before_a_closing_mark():
    from couplet.page.print_layout import wrap_cjk

    def fits(n):
        return lambda t: len(t) <= n

    text = "裁切：沿四角的裁切线裁去白边。长联分张打印，按「第 1 张」拼接。"
    lines = wrap_cjk(text, fits(16))
    assert "".join(lines) == text and all(len(x) <= 16 for x in lines)
    assert lines[0] == "裁切：沿四角的裁切线裁去白边。"  # at the 。, not at the 16th character
    assert not any(x[0] in "，。；：、！？）」" for x in lines)
    assert wrap_cjk("一二三四五六七八九十", fits(4)) == ["一二三四", "五六七八", "九十"]  # no punctuation: anywhere
    assert wrap_cjk("一二三，四五", fits(3)) == ["一二", "三，", "四五"]  # the ， stays with its character
    assert wrap_cjk("上联：春　　下联：风", fits(6)) == ["上联：春", "下联：风"]  # at the spaces, trimmed
