"""Behaviour of selection and attention recording: the window keeps the sinks and the last N; `selective`
keeps the top-scored and the protected positions; recorded scores are real attention probabilities."""

from __future__ import annotations

import pytest
import torch
from conftest import build_tiny_lm

from couplet.kvcache import ScoreView, make_mode
from couplet.kvcache.attention import attention_scores, install_attention
from couplet.kvcache.retention import RowState, keep_counts, plan
from couplet.writing.placement import couplet_protection

torch.set_num_threads(1)

PROMPT = [1, 7, 12, 30, 5, 44, 9, 3]


def kept_positions(session, layer: int = 0) -> list[list[int]]:
    """Per KV head of row 0, the logical positions stored (sorted), real slots only."""
    pos, valid = session.cache.layers[layer].pos[0], session.rows[0].valid
    return [sorted(p for p, ok in zip(head.tolist(), valid, strict=True) if ok) for head in pos]


def test_window_keeps_sinks_and_last_tokens(tiny_llama) -> None:
    policy = make_mode("window", ratio=0.5, sinks=2, floor=4)
    with policy.new_session(tiny_llama) as session:
        session.forward(torch.tensor([PROMPT]))
        for step in range(10):
            session.forward(torch.tensor([[step + 3]]))
            n = len(PROMPT) + step + 1
            budget = policy.budget(n)
            expected = [0, 1] + list(range(n - (budget - 2), n))
            for layer in range(2):
                assert kept_positions(session, layer) == [expected, expected]
            assert session.stats().stored_tokens == budget == max(4, -(-n // 2))


def test_length_hint_makes_the_budget_a_fixed_cap(tiny_llama) -> None:
    """With `expect`, nothing is evicted until ratio * expected tokens are held; then the cap holds."""
    policy = make_mode("window", ratio=0.5, sinks=2, floor=4)
    total = len(PROMPT) + 12
    cap = -(-total // 2)
    with policy.new_session(tiny_llama) as session:
        session.expect([total])
        session.forward(torch.tensor([PROMPT]))
        assert session.stats().stored_tokens == len(PROMPT)  # 8 < cap 10: the prompt is intact
        for step in range(12):
            session.forward(torch.tensor([[step + 3]]))
            n = len(PROMPT) + step + 1
            assert session.stats().stored_tokens == min(n, cap) == policy.budget(n, total)
            assert session.stats().logical_length == n
        assert kept_positions(session) == [[0, 1, *range(total - cap + 2, total)]] * 2
    with policy.new_session(tiny_llama) as session, pytest.raises(ValueError, match="one length per batch row"):
        session.forward(torch.tensor([PROMPT]))
        session.expect([10, 12])


def test_selective_keeps_top_scored_per_head_and_protected() -> None:
    policy = make_mode("selective", ratio=0.5, sinks=1, recent=1, floor=1, decay=1.0)  # the H2O mean
    n = 10
    # per head, different favourites; the normalised score is acc / (n - pos), so set acc accordingly
    mean = torch.tensor([[[[0.0, 0.1, 0.9, 0.2, 0.8, 0.05, 0.3, 0.01, 0.02, 0.0],
                           [0.0, 0.7, 0.1, 0.6, 0.2, 0.05, 0.9, 0.01, 0.02, 0.0]]]])  # (layers, batch, heads, slots)
    acc = mean * (n - torch.arange(n, dtype=torch.float32))
    pos = torch.arange(n, dtype=torch.int32).expand(1, 1, 2, n)
    keep = keep_counts(policy, [RowState(seen=n, prompt=n, valid=[True] * n)], 0, 0)
    assert keep == [5]
    view, valid = ScoreView(pos, acc, torch.tensor(float(n)).view(1, 1, 1, 1)), torch.ones(1, n, dtype=torch.bool)
    index = plan(policy, view, valid, 0, keep, torch.tensor([1]), None)
    kept = [sorted(index[0, 0, h].tolist()) for h in range(2)]
    assert kept == [[0, 2, 4, 6, 9], [0, 1, 3, 6, 9]]  # sink 0, recent 9, then the top 3 of each head
    valid[0, 4] = False  # a slot holding no token is never kept over a real one
    assert [sorted(plan(policy, view, valid, 0, keep, torch.tensor([1]), None)[0, 0, h].tolist())
            for h in range(2)] == [[0, 2, 3, 6, 9], [0, 1, 3, 6, 9]]
    valid[0, 4] = True
    protected = torch.tensor([[7, 8]])  # low scores, but protected: they outrank every unprotected token
    index = plan(policy, view, valid, 0, keep, torch.tensor([1]), protected)
    assert [sorted(index[0, 0, h].tolist()) for h in range(2)] == [[0, 2, 7, 8, 9], [0, 6, 7, 8, 9]]


def test_decayed_scores_weigh_recent_attention(tiny_llama) -> None:
    """decay=0 keeps only the latest forward's attention (TOVA); in between, a moving average normalised by
    its weights, so a token attended to in every step scores like one attended to as much just once."""
    prompt = torch.tensor([PROMPT])
    scores = {}
    for decay in (0.0, 0.5, 1.0):
        with make_mode("selective", ratio=1.0, decay=decay).new_session(tiny_llama) as session:
            session.forward(prompt)
            before = session.cache.meta.score.clone()
            rec: list[torch.Tensor] = []
            layer = session.cache.layers[0]
            original = layer.record
            layer.record = lambda s, rec=rec, original=original: (rec.append(s), original(s))  # observe, not replace
            session.forward(torch.tensor([[3]]))
            latest = rec[0][0]  # (kv_heads, slots) attention this step paid, layer 0, row 0
            after = session.cache.meta.score[0, 0]
            assert torch.allclose(after[:, :-1], decay * before[0, 0] + latest[:, :-1])
            scores[decay] = after
    assert torch.allclose(scores[0.0].sum(-1), torch.ones(2))  # one query's probabilities: they sum to 1
    policy = make_mode("selective", decay=0.5)
    pos = torch.tensor([[[[0, 1]]]], dtype=torch.int32)
    acc = torch.tensor([[[[1.0 + 0.5 + 0.25, 1.0 + 0.5]]]])  # attention 1.0 at every step each was visible
    assert torch.allclose(policy.score(ScoreView(pos, acc, torch.tensor(3.0))), torch.tensor([[[[1.0, 1.0]]]]))
    with pytest.raises(ValueError, match=r"decay must be a number in \[0, 1\], got 1.5"):
        make_mode("selective", decay=1.5)


def test_protected_positions_survive_many_evictions(tiny_qwen2) -> None:
    # merge=False: merged slots would take their room from this 4-token floor (test_kvcache_merge counts them)
    with make_mode("selective", ratio=0.3, sinks=1, recent=1, floor=4, merge=False).new_session(tiny_qwen2) \
            as session:
        session.protect([[3, 5]])
        session.forward(torch.tensor([PROMPT]))
        for step in range(12):
            session.forward(torch.tensor([[step + 3]]))
            for layer in range(2):
                for head in kept_positions(session, layer):
                    assert {0, 3, 5, len(PROMPT) + step}.issubset(head)  # sink, protected, newest
                    assert len(head) == max(4, -(-3 * (len(PROMPT) + step + 1) // 10))


def test_recorded_scores_are_attention_probabilities(tiny_llama) -> None:
    """Each real query's probabilities sum to 1 per KV head, so after a prefill of q tokens the scores of a
    head sum to q, and after one decode step to q + 1 (decay=1: plain sums); padding queries count for nothing."""
    with make_mode("selective", ratio=1.0, decay=1.0).new_session(tiny_llama) as session:
        session.forward(torch.tensor([PROMPT]))
        for layer in session.cache.layers:
            assert torch.allclose(layer.score.sum(-1), torch.full((1, 2), float(len(PROMPT))))
        session.forward(torch.tensor([[4]]))
        for layer in session.cache.layers:
            assert torch.allclose(layer.score.sum(-1), torch.full((1, 2), len(PROMPT) + 1.0))
            # causal: the last prompt token was seen by 2 queries, the new one by 1
            assert layer.score[0, :, -1].le(1.0).all() and layer.score[0, :, -2].le(2.0).all()
    with make_mode("selective", ratio=1.0).new_session(tiny_llama) as session:
        session.forward(torch.tensor([[0, 0, *PROMPT[:5]]]), attention_mask=torch.tensor([[0, 0, 1, 1, 1, 1, 1]]))
        for layer in session.cache.layers:
            assert torch.allclose(layer.score.sum(-1), torch.full((1, 2), 5.0))
            assert layer.score[0, :, :2].eq(0).all()  # padding slots receive nothing


def test_attention_scores_average_query_heads_of_a_group() -> None:
    torch.manual_seed(0)
    q, k = torch.randn(1, 4, 1, 8), torch.randn(1, 2, 5, 8)
    got = attention_scores(q, k, None, 8 ** -0.5, None)  # (1, 2, 5)
    probs = torch.softmax(q @ k.repeat_interleave(2, dim=1).transpose(-1, -2) * 8 ** -0.5, dim=-1)  # (1, 4, 1, 5)
    assert torch.allclose(got, probs[:, :, 0].view(1, 2, 2, 5).mean(2))


def test_install_attention_is_idempotent_and_identical_to_sdpa() -> None:
    model = build_tiny_lm("qwen2", seed=3)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        before = model(ids).logits
        install_attention(model)
        install_attention(model)
        assert model.config._attn_implementation == "couplet_kv_sdpa"
        after = model(ids).logits
    assert torch.equal(before, after)


def test_couplet_protection_positions() -> None:
    # <bos> <L7> k1 k2 <sep> | upper at 5..11 | <mid> 12 | lower from 13
    assert couplet_protection([2, 3], 5, 7, 0, 0) == [2, 3]  # 上联's first character: the keywords
    assert couplet_protection([2, 3], 5, 7, 0, 3) == [2, 3, 5, 6, 7]  # … and the 上联 written so far
    assert couplet_protection([2, 3], 5, 7, 1, 0) == [5, 6, 7, 8, 9, 10, 11]  # 下联: the 上联 left to mirror
    assert couplet_protection([2, 3], 5, 7, 1, 0, keywords_in_lower=True) == [2, 3, 5, 6, 7, 8, 9, 10, 11]
    assert couplet_protection([2, 3], 5, 7, 1, 3, ahead=False) == [7, 8, 9]
    assert couplet_protection([], 5, 7, 1, 6) == [10, 11]


LONG = [1, 7, 12, 30, 5, 44, 9, 3, 17, 22, 40, 8, 33, 19, 25, 11]


def test_lookahead_scores_the_prompt_by_pseudo_decode_queries(tiny_llama) -> None:
    """`lookahead=n`: before the prompt's eviction the session feeds each row its argmax token n times, keeps
    what each (layer, KV head) of those pseudo queries attended most, and leaves no trace of them. Checked
    against transformers' eager attention on prompt + the same greedy tokens, computed independently."""
    from transformers import LlamaForCausalLM

    n, p = 3, len(LONG)
    forwards: list[int] = []
    hook = tiny_llama.register_forward_pre_hook(lambda m, a, kw: forwards.append(kw["input_ids"].shape[1]),
                                                with_kwargs=True)
    try:
        with make_mode("selective", ratio=0.5, recent=2, merge=False, lookahead=n).new_session(tiny_llama) as session:
            session.expect([p + 4])
            seen: list[torch.Tensor] = []
            look = session._look_ahead
            session._look_ahead = lambda *a: seen.append(look(*a)) or seen[-1]  # the real method, its output kept
            logits = session.forward(torch.tensor([LONG]))
            assert forwards == [p] + [1] * n  # the prefill, then the pseudo tokens one by one
            row = session.rows[0]
            assert (row.seen, row.prompt, session.cache.meta.columns) == (p, p, p)  # as if never fed
            budget = -(-(p + 4) // 2)
            assert len(row.valid) == budget and all(row.valid)
            kept = session.cache.meta.pos  # (layers, 1, kv_heads, budget)
            # the prefill recorded nothing of its own: the kept slots' scores are the pseudo queries' sums
            assert torch.allclose(session.cache.meta.score, (seen[0] * n).gather(3, kept.long()))
            # later steps go on from the prompt: a decode step is one more forward, no pseudo tokens
            session.forward(torch.tensor([[4]]))
            assert forwards[-1] == 1 and len(forwards) == 2 + n and session.rows[0].seen == p + 1
    finally:
        hook.remove()
    eager = LlamaForCausalLM(tiny_llama.config).eval()
    eager.load_state_dict(tiny_llama.state_dict())
    eager.set_attn_implementation("eager")
    ids = list(LONG)
    with torch.no_grad():
        assert int(eager(torch.tensor([ids])).logits[0, -1].argmax()) == int(logits[0, -1].argmax())
        for _ in range(n):
            ids.append(int(eager(torch.tensor([ids])).logits[0, -1].argmax()))
        att = torch.stack(eager(torch.tensor([ids]), output_attentions=True).attentions)[:, 0]  # (layers, 4, T, T)
    # the 4 query heads read 2 KV heads; the pseudo queries are the tokens fed after the prompt (the last one
    # chosen is never fed)
    expected = att[:, :, p:p + n, :p].reshape(2, 2, 2, n, p).mean(2).sum(2) / n  # (layers, kv_heads, p)
    assert len(ids) == p + n
    assert torch.allclose(seen[0][:, 0], expected, atol=1e-5)
    for layer in range(2):
        for head in range(2):
            forced = set(range(p - 2, p))  # the recent window
            top = expected[layer, head, : p - 2].topk(budget - len(forced)).indices.tolist()
            assert sorted(kept[layer, 0, head].tolist()) == sorted(forced | set(top))


def test_lookahead_costs_nothing_when_the_prompt_fits(tiny_llama) -> None:
    """No eviction at the prefill (the budget holds the whole prompt): no pseudo tokens are fed."""
    forwards: list[int] = []
    hook = tiny_llama.register_forward_pre_hook(lambda m, a, kw: forwards.append(kw["input_ids"].shape[1]),
                                                with_kwargs=True)
    try:
        for ratio in (1.0, 0.9):
            with make_mode("selective", ratio=ratio, lookahead=4).new_session(tiny_llama) as session:
                session.expect([len(LONG) + 1])
                session.forward(torch.tensor([LONG]))
        assert forwards == [len(LONG)] * 2
    finally:
        hook.remove()
