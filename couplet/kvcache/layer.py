"""transformers cache classes: `CompressedLayer` (one per model layer) inside a `CompressedCache`. The
uncompressed baseline, `FullCache`, is in `dense.py`.

A `CompressedLayer` stores, per layer, optionally a read-only prefix of pool blocks (never evicted) and
its own slots in a `Store` (full precision or quantized). The cache's `SlotMeta` holds, once for all
layers, the logical length (columns fed), each owned slot's logical position and, when a retention
policy scores by attention, the attention it has received so far. Which slots hold a real token (not
padding or filler) is the session's, per row (`RowState.valid`).

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
from dataclasses import dataclass
from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer

from couplet.kvcache.blocks import BlockCodec
from couplet.kvcache.quant_store import QuantStore
from couplet.kvcache.storage import Store, pad_slots, storage_bytes


@dataclass(frozen=True)
class KVGeometry:
    """What one token's keys and values take in a model: `token_bytes` uncompressed, all layers."""

    layers: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    q_heads: int = 0  # query heads (0: as many as kv_heads); a merged slot's bias is kept per query head

    @property
    def token_bytes(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.dtype_bytes

    @classmethod
    def of(cls, model: Any) -> KVGeometry:
        config = model.config.get_text_config()
        heads = config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or heads
        # T5 names the head size d_kv (not always hidden / heads), and the cache is its decoder's
        head_dim = getattr(config, "head_dim", None) or getattr(config, "d_kv", None) or config.hidden_size // heads
        layers = getattr(config, "num_decoder_layers", None) or config.num_hidden_layers
        return cls(layers, kv_heads, head_dim, next(model.parameters()).element_size(), heads)


def attention_layers(model: Any) -> KVGeometry:
    """The model's KV geometry; compressed caches support full-attention layers only."""
    kinds = set(getattr(model.config.get_text_config(), "layer_types", None) or ["full_attention"])
    if kinds != {"full_attention"}:
        raise ValueError(f"compressed caches support full-attention layers only; this model has {sorted(kinds)}")
    return KVGeometry.of(model)


class SlotMeta:
    """What all layers share, kept once: `columns`, the logical length (columns fed: tokens seen, padding
    included); per owned slot `pos` (layers, batch, kv_heads, slots) int32 logical positions (filler slots:
    any value — validity is the session's, per row); and `score` (same shape) float32 attention received so
    far when the retention policy scores by attention, each forward's attention added after the older sum is
    multiplied by `decay` (1.0: a plain sum, H2O; 0.0: only the latest forward's, TOVA). Positions are kept
    only when `enabled` (modes that never evict skip them)."""

    def __init__(self, num_layers: int, kv_heads: int, wants_scores: bool, enabled: bool = True,
                 decay: float = 1.0) -> None:
        self.num_layers, self.kv_heads, self.wants_scores = num_layers, kv_heads, wants_scores
        self.enabled, self.decay = enabled, decay
        self.columns = 0
        self.device: torch.device | None = None
        self.pos: torch.Tensor | None = None
        self.score: torch.Tensor | None = None
        self.received: list[tuple[int, torch.Tensor]] = []  # this forward's attention per layer, not yet added
        self.new_valid: torch.Tensor | None = None  # (batch, q) bool of the tokens being fed; None = all real
        self.cascade = False  # attend the rows' common prefix once (`CompressedLayer.cascading`); set by the session

    def append(self, positions: torch.Tensor) -> None:
        """New owned slots at logical `positions` (batch, q) int32, in every layer and head."""
        self.device = positions.device
        self._add(positions, front=False)

    def prepend(self, positions: torch.Tensor) -> None:
        """Owned slots at logical `positions` (batch, n) int32 before those held (scores 0)."""
        self._add(positions, front=True)

    def _add(self, positions: torch.Tensor, front: bool) -> None:
        """Slots at `positions` after (or before) those held, in every layer and head; their scores 0."""
        if not self.enabled:
            return
        b, q = positions.shape
        new = positions[None, :, None, :].expand(self.num_layers, b, self.kv_heads, q)

        def put(held: torch.Tensor | None, added: torch.Tensor) -> torch.Tensor:
            return added.contiguous() if held is None else torch.cat([added, held] if front else [held, added], -1)

        self.pos = put(self.pos, new)
        if self.wants_scores:
            self.score = put(self.score, torch.zeros(new.shape, dtype=torch.float32, device=positions.device))

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

    def gather(self, index: torch.Tensor) -> None:
        """index (layers, batch, heads, kept)."""
        if self.pos is None:
            return
        self.pos = self.pos.gather(3, index)
        if self.score is not None:
            self.score = self.score.gather(3, index)

    def append_rows(self, other: SlotMeta, width: int) -> None:
        """`other`'s rows after these, both left-padded to `width` owned slots (positions and scores 0: filler)."""
        self.columns = max(self.columns, other.columns)
        if self.pos is not None and other.pos is not None:
            self.pos = torch.cat([pad_slots(self.pos, width, -1), pad_slots(other.pos, width, -1)], dim=1)
        if self.score is not None and other.score is not None:
            self.score = torch.cat([pad_slots(self.score, width, -1), pad_slots(other.score, width, -1)], dim=1)

    def keep_rows(self, rows: torch.Tensor, trim: int) -> None:
        if self.pos is not None:
            self.pos = self.pos[:, rows, :, trim:].contiguous()
        if self.score is not None:
            self.score = self.score[:, rows, :, trim:].contiguous()




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
        self.token_nbytes = 0  # what one token costs uncompressed in this layer: 2 * kv_heads * head_dim * dtype
        self.common_blocks = 0  # leading prefix blocks that are the same pool blocks in every row
        self.common_len = 0  # their tokens: attended once for the whole batch when `meta.cascade` (see `update`)
        # this forward's common prefix, (kv_heads, common_len, head_dim) keys and values, for the attention function
        # (which takes it: set in `update`, gone once this layer has attended)
        self.cascade_kv: tuple[torch.Tensor, torch.Tensor] | None = None
        # A retention policy's `merge`: the evicted tokens folded into one slot per query head, attended after the
        # owned slots (`attention.with_merged_slot`): keys, values (batch, kv_heads, groups, head_dim), bias
        # (batch, q_heads). The attention function leaves the last query (scaled) and its logits for the merge.
        self.merging = False
        self.merged: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        self.last_query: torch.Tensor | None = None  # (batch, q_heads, head_dim)
        self.last_logits: torch.Tensor | None = None  # (batch, q_heads, owned + groups)
        # A lossy pool's run of missing blocks computed in one forward (`Sharing._compute_blocks`): each block's
        # queries attend to the blocks before it in the run as the pool will store them (`codec`, blocks of
        # `block_size`), and to their own block at full precision (`attention.with_requantized_run`).
        self.requantized_run: tuple[BlockCodec, int] | None = None

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
        prefix, self.cascade_kv = None, None
        if self.prefix_len:  # the pool's rows in the store's own format: the store decodes them with its own
            assert self.prefix_rows is not None and self.prefix_codec is not None
            rows, width = self.prefix_rows, self.prefix_len
            if self.cascading:
                # Cascade attention (FlashInfer's shared-prefix decoding): the blocks every row shares are
                # decoded once, not once per row, and attended by all the rows' queries together
                # (`attention.cascade_attention`); only the rest is returned, per row, for the usual path.
                self.cascade_kv = self.prefix_codec.decode(rows[0][: self.common_blocks], key_states.dtype)
                rows = [row[self.common_blocks:] for row in rows]
                width -= self.common_len
            if width:
                prefix = self.prefix_codec.batch(rows, width)
        return self.store.update(key_states, value_states, self.meta.new_valid, prefix)

    @property
    def cascading(self) -> bool:
        """This forward attends the common prefix once for the batch (a session with more than one row turned it
        on: `SlotMeta.cascade`); the returned keys and values, and the mask, then cover the rest only."""
        return self.meta.cascade and self.common_len > 0

    @property
    def stored_length(self) -> int:
        return self.prefix_len + self.store.length

    def get_seq_length(self) -> int:
        return self.meta.columns

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        attended = self.stored_length - (self.common_len if self.cascading else 0)  # per row, besides the cascade
        return attended + query_length, self.meta.columns - attended

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
    def set_prefix(self, rows: list[list[tuple]], codec: BlockCodec, length: int) -> None:
        self.prefix_rows, self.prefix_codec, self.prefix_len = rows, codec, length
        common = 0  # the same payload objects in every row: the same pool blocks
        while common < min(len(row) for row in rows) and all(row[common] is rows[0][common] for row in rows):
            common += 1
        self.common_blocks = common
        self.common_len = length * common // len(rows[0]) if rows[0] else 0  # blocks are of one size

    def record(self, scores: torch.Tensor) -> None:
        """Add (batch, kv_heads, prefix + owned) attention received — the prefix part (the part of it `update`
        returned) is never evicted and is dropped here — after the forward, with every layer's
        (`SlotMeta.add_received`)."""
        if self.meta.score is not None:  # added for all layers at once after the forward (`CompressedCache.flush`)
            prefix = self.prefix_len - (self.common_len if self.cascading else 0)
            self.meta.received.append((self.index, scores[..., prefix:]))

    def kv_nbytes(self) -> int:
        return self.store.nbytes() + (storage_bytes(list(self.merged)) if self.merged is not None else 0)


class CompressedCache(Cache):
    """A transformers `Cache` of `CompressedLayer`s, one per model layer, sharing one `SlotMeta`."""

    def __init__(self, geometry: KVGeometry, make_store: Callable[[], Store], wants_scores: bool = False,
                 track_positions: bool = True, score_decay: float = 1.0) -> None:
        """geometry: `attention_layers(model)`; `track_positions`: keep slot positions
        (needed by retention; modes that never evict skip them); `score_decay`: `SlotMeta.decay`."""
        self.geometry = geometry
        layers, heads = geometry.layers, geometry.kv_heads
        self.meta = SlotMeta(layers, heads, wants_scores, enabled=track_positions or wants_scores, decay=score_decay)
        self.compressed = [CompressedLayer(make_store, self.meta, i) for i in range(layers)]
        super().__init__(layers=list(self.compressed))  # the same layer objects, typed for this package
        self._feeding = 0
        self.merged_slots = 0  # with a retention policy's `merge`: its slots per KV head (the query heads it serves)

    def begin(self, positions: torch.Tensor, valid: torch.Tensor | None) -> None:
        """Positions (batch, q) int32 (-1 for padding) and validity of the tokens about to be fed."""
        self.meta.append(positions)
        self.meta.new_valid = valid
        self.meta.received = []
        self._feeding = positions.shape[-1]

    def flush(self) -> None:
        """After a forward: the columns fed count, the attention recorded is added, and quantized stores
        quantize what left their residual (all layers at once)."""
        self.meta.columns += self._feeding
        self._feeding = 0
        self.meta.add_received()
        stores = [layer.store for layer in self.compressed]
        if all(isinstance(s, QuantStore) for s in stores):
            QuantStore.flush_all(stores)  # type: ignore[arg-type]

    def load(self, rows: list[Any], positions: torch.Tensor) -> None:
        """Fill the empty stores with rows already in their format (one entry per layer, `BlockCodec.batch`) at
        logical `positions` (batch, slots) int32 (filler: any); they count as columns fed."""
        for layer, layer_rows in zip(self.compressed, rows, strict=True):
            layer.store.load(layer_rows)
        self.meta.append(positions)
        self.meta.columns += positions.shape[-1]

    def evict(self, index: torch.Tensor, keep_residual: bool) -> None:
        """Keep owned slots `index` (layers, batch, kv_heads, kept) in every layer (`Store.gather`)."""
        for layer, layer_index in zip(self.compressed, index.unbind(0), strict=True):
            layer.store.gather(layer_index, keep_residual)
        self.meta.gather(index)

    @property
    def stored_length(self) -> int:
        return self.compressed[0].stored_length

    @property
    def prefix_len(self) -> int:
        return self.compressed[0].prefix_len

    def kv_nbytes(self) -> int:
        return sum(layer.kv_nbytes() for layer in self.compressed)

    def token_bytes(self) -> int:
        """Bytes one token costs in an uncompressed cache (all layers, keys + values, model dtype)."""
        return sum(layer.token_nbytes for layer in self.compressed)

    # ---- a running batch's rows (continuous batching: `ModeSession.join` and `drop`) ----
    def can_append(self, other: CompressedCache, prefix: bool = True) -> bool:
        """Whether `other`'s rows can follow these (`append_rows`): stores that join, one prefix length (unless
        `prefix` is False: a pool's join shortens the longer first, `Sharing.join`)."""
        return ((self.prefix_len == other.prefix_len or not prefix) and self.merged_slots == other.merged_slots
                and all(a.store.can_append(b.store) for a, b in zip(self.compressed, other.compressed, strict=True)))

    def append_rows(self, other: CompressedCache, batches: tuple[int, int]) -> int:
        """`other`'s rows after these (`can_append`; `batches`: how many rows each holds), every layer's owned
        slots left-padded to the longer's (the session marks the padding invalid); returns that width. The prefix
        keeps its length: each row its own blocks (the common ones, attended once, recomputed). Merged slots: a
        row that has none gets zero keys and a bias of -inf (it stands for nothing, as `merge_evicted` leaves
        it)."""
        width = max(self.compressed[0].store.length, other.compressed[0].store.length)
        for mine, theirs in zip(self.compressed, other.compressed, strict=True):
            mine.store.append_rows(theirs.store)
            if mine.merged is not None or theirs.merged is not None:
                ref = mine.merged if mine.merged is not None else theirs.merged
                assert ref is not None
                a, b = (m if m is not None else _no_merged(ref, n) for m, n in (
                    (mine.merged, batches[0]), (theirs.merged, batches[1])))
                mine.merged = tuple(torch.cat([x, y]) for x, y in zip(a, b, strict=True))  # type: ignore[assignment]
            if mine.prefix_len:
                assert mine.prefix_rows is not None and theirs.prefix_rows is not None and mine.prefix_codec
                mine.set_prefix(mine.prefix_rows + theirs.prefix_rows, mine.prefix_codec, mine.prefix_len)
            mine.last_query = mine.last_logits = None  # the next forward's, before any eviction reads them
        self.meta.append_rows(other.meta, width)
        return width

    def keep_rows(self, rows: torch.Tensor, trim: int) -> None:
        """Keep these rows (indices), without their first `trim` owned slots."""
        kept = rows.tolist()
        for layer in self.compressed:
            layer.store.keep_rows(rows, trim)
            if layer.merged is not None:
                layer.merged = tuple(t[rows] for t in layer.merged)  # type: ignore[assignment]
            if layer.prefix_len:
                assert layer.prefix_rows is not None and layer.prefix_codec is not None
                layer.set_prefix([layer.prefix_rows[r] for r in kept], layer.prefix_codec, layer.prefix_len)
            layer.last_query = layer.last_logits = None
        self.meta.keep_rows(rows, trim)

    def prepend(self, rows: list[Any], positions: torch.Tensor) -> None:
        """Rows in the stores' format (one entry per layer, `BlockCodec.batch`) before the owned slots, at logical
        `positions` (batch, n) int32: pool blocks a row now holds as its own (`Sharing.join`)."""
        for layer, layer_rows in zip(self.compressed, rows, strict=True):
            layer.store.prepend(layer_rows)
        self.meta.prepend(positions)


def _no_merged(like: tuple[torch.Tensor, torch.Tensor, torch.Tensor], batch: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Merged slots for `batch` rows that have merged nothing: zero keys and values, bias -inf."""
    k, v, bias = like
    return (k.new_zeros((batch, *k.shape[1:])), v.new_zeros((batch, *v.shape[1:])),
            bias.new_full((batch, *bias.shape[1:]), float("-inf")))
