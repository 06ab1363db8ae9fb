"""`combo`: the staged combination — prompt shared through the pool and quantized; generated tokens
kept selectively (with the sinks + recent window as a safety net) and stored quantized.

A composition of the other modes' parts, with no wiring of its own: an `Int8Policy`/`Int4Policy` storage
format (the same per-token rows in pool blocks and in the request's own store, so eviction is a gather of
quantized rows), a `SelectivePolicy` retention keeping the prompt, and a `SharedPolicy` for the pool.

Budget: `ratio` of the tokens seen, counted over everything the request attends to, prompt included.
The prompt is kept whole, wherever it lives (pool blocks are shared and immutable; the part not in a
full block is kept too, so results do not depend on the pool's state); generated tokens compete for the
rest, with the sinks + `recent` window always kept. The prompt's whole blocks are always attended as the
pool stores them (dequantized), on a miss too: the session computes missing blocks one at a time against
the pooled blocks before them (`sharing.Sharing._complete_chain`), so cold and warm pools give the same bits.

Defaults, for the embedded model (256 B per uncompressed token per layer; an int4 row costs 72 B): a
21-token couplet with a 6-token prompt keeps 11 tokens, one of them at full precision,
(10 x 72 + 256) / (21 x 256) = 0.18x; a 27-token one with a 12-token prompt, (13 x 72 + 256) / (27 x 256)
= 0.17x (target <= 0.20x).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from couplet.kvcache.base import Composition, Policy, check_choice
from couplet.kvcache.quantized import Int4Policy, Int8Policy
from couplet.kvcache.selective import SelectivePolicy
from couplet.kvcache.shared import SharedPolicy


@dataclass
class ComboPolicy(Policy):
    """Shared + quantized prompt, selective + quantized generation. See the module docstring."""

    name: ClassVar[str] = "combo"
    bits: int = 4
    ratio: float = 0.5
    sinks: int = 2
    recent: int = 2
    floor: int = 4
    decay: float = 0.0
    # No full-precision residual by default: on the dev list residual=1 cost 0.183x of full's bytes and
    # residual=0 0.147x at the same quality (NLL delta +0.650 vs +0.652, rule pass 1.0), with a little
    # less work per step (1.27x -> 1.24x full's step time, CPU float32, one run each).
    residual: int = 0
    block_size: int = 8  # as `shared`'s default (see there)
    group_size: int | None = None

    def __post_init__(self) -> None:
        check_choice("bits", self.bits, (8, 4))
        storage = Int8Policy if self.bits == 8 else Int4Policy
        self._parts = Composition(  # built here, so that invalid knobs fail at construction
            storage=storage(residual=self.residual, group_size=self.group_size),
            retention=SelectivePolicy(ratio=self.ratio, sinks=self.sinks, recent=self.recent, floor=self.floor,
                                      decay=self.decay, keep_prompt=True),
            sharing=SharedPolicy(self.block_size))

    def compose(self) -> Composition:
        return self._parts
