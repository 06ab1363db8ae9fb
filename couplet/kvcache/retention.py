"""Selection: which owned slots survive an eviction. A scoring policy writes only `score()`; the budget,
the safety net (sinks + recent window, optionally the whole prompt), protected positions, the per-row
top-k and the gather live here.

Per row (sequence) of a batch, with `seen` real tokens so far and, when the generation loop knows it,
`expected` = the row's whole logical length at the end of the request (`ModeSession.expect`):
    budget(seen) = seen                                                  if ratio >= 1 (keep everything)
                 = min(seen, max(floor, sinks + recent, ceil(ratio * expected)))   with a length hint
                 = min(seen, max(floor, sinks + recent, ceil(ratio * seen)))       without (streaming)
counts every token the row attends to, shared prefix included. With the hint the budget is a fixed
per-request cap, as in H2O and StreamingLLM: nothing is evicted until the cache is full, and the peak is
`ratio` of the full cache's peak. Without it the cache shrinks from the first step, which at couplet
lengths (~20 tokens) throws away half of the prompt before the first character is written.
Candidates are the row's valid owned slots outside the store's pinned tail (its full-precision residual).
Their keep order is a tier, then the score in [0, 1]: tier 3 = sinks (position < sinks; < prompt length if
`keep_prompt`) and the recent window (position >= seen - recent), tier 2 = protected positions, tier 1 = the
rest; padding and filler are never candidates. Each (row, head) keeps its top `keep[row]` candidates, sorted
by position, then filler slots up to the longest row (so every head and every layer has the same slot count
and the same filler slots), then the tail. One plan covers all layers at once; each layer's scores choose its
own slots.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch


class Retention:
    """Mixin for dataclass policies with `ratio`, `sinks`, `floor` (and optionally `recent`) fields."""

    ratio: float
    sinks: int
    floor: int
    recent: int = 0
    keep_prompt: bool = False

    def budget(self, seen: int, expected: int | None = None) -> int:
        """Tokens a row that has seen `seen` tokens may keep (prefix included); `expected`: the row's
        final logical length, when known, makes the budget a fixed cap of `ratio * expected`."""
        if self.ratio >= 1.0:
            return seen
        span = seen if expected is None else max(expected, 1)
        return min(seen, max(self.floor, self.sinks + self.recent, math.ceil(self.ratio * span)))

    def score(self, pos: torch.Tensor, acc: torch.Tensor | None, seen: torch.Tensor) -> torch.Tensor:
        """Keep priority in [0, 1] (higher is kept) of every owned slot.

        pos (layers, batch, kv_heads, slots) int32 logical positions (-1: none); acc the same shape, attention
        received so far (None unless the policy records attention); seen (1, batch, 1, 1) float tokens seen.
        """
        raise NotImplementedError


def keep_counts(retention: Retention, seen: Sequence[int], prompt: Sequence[int], prefix_len: int,
                cand_valid: Sequence[int], tail_valid: Sequence[int],
                expected: Sequence[int | None] | None = None) -> list[int]:
    """Per row, how many candidate slots to keep: the budget left after the prefix and the tail, but never
    fewer than the forced ones (sinks, the whole prompt if `keep_prompt`, the recent window) — the safety
    net holds even when a shared prefix has used up the budget."""
    out = []
    expected = expected if expected is not None else [None] * len(seen)
    for n, p, cv, tv, e in zip(seen, prompt, cand_valid, tail_valid, expected, strict=True):
        head = min(n, max(retention.sinks, p if retention.keep_prompt else 0))
        forced = set(range(head)) | set(range(max(0, n - retention.recent), n))
        n_forced = sum(1 for pos in forced if prefix_len <= pos < n - tv)
        out.append(min(cv, max(retention.budget(n, e) - prefix_len - tv, n_forced)))
    return out


def protected_mask(pos: torch.Tensor, protected: torch.Tensor | None) -> torch.Tensor:
    """pos (layers, batch, heads, slots), protected (batch, k) logical positions (-2 pads) -> same-shape bool."""
    if protected is None or protected.shape[-1] == 0:
        return torch.zeros_like(pos, dtype=torch.bool)
    return (pos[..., None] == protected.view(protected.shape[0], 1, 1, -1)).any(-1)  # (…, slots, k) -> any


def plan(pos: torch.Tensor, acc: torch.Tensor | None, tail: int, retention: Retention, keep: list[int],
         seen: torch.Tensor, head: torch.Tensor, protected: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Which owned slots every layer keeps: index (layers, batch, kv_heads, kept) and filler (batch, kept).

    pos/acc (layers, batch, kv_heads, slots) as in `Retention.score`; the last `tail` slots are pinned;
    keep[row] candidates kept per row; seen (batch,) tokens seen; head (batch,): positions below it are
    forced (sinks, or the whole prompt); protected (batch, k) logical positions, -2 padded, or None.
    """
    n, b, h, s = pos.shape
    cand = pos[..., : s - tail]  # (layers, batch, heads, candidates)
    width = max(keep)
    dev = pos.device
    seen4 = seen.view(1, b, 1, 1)
    forced = (cand < head.view(1, b, 1, 1)) | (cand >= seen4 - retention.recent)
    if protected is None or protected.shape[-1] == 0:
        tier = torch.where(forced, 3.0, 1.0)  # float32
    else:
        tier = torch.where(forced, 3.0, torch.where(protected_mask(cand, protected), 2.0, 1.0))
    score = retention.score(pos, acc, seen4.float())[..., : s - tail]
    priority = (tier + 0.5 * score.clamp(0, 1)).masked_fill_(cand < 0, float("-inf"))
    top = priority.topk(width, dim=-1).indices  # (layers, batch, heads, width), best first
    # (batch, width + tail): rows keeping fewer than `width` end with filler; built on the host in one go
    filler = torch.tensor([[i >= k for i in range(width)] + [False] * tail for k in keep], dtype=torch.bool,
                          device=dev)
    order_key = cand.gather(3, top).masked_fill_(filler[None, :, None, :width], torch.iinfo(torch.int32).max)
    index = top.gather(3, order_key.argsort(dim=-1))  # kept sorted by position, filler last
    if tail:
        tail_idx = torch.arange(s - tail, s, device=dev).expand(n, b, h, tail)
        index = torch.cat([index, tail_idx], dim=-1)
    return index, filler
