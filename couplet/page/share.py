"""The share link (分享): a query string holding what writes the same couplet again.

    ?kw=龙马精神&len=7&cang=0&t=0.8&seed=3&year=2026&modes=full,int8
    ?up=春风送暖千家福&t=0&seed=0&year=2026&modes=full

`kw` (keywords) or `up` (a 上联, for 对下联) — one of them makes the page write at once; `len` (5 | 7),
`cang` (藏头, 0 | 1), `t` (temperature, 0–1.5), `seed`, `year` and `modes` (comma-separated registry names)
are optional. Decoding is deterministic given these (greedy, or Gumbel noise seeded by `seed` and the
step), so the link writes the same couplet on any machine with the same model.

A value that is missing takes the form's default; one that is wrong takes the default too and is named in
a Chinese note; keywords or a 上联 that the form would refuse are refused the same way, and nothing is
written. Values are only ever parsed here and shown through the form's own components or `html.escape`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import quote

from couplet.kvcache import MODES, parse_modes
from couplet.writing.calendar import DEFAULT_YEAR, MAX_YEAR, MIN_YEAR
from couplet.writing.text import CoupletInputError, is_han, normalize_keywords, normalize_upper, visitor_part

MAX_VALUE_CHARS = 64  # a longer query value is cut (and said so): no one types 64 characters of keywords
MAX_TEMPERATURE = 1.5
MAX_SEED = 2**31 - 1
# The form's defaults, which a link's missing values take too. Sampled, so that each click (with a fresh seed,
# app.PREPARE_WRITE_JS) writes a new couplet; greedy is the temperature slider at 0. At 0.45 the sampled couplets
# keep the greedy figures (对仗, template repeat under 8%) on both phrase lists, where 0.6 let stock phrases through
# (template repeat 8.3% / 9.7%), and 96-98% of three clicks still differ (docs/results/quality.md, "Sampling on
# the page").
DEFAULT_TEMPERATURE = 0.45
# Ticked when the page opens: the baseline, one mode of each family the page compares (retention,
# quantization, the staged combination); the other four are a tick away. Fewer modes, a faster first character
# on two cores (docs/results/latency.md).
DEFAULT_MODES = ("full", "selective", "int4", "combo")
KEYS = ("kw", "up", "len", "cang", "t", "seed", "year", "modes", "best")


@dataclass
class ShareLink:
    """What the form holds; `task` is "keywords", "duixia", or "" (no couplet in the link)."""

    task: str = ""
    keywords: str = ""
    upper: str = ""
    length: int = 7
    acrostic: bool = False
    temperature: float = DEFAULT_TEMPERATURE
    seed: int = 0
    year: int = DEFAULT_YEAR
    modes: list[str] = field(default_factory=lambda: list(DEFAULT_MODES))
    best: bool = False  # 择优: several drafts per mode, the best shown
    notes: list[str] = field(default_factory=list)  # what was wrong with the link, in Chinese
    error: str = ""  # keywords / 上联 refused: nothing is written

    def query(self) -> str:
        """The query string (without `?`) that reproduces this couplet."""
        text = {"kw": self.keywords} if self.task == "keywords" else {"up": self.upper}
        params: dict[str, str] = {**text}
        if self.task == "keywords":
            params |= {"len": str(self.length), "cang": "1" if self.acrostic else "0"}
        params |= {"t": f"{self.temperature:g}", "seed": str(self.seed), "year": str(self.year),
                   "modes": ",".join(self.modes)} | ({"best": "1"} if self.best else {})
        # Han characters stay as they are (an IRI: browsers and chat apps show 龙马精神, not %E9%BE%99…);
        # everything else is percent-encoded
        return "&".join(f"{k}={''.join(c if is_han(c) else quote(c, safe=',') for c in v)}"
                        for k, v in params.items())


def checked_number(raw: str | float | None, kind: type, low: float, high: float) -> tuple[float | None, str]:
    """`raw` as a finite `kind` (int: a whole number) in [low, high]: (value, ""); else (None, why), why being
    "number" (not a number at all), "whole" or "range". The link's values and the form's share this check, so
    that a link writes the couplet on screen."""
    try:
        value = float(raw)  # type: ignore[arg-type]
        if not math.isfinite(value):
            raise ValueError
    except (TypeError, ValueError, OverflowError):
        return None, "number"
    if kind is int and value != int(value):
        return None, "whole"
    if not low <= value <= high:
        return None, "range"
    return kind(value), ""


def _number(raw: str, kind: type, low: float, high: float, name: str, default, notes: list[str]):
    value, why = checked_number(raw, kind, low, high)
    if why == "number":
        notes.append(f"链接中的{name}「{raw}」不是数字，已用默认值 {default}。")
    elif why == "whole":
        notes.append(f"链接中的{name}「{raw}」不是整数，已用默认值 {default}。")
    elif why == "range":
        bounds = f"{int(low)}–{int(high)}" if kind is int else f"{low:g}–{high:g}"  # 2147483647, not 2.14748e+09
        notes.append(f"链接中的{name} {raw} 超出 {bounds}，已用默认值 {default}。")
    return default if why else value


def _flag(raw: str, name: str, off: str, notes: list[str]) -> bool:
    """A 0/1 (or false/true) switch of the link; anything else is off, with a note saying so (`off`: what "off"
    means, in the note)."""
    if raw.lower() in ("0", "1", "true", "false"):
        return raw.lower() in ("1", "true")
    notes.append(f"链接中的{name}「{raw}」无效（应为 0 或 1），已{off}。")
    return False


def parse_query(params: Mapping[str, str]) -> ShareLink:
    """A share link's query parameters → the form's values, with notes for what was wrong. Never raises."""
    link = ShareLink()
    raw: dict[str, str] = {}
    for key in KEYS:
        value = params.get(key)
        if value is None:
            continue
        value = str(value)
        if len(value) > MAX_VALUE_CHARS:
            link.notes.append(f"链接中的「{key}」过长，只取前 {MAX_VALUE_CHARS} 个字符。")
            value = value[:MAX_VALUE_CHARS]
        raw[key] = value
    if "len" in raw:
        if raw["len"] in ("5", "7"):
            link.length = int(raw["len"])
        else:
            link.notes.append(f"链接中的字数「{raw['len']}」无效（应为 5 或 7），已用 7 字。")
    if "cang" in raw:
        link.acrostic = _flag(raw["cang"], "藏头", "不藏头", link.notes)
    if "t" in raw:
        link.temperature = _number(raw["t"], float, 0.0, MAX_TEMPERATURE, "温度", DEFAULT_TEMPERATURE, link.notes)
    if "seed" in raw:
        link.seed = _number(raw["seed"], int, 0, MAX_SEED, "随机种子", 0, link.notes)
    if "year" in raw:
        link.year = _number(raw["year"], int, MIN_YEAR, MAX_YEAR, "年份", DEFAULT_YEAR, link.notes)
    if "best" in raw:
        link.best = _flag(raw["best"], "择优", "不择优", link.notes)
    if "modes" in raw:
        try:
            link.modes = [m for m in MODES if m in parse_modes(raw["modes"])] or list(DEFAULT_MODES)
        except ValueError:
            link.notes.append("链接中有未知的缓存模式，已选默认模式（可选：" + "、".join(MODES) + "）。")
    # the text last: keywords (or a 上联) the form would refuse are refused here, with the form's message
    for key, task, field_name, normalize in (("kw", "keywords", "keywords", normalize_keywords),
                                             ("up", "duixia", "upper", normalize_upper)):
        if key in raw:
            link.task = task
            setattr(link, field_name, raw[key])
            try:
                normalize(raw[key])
            except CoupletInputError as e:
                link.error = visitor_part(e)
            break
    return link


def share_url(base: str, link: ShareLink) -> str:
    """`base` (the page's address, any query dropped) plus the link's query string."""
    return base.split("?", 1)[0].split("#", 1)[0] + "?" + link.query()
