"""`snapkv`: compress the prompt once, right after the prefill (SnapKV, Li et al. 2024, arXiv:2404.14469;
kvpress's `SnapKVPress`).

Every prompt token is scored by the attention the last `recent` prompt tokens (the observation window) pay
it, averaged over each KV head's query heads and max-pooled over `kernel` neighbouring positions so that a
kept token brings its neighbours (the paper's clustering). Each head keeps its top tokens plus the window;
decoding then runs normally, keeping every generated token. The cut is sized so the request ends at the
same budget as `selective` and `window`: `ratio` of its whole length (prompt + everything decoded), all of
the saving taken from the prompt at once. Without a length hint (`ModeSession.expect`) the budget is
`ratio` of the tokens seen, like the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from couplet.kvcache.base import check_int
from couplet.kvcache.policy import Policy
from couplet.kvcache.retention import Retention, ScoreView


@dataclass
class SnapKVPolicy(Retention, Policy):
    name: ClassVar[str] = "snapkv"
    ratio: float = 0.5
    recent: int = 8  # the observation window: the prompt's last tokens, kept, whose attention scores the rest
    kernel: int = 5  # max-pooling width over neighbouring positions (odd)
    floor: int = 4
    sinks: int = 0
    merge: bool = False  # fold the evicted tokens into one slot per query head (`retention.merge_evicted`)
    uses_attention: ClassVar[bool] = True
    prefill_only: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("recent", self.recent, 1)
        check_int("kernel", self.kernel, 1)
        if self.kernel % 2 == 0:
            raise ValueError(f"kernel must be odd (centred pooling), got {self.kernel}")

    @property
    def observe(self) -> int:  # attention is recorded from the window's queries only
        return self.recent

    def budget(self, seen: int, expected: int | None = None) -> int:
        if expected is None or self.ratio >= 1.0:
            return super().budget(seen, expected)
        cap = max(self.floor, self.sinks + self.recent, math.ceil(self.ratio * max(expected, 1)))
        # room for every token still to come: they are all kept, so the prompt alone pays for the cut
        return min(seen, max(self.sinks + self.recent, cap - max(expected - seen, 0)))

    def score(self, view: ScoreView) -> torch.Tensor:
        assert view.attention is not None
        n, b, h, s = view.attention.shape
        share = view.attention / self.recent  # mean attention of a window query, in [0, 1]
        pooled = F.max_pool1d(share.reshape(n * b * h, 1, s), self.kernel, stride=1, padding=self.kernel // 2)
        return pooled.view(n, b, h, s)
