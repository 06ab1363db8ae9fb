"""Where the keywords go: fixed characters at the heads of the two lines (嵌字 / 藏头).

A small model left to "use" keywords mostly ignores them, and forcing them into arbitrary positions
reads badly; setting them at the line heads and letting the model continue reads naturally
(DESIGN.md §4). Two placements:

- `heads` (default): the first half of the keywords opens 上联, the second half opens 下联 —
  龙马精神 → 龙马…… / 精神……, 吉祥 → 吉…… / 祥…….
- `acrostic` (藏头): keywords alternate between the lines, so the first two open the two lines —
  龙马精神 → 龙精…… / 马神…….
"""

from __future__ import annotations

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
    return Placement(dict(enumerate(first)), dict(enumerate(second)))
