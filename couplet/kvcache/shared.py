"""`shared`: the prompt's KV comes from the process-wide prefix pool (vLLM automatic prefix caching /
SGLang RadixAttention); the request owns only its suffix."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from couplet.kvcache.attention import install_attention
from couplet.kvcache.base import Policy, check_int
from couplet.kvcache.layer import CompressedCache, attention_layers
from couplet.kvcache.pool import PrefixPool, default_pool
from couplet.kvcache.session import ModeSession, Sharing, model_namespace
from couplet.kvcache.storage import BlockCodec, PlainCodec, PlainStore


@dataclass
class SharedPolicy(Policy):
    """Prompt blocks of `block_size` tokens are looked up by hash chain on the first forward and referenced
    (read-only) instead of recomputed; new full blocks are published for later requests. The default 2
    suits couplet prompts (`<bos> <L7> keywords <sep>`, 3-12 tokens): `<bos> <L7>` is one block every
    couplet of that length shares. Pool: the one passed to `new_session`, else `default_pool()`."""

    name: ClassVar[str] = "shared"
    block_size: int = 2

    def __post_init__(self) -> None:
        check_int("block_size", self.block_size, 1)

    def sharing(self, model: Any, pool: PrefixPool | None, codec: BlockCodec) -> Sharing:
        return Sharing(pool if pool is not None else default_pool(), self.block_size, codec,
                       model_namespace(model, codec, self.block_size))

    def new_session(self, model: Any, pool: PrefixPool | None = None) -> ModeSession:
        install_attention(model)
        cache = CompressedCache(attention_layers(model), PlainStore, track_positions=False)
        return ModeSession(self.name, model, cache, sharing=self.sharing(model, pool, PlainCodec()))
