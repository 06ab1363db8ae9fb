"""`selective`: keep the tokens the model actually attends to (H2O, Zhang et al. 2023, arXiv:2306.14048;
TOVA, Oren et al. 2024, arXiv:2401.06104), plus couplet structure through protected positions."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from couplet.kvcache.base import check_int, check_number
from couplet.kvcache.policy import Policy
from couplet.kvcache.retention import Retention, ScoreView


@dataclass
class SelectivePolicy(Retention, Policy):
    """Importance-based retention, re-evaluated after every forward.

    Score of a slot = attention it received (softmax probabilities recorded by the registered SDPA
    function, per KV head: the query heads of a GQA group averaged), as a moving average over the steps
    it has been visible: every step multiplies the older sum by `decay` before adding the new attention,
    and the sum is divided by the sum of the weights, 1 + decay + … + decay^(k-1) for a token seen by k
    queries — normalised for how long it has been visible, so early tokens do not win just by being old.
    decay=1.0 is the H2O mean (every step counts alike); decay=0.0 is TOVA (the latest query's attention
    only). Always kept: the first `sinks` tokens and the last `recent`; next, the positions the generation
    loop protects via `ModeSession.protect` (`couplet.writing.placement.couplet_protection`: the keywords while
    the 上联 is written, the 上联 characters the 下联 has yet to mirror); then the best scores, up to
    max(floor, sinks + recent, ceil(ratio * expected)) tokens per row, `expected` being the request's
    whole length when the generation loop gives it (`ModeSession.expect`; else the tokens seen so far).
    Heads choose independently (H2O is per head); ratio=1.0 keeps everything. keep_prompt=True never
    evicts the prompt (the first forward's
    tokens): only generated tokens compete (what `combo` uses).

    Defaults (decay 0.5, recent 8, merge, lookahead 8) were chosen on the 117-phrase dev list at the long
    prompt; the sweeps and their figures are in docs/results/kv-modes.md. Why each:
    - decay 0.5 / recent 8: with a ~415-token prompt the latest query's attention alone (TOVA, decay 0) is
      too narrow a view of what later steps need; a half-life of one step keeps the recent history in view.
    - merge: the evicted tokens are folded into one slot per query head instead of dropped
      (`retention.merge_evicted`), within the same budget; it costs a float attention mask once anything is
      merged. Not with a prefix pool (`combo` builds its retention with merge=False).
    - lookahead=8: the prompt's eviction is scored by 8 pseudo decode queries instead of the prompt's own
      (`ModeSession._look_ahead`; LAQ, Wang et al. 2025, arXiv:2505.20334), and the prefill records no
      attention of its own. The prompt's eviction is where the heuristic lost most against an oracle
      (`scripts/selective_oracle.py`), and the prompt's own queries (reading instructions and exemplars) are
      a poor stand-in for the couplet's. 8 pseudo tokens cost 8 forwards per request at its prefill; the
      prefill holds the prompt plus those tokens (`Composition.owned_peak_bytes`), the request's peak
      afterwards is unchanged.
    """

    name: ClassVar[str] = "selective"
    ratio: float = 0.5
    sinks: int = 0
    recent: int = 8
    floor: int = 4
    decay: float = 0.5
    keep_prompt: bool = False
    merge: bool = True  # fold the evicted tokens into one slot per query head (`retention.merge_evicted`)
    lookahead: int = 8  # pseudo decode queries score the prompt before its eviction (`ModeSession._look_ahead`)
    chunk: int = 32  # the prompt fed 32 tokens per forward, evicted after each (`base.prefill_chunk`); 0: at once

    uses_attention: ClassVar[bool] = True

    def __post_init__(self) -> None:
        super().__post_init__()
        check_int("recent", self.recent, 1)
        check_number("decay", self.decay, 0.0, 1.0)
        self.decay = float(self.decay)

    @property
    def score_decay(self) -> float:
        return self.decay

    def score(self, view: ScoreView) -> torch.Tensor:
        if view.lookahead is not None:  # the prompt's eviction: what the pseudo decode queries read
            return view.lookahead
        assert view.attention is not None
        viewers = (view.seen - view.pos.float()).clamp(min=1.0)  # real queries that could see each slot
        if self.decay == 1.0:
            weight = viewers
        else:  # 1 + d + … + d^(k-1); the prompt's queries share one forward, so its tokens may score above 1
            weight = (1.0 - self.decay ** viewers) / (1.0 - self.decay)
        return view.attention / weight
