"""`FullCache`, the uncompressed baseline: transformers' DynamicCache unchanged, plus the byte accounting
sessions report and the row operations of continuous batching (`ModeSession.join` / `drop`)."""

from __future__ import annotations

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

from couplet.kvcache.storage import pad_slots, storage_bytes


class FullCache(DynamicCache):
    """The baseline: transformers' DynamicCache unchanged, plus the byte accounting sessions report."""

    def begin(self, positions: torch.Tensor, valid: torch.Tensor | None) -> None:
        pass  # DynamicCache counts its own columns; it never evicts, so needs no positions

    def flush(self) -> None:
        pass

    @property
    def stored_length(self) -> int:
        return self.get_seq_length()

    def append_rows(self, other: FullCache) -> int:
        """Concatenate `other`'s rows after this cache's, the shorter left-padded with zeros to the longer's
        width (the callers mask the padding); returns that width. By hand: transformers' cache layers select
        and repeat rows (`batch_select_indices`) but have no concatenation of two caches."""
        width = max(self.get_seq_length(), other.get_seq_length())
        for mine, theirs in zip(self._dense(), other._dense(), strict=True):
            (k, v), (ok, ov) = _tensors(mine), _tensors(theirs)
            mine.keys, mine.values = (torch.cat([pad_slots(a, width), pad_slots(b, width)])
                                      for a, b in ((k, ok), (v, ov)))
        return width

    @property
    def sliding(self) -> bool:
        """Whether any layer is a sliding window (its own width and counters: no join)."""
        return any(getattr(layer, "is_sliding", False) for layer in self.layers)

    def release(self) -> None:
        """Drop every layer's tensors (a cache whose rows joined another)."""
        for layer in self._dense():
            layer.keys = layer.values = None
            layer.is_initialized = False

    def keep_rows(self, rows: torch.Tensor, trim: int) -> None:
        """Keep these rows (indices), without their first `trim` slots."""
        for layer in self._dense():
            k, v = _tensors(layer)
            layer.keys, layer.values = k[rows, :, trim:], v[rows, :, trim:]

    def _dense(self) -> list[DynamicLayer]:
        layers = [layer for layer in self.layers if isinstance(layer, DynamicLayer)]
        assert len(layers) == len(self.layers), "a FullCache of transformers' dense layers only"
        return layers

    def _keys_values(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        for layer in self.layers:
            k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
            if isinstance(k, torch.Tensor) and isinstance(v, torch.Tensor) and k.dim() == 4:
                out.append((k, v))
        return out

    def kv_nbytes(self) -> int:
        return storage_bytes([t for kv in self._keys_values() for t in kv])

    prefix_len = 0

    def token_bytes(self) -> int:
        return sum(2 * k.shape[1] * k.shape[-1] * k.element_size() for k, _ in self._keys_values())


def _tensors(layer: DynamicLayer) -> tuple[torch.Tensor, torch.Tensor]:
    assert layer.keys is not None and layer.values is not None, "a prefilled layer"
    return layer.keys, layer.values
