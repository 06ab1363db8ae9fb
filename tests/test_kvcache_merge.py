"""`merge` (a retention knob): what is evicted is folded into one slot per query head. For the query that
weighed it the attention is exactly what it was over every token; the merged slots count in the budget; at
ratio 1 nothing changes; a batch's rows write what they write alone."""

from __future__ import annotations

import pytest
import torch

from couplet.kvcache import make_mode
from couplet.kvcache.attention import with_merged_slot
from couplet.kvcache.layer import CompressedCache, KVGeometry
from couplet.kvcache.retention import merge_evicted
from couplet.kvcache.storage import PlainStore

torch.set_num_threads(1)


def attend(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """SDPA with GQA, query (batch, q_heads, 1, d): (batch, q_heads, d)."""
    groups = query.shape[1] // key.shape[1]
    k, v = key.repeat_interleave(groups, dim=1), value.repeat_interleave(groups, dim=1)
    return torch.nn.functional.scaled_dot_product_attention(query, k, v, attn_mask=mask)[:, :, 0]


def remember(layer, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> None:
    """What the attention function leaves for a merge: the last query (scaled) and its logits over every slot."""
    b, hq, _, d = query.shape
    groups = hq // key.shape[1]
    logits = (query @ key.repeat_interleave(groups, dim=1).transpose(-1, -2))[:, :, 0] * d**-0.5
    if mask is None:
        logits = torch.cat([logits, torch.full((b, hq, groups), float("-inf"))], dim=-1)
    else:
        logits = logits + mask[:, :, 0]
    layer.last_query, layer.last_logits = query[:, :, 0] * d**-0.5, logits


def test_merged_slots_give_the_weighing_query_the_attention_over_every_token() -> None:
    torch.manual_seed(0)
    b, hk, groups, s, d = 2, 2, 3, 10, 8
    cache = CompressedCache(KVGeometry(1, hk, d, 4), PlainStore)
    layer = cache.compressed[0]
    keys, values = torch.randn(b, hk, s, d), torch.randn(b, hk, s, d)
    layer.store.update(keys, values)
    q1 = torch.randn(b, hk * groups, 1, d)
    everything = attend(q1, keys, values, None)
    remember(layer, q1, keys, None)
    kept = torch.stack([torch.randperm(s)[:6].sort().values for _ in range(b * hk)]).view(b, hk, 6)
    merge_evicted(cache, kept[None])
    cache.evict(kept[None], keep_residual=True)
    k1, v1 = layer.store.kv()
    key, value, mask = with_merged_slot(q1, k1, v1, None, layer.merged)
    assert torch.allclose(attend(q1, key, value, mask), everything, atol=1e-5)
    # a second eviction folds into what the slots hold: exact again for the query that weighed it
    q2 = torch.randn(b, hk * groups, 1, d)
    before = attend(q2, key, value, mask)
    remember(layer, q2, key, mask)
    kept2 = torch.tensor([0, 2, 5]).expand(b, hk, 3)
    merge_evicted(cache, kept2[None])
    cache.evict(kept2[None], keep_residual=True)
    k2, v2 = layer.store.kv()
    key2, value2, mask2 = with_merged_slot(q2, k2, v2, None, layer.merged)
    assert key2.shape[2] == 3 + groups
    assert torch.allclose(attend(q2, key2, value2, mask2), before, atol=1e-5)
    assert not torch.allclose(attend(q1, key2, value2, mask2), everything, atol=1e-3)  # an approximation after


def test_merged_slots_count_in_the_budget_and_ratio_one_changes_nothing(tiny_llama) -> None:
    prompt = torch.tensor([[1, 7, 12, 30, 5, 44, 9, 3, 8, 21, 17, 6]])
    outs = {}
    for name, options in {"full": {}, "selective": {"ratio": 1.0, "merge": True}}.items():
        with make_mode(name, **options).new_session(tiny_llama) as session:
            outs[name] = [session.forward(prompt)] + [session.forward(torch.tensor([[t]])) for t in (4, 9, 11)]
    assert all(torch.equal(a, b) for a, b in zip(outs["full"], outs["selective"], strict=True))

    bytes_ = {}
    for merge in (False, True):
        policy = make_mode("selective", ratio=0.5, merge=merge)
        with policy.new_session(tiny_llama) as session:
            session.expect([prompt.shape[1] + 8])
            session.forward(prompt)
            peak = session.stats().kv_bytes
            for t in range(8):
                session.forward(torch.tensor([[t + 3]]))
                peak = max(peak, session.stats().kv_bytes)
            bytes_[merge] = peak
            merged = session.cache.compressed[0].merged if merge else None
    assert merged is not None and merged[0].shape[2] == 2  # one slot per query head: 4 heads over 2 KV heads
    # within the same token budget: the merged slots took the room of evicted tokens; only the per-query-head
    # biases are extra (2 layers x 4 query heads x float32)
    assert bytes_[True] <= bytes_[False] + 2 * 4 * 4


@pytest.mark.slow
def test_a_batch_with_merge_writes_what_each_row_writes_alone(embedded_lm) -> None:
    from couplet.serving.generate import CoupletRequest, Decoding, generate, prepare

    phrases = ["龙马精神", "春风", "五福临门"]  # prompts of different lengths: left-padded
    run = Decoding(embedded_lm, [prepare(embedded_lm, CoupletRequest(p)) for p in phrases], "selective",
                   merge=True)
    run.prefill()
    while not run.done:
        out = run.step()
    run.close()
    for phrase, progress in zip(phrases, out, strict=True):
        alone = generate(embedded_lm, CoupletRequest(phrase), "selective", merge=True)
        assert (progress.result.upper, progress.result.lower) == (alone.upper, alone.lower), phrase
