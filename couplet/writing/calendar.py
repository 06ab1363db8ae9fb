"""The sexagenary (干支) year and its zodiac animal, for the year shown on the gate.

The stem-branch year turns at the Spring Festival, not on 1 January; `year` here is the lunar year that
opens at that year's Spring Festival (2026 → 丙午, the Year of the Horse). Cycle: stem = (year − 4) mod 10,
branch = (year − 4) mod 12, because 4 CE was a 甲子 year.
"""

from __future__ import annotations

STEMS = "甲乙丙丁戊己庚辛壬癸"
BRANCHES = "子丑寅卯辰巳午未申酉戌亥"
ZODIAC = "鼠牛虎兔龙蛇马羊猴鸡狗猪"  # one per branch, same order
DEFAULT_YEAR = 2026  # 丙午马年
MIN_YEAR, MAX_YEAR = 1900, 2100


def _check(year: int) -> int:
    if isinstance(year, bool) or not isinstance(year, int):
        raise ValueError(f"年份必须是整数 / year must be an integer, got {year!r}")
    if not MIN_YEAR <= year <= MAX_YEAR:
        raise ValueError(f"年份须在 {MIN_YEAR}–{MAX_YEAR} 之间 / year must be between {MIN_YEAR} and {MAX_YEAR}, "
                         f"got {year}")
    return year


def ganzhi(year: int) -> str:
    """天干地支 of the lunar year: 2025 → 乙巳, 2026 → 丙午, 1984 → 甲子."""
    y = _check(year) - 4
    return STEMS[y % 10] + BRANCHES[y % 12]


def zodiac(year: int) -> str:
    """生肖 of the lunar year: 2026 → 马."""
    return ZODIAC[(_check(year) - 4) % 12]


def year_label(year: int) -> str:
    """What the gate shows: 2026 → 丙午马年."""
    return f"{ganzhi(year)}{zodiac(year)}年"
