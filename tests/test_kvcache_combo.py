"""A lossy prefix pool (`combo`: prompt blocks stored at int4/int8) must not make results depend on what the
pool held: cold, warm, a partial match, a longer prompt's chain, a pool too small for the prompt, blocks
computed one at a time — the same request gives the same logits and greedy tokens, and every reference is
released. Every block is computed attending to the blocks before it as the pool stores them, a run of missing
blocks in one forward (`attention.with_requantized_run`): bit for bit where the same forward computed them
(cold against warm); up to float rounding where another split of the chain did (a rounding difference may
cross a quantization level), as where a batch's rows computed their missing blocks together."""

from __future__ import annotations

import pytest
import torch

from couplet.kvcache import PrefixPool, make_mode
from couplet.kvcache.pool import chain_keys

torch.set_num_threads(1)

PROMPT = [1, 7, 12, 30, 5, 44, 9, 3]  # 8 tokens: with block_size 2, the last block ends the prompt
LOSSY = [("combo", {"block_size": 2}), ("combo", {"bits": 4, "ratio": 0.5, "block_size": 2}),
         ("combo", {"block_size": 3, "ratio": 0.4})]


def run(model, mode: str, options: dict, pool: PrefixPool, prompts: list[list[int]],
        steps: int = 8) -> list[torch.Tensor]:
    """Left-padded greedy decoding of `prompts` in one session; every forward's logits (the prefill's whole)."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with make_mode(mode, **options).new_session(model, pool=pool) as session:
        out = [session.forward(ids, attention_mask=mask if len(prompts) > 1 else None)]
        for _ in range(steps):
            out.append(session.forward(out[-1][:, -1].argmax(-1)[:, None]))
    assert pool.total_refs() == 0
    return out


def assert_identical(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.shape == y.shape and torch.equal(x, y), (step, (x - y).abs().max() if x.shape == y.shape else None)


def assert_same_up_to_rounding(a: list[torch.Tensor], b: list[torch.Tensor]) -> None:
    """Batched block computation: CPU kernels may sum in another order at another batch shape (~1e-7), and a
    value that sits on a quantization boundary can then round to the neighbouring level: logits move by far
    less than a greedy margin, and the tokens stay the same."""
    assert len(a) == len(b)
    for step, (x, y) in enumerate(zip(a, b, strict=True)):
        assert x.shape == y.shape, step
        torch.testing.assert_close(x, y, atol=1e-3, rtol=0)
        assert torch.equal(x[:, -1].argmax(-1), y[:, -1].argmax(-1)), step  # the same greedy path


def payloads(pool: PrefixPool) -> dict[bytes, list[torch.Tensor]]:
    return {key: [t for layer in blk.payload for p in layer for t in (p.tensors() if hasattr(p, "tensors") else [p])]
            for key, blk in pool._blocks.items()}


def assert_same_blocks(a: PrefixPool, b: PrefixPool) -> None:
    """The blocks both pools hold: the same codes but for the rare value a rounding difference moved across a
    quantization level, and the same scales up to rounding."""
    mine, theirs = payloads(a), payloads(b)
    keys = mine.keys() & theirs.keys()
    assert keys
    for key in keys:
        for x, y in zip(mine[key], theirs[key], strict=True):
            if x.is_floating_point():
                torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)
            else:
                assert (x == y).float().mean() > 0.99


@pytest.mark.parametrize("mode, options", LOSSY)
@pytest.mark.parametrize("prompt", [PROMPT, PROMPT[:7], PROMPT * 3])  # 24 tokens: more than one run of 8 blocks
def test_lossy_pool_results_do_not_depend_on_pool_state(tiny_causal_lm, mode: str, options: dict,
                                                         prompt: list[int]) -> None:
    model = tiny_causal_lm
    cold_pool = PrefixPool()
    cold = run(model, mode, options, cold_pool, [prompt])
    assert len(cold_pool) > 0
    assert_identical(run(model, mode, options, cold_pool, [prompt]), cold)  # warm: every whole block is a hit

    partial = PrefixPool()  # another prompt shares the first blocks only
    run(model, mode, options, partial, [prompt[:4] + [50, 51, 52, 53, 54]])
    assert_same_up_to_rounding(run(model, mode, options, partial, [prompt]), cold)

    longer = PrefixPool()  # a longer prompt's chain covers this one's, its last block included
    run(model, mode, options, longer, [prompt + [40, 41, 42, 43]])
    assert_same_up_to_rounding(run(model, mode, options, longer, [prompt]), cold)

    # one block per forward, as the pool computed them before runs of blocks shared a forward
    bs = options["block_size"]
    by_block = PrefixPool()
    for n in range(1, (len(prompt) - 1) // bs + 1):
        run(model, mode, options, by_block, [prompt[:n * bs + 1]], steps=0)
    assert_same_up_to_rounding(run(model, mode, options, by_block, [prompt]), cold)

    # the pool holds the same blocks whoever computed each one
    for pool in (partial, longer, by_block):
        assert_same_blocks(cold_pool, pool)

    block = cold_pool.nbytes // len(cold_pool)  # a pool with room for one block: the others stay private
    tight = PrefixPool(max_bytes=block + block // 2)
    # the prompt's last block stays as the prefill computed it, where cold's came from the run: rounding
    assert_same_up_to_rounding(run(model, mode, options, tight, [prompt]), cold)
    assert tight.rejected > 0 and len(tight) == 1
    assert_same_up_to_rounding(run(model, mode, options, tight, [prompt]), cold)


@pytest.mark.parametrize("mode, options", LOSSY)
def test_lossy_pool_batches_do_not_depend_on_pool_state(tiny_causal_lm, mode: str, options: dict) -> None:
    """Left-padded rows with different numbers of whole blocks: rows beyond the common prefix hold their pool
    blocks as private slots, so a batch too gives the same logits at any pool state (bit for bit when the
    pool's blocks were computed by this same batch; up to rounding when lone requests computed them)."""
    model = tiny_causal_lm
    prompts = [PROMPT, [1, 9, 33, 4, 27], PROMPT[:4] + [50, 51, 52]]
    pool = PrefixPool()
    cold = run(model, mode, options, pool, prompts)
    assert_identical(run(model, mode, options, pool, prompts), cold)
    partial = PrefixPool()
    run(model, mode, options, partial, [PROMPT[:6] + [60]])
    assert_same_up_to_rounding(run(model, mode, options, partial, prompts), cold)
    alone = PrefixPool()
    for p in prompts:
        run(model, mode, options, alone, [p])
    assert_same_up_to_rounding(run(model, mode, options, alone, prompts), cold)


@pytest.mark.parametrize("mode", ["shared", "combo"])
def test_the_prefill_counts_the_pool_blocks_it_computed(tiny_lm, mode: str) -> None:
    """`computed_tokens` of a cold prefill is the whole prompt: the missing blocks computed into the pool
    before the prefill count too (they did not, and the serve benchmark reported 2% of `combo`'s prefill
    tokens computed where 19% were). Warm, only the tail past the last whole block is computed. A wave
    computes each distinct block once: rows with the same prompt, or with different keywords after the
    same house prefix, share what they have in common."""
    from couplet.serving.generate import CoupletRequest, Decoding, generate, prepare

    pool = PrefixPool()
    prep = prepare(tiny_lm, CoupletRequest("春风"))
    cold = generate(tiny_lm, CoupletRequest("春风"), mode, pool)
    assert cold.steps[0].computed_tokens == len(prep.prompt)
    warm = generate(tiny_lm, CoupletRequest("春风"), mode, pool)
    block = make_mode(mode).compose().sharing.block_size
    assert 0 < warm.steps[0].computed_tokens <= block
    preps = [prep, prep, prepare(tiny_lm, CoupletRequest("万象更新")), prepare(tiny_lm, CoupletRequest("五福临门"))]
    keys = [chain_keys("", p.prompt, block) for p in preps]
    distinct = len({k for row in keys for k in row})
    assert distinct < sum(len(row) for row in keys) - len(keys[0])  # the house prefix is common to all
    decoding = Decoding(tiny_lm, preps, mode, PrefixPool())
    first = decoding.prefill()
    decoding.close()
    tails = sum(len(p.prompt) - block * ((len(p.prompt) - 1) // block) for p in preps)  # fed by the prefill
    assert sum(p.record.computed_tokens for p in first) == block * distinct + tails
    with make_mode(mode).new_session(tiny_lm.model, pool=PrefixPool()) as alone:  # a row as it would alone
        ref = alone.forward(torch.tensor([preps[2].prompt]))[:, -1]
    assert_same_up_to_rounding([decoding.logits[2:3, None]], [ref[:, None]])


@pytest.mark.parametrize("lossless", [True, False])
def test_a_run_of_blocks_attends_the_blocks_before_it_as_the_pool_stores_them(lossless: bool) -> None:
    """`with_requantized_run`: one forward over a run of blocks gives each block's queries what computing that
    block alone after the earlier ones were pooled gives: the prefix, the run's earlier blocks encoded and
    decoded, its own block causally. With a lossless codec that is plain causal attention."""
    from couplet.kvcache.attention import with_requantized_run
    from couplet.kvcache.blocks import PlainCodec, QuantCodec

    g = torch.Generator().manual_seed(3)
    b, hq, hk, d, start, bs, q = 2, 4, 2, 8, 3, 2, 6
    query = torch.randn(b, hq, q, d, generator=g)
    key, value = torch.randn(b, hk, start + q, d, generator=g), torch.randn(b, hk, start + q, d, generator=g)
    codec = PlainCodec() if lossless else QuantCodec(4, None)

    def sdpa(qs, ks, vs, mask):
        return torch.nn.functional.scaled_dot_product_attention(
            qs, ks.repeat_interleave(hq // hk, dim=1), vs.repeat_interleave(hq // hk, dim=1), attn_mask=mask)

    keys, values, mask = with_requantized_run(key, value, q, codec, bs)
    assert keys.shape == (b, hk, start + 2 * q, d) and mask.shape == (b, 1, q, start + 2 * q)
    out = sdpa(query, keys, values, mask)
    for j in range(q // bs):  # block j alone, its earlier blocks from the pool
        a = start + j * bs
        stored = [torch.stack(x) for x in zip(*(codec.decode(
            [codec.encode(key[r, :, c:c + bs], value[r, :, c:c + bs]) for c in range(start, a, bs)], key.dtype)
            if a > start else (key[r, :, :0], value[r, :, :0]) for r in range(b)), strict=True)]
        ks = torch.cat([key[:, :, :start], stored[0], key[:, :, a:a + bs]], dim=2)
        vs = torch.cat([value[:, :, :start], stored[1], value[:, :, a:a + bs]], dim=2)
        causal = torch.arange(ks.shape[2])[None, :] <= torch.arange(bs)[:, None] + ks.shape[2] - bs
        torch.testing.assert_close(out[:, :, j * bs:(j + 1) * bs], sdpa(query[:, :, j * bs:(j + 1) * bs], ks, vs,
                                                                       causal), atol=1e-6, rtol=0)
    if lossless:  # every key once: plain causal attention over [prefix, run]
        causal = torch.arange(start + q)[None, :] <= torch.arange(q)[:, None] + start
        torch.testing.assert_close(out, sdpa(query, key, value, causal), atol=1e-6, rtol=0)
    else:  # a later block really sees the earlier ones quantized
        assert not torch.allclose(out, sdpa(query, key, value, torch.arange(start + q)[None, :]
                                            <= torch.arange(q)[:, None] + start), atol=1e-4)


@pytest.mark.parametrize("mode", ["shared", "combo"])
def test_the_scratch_that_computes_blocks_holds_what_admission_counts(tiny_lm, mode: str) -> None:
    """`Composition.scratch_tokens` (what the engine and `owned_peak_bytes` count for the blocks being computed
    at full precision) bounds the tokens of every forward that computes a cold prompt's pool blocks: a lossy
    pool's runs of 8 blocks, a fraction of the ~430-token prompt; a lossless pool's whole run at once."""
    from couplet.kvcache.pool_protocol import Sharing
    from couplet.serving.generate import CoupletRequest, generate, prepare

    widths: list[int] = []
    compute = Sharing._compute_blocks

    def measured(self, s, tokens, chains):  # instrumentation of the real method, not a stand-in
        widths.append(sum(len(t) for t in tokens))
        return compute(self, s, tokens, chains)

    prompt = len(prepare(tiny_lm, CoupletRequest("春风")).prompt)
    composition = make_mode(mode).compose()
    try:
        Sharing._compute_blocks = measured
        generate(tiny_lm, CoupletRequest("春风"), mode, PrefixPool())
    finally:
        Sharing._compute_blocks = compute
    bs = composition.sharing.block_size
    assert sum(widths) == (prompt - 1) // bs * bs  # every whole block computed, once
    assert max(widths) <= composition.scratch_tokens(prompt)
    if mode == "combo":
        assert composition.scratch_tokens(prompt) == 8 * bs < prompt / 4 and len(widths) > 1
    else:
        assert len(widths) == 1
