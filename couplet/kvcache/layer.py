"""transformers cache classes: `CompressedLayer` (one per model layer) inside a `CompressedCache`, and
`FullCache`, the uncompressed baseline (transformers' own DynamicCache, plus byte accounting).

A `CompressedLayer` stores, per layer, optionally a read-only prefix of pool blocks (never evicted) and
its own slots in a `Store` (full precision or quantized). The cache's `SlotMeta` holds, for all layers at
once, each owned slot's logical position (-1 for padding and filler) and, when a retention policy scores
by attention, the attention it has received so far.

Logical ≠ physical (DESIGN §3.1), as in `DynamicSlidingWindowLayer`: `get_seq_length()` is the number of
columns fed (the logical length; for one unpadded sequence, the tokens seen), and `get_mask_sizes(q)` is
`(stored + q, logical - stored)`. transformers' own mask builder is then exactly right: every stored slot
precedes every new query, so only its validity matters, whatever order or gaps eviction left. With
nothing invalid the session passes no mask (plain causal over the stored slots + the new ones); with
padding or filler it passes a 2-D mask of zeros for the `logical - stored` columns no longer held, one
flag per stored slot, then the new tokens. Slot order is free; validity is per (row, slot) and the same
for every head and layer (eviction keeps the same number of slots per row in every head, filler at the
same slots), so no per-head mask is ever needed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

from couplet.kvcache.storage import BlockCodec, QuantStore, Store, storage_bytes


def attention_layers(model: Any) -> int:
    """Number of layers; compressed caches support full-attention layers only."""
    config = model.config.get_text_config()
    kinds = set(getattr(config, "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise ValueError(f"compressed caches support full-attention layers only; this model has {sorted(kinds)}")
    return int(config.num_hidden_layers)


class SlotMeta:
    """Bookkeeping per owned slot, for all layers at once (one op per step instead of one per layer):
    `pos` (layers, batch, kv_heads, slots) int32 logical positions, -1 for padding and filler; `score`
    (same shape) float32 attention received so far, when the retention policy scores by attention, each
    forward's attention added after the older sum is multiplied by `decay` (1.0: a plain sum, H2O; 0.0: only
    the latest forward's, TOVA)."""

    def __init__(self, num_layers: int, wants_scores: bool, enabled: bool = True, decay: float = 1.0) -> None:
        self.num_layers, self.wants_scores, self.enabled, self.decay = num_layers, wants_scores, enabled, decay
        self.pos: torch.Tensor | None = None
        self.score: torch.Tensor | None = None
        self.pending: torch.Tensor | None = None  # (batch, q) int32 positions of the tokens being fed
        self.received: list[tuple[int, torch.Tensor]] = []  # this forward's attention per layer, not yet added

    @property
    def length(self) -> int:
        return 0 if self.pos is None else self.pos.shape[-1]

    def sync(self, length: int, batch: int, heads: int, device: torch.device) -> None:
        """Called by each layer after storing: append the new tokens' positions once (the first layer)."""
        q = length - self.length
        if q <= 0 or not self.enabled:
            return
        new = self.pending
        if new is None or new.shape[-1] != q:  # a bare forward outside a session: contiguous positions
            start = 0 if self.pos is None else int(self.pos[0, 0, 0].max()) + 1
            new = torch.arange(start, start + q, dtype=torch.int32, device=device).expand(batch, q)
        new = new[None, :, None, :].expand(self.num_layers, batch, heads, q)
        self.pos = new.contiguous() if self.pos is None else torch.cat([self.pos, new], dim=-1)
        if self.wants_scores:
            zeros = torch.zeros(new.shape, dtype=torch.float32, device=device)
            self.score = zeros if self.score is None else torch.cat([self.score, zeros], dim=-1)
        self.pending = None

    def add_received(self) -> None:
        """Add the attention the layers recorded during the forward: one add for all layers when all recorded."""
        received, self.received = self.received, []
        if self.score is None or not received:
            return
        if self.decay != 1.0:
            self.score.mul_(self.decay)
        if [i for i, _ in received] == list(range(self.num_layers)):
            self.score += torch.stack([t for _, t in received])
        else:
            for i, t in received:
                self.score[i].add_(t)

    def gather(self, index: torch.Tensor, filler: torch.Tensor) -> None:
        """index (layers, batch, heads, kept), filler (batch, kept) bool: slots holding no token."""
        if self.pos is None:
            return
        self.pos = self.pos.gather(3, index).masked_fill_(filler[None, :, None, :], -1)
        if self.score is not None:
            self.score = self.score.gather(3, index).masked_fill_(filler[None, :, None, :], 0.0)

    def nbytes(self) -> int:
        return storage_bytes([t for t in (self.pos, self.score) if t is not None])


class CompressedLayer(DynamicLayer):
    """One layer's cache: optional shared prefix + own `Store`; slot positions/scores live in `SlotMeta`."""

    is_croppable = False

    def __init__(self, make_store: Callable[[], Store], meta: SlotMeta, index: int) -> None:
        super().__init__()
        self.make_store, self.meta, self.index = make_store, meta, index
        self.wants_scores = meta.wants_scores
        self._clear()

    def _clear(self) -> None:
        self.store: Store = self.make_store()
        self.prefix_rows: list[list[tuple]] | None = None  # per batch row, this layer's pool payloads in order
        self.prefix_codec: BlockCodec | None = None
        self.prefix_len = 0
        self.cumulative_length = 0
        self.pending_valid: torch.Tensor | None = None  # (batch, q) bool, None = all real
        self.keep_fresh = False  # keep the next update's raw rows (the session publishes prompt blocks from them)
        self.fresh: tuple[torch.Tensor, torch.Tensor] | None = None
        self.token_nbytes = 0  # what one token costs uncompressed in this layer: 2 * kv_heads * head_dim * dtype

    @property
    def pos(self) -> torch.Tensor | None:
        """(batch, kv_heads, owned) logical positions of this layer's owned slots (a view)."""
        return None if self.meta.pos is None else self.meta.pos[self.index]

    @property
    def score(self) -> torch.Tensor | None:
        return None if self.meta.score is None else self.meta.score[self.index]

    # ---- transformers' layer API ----
    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self.token_nbytes = 2 * key_states.shape[1] * key_states.shape[-1] * key_states.element_size()
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
               **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
        """Store (batch, kv_heads, q, head_dim) new rows; return [prefix, own rows, new rows] for attention."""
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        if self.keep_fresh:
            self.fresh = (key_states, value_states)
        prefix = None
        if self.prefix_len:  # the pool's rows in the store's own format: the store decodes them with its own
            assert self.prefix_rows is not None and self.prefix_codec is not None
            prefix = self.prefix_codec.batch(self.prefix_rows, self.prefix_len)
        keys, values = self.store.update(key_states, value_states, self.pending_valid, prefix)
        self.meta.sync(self.store.length, key_states.shape[0], key_states.shape[1], key_states.device)
        self.cumulative_length += key_states.shape[-2]
        return keys, values

    @property
    def stored_length(self) -> int:
        return self.prefix_len + self.store.length

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.stored_length + query_length, self.cumulative_length - self.stored_length

    def get_max_length(self) -> int:
        return -1

    def reset(self) -> None:
        raise NotImplementedError("start a new session instead of resetting a compressed cache")

    def crop(self, tokens_to_remove: int) -> None:
        raise NotImplementedError("a compressed cache cannot be cropped: evicted tokens are gone")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        raise NotImplementedError("beam search is not supported by compressed caches")

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("batch expansion is not supported by compressed caches")

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        raise NotImplementedError("batch selection is not supported by compressed caches")

    def offload(self) -> None:  # storage is already compact; offloading is not supported
        pass

    def prefetch(self) -> None:
        pass

    # ---- compression API used by the session ----
    def prefix_kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The shared prefix as (batch, kv_heads, prefix_len, head_dim), a transient copy for attention."""
        assert self.prefix_rows is not None and self.prefix_codec is not None
        rows = [self.prefix_codec.decode(payloads, self.dtype) for payloads in self.prefix_rows]
        if len(rows) == 1:
            return rows[0][0][None], rows[0][1][None]
        return torch.stack([k for k, _ in rows]), torch.stack([v for _, v in rows])

    def materialize(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """Every stored slot (prefix, then owned) at full precision, as attention sees it: (batch, kv_heads,
        stored, head_dim) each, a transient copy; None when empty."""
        own = self.store.kv()
        if not self.prefix_len:
            return own
        pk, pv = self.prefix_kv()
        return (pk, pv) if own is None else (torch.cat([pk, own[0]], dim=-2), torch.cat([pv, own[1]], dim=-2))

    def set_prefix(self, rows: list[list[tuple]], codec: BlockCodec, length: int) -> None:
        self.prefix_rows, self.prefix_codec, self.prefix_len = rows, codec, length

    def record(self, scores: torch.Tensor) -> None:
        """Add (batch, kv_heads, prefix + owned) attention received (the prefix part is never evicted) — after
        the forward, with every layer's (`SlotMeta.add_received`)."""
        if self.meta.score is not None:  # added for all layers at once after the forward (`CompressedCache.flush`)
            self.meta.received.append((self.index, scores[..., self.prefix_len:]))

    def kv_nbytes(self) -> int:
        return self.store.nbytes()


class CompressedCache(Cache):
    """A transformers `Cache` of `CompressedLayer`s, one per model layer, sharing one `SlotMeta`."""

    def __init__(self, num_layers: int, make_store: Callable[[], Store], wants_scores: bool = False,
                 track_positions: bool = True, score_decay: float = 1.0) -> None:
        """`track_positions`: keep `SlotMeta` (needed by retention; modes that never evict skip it);
        `score_decay`: `SlotMeta.decay`."""
        self.meta = SlotMeta(num_layers, wants_scores, enabled=track_positions or wants_scores, decay=score_decay)
        self.compressed = [CompressedLayer(make_store, self.meta, i) for i in range(num_layers)]
        super().__init__(layers=list(self.compressed))  # the same layer objects, typed for this package

    def begin(self, positions: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Positions (batch, q) int32 (-1 for padding) and validity of the tokens about to be fed."""
        self.meta.pending = positions
        self.meta.received = []
        for layer in self.compressed:
            layer.pending_valid = valid

    def load(self, rows: list[Any], positions: torch.Tensor, heads: int) -> None:
        """Fill the empty stores with rows already in their format (one entry per layer, `BlockCodec.batch`) at
        logical `positions` (batch, slots) int32, -1 for filler; they count as columns fed."""
        for layer, layer_rows in zip(self.compressed, rows, strict=True):
            layer.store.load(layer_rows)
            layer.cumulative_length += positions.shape[-1]
        self.meta.pending = positions
        self.meta.sync(positions.shape[-1], positions.shape[0], heads, positions.device)

    def evict(self, index: torch.Tensor, filler: torch.Tensor, tail_pinned: bool) -> None:
        """Keep owned slots `index` (layers, batch, kv_heads, kept) in every layer; `filler` (batch, kept) bool
        marks slots that hold no token (rows keeping fewer than `kept`): position -1, masked."""
        for layer, layer_index in zip(self.compressed, index.unbind(0), strict=True):
            layer.store.gather(layer_index, tail_pinned)
        self.meta.gather(index, filler)

    def flush(self) -> None:
        """After a forward: add the attention recorded, and let quantized stores quantize what left their
        residual (all layers at once)."""
        self.meta.add_received()
        stores = [layer.store for layer in self.compressed]
        if all(isinstance(s, QuantStore) for s in stores):
            QuantStore.flush_all(stores)  # type: ignore[arg-type]

    @property
    def stored_length(self) -> int:
        return self.compressed[0].stored_length

    def kv_nbytes(self) -> int:
        return sum(layer.kv_nbytes() for layer in self.compressed)

    def token_bytes(self) -> int:
        """Bytes one token costs in an uncompressed cache (all layers, keys + values, model dtype)."""
        return sum(layer.token_nbytes for layer in self.compressed)

    def meta_nbytes(self) -> int:
        return self.meta.nbytes()


class FullCache(DynamicCache):
    """The baseline: transformers' DynamicCache unchanged, plus the byte accounting sessions report."""

    def begin(self, positions: torch.Tensor, valid: torch.Tensor | None) -> None:
        pass

    def flush(self) -> None:
        pass

    @property
    def stored_length(self) -> int:
        return self.get_seq_length()

    def _keys_values(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for layer in self.layers:
            k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
            if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dim() == 4:
                out.append((k, v))
        return out

    def kv_nbytes(self) -> int:
        return storage_bytes([t for kv in self._keys_values() for t in kv])

    def meta_nbytes(self) -> int:
        return 0

    def token_bytes(self) -> int:
        return sum(2 * k.shape[1] * k.shape[-1] * k.element_size() for k, _ in self._keys_values())
