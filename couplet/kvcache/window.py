"""`window`: attention sinks + the most recent tokens (StreamingLLM, Xiao et al. 2023, arXiv:2309.17453)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from couplet.kvcache.policy import Policy
from couplet.kvcache.retention import Retention, ScoreView


@dataclass
class WindowPolicy(Retention, Policy):
    """Keep the first `sinks` tokens and the most recent ones: per row, budget(seen) tokens in all
    (`ratio` of the request's whole length when known, else of the tokens seen; at least `floor`; ratio=1.0
    keeps everything). The window is a share of the length rather than a fixed size: a fixed window large
    enough for a long prompt compresses nothing at couplet lengths.

    No sinks by default: StreamingLLM's sinks keep attention stable once the window has slid far past the
    start; on the dev list (short prompt, ratio 0.5, bf16) every sink cost a recent slot the model needed
    more: NLL of `full`'s couplets +0.18 nats/char with 0 sinks, +0.52 with 1, +1.00 with 2. `sinks=4` gives
    the paper's layout."""

    name: ClassVar[str] = "window"
    ratio: float = 0.5
    sinks: int = 0
    floor: int = 4
    merge: bool = False  # fold the evicted tokens into one slot per query head (`retention.merge_evicted`)
    chunk: int = 32  # the prompt fed 32 tokens per forward, evicted after each (`base.prefill_chunk`); 0: at once

    def score(self, view: ScoreView) -> torch.Tensor:
        return (view.pos.float() + 1) / view.seen  # the newest token scores 1, older ones less
