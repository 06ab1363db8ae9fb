"""Level (平) and oblique (仄) tones of characters, from pypinyin's Mandarin readings (新声韵).

Tones 1 and 2 are level, 3 and 4 oblique; the neutral tone counts as neither. Classical entering tones
(入声) are not modelled: modern Spring Festival couplets are judged by modern readings.
"""

from __future__ import annotations

from functools import lru_cache

from pypinyin import Style, lazy_pinyin

LEVEL, OBLIQUE = "平", "仄"


@lru_cache(maxsize=20000)
def tone_class(ch: str) -> str | None:
    """'平', '仄' or None (neutral tone, or not a Han character)."""
    syllable = lazy_pinyin(ch, style=Style.TONE3, neutral_tone_with_five=True, errors="ignore")
    if not syllable or not syllable[0][-1:].isdigit():
        return None
    tone = int(syllable[0][-1])
    return LEVEL if tone in (1, 2) else OBLIQUE if tone in (3, 4) else None
