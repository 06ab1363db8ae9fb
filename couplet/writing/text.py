"""Keyword normalisation: what a visitor types becomes 1-8 simplified Han characters, or a clear refusal.

Full-width and compatibility forms are folded with NFKC, traditional characters mapped to simplified
with OpenCC's `t2s` table, and anything that is not a Han character removed with a visible note.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass, field
from functools import lru_cache

MAX_KEYWORDS = 8

# CJK Unified Ideographs and Extension A: the characters a visitor's text keeps and the decoder may write
# (`vocab.py`). Not the supplementary planes' extensions: the embedded vocabulary holds 112 of those from the
# corpus, which the decoder never writes, so the shipped font need not show them.
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")


class CoupletInputError(ValueError):
    """Bad user input. The message is written for the visitor (Chinese first, English after)."""


def visitor_part(message: object) -> str:
    """The part of a bilingual message ("中文说明。 (English.)") a visitor reads: everything before " (".
    Every refusal in this project (input, printing, model loading) is written that way."""
    return str(message).split(" (")[0]


def is_han(ch: str) -> bool:
    return bool(_HAN.fullmatch(ch))


@lru_cache(maxsize=1)
def _t2s():
    from opencc import OpenCC  # opencc-python-reimplemented: pure Python, no native build needed

    return OpenCC("t2s")


@dataclass(frozen=True)
class Keywords:
    """Normalised keywords plus what the visitor should be told about the normalisation."""

    text: str
    notes: list[str] = field(default_factory=list)
    unknown: list[str] = field(default_factory=list)  # characters outside the model's vocabulary


def _fold(raw: str) -> tuple[str, list[str]]:
    """NFKC, traditional → simplified, non-Han characters dropped: (Han text, notes for the visitor)."""
    folded = unicodedata.normalize("NFKC", str(raw))
    simplified = _t2s().convert(folded)
    notes: list[str] = []
    converted = sorted({f"{a}→{b}" for a, b in zip(folded, simplified, strict=False) if a != b and is_han(a)})
    if converted and len(folded) == len(simplified):
        notes.append("已将繁体字转换为简体：" + "、".join(converted))
    han = "".join(ch for ch in simplified if is_han(ch))
    dropped = "".join(dict.fromkeys(ch for ch in simplified if not is_han(ch) and not ch.isspace()))
    if dropped:  # an invisible one (zero-width space, a control character) is named by its code point
        shown = "".join(ch if ch.isprintable() else f"〔U+{ord(ch):04X}〕" for ch in dropped)
        notes.append(f"已忽略非汉字字符：{shown}")
    return han, notes


def fold_han(raw: str) -> str:
    """The Han characters of `raw` after NFKC and traditional → simplified (what the couplet will print)."""
    return _fold(raw)[0]


def _unknown_note(han: str, vocab: set[str] | dict[str, int] | None) -> list[str]:
    return [ch for ch in dict.fromkeys(han) if vocab is not None and ch not in vocab]


def normalize_keywords(raw: str, vocab: set[str] | dict[str, int] | None = None) -> Keywords:
    """Fold, convert and filter `raw`; raise CoupletInputError when nothing usable is left."""
    if raw is None or not str(raw).strip():
        raise CoupletInputError(
            "请输入 1–8 个汉字作为关键词，例如「龙马精神」。 (Please enter 1-8 Chinese characters.)")
    han, notes = _fold(raw)
    if not han:
        raise CoupletInputError(
            "关键词里没有汉字，请输入 1–8 个汉字，例如「吉祥如意」。 (No Chinese characters in the keywords.)")
    if len(han) > MAX_KEYWORDS:
        raise CoupletInputError(
            f"关键词最多 {MAX_KEYWORDS} 个汉字，您输入了 {len(han)} 个，请精简。 "
            f"(At most {MAX_KEYWORDS} characters; got {len(han)}.)")
    unknown = _unknown_note(han, vocab)
    if unknown:
        notes.append(f"模型字表中没有「{''.join(unknown)}」，仍按原字嵌入联中，但模型只能凭上下文续写。")
    return Keywords(han, notes, unknown)


UPPER_LENGTHS = (5, 7)


def normalize_upper(raw: str, vocab: set[str] | dict[str, int] | None = None) -> Keywords:
    """A 上联 for 对下联: 5 or 7 Han characters after folding; raise CoupletInputError otherwise."""
    if raw is None or not str(raw).strip():
        raise CoupletInputError(
            "请输入一句 5 字或 7 字的上联，例如「春风送暖千家福」。 (Please enter a 5- or 7-character line.)")
    han, notes = _fold(raw)
    if not han:
        raise CoupletInputError(
            "上联里没有汉字，请输入 5 字或 7 字的上联，例如「春风送暖千家福」。 (No Chinese characters.)")
    if len(han) not in UPPER_LENGTHS:
        raise CoupletInputError(
            f"上联须为 5 字或 7 字，您输入了 {len(han)} 个汉字。 "
            f"(The line must have 5 or 7 characters; got {len(han)}.)")
    unknown = _unknown_note(han, vocab)
    if unknown:
        notes.append(f"模型字表中没有「{''.join(unknown)}」，模型只能凭上下文对出下联。")
    return Keywords(han, notes, unknown)
