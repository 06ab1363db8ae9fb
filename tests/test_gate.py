"""The palace gate's HTML/CSS (couplet.page.gate) and the shipped font it is drawn in."""

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import pytest
from fontTools.ttLib import TTFont

from couplet.page.gate import ASSETS_DIR, CSS_PATH, FONT_PATH, gate_css, render_gate
from couplet.writing.phrases import HENGPI_PHRASES

ROOT = Path(__file__).resolve().parent.parent
XSS = "<img src=x onerror=alert(1)>"


class Node:
    def __init__(self, tag, attrs, parent=None):
        self.tag, self.attrs, self.parent, self.children = tag, dict(attrs), parent, []

    @property
    def classes(self):
        return set((self.attrs.get("class") or "").split())

    def text(self):
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)

    def walk(self):
        for c in self.children:
            if isinstance(c, Node):
                yield c
                yield from c.walk()

    def matches(self, simple):  # "#id", ".cls", "tag", or combinations like "div.cls"
        tag, rest = re.match(r"^([a-z0-9]*)(.*)$", simple).groups()
        if tag and self.tag != tag:
            return False
        for kind, name in re.findall(r"([.#])([\w-]+)", rest):
            if (kind == "#" and self.attrs.get("id") != name) or (kind == "." and name not in self.classes):
                return False
        return True

    def select(self, selector):
        """Descendant selectors only ('.door-right .couplet-line')."""
        nodes = [self]
        for part in selector.split():
            nodes = [n for node in nodes for n in node.walk() if n.matches(part)]
            nodes = list({id(n): n for n in nodes}.values())
        return nodes


class Tree(HTMLParser):
    def __init__(self, html):
        super().__init__(convert_charrefs=True)
        self.root = self.cur = Node("#root", {})
        self.feed(html)
        self.close()

    def handle_starttag(self, tag, attrs):
        node = Node(tag, attrs, self.cur)
        self.cur.children.append(node)
        self.cur = node

    def handle_startendtag(self, tag, attrs):
        self.cur.children.append(Node(tag, attrs, self.cur))

    def handle_endtag(self, tag):
        node = self.cur
        while node is not self.root and node.tag != tag:
            node = node.parent
        assert node is not self.root, f"stray </{tag}>"
        self.cur = node.parent

    def handle_data(self, data):
        self.cur.children.append(data)


def dom(html):
    tree = Tree(html)
    assert tree.cur is tree.root, "unclosed elements"
    return tree.root


def one(root, selector):
    found = root.select(selector)
    assert len(found) == 1, f"{selector}: {len(found)} matches"
    return found[0]


def gate(**kw):
    args = dict(upper="龙马不知天下客", lower="精神不见水中仙", hengpi="龙马精神", year_label="丙午马年", opened=True)
    args.update(kw)
    return render_gate(args.pop("upper"), args.pop("lower"), args.pop("hengpi"), **args)


def test_lines_sit_on_their_doors():
    root = dom(gate())
    assert one(root, "#gate").classes >= {"gate", "is-open"}
    assert one(root, ".door-right .couplet-line").text() == "龙马不知天下客"  # 上联 on the right
    assert one(root, ".door-left .couplet-line").text() == "精神不见水中仙"  # 下联 on the left
    assert one(root, ".lintel .hengpi").text() == "龙马精神"
    assert one(root, ".gate-plaque .year-label").text() == "丙午马年"
    assert not root.select(".gate-message")  # no message, no banner


def test_upper_line_comes_first_in_reading_order():
    text = one(dom(gate()), "#gate").text()
    assert text.index("龙马不知天下客") < text.index("精神不见水中仙")


@pytest.mark.parametrize("field", ["upper", "lower", "hengpi", "year_label", "message"])
def test_user_text_is_escaped(field):
    html = gate(**{field: XSS})
    assert "<img" not in html and "&lt;img src=x onerror=alert(1)&gt;" in html
    root = dom(html)
    assert not [n for n in root.walk() if n.tag == "img" or "onerror" in n.attrs]
    assert XSS in one(root, "#gate").text()


def test_quotes_and_ampersands_survive_as_text():
    root = dom(gate(upper='"&\'<>', message="a&b"))
    assert one(root, ".door-right .couplet-line").text() == '"&\'<>'
    assert one(root, ".gate-message").text() == "a&b"


def test_states():
    empty = dom(gate(opened=False, upper="", lower="", hengpi=""))
    assert "is-closed" in one(empty, "#gate").classes
    assert one(empty, ".lintel .hengpi").text() == one(empty, ".door-right .couplet-line").text() == ""
    assert one(dom(gate(opened=False, pending=True)), "#gate").attrs["data-state"] == "pending"
    assert one(dom(gate(opened=True, pending=True)), "#gate").attrs["data-state"] == "open"


def test_streaming_marks_the_growing_line_and_its_newest_character():
    root = dom(gate(opened=False, pending=True, upper="龙马不", lower="", hengpi=""))
    assert "is-writing" in one(root, ".door-right .strip").classes
    assert "is-writing" not in one(root, ".door-left .strip").classes
    assert one(root, ".door-right .couplet-line").text() == "龙马不"
    assert one(root, ".door-right .ch-new").text() == "不"

    root = dom(gate(opened=False, pending=True, lower="精神"))
    assert "is-writing" in one(root, ".door-left .strip").classes
    assert "is-writing" not in one(root, ".door-right .strip").classes
    assert one(root, ".door-left .ch-new").text() == "神"
    assert not dom(gate()).select(".ch-new")  # nothing fades in once complete


def test_short_lines_are_spaced_out():
    assert "lines-short" in one(dom(gate(upper="春风得意来", lower="瑞雪兆丰年")), "#gate").classes
    assert "lines-short" not in one(dom(gate()), "#gate").classes
    assert "lines-short" in one(dom(gate(opened=False, pending=True, upper="春", lower="", length=5)), "#gate").classes


def test_svg_ids_are_unique_across_renders():
    html = gate() + gate(opened=False)
    ids = re.findall(r'\bid="([^"]+)"', html)
    assert ids.count("gate") == 2
    svg_ids = [i for i in ids if i != "gate"]
    assert svg_ids and len(svg_ids) == len(set(svg_ids))
    for ref in re.findall(r"url\(#([^)]+)\)", html):
        assert ref in svg_ids


def test_ornaments_need_no_font():
    for name in ("fu.svg", "lantern.svg", "knocker.svg", "roof.svg"):
        svg = (ASSETS_DIR / name).read_text(encoding="utf-8")
        assert svg.lstrip().startswith("<svg") and "<text" not in svg
    assert "<path" in (ASSETS_DIR / "fu.svg").read_text(encoding="utf-8")


def test_css_points_the_font_at_the_given_url():
    css = gate_css("/gradio_api/file=/srv/app/assets/fonts/lxgw-wenkai-subset.woff2")
    assert re.search(r'@font-face\s*{[^}]*font-family: "CoupletKai";[^}]*'
                     r'url\("/gradio_api/file=/srv/app/assets/fonts/lxgw-wenkai-subset.woff2"\)', css)
    assert "vertical-rl" in css and "rotateY" in css and "#open-btn" in css
    assert css.count("{") == css.count("}")
    for bad in ['x") ; } body { color: red', "", "a'b"]:
        with pytest.raises(ValueError):
            gate_css(bad)


# ------------------------------------------------------------------ the shipped font

@pytest.fixture(scope="module")
def font_chars():
    assert FONT_PATH.is_file(), "run python scripts/subset_font.py"
    font = TTFont(FONT_PATH)
    assert font.flavor == "woff2"
    return {chr(c) for c in font.getBestCmap()}


def test_font_is_small_and_licensed(font_chars):
    assert FONT_PATH.stat().st_size <= 1.6 * 1024 * 1024
    assert "SIL OPEN FONT LICENSE" in (FONT_PATH.parent / "OFL.txt").read_text(encoding="utf-8")
    assert 'url("fonts/lxgw-wenkai-subset.woff2")' in CSS_PATH.read_text(encoding="utf-8")


def test_font_covers_hengpi_and_punctuation(font_chars):
    missing = set("".join(HENGPI_PHRASES) + "，。：；！？「」《》·—、（）0123456789abcXYZ") - font_chars
    assert not missing, f"missing {''.join(sorted(missing))}: run python scripts/subset_font.py"


def test_font_covers_the_model_vocabulary(font_chars):
    path = ROOT / "assets/model/tokenizer.json"
    if not path.is_file():
        pytest.skip("no tokenizer yet (assets/model/tokenizer.json appears with the first checkpoint)")
    tokens = json.loads(path.read_text(encoding="utf-8"))["model"]["vocab"]
    vocab = {t for t in tokens if len(t) == 1 and not t.isspace()}
    source = Path("/usr/share/fonts/truetype/lxgw-wenkai/LXGWWenKai-Regular.ttf")
    if source.is_file():  # characters the source font itself lacks cannot be in the subset
        have = TTFont(source, lazy=True).getBestCmap()
        vocab = {c for c in vocab if ord(c) in have}
    else:  # without the source: the rare CJK extension blocks (A: U+3400-4DBF, B+: planes 2-3) may fall back
        vocab = {c for c in vocab if not (0x3400 <= ord(c) <= 0x4DBF or ord(c) >= 0x20000)}
    missing = vocab - font_chars
    assert not missing, f"missing {''.join(sorted(missing))[:60]}: run python scripts/subset_font.py"


def test_font_covers_ui_text(font_chars):
    # Han, CJK punctuation and fullwidth forms: only a CJK font has them, so a page without the shipped
    # glyph shows a box (Latin punctuation such as – falls back to the browser's own fonts)
    han = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")
    files = [*ROOT.glob("couplet/**/*.py"), *ROOT.glob("app.py"), *ROOT.glob("assets/*.css")]
    missing = {c for f in files for c in han.findall(f.read_text(encoding="utf-8"))} - font_chars
    assert not missing, f"UI text {''.join(sorted(missing))} would render as boxes: run python scripts/subset_font.py"
