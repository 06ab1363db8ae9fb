"""`int8` / `int4`: KIVI-style quantized storage (Liu et al. 2024, arXiv:2402.02750).

Default layout, and why (the arithmetic for the embedded model: 6 layers, 2 KV heads, head_dim 32, bf16;
one uncompressed token costs 2 (K, V) x 2 heads x 32 x 2 B = 256 B per layer, a couplet is ~14-25 tokens):
- per-token rows for values AND keys, one scale per head row (group = head_dim = 32), symmetric (no zero
  point): a token costs 2 x 2 x (32 + 2) = 136 B at int8 (0.531x) and 2 x 2 x (16 + 2) = 72 B at int4
  (0.281x), at any length, and a row is self-contained, so eviction (`combo`) is a gather of rows.
- residual = 0: the tokens of the current step are attended at full precision anyway (`update` returns
  them unquantized); each token kept longer at full precision costs 256 B instead of 136 / 72, so with
  residual = 1 int8 is at (19 x 136 + 256) / (20 x 256) = 0.555x at 20 tokens (target <= 0.55) and int4 at
  (15 x 72 + 256) / (16 x 256) = 0.326x at 16 tokens (target <= 0.32). Raise it for long contexts.
- key_axis = "channel" is KIVI's own choice for keys (per-channel outliers): groups of `key_group` tokens
  share one scale per channel. A group can only be quantized once complete, so up to key_group - 1 tokens
  (+ the residual) wait at full precision: at 20 tokens with key_group = 8, int4 keys alone cost
  16 x 2 x 16 + 2 x 64 x 2 + 4 x 128 = 1280 B of 2560 (0.5x), so the int4 target is out of reach at couplet
  length; it is the documented option for long sequences, and its groups cannot be evicted row by row.
- symmetric = False adds a zero point per group (+2 B per head row: int4 0.3125x).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from couplet.kvcache.base import Composition, check_bool, check_choice, check_int
from couplet.kvcache.blocks import QuantCodec
from couplet.kvcache.policy import Policy
from couplet.kvcache.quant_store import QuantStore

KEY_AXES = ("token", "channel")


@dataclass
class QuantizedPolicy(Policy):
    """Quantized KV storage at `bits` (8 or 4; int4 packs two codes per byte) with a full-precision residual.

    residual: most recent tokens kept at full precision; group_size: channels per scale (None = head_dim);
    key_axis: "token" or "channel" (KIVI keys); key_group: tokens per key group when per channel;
    symmetric: scales only (True) or scales + zero points.
    """

    bits: ClassVar[int]
    residual: int = 0
    group_size: int | None = None
    key_axis: str = "token"
    key_group: int = 8
    symmetric: bool = True

    def __post_init__(self) -> None:
        check_int("residual", self.residual, 0)
        if self.group_size is not None:
            check_int("group_size", self.group_size, 1)
            if self.bits == 4 and self.group_size % 2:
                raise ValueError(f"group_size must be even for int4 (two codes per byte), got {self.group_size}")
        check_choice("key_axis", self.key_axis, KEY_AXES)
        check_int("key_group", self.key_group, 2 if self.bits == 4 else 1)
        if self.bits == 4 and self.key_group % 2:
            raise ValueError(f"key_group must be even for int4, got {self.key_group}")
        check_bool("symmetric", self.symmetric)

    def compose(self) -> Composition:
        return Composition(storage=self)

    def make_store(self) -> QuantStore:
        return QuantStore(self.bits, self.group_size, self.residual, self.symmetric, self.key_axis, self.key_group)

    def row_bytes(self, head_dim: int, dtype_bytes: int) -> float:
        """One head row of K or V: packed codes, one scale (and zero point) per group, scales at the dtype."""
        groups = head_dim // (self.group_size or head_dim)
        return head_dim * self.bits / 8 + groups * dtype_bytes * (1 if self.symmetric else 2)

    def codec(self) -> QuantCodec:
        """The same per-token row format, for immutable pool blocks (`combo`)."""
        return QuantCodec(self.bits, self.group_size, self.symmetric)


@dataclass
class Int8Policy(QuantizedPolicy):
    name: ClassVar[str] = "int8"
    bits: ClassVar[int] = 8


@dataclass
class Int4Policy(QuantizedPolicy):
    name: ClassVar[str] = "int4"
    bits: ClassVar[int] = 4
