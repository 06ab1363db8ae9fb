"""Where things sit in a couplet: the keywords at the heads of the two lines (嵌字 / 藏头), and the positions a
retention mode should protect while each character is written (`couplet_protection`).

A small model left to "use" keywords mostly ignores them, and forcing them into arbitrary positions
reads badly; setting them at the line heads and letting the model continue reads naturally
(DESIGN.md §4). Two placements:

- `heads` (default): the first half of the keywords opens 上联, the second half opens 下联 —
  龙马精神 → 龙马…… / 精神……, 吉祥 → 吉…… / 祥…….
- `acrostic` (藏头): keywords alternate between the lines, so the first two open the two lines —
  龙马精神 → 龙精…… / 马神…….
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

PLACEMENTS = ("heads", "acrostic")


@dataclass(frozen=True)
class Placement:
    """Characters fixed at positions of each line: {position: character}."""

    upper: dict[int, str]
    lower: dict[int, str]

    def fixed(self, line: int) -> dict[int, str]:
        return self.upper if line == 0 else self.lower


def place_keywords(keywords: str, length: int, style: str = "heads") -> Placement:
    """Fix every keyword character at the head of a line; at most length-1 per line (the last
    character is left free for the tone constraint)."""
    if style not in PLACEMENTS:
        raise ValueError(f"unknown placement {style!r}; choose from {PLACEMENTS}")
    if len(keywords) > 2 * (length - 1):
        raise ValueError(f"{len(keywords)} keywords do not fit two {length}-character lines")
    if style == "acrostic":
        first, second = keywords[0::2], keywords[1::2]
    else:
        half = (len(keywords) + 1) // 2
        first, second = keywords[:half], keywords[half:]
    # Keywords that repeat a character (大吉大利 → 大吉 / 大利) would put it at the same position of both
    # lines, which the rules forbid (同位重字): the 下联's part then starts one place later (…大利…).
    def collides(shift: int) -> bool:
        return any(i + shift < len(first) and first[i + shift] == c for i, c in enumerate(second))

    shift = next((k for k in range(length - len(second)) if not collides(k)), 0)
    return Placement(dict(enumerate(first)), {i + shift: c for i, c in enumerate(second)})


def couplet_protection(keywords: Iterable[int], upper_start: int, upper_len: int, line: int, index: int,
                       neighbours: int = 1, ahead: bool = True, keywords_in_lower: bool = False) -> list[int]:
    """Logical positions worth protecting while character `index` (0-based) of `line` (0 上联, 1 下联) is written.

    keywords: positions of the keyword tokens; upper_start: position of the first 上联 character;
    upper_len: characters per line.
    - 上联: the keywords (the line must carry them) and the 上联 written so far.
    - 下联: the aligned 上联 character ± `neighbours`; with `ahead`, every 上联 character still to be matched
      (evicted tokens never come back, so a character needed two steps later must survive this step's
      eviction); the keywords only with `keywords_in_lower` — by then the 上联 has used them, and on the dev
      list (ratio 0.5, bf16) protecting them through the 下联 cost +0.20 nats/char of NLL against `full`
      (it crowds out the 上联 the 下联 mirrors).
    Protection competes within the budget: when it does not all fit, the protected tokens with the most
    attention stay.
    """
    if line == 0:
        return sorted({*keywords, *range(upper_start, upper_start + index)})
    first = max(index - neighbours, 0)
    last = upper_len - 1 if ahead else min(index + neighbours, upper_len - 1)
    return sorted({*(keywords if keywords_in_lower else ()), *range(upper_start + first, upper_start + last + 1)})
