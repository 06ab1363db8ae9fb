"""`shared`: the prompt's KV comes from the process-wide prefix pool (vLLM automatic prefix caching /
SGLang RadixAttention); the request owns only its suffix. The protocol is `pool_protocol.py`'s."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from couplet.kvcache.base import Composition, check_int
from couplet.kvcache.blocks import BlockCodec
from couplet.kvcache.policy import Policy
from couplet.kvcache.pool import PrefixPool, default_pool
from couplet.kvcache.pool_protocol import Sharing, model_namespace


@dataclass
class SharedPolicy(Policy):
    """Prompt blocks of `block_size` tokens are looked up by hash chain on the first forward and referenced
    (read-only) instead of recomputed; new whole blocks are published for later requests. The default 8
    suits the long prompt (`couplet.writing.prompt`: a 301-token house prefix, then ~100 tokens of exemplars): 37
    whole blocks (296 tokens) of house prefix are shared by every visitor, so a visitor with other keywords
    computes ~29% of a 415-token prompt (16-token blocks, vLLM's default, would share 288 and leave 31%),
    and a cold pool computes each distinct run of missing blocks once per wave (`Sharing._complete_chains`).
    Pool: the one passed to `new_session`, else `default_pool()`."""

    name: ClassVar[str] = "shared"
    block_size: int = 8

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size, 1)

    def compose(self) -> Composition:
        return Composition(sharing=self)

    def sharing(self, model: Any, pool: PrefixPool | None, codec: BlockCodec) -> Sharing:
        return Sharing(pool if pool is not None else default_pool(), self.block_size, codec,
                       model_namespace(model, codec, self.block_size))
