"""Retention: which owned slots survive an eviction. A retention policy is a small dataclass — its knobs and
one `score()`; the budget, its validation, the safety net (sinks + recent window, optionally the whole
prompt), protected positions, the per-row top-k and the gather live here, once.

Per row (sequence) of a batch, with `seen` real tokens so far and, when the generation loop knows it,
`expected` = the row's whole logical length at the end of the request (`ModeSession.expect`):
    budget(seen) = seen                                                  if ratio >= 1 (keep everything)
                 = min(seen, max(floor, sinks + recent, ceil(ratio * expected)))   with a length hint
                 = min(seen, max(floor, sinks + recent, ceil(ratio * seen)))       without (streaming)
counts every token the row attends to, shared prefix included. With the hint the budget is a fixed
per-request cap, as in H2O and StreamingLLM: nothing is evicted until the cache is full, and the peak is
`ratio` of the full cache's peak. Without it the cache shrinks from the first step. A policy may override
`budget` (SnapKV spends the whole cut on the prompt, at once).
Candidates are the row's valid owned slots outside the store's residual (its full-precision tail, kept in
place). Their keep order is a tier, then the score in [0, 1]: tier 3 = forced (position below the row's
`forced_below`: the sinks, or the whole prompt with `keep_prompt`; and the recent window, position >= seen -
recent), tier 2 = protected positions, tier 1 = the rest; padding and filler are never candidates. Each
(row, head) keeps its top `keep[row]` candidates, sorted by position, then filler slots up to the longest
row (so every head and every layer has the same slot count and the same filler slots), then the residual.
One plan covers all layers at once; each layer's scores choose its own slots.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING, ClassVar

import torch

from couplet.kvcache.attention import merged_slot_owners
from couplet.kvcache.base import Composition, check_bool, check_int, check_ratio

if TYPE_CHECKING:
    from couplet.kvcache.layer import CompressedCache


@dataclass
class ScoreView:
    """What a scorer sees, for every owned slot of every layer at once — what kvpress's scorers see.
    Keys and values are materialised only if a scorer reads them."""

    pos: torch.Tensor  # (layers, batch, kv_heads, slots) int32 logical positions (filler slots: any value)
    attention: torch.Tensor | None  # same shape, float32 attention received (policies with uses_attention)
    seen: torch.Tensor  # (1, batch, 1, 1) float32 tokens seen per row
    cache: CompressedCache | None = field(default=None, repr=False)  # for keys/values, read lazily
    # at the prompt's eviction, with `Retention.lookahead`: the attention the pseudo decode queries paid, per query
    # (same shape as `pos`; `ModeSession._look_ahead`)
    lookahead: torch.Tensor | None = field(default=None, repr=False)

    @cached_property
    def _kv(self) -> tuple[torch.Tensor, torch.Tensor]:
        assert self.cache is not None, "this view was made without a cache: no keys or values"
        own = [layer.store.kv() for layer in self.cache.compressed]
        keys = torch.stack([kv[0] for kv in own if kv is not None])
        return keys, torch.stack([kv[1] for kv in own if kv is not None])

    @property
    def keys(self) -> torch.Tensor:
        """(layers, batch, kv_heads, slots, head_dim) at full precision (a transient copy if quantized)."""
        return self._kv[0]

    @property
    def values(self) -> torch.Tensor:
        return self._kv[1]


class Retention:
    """Base of retention policies (mixed into `@dataclass` policies with `ratio`, `sinks`, `floor` fields and
    optionally `recent`, `keep_prompt`). Subclasses write `score`; the knobs are validated here, once."""

    ratio: float
    sinks: int
    floor: int
    recent: int = 0
    keep_prompt: bool = False
    merge: bool = False  # fold what is evicted into one slot per query head (`merge_evicted`)
    lookahead: int = 0  # pseudo decode queries that score the prompt before its eviction (`ModeSession._look_ahead`)
    chunk: int = 0  # the prompt fed this many tokens per forward, evicted after each (`base.prefill_chunk`)
    uses_attention: ClassVar[bool] = False  # record attention received per slot (`ScoreView.attention`)
    prefill_only: ClassVar[bool] = False  # evict once, after the first forward (the prompt), then never again

    def __post_init__(self) -> None:
        check_ratio(self.ratio)
        check_int("sinks", self.sinks, 0)
        check_int("floor", self.floor, 1)
        check_int("recent", self.recent, 0)
        check_bool("keep_prompt", self.keep_prompt)
        check_bool("merge", self.merge)
        check_int("lookahead", self.lookahead, 0)
        check_int("chunk", self.chunk, 0)

    @property
    def observe(self) -> int | None:
        """Record the attention of only the last `observe` queries of each forward (None: all of them)."""
        return None

    @property
    def score_decay(self) -> float:
        """How the recorded attention accumulates across forwards (`SlotMeta.decay`): 1.0 sums."""
        return 1.0

    def compose(self) -> Composition:
        return Composition(retention=self)

    def budget(self, seen: int, expected: int | None = None) -> int:
        """Tokens a row that has seen `seen` tokens may keep (prefix included); `expected`: the row's
        final logical length, when known, makes the budget a fixed cap of `ratio * expected`."""
        if self.ratio >= 1.0:
            return seen
        span = seen if expected is None else max(expected, 1)
        return min(seen, max(self.floor, self.sinks + self.recent, math.ceil(self.ratio * span)))

    def score(self, view: ScoreView) -> torch.Tensor:
        """Keep priority in [0, 1] (higher is kept) of every owned slot: (layers, batch, kv_heads, slots)."""
        raise NotImplementedError


@dataclass
class RowState:
    """One sequence of a session's batch: everything kept per row, once."""

    seen: int = 0  # real tokens so far: the next logical position
    fed: int = 0  # real tokens the last forward computed (a pool hit computes only the rest of the prompt)
    pooled_computed: int = 0  # prompt tokens computed into pool blocks for this row before its prefill (lossy)
    prompt: int = 0  # real tokens of the first forward
    valid: list[bool] = field(default_factory=list)  # per owned slot: holds a real token (not padding/filler)
    protected: list[int] = field(default_factory=list)  # logical positions to keep (`ModeSession.protect`)
    expected: int | None = None  # the whole logical length at the end of the request, if the caller said
    merged: bool = False  # something of this row was folded into its merged slots (`merge_evicted`)


def keep_counts(retention: Retention, rows: list[RowState], prefix_len: int, residual: int,
                merged: int = 0) -> list[int]:
    """Per row, how many candidate slots to keep: the budget left after the prefix, the residual and the
    `merged` slots (`merge`: once the row holds something merged, `RowState.merged`, or as soon as anything is
    evicted; per row, since a bounded prefill's rows start evicting at different forwards), but never fewer than
    the forced ones (sinks, the whole prompt if `keep_prompt`, the recent window) — the safety net holds even when a
    shared prefix has used up the budget."""
    out = []
    for row in rows:
        owned = len(row.valid)
        cand_valid, tail_valid = sum(row.valid[: owned - residual]), sum(row.valid[owned - residual:])
        n = row.seen
        forced = set(range(forced_below(retention, row))) | set(range(max(0, n - retention.recent), n))
        n_forced = sum(1 for p in forced if prefix_len <= p < n - tail_valid)
        room = retention.budget(n, row.expected) - prefix_len - tail_valid
        if row.merged or room < cand_valid:  # once anything is evicted, the merged slots take their room
            room -= merged
        out.append(min(cand_valid, max(room, n_forced)))
    return out


def forced_below(retention: Retention, row: RowState) -> int:
    """Positions below this are always kept: the sinks, or the whole prompt with `keep_prompt`."""
    return min(row.seen, max(retention.sinks, row.prompt if retention.keep_prompt else 0))


def evict(retention: Retention, cache: CompressedCache, rows: list[RowState], prefix_len: int,
          lookahead: torch.Tensor | None = None) -> None:
    """Shrink every row to its budget, the same way in every layer (equal physical lengths). lookahead: see
    `ScoreView.lookahead`."""
    residual = cache.compressed[0].store.residual_len
    owned = len(rows[0].valid)
    merged = cache.merged_slots if retention.merge else 0
    keep = keep_counts(retention, rows, prefix_len, residual, merged)
    if all(k >= sum(r.valid[: owned - residual]) for k, r in zip(keep, rows, strict=True)):
        return
    dev = cache.meta.device
    width = max(len(r.protected) for r in rows)
    protected = torch.tensor([r.protected + [-2] * (width - len(r.protected)) for r in rows], device=dev) \
        if width else None
    per_row = torch.tensor([[r.seen, forced_below(retention, r)] for r in rows], device=dev)
    valid = None if all(all(r.valid) for r in rows) else torch.tensor([r.valid for r in rows], dtype=torch.bool,
                                                                      device=dev)  # batch 1: no padding, no filler
    assert cache.meta.pos is not None
    view = ScoreView(cache.meta.pos, cache.meta.score, per_row[:, 0].float().view(1, -1, 1, 1), cache, lookahead)
    index = plan(retention, view, valid, residual, keep, per_row[:, 1], protected)
    if retention.merge:
        merge_evicted(cache, index, keep, valid)
    cache.evict(index, keep_residual=True)
    width = max(keep)
    for k, row in zip(keep, rows, strict=True):
        row.merged |= retention.merge and k < sum(row.valid[: owned - residual])
        row.valid = [True] * k + [False] * (width - k) + row.valid[owned - residual:]


def plan(retention: Retention, view: ScoreView, valid: torch.Tensor | None, residual: int, keep: list[int],
         forced_below: torch.Tensor, protected: torch.Tensor | None) -> torch.Tensor:
    """Which owned slots every layer keeps: index (layers, batch, kv_heads, kept); rows keeping fewer than the
    longest end with filler slots (the session marks them invalid).

    valid (batch, slots) bool: real tokens (None: all are); the last `residual` slots are kept in place;
    keep[row] candidates kept per row; forced_below (batch,): positions below it are forced; protected
    (batch, k) logical positions, -2 padded, or None.
    """
    pos = view.pos
    n, b, h, s = pos.shape
    cand = pos[..., : s - residual]  # (layers, batch, heads, candidates)
    width = max(keep)
    dev = pos.device
    forced = (cand < forced_below.view(1, b, 1, 1)) | (cand >= view.seen - retention.recent)
    if protected is None:
        tier = torch.where(forced, 3.0, 1.0)  # float32
    else:
        hit = (cand[..., None] == protected.view(b, 1, 1, -1)).any(-1)  # (…, slots, k) -> any
        tier = torch.where(forced, 3.0, torch.where(hit, 2.0, 1.0))
    score = retention.score(view)[..., : s - residual]
    priority = tier + 0.5 * score.clamp(0, 1)
    if valid is not None:
        priority.masked_fill_(~valid[None, :, None, : s - residual], float("-inf"))
    top = priority.topk(width, dim=-1).indices  # (layers, batch, heads, width), best first
    # (batch, width): rows keeping fewer than `width` end with filler; built on the host in one go
    filler = torch.tensor([[i >= k for i in range(width)] for k in keep], dtype=torch.bool, device=dev)
    order_key = cand.gather(3, top).masked_fill_(filler[None, :, None, :], torch.iinfo(torch.int32).max)
    index = top.gather(3, order_key.argsort(dim=-1))  # kept sorted by position, filler last
    if residual:
        index = torch.cat([index, torch.arange(s - residual, s, device=dev).expand(n, b, h, residual)], dim=-1)
    return index


def merge_evicted(cache: CompressedCache, index: torch.Tensor, keep: list[int] | None = None,
                  valid: torch.Tensor | None = None) -> None:
    """Fold the owned slots about to be evicted (those not in `index`, (layers, batch, kv_heads, kept), and the filler
    picks of a row keeping fewer than `keep`'s widest: their slots stay, but as filler, never read again; real
    tokens only, `valid` (batch, slots) when some slots are padding or filler: a row whose last query is padding, in
    a bounded prefill's forward before its prompt starts, sees every key, padding included) into each
    layer's merged slots, one per query head, with what each already holds — as the cache-merging methods do
    (CaM, Zhang et al. 2024; D2O, Wan et al. 2024), weighted by the last query's attention. For query head j:

        β_j = logsumexp of its logits over (evicted ∪ its merged slot)     (the mass they had)
        w = softmax of those logits;  k̄_j = Σ w k,  v̄_j = Σ w v
        bias_j = β_j − q_j · k̄_j   (so that the last query gives the slot exactly the mass β_j)

    For the last query the attention output is then exactly what it was over every token; later queries see
    the slot through k̄_j, so its share follows what they ask. transformers' cache layers have no notion of a
    merged slot (nor SDPA of a per-key bias without a float mask), hence this by hand."""
    for layer, kept in zip(cache.compressed, index.unbind(0), strict=True):
        kv = layer.store.kv()
        if layer.last_logits is None or layer.last_query is None or kv is None:
            continue
        keys, values = kv
        b, hk, s, d = keys.shape
        hq = layer.last_logits.shape[1]
        groups = hq // hk
        evicted = torch.ones(b, hk, s, dtype=torch.bool, device=keys.device).scatter_(2, kept, False)
        if keep is not None and min(keep) < max(keep):  # a row's filler picks are evicted too: merged as it alone
            width = max(keep)
            filler = torch.tensor([[i >= k for i in range(width)] for k in keep], device=keys.device)
            evicted.scatter_(2, kept[..., :width], filler[:, None, :].expand(b, hk, width))
        if valid is not None:
            evicted &= valid[:, None, :s]
        own = merged_slot_owners(hk, groups, keys.device)  # (q_heads, groups)
        logits = torch.cat([  # (batch, q_heads, s + 1): the evicted slots, then the head's own merged slot
            layer.last_logits[..., :s].masked_fill(~evicted.repeat_interleave(groups, dim=1), float("-inf")),
            layer.last_logits[..., s:].masked_fill(~own[None], float("-inf")).amax(-1, keepdim=True)], dim=-1)
        beta = torch.logsumexp(logits, dim=-1)  # -inf where nothing was ever evicted
        w = torch.softmax(logits, dim=-1).nan_to_num_(0.0).view(b, hk, groups, s + 1)
        old_k, old_v = (layer.merged[0], layer.merged[1]) if layer.merged is not None else \
            (keys.new_zeros(b, hk, groups, d), values.new_zeros(b, hk, groups, d))
        mk = torch.matmul(w[..., :s], keys.float()) + w[..., s:] * old_k.float()  # (batch, kv_heads, groups, d)
        mv = torch.matmul(w[..., :s], values.float()) + w[..., s:] * old_v.float()
        q_dot_k = (layer.last_query.view(b, hk, groups, d) * mk).sum(-1).view(b, hq)
        layer.merged = (mk.to(keys.dtype), mv.to(values.dtype), beta - q_dot_k)
