"""`selective`: keep the tokens the model actually attends to (H2O, Zhang et al. 2023, arXiv:2306.14048;
TOVA, Oren et al. 2024, arXiv:2401.06104), plus couplet structure through protected positions."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from couplet.kvcache.attention import install_attention
from couplet.kvcache.base import Policy, check_int, check_ratio
from couplet.kvcache.layer import CompressedCache, attention_layers
from couplet.kvcache.pool import PrefixPool
from couplet.kvcache.retention import Retention
from couplet.kvcache.session import ModeSession
from couplet.kvcache.storage import PlainStore


@dataclass
class SelectivePolicy(Retention, Policy):
    """Importance-based retention, re-evaluated after every forward.

    Score of a slot = attention it received (softmax probabilities recorded by the registered SDPA
    function, per KV head: the query heads of a GQA group averaged), summed over every real query that
    could see it, divided by how many could (seen - position): the mean attention paid to it, so early
    tokens do not win just by being old. Always kept: the first `sinks` tokens and the last `recent`;
    next, the positions the generation loop protects via `ModeSession.protect` (keywords, the 上联
    characters aligned with the 下联 character being written and their neighbours); then the best scores,
    up to max(floor, sinks + recent, ceil(ratio * expected)) tokens per row, `expected` being the request's
    whole length when the generation loop gives it (`ModeSession.expect`; else the tokens seen so far). Heads choose
    independently (H2O is per head); ratio=1.0 keeps everything. keep_prompt=True never evicts the prompt
    (the first forward's tokens): only generated tokens compete (what `combo` uses).
    """

    name: ClassVar[str] = "selective"
    ratio: float = 0.5
    sinks: int = 2
    recent: int = 2
    floor: int = 4
    keep_prompt: bool = False

    def __post_init__(self) -> None:
        check_ratio(self.ratio)
        check_int("sinks", self.sinks, 0)
        check_int("recent", self.recent, 1)
        check_int("floor", self.floor, 1)
        if not isinstance(self.keep_prompt, bool):
            raise ValueError(f"keep_prompt must be True or False, got {self.keep_prompt!r}")

    def score(self, pos: torch.Tensor, acc: torch.Tensor | None, seen: torch.Tensor) -> torch.Tensor:
        assert acc is not None
        viewers = (seen - pos.float()).clamp(min=1.0)  # real queries that could see each slot
        return torch.where(pos >= 0, acc / viewers, 0.0)

    def make_cache(self, model: Any, make_store: Any = PlainStore) -> CompressedCache:
        return CompressedCache(attention_layers(model), make_store, wants_scores=True)

    def new_session(self, model: Any, pool: PrefixPool | None = None) -> ModeSession:
        install_attention(model)
        return ModeSession(self.name, model, self.make_cache(model), retention=self)


def couplet_protection(keywords: Iterable[int], upper_start: int, upper_len: int, lower_index: int,
                       neighbours: int = 1, ahead: bool = True) -> list[int]:
    """Logical positions worth protecting while the 下联 character `lower_index` (0-based) is written.

    keywords: positions of the keyword tokens; upper_start: position of the first 上联 character;
    upper_len: characters per line. Protects the keywords and the aligned 上联 character ± `neighbours`;
    with `ahead`, also every 上联 character still to be matched (evicted tokens never come back, so a
    character needed two steps later must survive this step's eviction). Protection competes within the
    budget: when it does not all fit, the protected tokens with the most attention stay.
    """
    first = max(lower_index - neighbours, 0)
    last = upper_len - 1 if ahead else min(lower_index + neighbours, upper_len - 1)
    return sorted({*keywords, *range(upper_start + first, upper_start + last + 1)})
