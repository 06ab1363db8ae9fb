"""`full`: the uncompressed baseline — transformers' DynamicCache, with byte accounting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from couplet.kvcache.base import Composition
from couplet.kvcache.policy import Policy


@dataclass
class FullPolicy(Policy):
    """Keep every token at full precision (the reference every other mode is measured against)."""

    name: ClassVar[str] = "full"

    def compose(self) -> Composition:
        return Composition()
