"""Block codecs: one row's slice of keys/values, (kv_heads, tokens, head_dim), to the immutable payload stored in
the prefix pool, and back; `batch` lays pool payloads out in their store's own format (`Store.load`,
`storage.py`), for the prefix a batch attends and for rows that keep pool blocks as private slots (see
`pool_protocol.py`).
"""

from __future__ import annotations

from typing import Any, Protocol

import torch

from couplet.kvcache.codec import QuantRows, cat_rows, dequantize, quantize


class BlockCodec(Protocol):
    name: str
    lossless: bool  # decode(encode(k, v)) == (k, v) exactly

    def encode(self, k: torch.Tensor, v: torch.Tensor) -> tuple: ...
    def decode(self, payloads: list[tuple], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]: ...
    def tensors(self, payload: tuple) -> list[torch.Tensor]: ...
    def batch(self, payloads: list[list[tuple]], width: int) -> Any: ...  # per row, payloads -> `Store.load` rows


def _left_padded(parts: list[torch.Tensor | None], width: int) -> torch.Tensor:
    """Per-row (*lead, heads, tokens, ·) tensors (None: no tokens) -> (*lead, batch, heads, width, ·), each row
    right-aligned and zero-filled on the left (filler slots, masked by the session)."""
    full = [p for p in parts if p is not None and p.shape[-2] == width]
    if len(full) == len(parts):  # e.g. a prefix: every row complete, no filler
        axis = full[0].dim() - 3
        return full[0].unsqueeze(axis) if len(full) == 1 else torch.stack(full, dim=axis)
    ref = next(p for p in parts if p is not None)
    out = ref.new_zeros((*ref.shape[:-3], len(parts), ref.shape[-3], width, ref.shape[-1]))
    for r, p in enumerate(parts):
        if p is not None and p.shape[-2]:
            out[..., r, :, width - p.shape[-2]:, :] = p
    return out


class PlainCodec:
    name = "plain"
    lossless = True

    def encode(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return k.contiguous().clone(), v.contiguous().clone()

    def decode(self, payloads: list[tuple], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.cat([p[0] for p in payloads], dim=-2), torch.cat([p[1] for p in payloads], dim=-2)

    def tensors(self, payload: tuple) -> list[torch.Tensor]:
        return list(payload)

    def batch(self, payloads: list[list[tuple]], width: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per row, blocks in order -> (batch, heads, width, head_dim) keys and values, left-padded with zeros."""
        ks = [torch.cat([p[0] for p in row], dim=-2) if row else None for row in payloads]
        vs = [torch.cat([p[1] for p in row], dim=-2) if row else None for row in payloads]
        return _left_padded(ks, width), _left_padded(vs, width)


class QuantCodec:
    """Per-token quantized blocks: keys and values as one (2, 1, kv_heads, tokens, ·) `QuantRows`, the row format
    of `QuantStore` with key_axis='token' for a batch of one: a row's blocks and its own rows concatenate as they
    are, in one call per step."""

    lossless = False

    def __init__(self, bits: int, group: int | None, symmetric: bool = True) -> None:
        self.bits, self.group, self.symmetric = bits, group, symmetric
        self.name = f"int{bits}-g{group or 'head'}-{'sym' if symmetric else 'asym'}"

    def encode(self, k: torch.Tensor, v: torch.Tensor) -> tuple[QuantRows]:
        kv = torch.stack([k, v])[:, None]  # (2, 1, kv_heads, tokens, head_dim)
        return (quantize(kv, self.bits, self.group or k.shape[-1], self.symmetric),)

    def decode(self, payloads: list[tuple], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        kv = dequantize(cat_rows([p[0] for p in payloads], dim=-2), dtype)
        return kv[0, 0], kv[1, 0]

    def tensors(self, payload: tuple) -> list[torch.Tensor]:
        return payload[0].tensors()

    def batch(self, payloads: list[list[tuple]], width: int) -> list[QuantRows]:
        """Per row, blocks in order -> pieces of (2, batch, heads, ·, ·) rows in `QuantStore`'s format, `width`
        slots in all, codes and scales as stored (nothing re-quantized): a single row's blocks as they are (it
        fills `width`); rows of a batch concatenated, right-aligned after zero rows (they dequantize to zeros)."""
        if len(payloads) == 1:
            return [p[0] for p in payloads[0]]
        parts = [cat_rows([p[0] for p in row], dim=-2).map(lambda t: t[:, 0]) if row else None for row in payloads]
        ref = next(p for p in parts if p is not None)
        zero = None
        if ref.zero is not None:
            zero = _left_padded([None if p is None else p.zero for p in parts], width)
        return [QuantRows(_left_padded([None if p is None else p.data for p in parts], width),
                          _left_padded([None if p is None else p.scale for p in parts], width), zero,
                          ref.bits, ref.group)]
