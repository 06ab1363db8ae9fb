"""`combo`: the staged combination — the prompt shared through the pool, and everything stored quantized;
optionally, generated tokens kept selectively.

A composition of the other modes' parts, with no wiring of its own: an `Int8Policy`/`Int4Policy` storage
format (the same per-token rows in pool blocks and in the request's own store, so eviction is a gather of
quantized rows), a `SharedPolicy` for the pool, and — when `ratio` < 1 — a `SelectivePolicy` retention that
keeps the prompt whole and lets generated tokens compete for the rest of the budget. The prompt's whole
blocks are always attended as the pool stores them (dequantized), on a miss too: each missing block is
computed against the pooled blocks before it as they are stored (`sharing.Sharing._complete_chains`: runs of up
to 8 blocks per forward, each block attending to the run's earlier ones encoded and decoded, for all the rows
of a wave at once), so cold and warm pools give the same couplets (the same bits where the same forward
computed the blocks, up to float rounding otherwise).

Defaults: int8, ratio 1.0 (no eviction). At the long prompt (~415 tokens, 296 of them the house prefix every
visitor shares) an evicting int4 composition spent its whole budget on the prompt and evicted nearly every
generated token; int8 without eviction keeps `full`'s couplet for almost every phrase and, with the pool's
share, stores a small fraction of `full`'s bytes per request. The figures: docs/results/kv-modes.md and
docs/results/serving.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from couplet.kvcache.base import Composition, check_choice
from couplet.kvcache.policy import Policy
from couplet.kvcache.quantized import Int4Policy, Int8Policy
from couplet.kvcache.selective import SelectivePolicy
from couplet.kvcache.shared import SharedPolicy


@dataclass
class ComboPolicy(Policy):
    """Shared + quantized prompt, selective + quantized generation. See the module docstring."""

    name: ClassVar[str] = "combo"
    bits: int = 8
    ratio: float = 1.0
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
        retention = SelectivePolicy(ratio=self.ratio, sinks=self.sinks, recent=self.recent, floor=self.floor,
                                    decay=self.decay, keep_prompt=True,  # built here: invalid knobs fail now
                                    merge=False)  # cascade attention over pool blocks has no merged slot
        self._parts = Composition(storage=storage(residual=self.residual, group_size=self.group_size),
                                  retention=None if self.ratio >= 1.0 else retention,
                                  sharing=SharedPolicy(self.block_size))

    def compose(self) -> Composition:
        return self._parts
