"""Cascade attention: a batch attends its rows' common pool prefix once (`attention.cascade_attention`) — the
same output and recorded attention as SDPA over [prefix, own keys] per row, and, in a session, each row's
logits as if it ran alone."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_VOCAB

from couplet.kvcache import PrefixPool, make_mode
from couplet.kvcache.attention import attention_scores, cascade_attention

torch.set_num_threads(1)


def reference(query, key, value, mask, shared):
    """SDPA over [the shared prefix copied into every row, the row's own keys], GQA by repeating KV heads."""
    b, hq, q, d = query.shape
    hk, s = key.shape[1], shared[0].shape[1]
    k = torch.cat([shared[0][None].expand(b, -1, -1, -1), key], dim=2)
    v = torch.cat([shared[1][None].expand(b, -1, -1, -1), value], dim=2)
    full_mask = None
    if mask is not None:
        full_mask = torch.cat([torch.ones(b, 1, q, s, dtype=torch.bool), mask], dim=-1)
    elif q > 1:
        kv = k.shape[2]
        full_mask = (torch.arange(kv)[None, :] <= torch.arange(q)[:, None] + kv - q)[None, None].expand(b, 1, q, kv)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1), attn_mask=full_mask,
        scale=d ** -0.5)
    return out.transpose(1, 2), attention_scores(query, k, full_mask, d ** -0.5, None)[..., s:]


@pytest.mark.parametrize("q, masked", [(1, False), (1, True), (5, False), (5, True)])
def test_cascade_attention_equals_sdpa_over_the_copied_prefix(q: int, masked: bool) -> None:
    g = torch.Generator().manual_seed(q + 10 * masked)
    b, hq, hk, d, s, kv = 3, 4, 2, 8, 11, 6 + q
    query = torch.randn(b, hq, q, d, generator=g)
    key, value = torch.randn(b, hk, kv, d, generator=g), torch.randn(b, hk, kv, d, generator=g)
    shared = (torch.randn(hk, s, d, generator=g), torch.randn(hk, s, d, generator=g))
    mask = None
    if masked:  # left padding in row 1 and a filler slot in row 2, then causal over the new tokens
        causal = torch.arange(kv)[None, :] <= torch.arange(q)[:, None] + kv - q
        mask = causal[None, None].repeat(b, 1, 1, 1)
        mask[1, :, :, :3] = False
        mask[2, :, :, 1] = False
    out, received = cascade_attention(query, key, value, mask, shared, d ** -0.5, scores=True)
    ref_out, ref_received = reference(query, key, value, mask, shared)
    assert out.shape == (b, q, hq, d)
    torch.testing.assert_close(out, ref_out, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(received, ref_received, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("mode", ["shared", "combo"])
def test_a_batch_attends_its_common_prefix_once_and_each_row_writes_as_alone(tiny_causal_lm, mode: str,
                                                                             monkeypatch) -> None:
    """Two rows with the same first blocks (a house prefix) and different tails: the session decodes the common
    blocks once per layer (cascade) and each row's logits match the row decoded alone. The decoded copy lives
    for its layer's attention only: nothing of it is left between steps. (The wrapper records what the real
    cascade attention receives, then calls it.)"""
    from couplet.kvcache import attention

    received: list[torch.Size] = []
    cascade = attention.cascade_attention
    monkeypatch.setattr(attention, "cascade_attention",
                        lambda q, k, v, m, shared, *a: (received.append(shared[0].shape), cascade(q, k, v, m, shared,
                                                                                                   *a))[1])
    house = [(5 * i + 2) % (TINY_VOCAB - 3) + 3 for i in range(12)]
    prompts = [house + [7, 9, 11], house + [13, 4, 8, 30, 21]]
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    pool = PrefixPool()
    with make_mode(mode, block_size=4).new_session(tiny_causal_lm, pool=pool) as session:
        logits = [session.forward(ids, attention_mask=mask)[:, -1]]
        layer = session.cache.compressed[0]
        assert layer.common_len == 12 and layer.cascading
        for _ in range(4):
            received.clear()
            logits.append(session.forward(logits[-1].argmax(-1)[:, None])[:, -1])
            layers = session.cache.compressed
            assert len(received) == len(layers) and all(shape[1] == 12 for shape in received)  # once, not per row
            assert all(layer.cascade_kv is None for layer in layers)  # freed as each layer attended
    for r, prompt in enumerate(prompts):
        with make_mode(mode, block_size=4).new_session(tiny_causal_lm, pool=PrefixPool()) as alone:
            out = [alone.forward(torch.tensor([prompt]))[:, -1]]
            assert not alone.cache.compressed[0].cascading  # a lone row: the plain SDPA path
            for step in range(4):
                out.append(alone.forward(logits[step][r].argmax(-1).view(1, 1))[:, -1])
        atol = 1e-4 if mode == "combo" else 1e-5  # quantized: rounding can cross a level
        for a, b in zip(logits, out, strict=True):
            torch.testing.assert_close(a[r], b[0], atol=atol, rtol=0)
    assert pool.total_refs() == 0


def test_a_padding_query_row_sees_every_key_and_real_rows_keep_transformers_mask() -> None:
    """A left-padding query row that may see no key would be NaN in CUDA's fused SDPA kernels (CPU returns
    0) and spread through the next layer; `padded_sdpa_mask` lets it see every key, and changes nothing else."""
    from transformers.masking_utils import sdpa_mask

    from couplet.kvcache.attention import padded_sdpa_mask

    pad = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1]], dtype=torch.bool)  # row 0: two left-padding positions
    want = sdpa_mask(batch_size=2, q_length=4, kv_length=4, attention_mask=pad, device="cpu")
    got = padded_sdpa_mask(batch_size=2, q_length=4, kv_length=4, attention_mask=pad, device="cpu")
    assert not want[0, 0, :2].any(-1).any()  # transformers leaves the padding rows fully masked
    assert got[0, 0, :2].all()
    assert torch.equal(got[0, 0, 2:], want[0, 0, 2:]) and torch.equal(got[1], want[1])
    # a plain masked softmax (what a kernel without a fully-masked-row guard computes): NaN, then finite
    logits = torch.randn(2, 1, 4, 4)
    assert torch.softmax(logits.masked_fill(~want, float("-inf")), -1)[0, 0, :2].isnan().all()
    assert torch.isfinite(torch.softmax(logits.masked_fill(~got, float("-inf")), -1)).all()
