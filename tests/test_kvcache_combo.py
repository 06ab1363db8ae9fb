"""A lossy prefix pool (`combo`: prompt blocks stored at int4/int8) must not make results depend on what the
pool held: cold, warm, a partial match, a longer prompt's chain, a pool too small for the prompt — the same
request gives bit-identical logits, the pool ends up holding the same bits, and every reference is released.
A batch whose rows' missing blocks are computed together (one forward per chain depth) gives the same up to
float rounding (a rounding difference may cross a quantization level) and the same greedy tokens."""

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


@pytest.mark.parametrize("mode, options", LOSSY)
@pytest.mark.parametrize("prompt", [PROMPT, PROMPT[:7]])
def test_lossy_pool_results_do_not_depend_on_pool_state(tiny_causal_lm, mode: str, options: dict,
                                                         prompt: list[int]) -> None:
    model = tiny_causal_lm
    cold_pool = PrefixPool()
    cold = run(model, mode, options, cold_pool, [prompt])
    assert len(cold_pool) > 0
    assert_identical(run(model, mode, options, cold_pool, [prompt]), cold)  # warm: every whole block is a hit

    partial = PrefixPool()  # another prompt shares the first blocks only
    run(model, mode, options, partial, [prompt[:4] + [50, 51, 52, 53, 54]])
    assert_identical(run(model, mode, options, partial, [prompt]), cold)

    longer = PrefixPool()  # a longer prompt's chain covers this one's, its last block included
    run(model, mode, options, longer, [prompt + [40, 41, 42, 43]])
    assert_identical(run(model, mode, options, longer, [prompt]), cold)

    # the pool holds the same bits whoever computed each block
    for pool in (partial, longer):
        mine, theirs = payloads(cold_pool), payloads(pool)
        shared_keys = mine.keys() & theirs.keys()
        assert shared_keys
        assert all(all(torch.equal(x, y) for x, y in zip(mine[k], theirs[k], strict=True)) for k in shared_keys)

    block = cold_pool.nbytes // len(cold_pool)  # a pool with room for one block: the others stay private
    tight = PrefixPool(max_bytes=block + block // 2)
    assert_identical(run(model, mode, options, tight, [prompt]), cold)
    assert tight.rejected > 0 and len(tight) == 1
    assert_identical(run(model, mode, options, tight, [prompt]), cold)


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
    from couplet.generate import CoupletRequest, Decoding, generate, prepare

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
