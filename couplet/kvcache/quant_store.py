"""`QuantStore`: a request's own KV rows quantized (KIVI-style), the `Store` of the `int8`/`int4` modes
(`storage.py` holds the protocol, the full-precision store and the helpers both use)."""

from __future__ import annotations

import torch

from couplet.kvcache.codec import (
    QuantRows,
    cat_rows,
    check_format,
    dequantize,
    gather_rows,
    quantize,
    same_format,
    take_rows,
)
from couplet.kvcache.storage import Prefix, Store, own, pad_slots, storage_bytes


def _padded_rows(rows: QuantRows | None, like: QuantRows, batch: int, width: int) -> QuantRows:
    """(2, batch, heads, slots, ·) rows left-padded with zero codes and scales to `width` slots; None: all zeros
    shaped as `like`'s, for `batch` rows."""
    if rows is None:
        return like.map(lambda t: t.new_zeros((t.shape[0], batch, *t.shape[2:-2], width, t.shape[-1])))
    return rows.map(lambda t: pad_slots(t, width))


class QuantStore:
    """KIVI-style quantized rows plus a full-precision residual of the most recent `residual` tokens.

    Values are quantized per token (groups of `group` channels). Keys are quantized per token too when
    `key_axis == "token"` — then keys and values are stored together as one (2, batch, heads, tokens, ·)
    tensor, quantized and dequantized in one call — or per channel (KIVI's choice) when
    `key_axis == "channel"`: groups of `key_group` tokens share one scale per channel, layout (batch, heads,
    head_dim, tokens); the open group waits at full precision next to the residual until it is complete,
    and such rows cannot be gathered one by one (no eviction).
    Attention sees old rows dequantized (a transient copy) and the tokens of the current step at full
    precision; after the forward, `flush_all` quantizes whatever left the residual (all layers in one call;
    a store that was not flushed catches up on its next update). A multi-token update (a prefill) is
    quantized at once, in its own layer.
    """

    def __init__(self, bits: int, group: int | None, residual: int, symmetric: bool = True,
                 key_axis: str = "token", key_group: int = 8) -> None:
        self.bits, self.residual, self.symmetric = bits, residual, symmetric
        self.group = group or 0  # channels per scale; 0 = head_dim, resolved on the first update
        self.key_axis, self.key_group = key_axis, key_group
        self.rows: QuantRows | None = None  # per-token rows: (2, b, h, tokens, ·) [keys, values], or (1, ...) [values]
        self.kq: QuantRows | None = None  # per-channel keys: (b, h, head_dim, tokens)
        self.res: torch.Tensor | None = None  # (2, b, h, r, head_dim) full-precision residual [keys, values]
        self.dtype: torch.dtype | None = None

    @property
    def n_quantized(self) -> int:
        return 0 if self.rows is None else self.rows.scale.shape[-2]

    @property
    def residual_len(self) -> int:
        return 0 if self.res is None else self.res.shape[-2]

    @property
    def length(self) -> int:
        return self.n_quantized + self.residual_len

    @property
    def can_gather(self) -> bool:
        return self.key_axis == "token"

    def _stacked(self, extra: torch.Tensor | None = None, prefix: Prefix | None = None) -> torch.Tensor | None:
        """[prefix,] all slots at full precision[, then `extra`] as (2, b, h, slots, head_dim); a transient copy.
        A `prefix` in the rows' format is dequantized together with them: one call instead of two, same values."""
        if self.length == 0 and prefix is None:
            return extra
        assert self.dtype is not None
        parts = []
        rows = self.rows
        if isinstance(prefix, tuple):  # full-precision keys, values (`PlainCodec.batch`)
            parts.append(torch.stack(prefix))
        elif prefix:  # quantized pieces of one codec, hence one format
            if rows is not None and self.kq is None and same_format(prefix[0], rows):
                rows = cat_rows([*prefix, rows], dim=-2)  # one concatenation, one dequantization
            else:
                parts.append(dequantize(cat_rows(prefix, dim=-2), self.dtype))
        if rows is not None:
            old = dequantize(rows, self.dtype)
            if self.kq is not None:  # per-channel keys: (b, h, head_dim, t) -> (1, b, h, t, head_dim)
                old = torch.cat([dequantize(self.kq, self.dtype).transpose(-1, -2)[None], old])
            parts.append(old)
        if self.res is not None:
            parts.append(self.res)
        if extra is not None:
            parts.append(extra)
        return torch.cat(parts, dim=-2) if len(parts) > 1 else parts[0]

    def kv(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """All slots at full precision (quantized rows dequantized: a transient copy), or None if empty."""
        kv = self._stacked()
        return None if kv is None else (kv[0], kv[1])

    def update(self, k: torch.Tensor, v: torch.Tensor, valid: torch.Tensor | None = None,
               prefix: Prefix | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Return [prefix +] old rows (dequantized) + residual + the new rows at full precision; then store the
        new rows. `prefix`: rows not held by this store, per-token quantized pieces (2, b, h, t_i, ·)
        (`QuantCodec.batch`) or full-precision keys, values (`PlainCodec.batch`).

        `valid` (batch, q) bool marks real tokens; padding is zeroed before it can enter per-channel scales.
        """
        if self.dtype is None:
            self.dtype = k.dtype
            self.group = self.group or int(k.shape[-1])  # default: one scale per head row
            check_format(self.bits, self.group, k.shape[-1])
            if self.key_axis == "channel":
                check_format(self.bits, self.key_group, self.key_group)
        if self.overflow() > 0:  # nobody flushed after the last forward (see `flush_all`)
            self._flush()
        new = torch.stack([k, v])  # (2, b, h, q, head_dim)
        full = self._stacked(extra=new, prefix=prefix)
        assert full is not None
        if valid is not None and self.key_axis == "channel":
            new = torch.where(valid[None, :, None, :, None], new, torch.zeros((), dtype=new.dtype, device=new.device))
        self.res = new if self.res is None else torch.cat([self.res, new], dim=-2)
        if new.shape[-2] > 1:
            # Several tokens at once (a prefill): quantized now, layer by layer, not after the forward with
            # every layer's. The same values are quantized either way, and attention still sees them at full
            # precision (`full`, a transient); but a prompt is no longer held at full precision in all layers
            # at once, so a request's prefill peak is its prompt in the store's format plus one layer's
            # transient (`Composition.owned_peak_bytes`): more requests fit in a KV budget when they arrive.
            # One token per step stays deferred (`flush_all`: one quantize call for all layers).
            self._flush()
        keys, values = full.unbind(0)
        return keys, values

    def overflow(self, keep: int | None = None) -> int:
        """Residual rows to quantize now: beyond `keep` (default `residual`), whole key groups per channel."""
        n = self.residual_len - (self.residual if keep is None else keep)
        if self.key_axis == "channel":
            n = (n // self.key_group) * self.key_group
        return max(n, 0)

    @staticmethod
    def flush_all(stores: list[QuantStore]) -> None:
        """Quantize every store's overflow after a forward — one `quantize` call for all layers when they are
        alike (per-token, same overflow), which is most of the per-step cost of a quantized cache."""
        if not stores:
            return
        n = stores[0].overflow()
        shape = None if stores[0].res is None else stores[0].res.shape
        alike = all(s.key_axis == "token" and s.res is not None and s.res.shape == shape and s.overflow() == n
                    for s in stores)
        if not alike or n == 0 or len(stores) == 1:
            for s in stores:
                s._flush()
            return
        first = stores[0]
        res = torch.stack([s.res for s in stores if s.res is not None])  # (layers, 2, b, h, r, head_dim)
        rows = quantize(res[..., :n, :], first.bits, first.group, first.symmetric)  # (layers, 2, b, h, n, ·)
        data, scale = rows.data.unbind(0), rows.scale.unbind(0)
        zero = [None] * len(stores) if rows.zero is None else rows.zero.unbind(0)
        left = None if n == res.shape[-2] else res[..., n:, :].unbind(0)
        for i, s in enumerate(stores):
            mine = QuantRows(data[i], scale[i], zero[i], rows.bits, rows.group)
            s.rows = mine.map(own) if s.rows is None else cat_rows([s.rows, mine], dim=-2)
            s.res = None if left is None else own(left[i])

    def seal(self) -> None:
        """Quantize the residual now (whole key groups only, per channel); e.g. a prompt stored like pool blocks."""
        if self.res is not None:
            self._flush(keep=0)

    def load(self, pieces: list[QuantRows]) -> None:
        """Fill an empty store with quantized per-token rows (2, batch, heads, slots, ·) [keys, values] of its
        own format, in pieces (`QuantCodec.batch`): the codes are kept as they are, never re-quantized."""
        if self.length:
            raise ValueError("load() fills an empty store")
        rows = cat_rows(pieces, dim=-2)
        if (self.key_axis != "token" or rows.bits != self.bits or (rows.zero is None) != self.symmetric
                or self.group not in (0, rows.group)):
            raise ValueError(f"rows of {rows.bits} bits, group {rows.group}, symmetric {rows.zero is None} do not "
                             f"match this store ({self.bits} bits, group {self.group or 'head_dim'}, "
                             f"symmetric {self.symmetric}, keys per {self.key_axis})")
        self.dtype, self.group = rows.scale.dtype, rows.group
        self.rows = rows.map(own) if len(pieces) > 1 else rows.map(torch.clone)  # never a payload's own tensors

    def can_append(self, other: Store) -> bool:
        """Per-token rows of one format with residuals of one length (a residual is its rows' newest tokens: one
        of another length would flush at another step than alone). Per-channel keys have no row join."""
        return (isinstance(other, QuantStore) and self.key_axis == other.key_axis == "token"
                and (self.bits, self.group, self.symmetric) == (other.bits, other.group, other.symmetric)
                and self.residual_len == other.residual_len and self.dtype is not None and other.dtype is not None)

    def append_rows(self, other: QuantStore) -> None:
        """`other`'s rows after these: the quantized slots left-padded with zero codes and scales (they dequantize
        to zeros) to the longer's, the residuals (of one length) side by side."""
        width = max(self.n_quantized, other.n_quantized)
        if width:
            ref = self.rows if self.rows is not None else other.rows
            assert ref is not None
            a, b = (_padded_rows(q, ref, n, width) for q, n in ((self.rows, self._rows_batch), (other.rows,
                                                                                          other._rows_batch)))
            self.rows = QuantRows(torch.cat([a.data, b.data], dim=1), torch.cat([a.scale, b.scale], dim=1),
                                  None if a.zero is None or b.zero is None else torch.cat([a.zero, b.zero], dim=1),
                                  ref.bits, ref.group)
        if self.res is not None and other.res is not None:
            self.res = torch.cat([self.res, other.res], dim=1)

    @property
    def _rows_batch(self) -> int:
        for t in (self.res, None if self.rows is None else self.rows.data):
            if t is not None:
                return t.shape[1]
        raise ValueError("an empty store has no rows")

    def keep_rows(self, rows: torch.Tensor, trim: int) -> None:
        """Keep these rows (indices), without their first `trim` slots (quantized ones: the residual is real)."""
        trim = min(trim, self.n_quantized)
        if self.rows is not None:
            self.rows = self.rows.map(lambda t: own(t[:, rows, :, trim:]))
            if not self.rows.scale.shape[-2]:
                self.rows = None
        if self.res is not None:
            self.res = own(self.res[:, rows])

    def prepend(self, pieces: list[QuantRows]) -> None:
        """Quantized per-token rows of this store's format (`QuantCodec.batch`) before the slots held, as they are."""
        self.rows = cat_rows([*pieces, self.rows] if self.rows is not None else pieces, dim=-2)

    def _flush(self, keep: int | None = None) -> None:
        """Quantize the oldest residual rows beyond `keep` (default `residual`)."""
        n = self.overflow(keep)
        if n == 0:
            return
        assert self.res is not None
        old = self.res[..., :n, :]  # (2, b, h, n, head_dim)
        self.res = None if n == self.res.shape[-2] else own(self.res[..., n:, :])
        if self.key_axis == "channel":  # keys: (b, h, head_dim, n), groups of tokens along the last dim
            new_k = quantize(old[0].transpose(-1, -2), self.bits, self.key_group, self.symmetric)
            self.kq = new_k if self.kq is None else cat_rows([self.kq, new_k], dim=-1)
            old = old[1:]
        new_rows = quantize(old, self.bits, self.group, self.symmetric)
        self.rows = new_rows if self.rows is None else cat_rows([self.rows, new_rows], dim=-2)

    def gather(self, index: torch.Tensor, keep_residual: bool = True) -> None:
        """Keep the slots `index` (batch, heads, kept) of [quantized rows, residual].

        `keep_residual`: the last `residual_len` entries of every index row are the residual slots in order (eviction
        keeps the residual as it is), so only quantized rows are gathered — codes and scales, no re-quantizing.
        Otherwise (re-layout) the last min(residual_len, kept) entries become the new residual and the rest are
        taken from all slots in quantized form (residual rows quantized on the way).
        """
        if not self.can_gather:
            raise ValueError("per-channel key groups cannot be gathered row by row; use key_axis='token'")
        r, kept = self.residual_len, index.shape[-1]
        if keep_residual:
            if self.rows is not None:
                self.rows = gather_rows(self.rows, index[..., : kept - r])
            return
        r_new = min(r, kept)
        to_quantized, to_residual = index[..., : kept - r_new], index[..., kept - r_new:]
        every = [q for q in (self.rows, None if self.res is None else quantize(self.res, self.bits, self.group,
                                                                                self.symmetric)) if q is not None]
        full = self._stacked()
        self.rows = gather_rows(cat_rows(every, dim=-2), to_quantized) if every else None
        self.res = take_rows(full, to_residual) if r_new and full is not None else None

    def tensors(self) -> list[torch.Tensor]:
        out = [] if self.res is None else [self.res]
        for q in (self.kq, self.rows):
            if q is not None:
                out += q.tensors()
        return out

    def nbytes(self) -> int:
        return storage_bytes(self.tensors())
