"""Group-wise integer quantization as plain tensor functions (KIVI-style storage builds on these).

Every function works on the LAST dimension: it is cut into groups of `group` consecutive elements and each
group gets one scale (and, asymmetric only, one zero point). To quantize along another axis (keys per
channel: groups of tokens), transpose first so that axis is last.

Formats (`bits`, `symmetric`):
- 8, symmetric:  int8 in [-127, 127], x ≈ q * scale                      (no zero point)
- 8, asymmetric: uint8 in [0, 255],  x ≈ q * scale + zero
- 4, symmetric:  4-bit codes q + 8 in [1, 15], two per uint8 byte        (no zero point)
- 4, asymmetric: 4-bit codes in [0, 15], two per uint8 byte

Scales and zero points are stored in the input's dtype (bf16 for a bf16 model), rounded so that the
stored values still cover the group (scale rounded up, zero point rounded down): every element then
dequantizes within scale / 2 of its original value, the bound the tests check. Leading dimensions are
free: keys and values are quantized together as one (2, batch, heads, tokens, head_dim) tensor.

Why by hand, not transformers' `QuantizedLayer` (quanto / HQQ backends): those keep a full-precision
residual of `residual_length` tokens (128 by default) before anything is quantized — longer than a whole
couplet request — and store codes in the backend's own packed objects, whose bytes are not exact tensor
storages; they cannot gather single rows (eviction, `combo`), nor lay out immutable pool blocks whose
codes a request reuses as they are. Both need an extra package (optimum-quanto, hqq). Here a row is a
self-contained uint8/int8 tensor plus a scale, its bytes are `untyped_storage().nbytes()`, int4 packs two
codes per byte, and the residual is a knob (0 by default).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

BITS = (4, 8)


@dataclass(frozen=True)
class QuantRows:
    """Quantized tensor: `data` (..., n) int8/uint8 for 8 bits or (..., n // 2) packed uint8 for 4 bits;
    `scale` and `zero` (..., n // group) in the original dtype (`zero` is None when symmetric)."""

    data: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor | None
    bits: int
    group: int

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.data, self.scale, self.zero) if t is not None]

    def map(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> QuantRows:
        """Apply the same row operation (gather, slice, clone) to codes, scales and zero points."""
        return QuantRows(fn(self.data), fn(self.scale), None if self.zero is None else fn(self.zero),
                         self.bits, self.group)


def check_format(bits: int, group: int, n: int) -> None:
    if bits not in BITS:
        raise ValueError(f"bits must be one of {BITS}, got {bits}")
    if group <= 0 or n % group:
        raise ValueError(f"group size {group} must divide the quantized dimension {n}")
    if bits == 4 and n % 2:
        raise ValueError(f"4-bit packing needs an even quantized dimension, got {n}")


def _stored(t: torch.Tensor, dtype: torch.dtype, up: bool) -> torch.Tensor:
    """Cast float32 `t` to `dtype` so the stored value is >= t (`up`) or <= t. bf16/fp16 round to nearest
    within 2^-8 / 2^-11 relative, so a 2^-7 relative margin before the cast suffices (one multiply instead of
    a compare-and-fix; the step grows by < 0.8%)."""
    if dtype == torch.float32:
        return t
    margin = t.abs() * 2**-7
    return (t + margin if up else t - margin).to(dtype)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """(..., n) uint8 codes in [0, 15] -> (..., n // 2) uint8, element 2i in the low nibble, 2i+1 in the high."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """(..., n // 2) uint8 -> (..., n) uint8 codes in [0, 15]."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2)


_LUTS: dict[tuple[torch.device, bool], torch.Tensor] = {}


def _int4_lut(device: torch.device, symmetric: bool) -> torch.Tensor:
    """(256, 2) float32: byte -> its two decoded codes (minus 8 when symmetric); one lookup unpacks a row."""
    key = (device, symmetric)
    if key not in _LUTS:
        byte = torch.arange(256, dtype=torch.uint8, device=device)
        _LUTS[key] = unpack_int4(byte[:, None]).float() - (8.0 if symmetric else 0.0)
    return _LUTS[key]


def quantize(x: torch.Tensor, bits: int, group: int, symmetric: bool = True) -> QuantRows:
    """Quantize `x` (..., n) in groups of `group` along the last dimension."""
    n = x.shape[-1]
    check_format(bits, group, n)
    g = x.float().unflatten(-1, (n // group, group))  # (..., groups, group)
    tiny = torch.finfo(x.dtype).tiny
    if symmetric:
        qmax = 2 ** (bits - 1) - 1
        scale = _stored((g.abs().amax(-1) / qmax).clamp_min_(tiny), x.dtype, up=True)
        q = (g / scale.float().unsqueeze(-1)).round_().clamp_(-qmax, qmax).flatten(-2)
        zero = None
        codes = q.add_(8).to(torch.uint8) if bits == 4 else q.to(torch.int8)
    else:
        levels = 2**bits - 1
        zero = _stored(g.amin(-1), x.dtype, up=False)
        span = g.amax(-1) - zero.float()
        scale = _stored((span / levels).clamp_min_(tiny), x.dtype, up=True)
        q = torch.round((g - zero.float().unsqueeze(-1)) / scale.float().unsqueeze(-1)).clamp_(0, levels)
        codes = q.flatten(-2).to(torch.uint8)
    data = pack_int4(codes) if bits == 4 else codes
    return QuantRows(data, scale, zero, bits, group)


def dequantize(q: QuantRows, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of `quantize`: (..., n) in `dtype` (computed in float32, cast once)."""
    grouped = (*q.scale.shape, q.group)  # (..., groups, group)
    if q.bits == 4:  # index_select: the same lookup as lut[codes], half the dispatch cost
        lut = _int4_lut(q.data.device, q.zero is None)
        codes = lut.index_select(0, q.data.reshape(-1).long()).view(grouped)
    else:
        codes = q.data.float().reshape(grouped)
    # a bf16/fp16 scale (zero) is promoted to float32 exactly, as .float() would: the product is float32 either way
    x = codes * q.scale.unsqueeze(-1)
    if q.zero is not None:
        x = x + q.zero.unsqueeze(-1)
    x = x.flatten(-2)
    return x if x.dtype == dtype else x.to(dtype)


def take_rows(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """Gather along the slot dimension of (..., batch, heads, slots, channels) `t`; index (batch, heads, kept)."""
    lead = t.dim() - 4
    idx = index.view(*(1,) * lead, *index.shape, 1).expand(*t.shape[:lead], *index.shape, t.shape[-1])
    return t.gather(t.dim() - 2, idx)


def cat_rows(parts: list[QuantRows], dim: int) -> QuantRows:
    """Concatenate quantized tensors along a non-last dimension (e.g. tokens for per-token rows)."""
    head = parts[0]
    if len(parts) == 1:
        return head
    zero = None if head.zero is None else torch.cat([p.zero for p in parts], dim)  # type: ignore[misc]
    return QuantRows(torch.cat([p.data for p in parts], dim), torch.cat([p.scale for p in parts], dim), zero,
                     head.bits, head.group)


def same_format(a: QuantRows, b: QuantRows) -> bool:
    """Whether `a` and `b`, per-token rows of the same layout, dequantize alike once concatenated."""
    return (a.bits == b.bits and a.group == b.group and (a.zero is None) == (b.zero is None)
            and a.scale.dtype == b.scale.dtype)


def gather_rows(q: QuantRows, index: torch.Tensor) -> QuantRows:
    """Gather rows along the slot dimension of (..., batch, heads, slots, ·) tensors; index (batch, heads, kept).

    This is how a quantized cache evicts: whole quantized rows (codes + their scales) are kept or dropped,
    nothing is re-quantized.
    """
    return q.map(lambda t: take_rows(t, index))
