"""`full`: the uncompressed baseline — transformers' DynamicCache, with byte accounting."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from couplet.kvcache.attention import install_attention
from couplet.kvcache.base import Policy
from couplet.kvcache.layer import FullCache
from couplet.kvcache.pool import PrefixPool
from couplet.kvcache.session import ModeSession


@dataclass
class FullPolicy(Policy):
    """Keep every token at full precision (the reference every other mode is measured against)."""

    name: ClassVar[str] = "full"

    def new_session(self, model: Any, pool: PrefixPool | None = None) -> ModeSession:
        install_attention(model)
        return ModeSession(self.name, model, FullCache(config=model.config))
