"""A registered attention function: transformers' own SDPA path, plus a record of the attention paid.

`install_attention(model)` registers `couplet_kv_sdpa` once, in both `AttentionInterface` (the attention
function) and `AttentionMaskInterface` (its mask builder: transformers' `sdpa_mask`, padding query rows made
finite: `padded_sdpa_mask`), and switches
the model to it. Outputs are bit-identical to `attn_implementation="sdpa"`: the function returns what
`sdpa_attention_forward` returns and never touches it. The model is never switched to eager.

Recording happens only while a session's forward is running (a context variable holds the active cache,
so concurrent threads do not see each other's) and only if that cache asks for it: the softmax of
q·kᵀ·scale under the same mask, averaged over the query heads of each KV head's group (GQA), summed over
the real (non-padding) queries, is added to the layer's per-slot accumulated score.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION_NAME = "couplet_kv_sdpa"


@dataclass
class Recording:
    """What the attention function needs during one forward: the cache's layers (a layer with `wants_scores`
    receives `record(...)` when `scores` is on; one with `cascade_kv` set is attended by `cascade_attention`)
    and which queries are real."""

    layers: list[Any]
    query_valid: torch.Tensor | None  # (batch, q) bool; None = all real
    scores: bool = True
    # only the last `observe` queries are recorded (the others are invalid in query_valid): the rest are not
    # even computed (SnapKV's observation window: 8 of a ~415-token prefill's queries)
    observe: int | None = None


_ACTIVE: ContextVar[Recording | None] = ContextVar("couplet_kv_recording", default=None)


@contextmanager
def recording(rec: Recording | None) -> Iterator[None]:
    token = _ACTIVE.set(rec)
    try:
        yield
    finally:
        _ACTIVE.reset(token)


def attention_scores(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float,
                     query_valid: torch.Tensor | None, logits: torch.Tensor | None = None) -> torch.Tensor:
    """Attention probabilities summed over real queries, averaged over each KV head's query heads.

    query (batch, q_heads, q, head_dim), key (batch, kv_heads, kv_len, head_dim), mask None (causal,
    bottom-right aligned) or (batch, 1, q, kv_len) bool / additive float. Returns (batch, kv_heads, kv_len).
    logits: `_logits(query, key, mask, scaling)` when the caller has them already (not recomputed; the
    unmasked decode step's own path needs none).
    """
    b, hq, q, d = query.shape
    hk = key.shape[1]
    groups = hq // hk
    if q == 1 and mask is None and query_valid is None:  # the decode step: one query sees every slot
        logits = torch.matmul(query.reshape(b, hk, groups, d).float(), key.float().transpose(-1, -2)) * scaling
        return torch.softmax(logits, dim=-1).mean(2)  # (batch, kv_heads, kv_len)
    probs = torch.softmax(_logits(query, key, mask, scaling) if logits is None else logits, dim=-1).nan_to_num_(0.0)
    return _received(probs, query_valid)


def _logits(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float) -> torch.Tensor:
    """q·kᵀ·scaling in float32, masked (-inf or the additive mask): (batch, kv_heads, groups, q, kv_len), the query
    heads grouped by the KV head they read (GQA). mask as `attention_scores`'s; None is bottom-right causal."""
    b, hq, q, d = query.shape
    hk, kv_len = key.shape[1], key.shape[2]
    groups = hq // hk
    # (batch, kv_heads, groups*q, head_dim) @ (batch, kv_heads, head_dim, kv_len)
    logits = torch.matmul(query.reshape(b, hk, groups * q, d).float(), key.float().transpose(-1, -2)) * scaling
    logits = logits.view(b, hk, groups, q, kv_len)
    if mask is None:
        if q > 1:
            logits = logits.masked_fill(~causal_visible(q, kv_len, key.device), float("-inf"))
    elif mask.dtype == torch.bool:
        logits = logits.masked_fill(~mask[:, :, None], float("-inf"))  # (batch, 1, 1, q, kv_len)
    elif mask.shape[1] == hq and hq > 1:  # per query head (`with_merged_slot`'s bias)
        logits = logits + mask.float().view(b, hk, groups, q, kv_len)
    else:
        logits = logits + mask[:, :, None].float()
    return logits


def causal_visible(q: int, kv: int, device: torch.device) -> torch.Tensor:
    """(q, kv) bool, bottom-right causal: query i sees keys up to kv - q + i (SDPA's `is_causal` over a cache)."""
    return torch.arange(kv, device=device)[None, :] <= torch.arange(q, device=device)[:, None] + (kv - q)


def merged_slot_owners(kv_heads: int, groups: int, device: torch.device) -> torch.Tensor:
    """(q_heads, groups) bool: merged slot j of a KV head serves its query head j only (`with_merged_slot`)."""
    return torch.eye(groups, dtype=torch.bool, device=device).repeat(kv_heads, 1)


def _received(probs: torch.Tensor, query_valid: torch.Tensor | None) -> torch.Tensor:
    """(batch, kv_heads, groups, q, kv_len) probabilities -> the attention each key received: averaged over the
    query heads of its group, summed over the real queries; (batch, kv_heads, kv_len)."""
    per_query = probs.mean(2)  # (batch, kv_heads, q, kv_len)
    if query_valid is not None:
        per_query = per_query * query_valid[:, None, :, None]
    return per_query.sum(2)


def cascade_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                      shared: tuple[torch.Tensor, torch.Tensor], scaling: float,
                      query_valid: torch.Tensor | None = None, scores: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention over [a prefix every row shares, then each row's own keys], the shared part stored once.

    As FlashInfer's cascade (shared-prefix) decoding: all the rows' queries meet the shared keys in one matmul
    — no per-row copy of the prefix is ever made — and each row's own keys in a batched one; the two parts are
    merged in one softmax over their concatenated logits. transformers' SDPA cannot take a key tensor shared
    across the batch, hence this function. The same values as attending [prefix, own] per row, up to float
    rounding.

    query (batch, q_heads, q, head_dim); key/value (batch, kv_heads, kv, head_dim); mask None (causal, bottom-
    right, over the own part) or (batch, 1, q, kv) bool / additive float; shared keys/values (kv_heads, s,
    head_dim). Returns the output (batch, q, q_heads, head_dim), as `sdpa_attention_forward`, and with `scores`
    the attention each own key received, as `attention_scores` gives it (batch, kv_heads, kv)."""
    b, hq, q, d = query.shape
    hk, kv, s = key.shape[1], key.shape[2], shared[0].shape[1]
    groups = hq // hk  # GQA: query heads i*groups .. i*groups + groups-1 read KV head i
    # (kv_heads, batch * groups * q, head_dim) @ (kv_heads, head_dim, s): every row's queries, one copy of the keys
    flat = query.reshape(b, hk, groups * q, d).float().transpose(0, 1).reshape(hk, b * groups * q, d)
    logits_shared = (torch.matmul(flat, shared[0].float().transpose(-1, -2)) * scaling).view(hk, b, groups * q, s)
    # the own part, masked as SDPA's mask says (the shared part precedes every query)
    logits_own = _logits(query, key, mask, scaling).view(b, hk, groups * q, kv)
    top = torch.maximum(logits_shared.amax(-1).transpose(0, 1), logits_own.amax(-1))[..., None]  # (b, hk, g*q, 1)
    e_shared = (logits_shared - top.transpose(0, 1)).exp()  # (kv_heads, batch, groups * q, s)
    e_own = (logits_own - top).exp()
    total = e_shared.sum(-1).transpose(0, 1)[..., None] + e_own.sum(-1, keepdim=True)  # (b, hk, g*q, 1)
    out_shared = torch.matmul(e_shared.reshape(hk, b * groups * q, s), shared[1].float()).view(hk, b, groups * q, d)
    out = (out_shared.transpose(0, 1) + torch.matmul(e_own, value.float())) / total
    out = out.to(query.dtype).reshape(b, hq, q, d).transpose(1, 2).contiguous()
    received = _received((e_own / total).view(b, hk, groups, q, kv), query_valid) if scores else None
    return out, received


def recording_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                             attention_mask: torch.Tensor | None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' SDPA attention, unchanged, unless the active cache's layer holds a common prefix to attend
    once (`cascade_attention`); records scores for that layer if it asks."""
    rec = _ACTIVE.get()
    layer_idx = getattr(module, "layer_idx", None)
    layer = rec.layers[layer_idx] if rec is not None and layer_idx is not None and layer_idx < len(rec.layers) \
        else None
    wants = rec is not None and rec.scores and layer is not None and getattr(layer, "wants_scores", False)
    scaling = kwargs.get("scaling")
    if scaling is None:
        scaling = getattr(module, "scaling", query.shape[-1] ** -0.5)
    shared = getattr(layer, "cascade_kv", None)
    if shared is not None:
        assert rec is not None and layer is not None
        # consumed: the decoded copy of the common prefix lives for this layer's attention only. Kept on the
        # layer, every layer's copy outlived the forward, a full-precision prefix per wave between its steps
        layer.cascade_kv = None
        out, received = cascade_attention(query, key, value, attention_mask, shared, float(scaling),
                                          rec.query_valid, wants)
        if received is not None:
            layer.record(received)
        return out, None
    run = getattr(layer, "requantized_run", None)
    if run is not None:  # a lossy pool's missing blocks, several per forward (`Sharing._compute_blocks`)
        assert layer is not None
        layer.requantized_run = None  # consumed: the caller checks that every layer's was
        key, value, attention_mask = with_requantized_run(key, value, query.shape[2], *run)
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)[0], None
    own = key.shape[2]
    merging = layer is not None and getattr(layer, "merging", False)
    if merging and layer is not None and layer.merged is not None:  # the evicted tokens' slots (`merge_evicted`)
        key, value, attention_mask = with_merged_slot(query, key, value, attention_mask, layer.merged)
    out = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)[0]
    last_logits = None  # a decode step's logits: the recording below would compute the very same ones
    if merging:  # what the next merge weighs by: the last query (scaled) and its logits over every slot
        assert layer is not None
        mask = None if attention_mask is None else attention_mask[:, :, -1:]
        grouped = _logits(query[:, :, -1:], key, mask, float(scaling))  # (b, kv_heads, groups, 1, kv)
        if query.shape[2] == 1:  # one query: the recording's `_logits(query, key, attention_mask)` is this
            last_logits = grouped
        logits = grouped.flatten(1, 2)[:, :, 0]  # (b, q_heads, kv)
        if layer.merged is None:  # no merged slots yet: theirs are empty (-inf), for one layout
            groups = query.shape[1] // key.shape[1]
            logits = torch.cat([logits, logits.new_full((*logits.shape[:2], groups), float("-inf"))], dim=-1)
        layer.last_query, layer.last_logits = query[:, :, -1].float() * float(scaling), logits
    if wants:
        assert rec is not None and layer is not None
        mask, valid = attention_mask, rec.query_valid
        if rec.observe is not None and query.shape[2] > rec.observe:  # left-padded: the last columns are real
            query = query[:, :, -rec.observe:]
            mask = None if mask is None else mask[:, :, -rec.observe:]
            valid = None if valid is None else valid[:, -rec.observe:]
        layer.record(attention_scores(query, key, mask, float(scaling), valid, last_logits)[..., :own])
    return out, None


def with_merged_slot(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None,
                     merged: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """keys/values (batch, kv_heads, kv, head_dim) + the merged slots: one per query head, `groups` per KV head
    (slot j of KV head h serves query head h * groups + j only), and the float mask (batch, q_heads, q,
    kv + groups) that gives each its query head's bias (the log of the mass it stands for) and hides it from
    the group's other heads. merged: (keys, values (batch, kv_heads, groups, head_dim), bias (batch, q_heads)).
    mask as SDPA's (None: causal)."""
    b, hq, q, _ = query.shape
    hk, kv = key.shape[1], key.shape[2]
    mk, mv, bias = merged
    if mask is None:  # causal over the stored keys, as SDPA's is_causal would be
        base = torch.zeros(b, 1, q, kv, device=query.device).masked_fill(
            ~causal_visible(q, kv, key.device), float("-inf"))
    elif mask.dtype == torch.bool:
        base = torch.zeros(mask.shape, device=query.device).masked_fill(~mask, float("-inf"))
    else:
        base = mask.float()
    groups = hq // hk
    slots = bias[:, :, None].masked_fill(~merged_slot_owners(hk, groups, query.device)[None], float("-inf"))
    full = torch.cat([base[..., :kv].expand(b, hq, q, kv), slots[:, :, None, :].expand(b, hq, q, groups)], dim=-1)
    return (torch.cat([key, mk.to(key.dtype)], dim=2), torch.cat([value, mv.to(value.dtype)], dim=2),
            full.to(query.dtype))


def with_requantized_run(key: torch.Tensor, value: torch.Tensor, q: int, codec: Any, block_size: int
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys/values and a bool mask for a run of `q` new tokens (whole blocks of `block_size`, after a pooled
    prefix) whose blocks a lossy pool will store in `codec`'s format: a query of block j attends to the prefix,
    to blocks 0..j-1 of the run as the pool stores them (encoded and decoded, block by block, as the pool
    encodes them), and to its own block at full precision, causally. That is the forward that computes block j
    alone after blocks 0..j-1 were pooled, so one forward computes the run where one per block did, with the
    same values up to float rounding (layer by layer: every hidden state below attended the same keys).

    key/value (batch, kv_heads, prefix + q, head_dim) from the cache: [pooled prefix (decoded), the run]. Returns
    [prefix, run as stored, run] keys and values and the (batch, 1, q, prefix + 2q) mask. Rows are right-padded
    by whole blocks (`_compute_blocks`): a real query's blocks before it are real."""
    b, _, kv, _ = key.shape
    start = kv - q
    stored_k, stored_v = [], []
    for r in range(b):  # encoded per block, as `Sharing._compute_blocks` encodes what the pool stores
        payloads = [codec.encode(key[r, :, a:a + block_size], value[r, :, a:a + block_size])
                    for a in range(start, kv, block_size)]
        k, v = codec.decode(payloads, key.dtype)
        stored_k.append(k)
        stored_v.append(v)
    block = torch.arange(q, device=key.device) // block_size
    earlier = block[None, :] < block[:, None]  # (q, q): the run's blocks before the query's, as stored
    own = (block[None, :] == block[:, None]) & causal_visible(q, q, key.device)  # its own block, causally
    visible = torch.cat([earlier.new_ones(q, start), earlier, own], dim=1)
    keys = torch.cat([key[:, :, :start], torch.stack(stored_k).to(key.dtype), key[:, :, start:]], dim=2)
    values = torch.cat([value[:, :, :start], torch.stack(stored_v).to(value.dtype), value[:, :, start:]], dim=2)
    return keys, values, visible[None, None].expand(b, 1, q, start + 2 * q)


def padded_sdpa_mask(*args: Any, **kwargs: Any) -> torch.Tensor | None:
    """transformers' `sdpa_mask`, except that a query row which may see no key (a left-padding position of a
    batched prefill) sees every key instead. Its output is never read (padding is masked as a key everywhere),
    but it must be finite: CPU SDPA returns 0 for a fully masked row, while CUDA's fused kernels may return
    NaN, which the next layer's 0 x NaN would spread into the row's real tokens. transformers no longer
    patches such rows (`allow_torch_fix` is a no-op), so we do; real rows' masks are unchanged."""
    mask = sdpa_mask(*args, **kwargs)
    if mask is not None and mask.dtype == torch.bool:
        mask = mask | ~mask.any(dim=-1, keepdim=True)
    return mask


def install_attention(model: Any) -> None:
    """Register (once) and select the recording SDPA attention for `model`. Idempotent; outputs identical to sdpa."""
    if ATTENTION_NAME not in AttentionInterface._global_mapping:
        AttentionInterface.register(ATTENTION_NAME, recording_sdpa_attention)
    if ATTENTION_NAME not in AttentionMaskInterface._global_mapping:
        AttentionMaskInterface.register(ATTENTION_NAME, padded_sdpa_mask)
    if model.config._attn_implementation != ATTENTION_NAME:
        model.set_attn_implementation(ATTENTION_NAME)
        if model.config._attn_implementation != ATTENTION_NAME:
            raise ValueError(f"{type(model).__name__} does not let its attention implementation be set to "
                             f"{ATTENTION_NAME!r}; it must use transformers' AttentionInterface")
