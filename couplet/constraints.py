"""Constrained decoding: which characters may stand at a given position of a couplet.

Every step, the allowed set is: single Han characters of the vocabulary, minus characters already in
the current line (no repeats inside a line), minus every 上联 character while 下联 is written (the
lines do not share characters, which also rules out the same character at the same position), and at
the last position only oblique-tone (仄) characters for 上联 and level-tone (平) ones for 下联.
Keyword characters fixed by the placement bypass all of this.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from couplet.model import LoadedModel
from couplet.placement import Placement
from couplet.tones import LEVEL, OBLIQUE, tone_class


@lru_cache(maxsize=4)
def _masks(lm: LoadedModel) -> dict[str, torch.Tensor]:
    """Boolean (vocab,) masks: Han characters, and Han characters of each tone class."""
    size = len(lm.id_to_char)
    han = torch.zeros(size, dtype=torch.bool)
    han[lm.han_ids] = True
    level = torch.zeros(size, dtype=torch.bool)
    oblique = torch.zeros(size, dtype=torch.bool)
    for i in lm.han_ids.tolist():
        tone = tone_class(lm.id_to_char[i])
        level[i] = tone == LEVEL
        oblique[i] = tone == OBLIQUE
    return {"han": han, LEVEL: level, OBLIQUE: oblique}


class LineConstraints:
    """The allowed-character mask for (line, position), given what has been written so far."""

    def __init__(self, lm: LoadedModel, placement: Placement, length: int):
        self.lm = lm
        self.placement = placement
        self.length = length
        self.masks = _masks(lm)

    def fixed(self, line: int, pos: int) -> str | None:
        """A keyword character fixed at this position, if any."""
        return self.placement.fixed(line).get(pos)

    def allowed(self, line: int, pos: int, lines: list[str]) -> torch.Tensor:
        allowed = self.masks["han"].clone()
        if pos == self.length - 1:
            allowed &= self.masks[OBLIQUE if line == 0 else LEVEL]
        banned = set(lines[line])
        if line == 1:
            banned |= set(lines[0])
        # keyword characters have their own fixed places; they never appear a second time
        banned |= set(self.placement.upper.values()) | set(self.placement.lower.values())
        vocab = self.lm.vocab
        ids = [vocab[c] for c in banned if c in vocab]
        if ids:
            allowed[ids] = False
        if not allowed.any():  # cannot happen with a real vocabulary; never leave the sampler empty-handed
            return self.masks["han"].clone()
        return allowed
