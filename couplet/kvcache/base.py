"""A mode is a composition: a storage format × a retention policy × a sharing policy.

Every mode is a small dataclass whose fields are its knobs, validated at construction. `compose()` says
what it is made of; one factory, `build_session`, builds the session for any composition:

    storage      full precision (`PlainStorage`) | int8 / int4 (`QuantizedPolicy`, `quantized.py`)
    retention    none | window | selective | snapkv | …  (`Retention` subclasses: knobs and one `score`)
    sharing      none | the prefix pool (`SharedPolicy`, `shared.py`)

`full` is (plain, none, none), `int4` (int4, none, none), `selective` (plain, selective, none), `combo`
(int8, none, prefix pool) by default, and (int8 or int4, selective keeping the prompt, prefix pool) when its
`ratio` is below 1. A policy that is one of the three parts is a mode on
its own: its `compose()` fills the other two with "plain" and "none".
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from couplet.kvcache.blocks import BlockCodec, PlainCodec
from couplet.kvcache.layer import KVGeometry
from couplet.kvcache.pool import PrefixPool
from couplet.kvcache.pool_protocol import LOSSY_RUN_BLOCKS
from couplet.kvcache.storage import PlainStore, Store

if TYPE_CHECKING:
    from couplet.kvcache.pool_protocol import Sharing
    from couplet.kvcache.retention import Retention


class Storage(Protocol):
    """A storage format: the per-layer store of a request's own rows, and the pool blocks' codec."""

    @property
    def residual(self) -> int: ...  # newest tokens kept at full precision

    def make_store(self) -> Store: ...
    def codec(self) -> BlockCodec: ...
    def row_bytes(self, head_dim: int, dtype_bytes: int) -> float: ...  # one head row of K or V, stored


class SharingPolicy(Protocol):
    block_size: int

    def sharing(self, model: Any, pool: PrefixPool | None, codec: BlockCodec) -> Sharing: ...


@dataclass(frozen=True)
class PlainStorage:
    """Keys and values at the model's dtype."""

    residual: ClassVar[int] = 0  # everything is at full precision; nothing extra

    def make_store(self) -> PlainStore:
        return PlainStore()

    def codec(self) -> PlainCodec:
        return PlainCodec()

    def row_bytes(self, head_dim: int, dtype_bytes: int) -> float:
        return head_dim * dtype_bytes


PLAIN = PlainStorage()


@dataclass(frozen=True)
class Composition:
    storage: Storage = PLAIN
    retention: Retention | None = None
    sharing: SharingPolicy | None = None

    @property
    def plain(self) -> bool:
        """Nothing compressed: transformers' DynamicCache itself (`build_session`)."""
        return isinstance(self.storage, PlainStorage) and self.retention is None and self.sharing is None

    def stored_token_bytes(self, geometry: KVGeometry) -> float:
        """What one token's keys and values take in this composition's storage format, all layers (a fraction of
        a byte per element for int4: codes and scales)."""
        return 2 * geometry.layers * geometry.kv_heads * self.storage.row_bytes(geometry.head_dim,
                                                                               geometry.dtype_bytes)

    def block_bytes(self, geometry: KVGeometry) -> int:
        """Bytes of one pool block in this composition's codec (all layers, keys and values); 0 without a
        pool. What `PrefixPool.lease` sets aside for a block not yet computed."""
        if self.sharing is None:
            return 0
        return math.ceil(self.sharing.block_size * self.stored_token_bytes(geometry))

    def attached_tokens(self, prompt: int) -> int:
        """The prompt's tokens in whole pool blocks (attached from the pool, or computed into it); 0 without a
        pool. At least one token is left to compute: its logits are the first next-token distribution."""
        if self.sharing is None:
            return 0
        bs = self.sharing.block_size
        return (prompt - 1) // bs * bs

    def scratch_tokens(self, prompt: int) -> int:
        """Tokens a prompt's missing pool blocks hold at full precision while they are computed (the scratch of
        `Sharing._compute_blocks`, per distinct prompt in a wave): a lossless pool's whole blocks in one
        forward, a lossy pool's runs of at most LOSSY_RUN_BLOCKS; 0 without a pool."""
        if self.sharing is None:
            return 0
        bs, whole = self.sharing.block_size, self.attached_tokens(prompt)
        if self.storage.codec().lossless:
            return whole
        return max(bs, min(whole, LOSSY_RUN_BLOCKS * bs))

    def owned_peak_bytes(self, prompt: int, total: int, geometry: KVGeometry,
                         shared_prefix: int | None = None, leased: bool = False) -> tuple[int, int]:
        """Upper bounds of the KV bytes a request owns (pool blocks aside: the pool keeps its own budget), for
        `prompt` tokens and `total` fed in all (as announced with `ModeSession.expect`): (during the prefill,
        from then on). What a serving engine admits by. `shared_prefix`: the prompt tokens every request in a
        batch shares (the house prefix); None: all of them (a request alone).

        The prefill may hold every prompt token at full precision until the forward ends (a retention policy
        evicts after the forward), unless the retention feeds it in chunks (`prefill_chunk`): then what one
        eviction keeps, plus a chunk, plus the pseudo decode tokens (`lookahead_tokens`). A quantized store
        quantizes a prefill layer by layer, so it holds the prompt in its format plus one layer at full precision.
        With a pool, the prompt's whole blocks are computed
        into it before the prefill (`Sharing._complete_chains`): a block the pool refuses (its byte budget)
        stays with the request, but in the store's format, so only the rest of the prompt — and the block
        being computed — are held at full precision; the bound assumes the pool refuses everything, unless
        `leased`: the pool has set room aside for the prompt's whole blocks (`PrefixPool.lease`, every row of
        the batch with this same prompt), so a row holds only the rest of its prompt. From then
        on a request holds what its retention keeps (budget, or the forced tokens if more) plus up to 2
        tokens fed before the next eviction, less the whole blocks of the shared prefix (a batch references
        only the blocks all its rows have), at its storage format's bytes (per-token layout), plus any
        full-precision residual."""
        per_token = self.stored_token_bytes(geometry)
        residual = self.storage.residual * geometry.token_bytes
        # a retention's pseudo decode tokens join the whole prompt before its eviction (`ModeSession._look_ahead`)
        prefill = (prompt + lookahead_tokens(self.retention, self.sharing is not None)) * geometry.token_bytes
        if per_token < geometry.token_bytes:  # a quantized store quantizes a prefill layer by layer
            layer = -(-prompt * geometry.token_bytes // geometry.layers)  # one layer's rows at full precision
            prefill = min(prefill, int(prompt * per_token + 0.999) + layer + residual)
        pooled = 0
        if self.sharing is not None:
            bs = self.sharing.block_size
            whole = self.attached_tokens(prompt)
            # and the blocks being computed, at full precision in the scratch (`scratch_tokens`)
            prefill = min(prefill, int(whole * per_token + 0.999) + self.scratch_tokens(prompt) * geometry.token_bytes
                          + residual)
            if leased:  # the pool takes every whole block; the scratch that computes them is the caller's
                prefill = (prompt - whole) * geometry.token_bytes + residual
            common = prompt - 1 if shared_prefix is None else min(prompt - 1, shared_prefix)
            pooled = common // bs * bs
        kept = total
        if self.retention is not None:
            r = self.retention
            forced = max(r.sinks, prompt if r.keep_prompt else 0) + r.recent
            kept = min(total, max(r.budget(total, total), forced) + 2)
        # `merge`: the merged slots' keys and values take their room from the budget (`keep_counts`); their
        # biases, one float32 per query head and layer, come on top
        merged = 4 * geometry.layers * (geometry.q_heads or geometry.kv_heads) \
            if self.retention is not None and self.retention.merge else 0
        chunk = prefill_chunk(self.retention, self.sharing is not None)
        if self.retention is not None and chunk and prompt > chunk:
            # a bounded prefill: what one eviction keeps, one chunk, the pseudo decode tokens
            ahead = lookahead_tokens(self.retention, False)
            prefill = min(prefill, (min(kept, prompt) + chunk + ahead) * geometry.token_bytes + merged)
        return prefill, int(max(kept - pooled, 0) * per_token + residual + merged + 0.999)


def prefill_chunk(retention: Retention | None, pooled: bool) -> int:
    """Tokens per forward of a bounded prefill (`Retention.chunk`; `prefill.bounded_prefill`): the prompt is
    fed a chunk at a time and evicted to the budget after each, as StreamingLLM and H2O do, so a request holds
    its budget plus one chunk instead of the whole prompt. 0 (the whole prompt in one forward) for a policy that
    evicts once after the prompt (`prefill_only`: SnapKV scores the prompt by its last queries), never evicts the
    prompt (`keep_prompt`) or keeps everything, and under a pool (the prompt's blocks come from it)."""
    if retention is None or pooled or retention.prefill_only or retention.keep_prompt or retention.ratio >= 1.0:
        return 0
    return retention.chunk


def lookahead_tokens(retention: Retention | None, pooled: bool) -> int:
    """Pseudo decode tokens a prefill feeds before the prompt's eviction (`ModeSession._look_ahead`): none without
    attention scores, when the prompt is never evicted (`keep_prompt`) or comes from a pool (`pooled`)."""
    if retention is None or not retention.uses_attention or retention.keep_prompt or pooled:
        return 0
    return retention.lookahead


def check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    """Raise ValueError unless `value` is an int in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {span}, got {value!r}")


def check_number(name: str, value: object, low: float, high: float) -> None:
    """Raise ValueError unless `value` is a number (int or float, not bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")


def check_ratio(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"ratio must be a number in (0, 1] (the share of tokens kept; 1.0 keeps all), got {value!r}")


def check_choice(name: str, value: object, valid: tuple) -> None:
    if value not in valid:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, valid))}; got {value!r}")


def check_bool(name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
