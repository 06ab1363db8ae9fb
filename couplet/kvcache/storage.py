"""Per-layer storage of a request's own KV rows: the `Store` protocol, full precision (`PlainStore`) here, quantized
(`QuantStore`) in `quant_store.py`.

Storage is apart from selection: a store only appends, materializes full-precision keys/values for
attention, and gathers the slots a retention policy chose. Shapes are transformers' cache layout,
(batch, kv_heads, slots, head_dim). Every tensor a store holds is an owning, compact tensor (never a view
into a bigger buffer), so `nbytes()` — the sum of `untyped_storage().nbytes()` — is exactly what it holds.

The pool's block codecs, whose payloads a store takes in its own format (`Store.load`), are in `blocks.py`.
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from couplet.kvcache.codec import (
    QuantRows,
    cat_rows,
    dequantize,
    take_rows,
)

# Rows handed to `Store.update` (a shared prefix) or `Store.load`: what `BlockCodec.batch` gives, quantized pieces
# (2, batch, heads, t_i, ·) in slot order, or full-precision keys and values (batch, heads, p, head_dim).
Prefix = list[QuantRows] | tuple[torch.Tensor, torch.Tensor]


def own(t: torch.Tensor) -> torch.Tensor:
    """`t` itself if it owns exactly its storage, else a compact copy (a view would hold its whole base)."""
    if not t.is_contiguous():
        return t.contiguous()  # already a new, compact tensor: one copy, not two
    if t.storage_offset() == 0 and t.untyped_storage().nbytes() == t.numel() * t.element_size():
        return t
    return t.clone()


def storage_bytes(tensors: list[torch.Tensor]) -> int:
    """Bytes of the storages behind `tensors`, each storage counted once."""
    seen: dict[int, int] = {}
    for t in tensors:
        s = t.untyped_storage()
        seen[s.data_ptr() or id(s)] = s.nbytes()
    return sum(seen.values())


def pad_slots(t: torch.Tensor, width: int, dim: int = -2) -> torch.Tensor:
    """`t` left-padded with zeros to `width` slots along `dim` (a negative axis: -2 for (..., slots, ·) keys and
    values, -1 for (..., slots) positions and scores); filler, which the session masks."""
    n = t.shape[dim]
    return t if n == width else torch.nn.functional.pad(t, (0, 0) * (-1 - dim) + (width - n, 0))


class Store(Protocol):
    """What a cache layer needs from its storage."""

    @property
    def length(self) -> int: ...  # slots held
    @property
    def residual_len(self) -> int: ...  # trailing full-precision slots (the residual), kept in place by eviction
    @property
    def can_gather(self) -> bool: ...
    def update(self, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None,
               prefix: Any = None) -> tuple[torch.Tensor, torch.Tensor]: ...  # prefix: `BlockCodec.batch` rows
    def kv(self) -> tuple[torch.Tensor, torch.Tensor] | None: ...  # full-precision view of all slots
    def seal(self) -> None: ...  # store every slot in the compact format now (no residual)
    def load(self, rows: Any) -> None: ...  # fill an empty store with rows already in its format (`BlockCodec.batch`)
    def gather(self, index: torch.Tensor, keep_residual: bool) -> None: ...
    def tensors(self) -> list[torch.Tensor]: ...
    def nbytes(self) -> int: ...
    # a running batch's rows (continuous batching, `CompressedCache.append_rows`): another store's rows after these,
    # both left-padded to one width; rows kept (and leading slots trimmed); rows in the store's format put first
    def can_append(self, other: Any) -> bool: ...
    def append_rows(self, other: Any) -> None: ...
    def keep_rows(self, rows: torch.Tensor, trim: int) -> None: ...
    def prepend(self, rows: Any) -> None: ...


class PlainStore:
    """Full-precision rows; `update` is exactly DynamicLayer's concatenation."""

    residual_len = 0
    can_gather = True

    def __init__(self) -> None:
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None

    @property
    def length(self) -> int:
        return 0 if self.k is None else self.k.shape[-2]

    def update(self, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None = None,
               prefix: Prefix | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Append (batch, heads, q, dim) rows; return all rows (the stored tensors themselves), after `prefix`'s
        keys and values (batch, heads, p, dim) if given (`PlainCodec.batch`; `QuantCodec.batch` rows are
        dequantized)."""
        self.k = own(k) if self.k is None else torch.cat([self.k, k], dim=-2)
        self.v = own(v) if self.v is None else torch.cat([self.v, v], dim=-2)
        if prefix is None:
            return self.k, self.v
        if isinstance(prefix, list):
            pk, pv = dequantize(cat_rows(prefix, dim=-2), k.dtype).unbind(0)
        else:
            pk, pv = prefix
        return torch.cat([pk, self.k], dim=-2), torch.cat([pv, self.v], dim=-2)

    def kv(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        return None if self.k is None or self.v is None else (self.k, self.v)

    def seal(self) -> None:
        pass

    def load(self, rows: tuple[torch.Tensor, torch.Tensor]) -> None:
        """Fill an empty store with (batch, heads, slots, head_dim) keys and values (`PlainCodec.batch`)."""
        if self.length:
            raise ValueError("load() fills an empty store")
        self.k, self.v = own(rows[0]), own(rows[1])

    def gather(self, index: torch.Tensor, keep_residual: bool = True) -> None:
        assert self.k is not None and self.v is not None
        self.k, self.v = take_rows(self.k, index), take_rows(self.v, index)

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.k, self.v) if t is not None]

    def nbytes(self) -> int:
        return storage_bytes(self.tensors())

    def can_append(self, other: Store) -> bool:
        return isinstance(other, PlainStore) and self.k is not None and other.k is not None

    def append_rows(self, other: PlainStore) -> None:
        """`other`'s rows after these, the shorter left-padded with zeros to the longer's slots."""
        assert self.k is not None and self.v is not None and other.k is not None and other.v is not None
        width = max(self.length, other.length)
        self.k = torch.cat([pad_slots(self.k, width), pad_slots(other.k, width)])
        self.v = torch.cat([pad_slots(self.v, width), pad_slots(other.v, width)])

    def keep_rows(self, rows: torch.Tensor, trim: int) -> None:
        """Keep these rows (indices), without their first `trim` slots."""
        assert self.k is not None and self.v is not None
        self.k, self.v = own(self.k[rows, :, trim:]), own(self.v[rows, :, trim:])

    def prepend(self, rows: tuple[torch.Tensor, torch.Tensor]) -> None:
        """(batch, heads, n, head_dim) keys and values (`PlainCodec.batch`) before the slots held."""
        assert self.k is not None and self.v is not None
        self.k, self.v = torch.cat([rows[0], self.k], dim=-2), torch.cat([rows[1], self.v], dim=-2)
