"""Every registered mode through one matrix on the tiny models, then the behaviour and exactness checks."""

from __future__ import annotations

import pytest
import torch
from conftest import TINY_VOCAB, build_tiny_lm
from transformers import DynamicCache

from couplet.kvcache import MODE_INFO, MODES, PrefixPool, make_mode
from couplet.kvcache.base import PlainStorage, lookahead_tokens, prefill_chunk
from couplet.kvcache.layer import CompressedLayer
from couplet.kvcache.registry import option_names
from couplet.kvcache.storage import storage_bytes

torch.set_num_threads(1)

PROMPT = [1, 7, 12, 30, 5, 44, 9, 3]
LONG_PROMPT = [(7 * i + 3) % (TINY_VOCAB - 3) + 3 for i in range(40)]  # prompt-heavy, as the real requests
BUDGETED = [m for m, info in MODE_INFO.items() if info.knob == "ratio"]  # modes with a retention budget
# retention alone: full precision, no pool — with the budget at 1.0 they must be `full` itself
RETENTION_ONLY = [m for m in BUDGETED if isinstance(make_mode(m).compose().storage, PlainStorage)
                  and make_mode(m).compose().sharing is None]


def greedy(session, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """Prefill `prompt`, then feed back the argmax `steps` times; return the tokens and last-position logits."""
    logits = session.forward(torch.tensor([prompt]))[:, -1]
    tokens, outs = [], [logits]
    for _ in range(steps):
        tokens.append(int(logits.argmax(-1)))
        logits = session.forward(torch.tensor([[tokens[-1]]]))[:, -1]
        outs.append(logits)
    return tokens, outs


def reference(model, prompt: list[int], steps: int) -> tuple[list[int], list[torch.Tensor]]:
    """The same greedy loop with transformers' DynamicCache and no session at all."""
    cache = DynamicCache()
    with torch.no_grad():
        logits = model(torch.tensor([prompt]), cache=cache, use_cache=True).logits[:, -1]
        tokens, outs = [], [logits]
        for _ in range(steps):
            tokens.append(int(logits.argmax(-1)))
            logits = model(torch.tensor([[tokens[-1]]]), cache=cache, use_cache=True).logits[:, -1]
            outs.append(logits)
    return tokens, outs


def kv_heads(model) -> int:
    return getattr(model.config, "num_key_value_heads", None) or model.config.num_attention_heads


def held_tensors(session) -> list[torch.Tensor]:
    layers = session.cache.layers
    if isinstance(layers[0], CompressedLayer):
        # a retention's merged slots (`merge`): keys, values and biases, held beside the store
        return [t for layer in layers for t in (*layer.store.tensors(), *(layer.merged or ()))]
    return [t for layer in layers for t in (layer.keys, layer.values)]


def stored_kv(layer) -> tuple[torch.Tensor, torch.Tensor]:
    """Every slot a compressed layer holds (pool prefix, then its own) at full precision, as attention sees it."""
    k, v = layer.store.kv()
    if layer.prefix_len:
        pk, pv = layer.prefix_codec.decode(layer.prefix_rows[0], k.dtype)  # batch 1: (kv_heads, prefix, head_dim)
        k, v = torch.cat([pk[None], k], dim=-2), torch.cat([pv[None], v], dim=-2)
    return k, v


# ---- the matrix: every mode, every architecture ----

@pytest.mark.parametrize("mode", list(MODES))
def test_every_mode_runs_and_accounts(tiny_causal_lm, mode: str) -> None:
    """Every mode on every architecture, cold and warm pool: exact byte accounting, and a compressing mode
    holds at most its registry byte target of `full`'s bytes (a lossless one holds them all)."""
    pool = PrefixPool()
    steps = 12
    for _ in range(2):  # cold pool, then warm pool
        with make_mode(mode).new_session(tiny_causal_lm, pool=pool) as session:
            session.expect([len(LONG_PROMPT) + steps])
            tokens, outs = greedy(session, LONG_PROMPT, steps)
            assert len(tokens) == steps and all(0 <= t < TINY_VOCAB for t in tokens)
            assert all(torch.isfinite(o).all() for o in outs)
            st = session.stats()
            logical = len(LONG_PROMPT) + steps
            assert st.logical_length == logical == session.cache.get_seq_length()
            assert 0 < st.stored_tokens <= logical
            assert st.full_equivalent_bytes == logical * 2 * 2 * kv_heads(tiny_causal_lm) * 8 * 4  # layers, K+V, fp32
            held = held_tensors(session)
            assert st.kv_bytes == storage_bytes(held) == sum(t.numel() * t.element_size() for t in held)
            assert 0 < st.total_bytes <= st.full_equivalent_bytes
            ratio = st.total_bytes / st.full_equivalent_bytes
            assert ratio == 1.0 if MODE_INFO[mode].lossless else ratio <= MODE_INFO[mode].byte_target, ratio
            lengths = {layer.get_seq_length() for layer in session.cache.layers}
            physical = {getattr(layer, "stored_length", None) or layer.keys.shape[-2] for layer in session.cache.layers}
            assert len(lengths) == 1 and len(physical) == 1
    assert pool.total_refs() == 0


def test_byte_targets_on_the_embedded_geometry() -> None:
    """The embedded model's KV geometry (6 layers, 2 KV heads, head_dim 32, bf16) at the real request's
    shape: a long prompt (the house prefix and exemplars, ~400 tokens; also 100), then 7 + 1 + 7 tokens, the
    whole length announced as the generation loop does. Every mode at its defaults meets its registry byte
    target per request (its pool share included) of `full` at the same dtype."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=TINY_VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=6,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=512)
    model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    for prompt_len in (100, 400):
        prompt = [3 + i % (TINY_VOCAB - 3) for i in range(prompt_len)]
        for mode, info in MODE_INFO.items():
            with make_mode(mode).new_session(model, pool=PrefixPool()) as session:
                session.expect([prompt_len + 15])
                greedy(session, prompt, 15)
                st = session.stats()
                assert st.full_equivalent_bytes == (prompt_len + 15) * 6 * 2 * 2 * 32 * 2
                assert st.total_bytes / st.full_equivalent_bytes <= info.byte_target, (mode, prompt_len)


# ---- exactness ----

@pytest.mark.parametrize("mode", ["full", *RETENTION_ONLY])
def test_unlimited_budget_reproduces_full_exactly(tiny_causal_lm, mode: str) -> None:
    ref_tokens, ref_logits = reference(tiny_causal_lm, PROMPT, 10)
    options = {} if mode == "full" else {"ratio": 1.0}
    with make_mode(mode, **options).new_session(tiny_causal_lm) as session:
        tokens, logits = greedy(session, PROMPT, 10)
    assert tokens == ref_tokens
    for a, b in zip(logits, ref_logits, strict=True):
        assert torch.equal(a, b)


def test_shared_reproduces_full_at_any_pool_state(tiny_causal_lm) -> None:
    """A prompt's whole blocks are always attended from the pool (`Sharing._complete_chains` computes the
    missing ones first), so the same prompt gives the same bits on a cold and a warm pool; against `full`'s
    one-forward prefill, and where a partial match attends blocks computed in another request's forward,
    matmuls block differently for a different number of rows: tight allclose and identical greedy tokens."""
    pool = PrefixPool()
    ref_tokens, ref_logits = reference(tiny_causal_lm, PROMPT, 8)
    with make_mode("shared", block_size=2).new_session(tiny_causal_lm, pool=pool) as session:  # cold
        tokens, cold = greedy(session, PROMPT, 8)
        assert session.cache.layers[0].prefix_len == len(PROMPT)  # every whole block, computed into the pool
    assert tokens == ref_tokens
    assert all(torch.allclose(a, b, atol=1e-5, rtol=0) for a, b in zip(cold, ref_logits, strict=True))
    assert len(pool) == len(PROMPT) // 2 and pool.total_refs() == 0
    snapshot = {key: [t.clone() for p in blk.payload for t in p] for key, blk in pool._blocks.items()}
    with make_mode("shared", block_size=2).new_session(tiny_causal_lm, pool=pool) as session:  # warm
        tokens, warm = greedy(session, PROMPT, 8)
        assert session.stats().shared_bytes > 0 and session.cache.layers[0].prefix_len == len(PROMPT)
    assert tokens == ref_tokens and all(torch.equal(a, b) for a, b in zip(warm, cold, strict=True))
    other = PROMPT[:4] + [50, 51, 52]  # partial match: the first two blocks only
    ref_tokens, ref_logits = reference(tiny_causal_lm, other, 8)
    with make_mode("shared", block_size=2).new_session(tiny_causal_lm, pool=PrefixPool()) as session:
        _, alone = greedy(session, other, 8)  # the same prompt on a cold pool of its own
    with make_mode("shared", block_size=2).new_session(tiny_causal_lm, pool=pool) as session:
        tokens, logits = greedy(session, other, 8)
    assert tokens == ref_tokens
    assert all(torch.allclose(a, b, atol=1e-5, rtol=0) for a, b in zip(logits, alone, strict=True))
    assert all(torch.allclose(a, b, atol=1e-5, rtol=0) for a, b in zip(logits, ref_logits, strict=True))
    assert pool.hits >= len(PROMPT) // 2 - 1 + 2 and pool.total_refs() == 0
    for key, tensors in snapshot.items():  # blocks are never mutated
        assert all(torch.equal(a, b) for a, b in zip(tensors, [t for p in pool._blocks[key].payload for t in p],
                                                      strict=True))


# ---- positions after eviction ----

@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_positions_after_eviction_match_manual_recomputation(arch: str) -> None:
    """One layer: a kept token's K/V depend only on the token and its position, so running the model on
    the kept tokens alone, at their logical positions, must give the evicted cache's logits."""
    model = build_tiny_lm(arch, layers=1, seed=1)
    with make_mode("window", ratio=0.5, sinks=2, floor=2).new_session(model) as session:
        session.forward(torch.tensor([PROMPT]))  # 8 seen -> keeps positions 0, 1, 6, 7
        kept = session.cache.layers[0].pos[0, 0].tolist()
        assert kept == [0, 1, 6, 7]
        assert session.cache.get_seq_length() == 8 and session.cache.layers[0].get_mask_sizes(1) == (5, 4)
        logits = session.forward(torch.tensor([[21]]))[:, -1]
    ids = torch.tensor([[PROMPT[p] for p in kept]])
    cache = DynamicCache()
    with torch.no_grad():
        model(ids, position_ids=torch.tensor([kept]), cache=cache, use_cache=True)
        manual = model(torch.tensor([[21]]), position_ids=torch.tensor([[8]]), cache=cache).logits[:, -1]
    assert torch.allclose(logits, manual, atol=1e-5, rtol=0)


COMPRESSED = [m for m in MODES if m != "full"]


@pytest.mark.parametrize("pool_bytes", [64 * 2**20, 0])  # a pool with room, and one refusing every block
@pytest.mark.parametrize("mode", COMPRESSED)
def test_the_prefill_holds_no_more_than_the_engine_reserves(tiny_causal_lm, mode: str, pool_bytes: int) -> None:
    """What the engine admits by (`owned_peak_bytes`, during the prefill) bounds what a cold request owns at
    the peak of its first forward: every layer's new rows stored, none yet quantized or evicted (measured
    as the last layer's store returns). With a pool, only the tail past the last whole block is held at
    full precision — the whole blocks are in the pool or, refused, owned in the store's format."""
    from couplet.kvcache.layer import KVGeometry

    prompt = LONG_PROMPT
    bound, _ = make_mode(mode).compose().owned_peak_bytes(len(prompt), len(prompt) + 4,
                                                          KVGeometry.of(tiny_causal_lm))
    with make_mode(mode).new_session(tiny_causal_lm, pool=PrefixPool(pool_bytes)) as session:
        last, held = session.cache.compressed[-1], []
        update = last.store.update

        def measured(*args, **kwargs):  # instrumentation of the real store, not a stand-in
            out = update(*args, **kwargs)
            held.append(session.cache.kv_nbytes())
            return out

        last.store.update = measured
        session.expect([len(prompt) + 4])
        session.forward(torch.tensor([prompt]))
    geometry = KVGeometry.of(tiny_causal_lm)
    full_prompt = len(prompt) * geometry.token_bytes
    composition = make_mode(mode).compose()
    # `selective`'s pseudo decode tokens join the prompt before its eviction (`ModeSession._look_ahead`)
    ahead = lookahead_tokens(composition.retention, composition.sharing is not None)
    assert ahead == (8 if mode == "selective" else 0)
    assert held and 0 < held[-1] <= bound <= full_prompt + ahead * geometry.token_bytes
    if composition.sharing is None and composition.storage.residual == 0 and MODE_INFO[mode].byte_target < 1.0 \
            and composition.retention is None:  # int8, int4: the prompt is quantized layer by layer
        per_token = 2 * geometry.layers * geometry.kv_heads * composition.storage.row_bytes(geometry.head_dim,
                                                                                          geometry.dtype_bytes)
        assert held[-1] <= len(prompt) * per_token < full_prompt  # never all layers at full precision at once
    if composition.sharing is not None and MODE_INFO[mode].byte_target < 1.0:
        # a quantized pool mode admits a prefill at a fraction of the prompt: its whole blocks in the pool's
        # format, and the run of them being computed (8 blocks at most) at full precision; here that run is
        # the whole 40-token prompt, at the real prompt's length (~430 tokens) a seventh of it
        assert bound < full_prompt
        real, _ = composition.owned_peak_bytes(430, 444, geometry)
        assert real <= 0.7 * 430 * geometry.token_bytes


def prefill_peak(model, mode: str, prompts: list[list[int]], **options) -> tuple[int, torch.Tensor]:
    """The most KV bytes a session holds at any layer's update during the prefill of `prompts` (left-padded, 6
    more tokens expected), and the prefill's last logits. Instrumentation of the real store, as above."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with make_mode(mode, **options).new_session(model) as session:
        last, held = session.cache.compressed[-1], [0]
        update = last.store.update

        def measured(*args, **kwargs):
            out = update(*args, **kwargs)
            held[0] = max(held[0], session.cache.kv_nbytes())
            return out

        last.store.update = measured
        session.expect([len(p) + 6 for p in prompts])
        logits = session.forward(ids, attention_mask=mask)[:, -1]
    return held[0], logits


@pytest.mark.parametrize("mode", ["window", "selective"])
def test_a_bounded_prefill_holds_its_budget_plus_one_chunk(tiny_causal_lm, mode: str) -> None:
    """Issue 32: a retention mode feeds the prompt a chunk at a time and evicts after each, so its prefill holds
    what one eviction keeps plus one chunk (and `selective`'s pseudo decode tokens), not the whole prompt; the
    engine reserves exactly that (`owned_peak_bytes`). One-shot (chunk 0) holds the whole prompt."""
    from couplet.kvcache.layer import KVGeometry

    geometry = KVGeometry.of(tiny_causal_lm)
    prompt = LONG_PROMPT + LONG_PROMPT[:16]  # 56 tokens (the tiny models have 64 positions)
    composition = make_mode(mode, ratio=0.3, chunk=8).compose()
    assert composition.retention is not None and prefill_chunk(composition.retention, pooled=False) == 8
    bound, steady = composition.owned_peak_bytes(len(prompt), len(prompt) + 6, geometry)
    chunked, _ = prefill_peak(tiny_causal_lm, mode, [prompt], ratio=0.3, chunk=8)
    whole, _ = prefill_peak(tiny_causal_lm, mode, [prompt], ratio=0.3, chunk=0)
    ahead = lookahead_tokens(composition.retention, pooled=False)
    cap = composition.retention.budget(len(prompt) + 6, len(prompt) + 6)  # ceil(0.3 * 62) = 19
    biases = 4 * geometry.layers * (geometry.q_heads or 0) if composition.retention.merge else 0  # merged slots'
    assert chunked <= bound <= (cap + 2 + 8 + ahead) * geometry.token_bytes + biases
    assert whole >= len(prompt) * geometry.token_bytes > 1.45 * bound
    one_shot, _ = make_mode(mode, ratio=0.3, chunk=0).compose().owned_peak_bytes(len(prompt), len(prompt) + 6,
                                                                                 geometry)
    assert whole <= one_shot and steady < bound < one_shot


@pytest.mark.parametrize("mode", ["window", "selective"])
def test_a_bounded_prefill_cuts_each_row_where_it_would_be_cut_alone(tiny_causal_lm, mode: str) -> None:
    """Chunks start at each row's first real token, so a left-padded batch's rows get what they get alone; and a
    prompt within one chunk is the one-shot prefill itself."""
    prompts = [LONG_PROMPT + LONG_PROMPT[:16], LONG_PROMPT[:13] + LONG_PROMPT[8:], LONG_PROMPT[5:]]  # 56, 45, 35
    _, together = prefill_peak(tiny_causal_lm, mode, prompts, ratio=0.3, chunk=8)
    for r, p in enumerate(prompts):
        _, alone = prefill_peak(tiny_causal_lm, mode, [p], ratio=0.3, chunk=8)
        assert torch.allclose(together[r], alone[0], atol=1e-4, rtol=0), r
    _, short = prefill_peak(tiny_causal_lm, mode, [LONG_PROMPT], ratio=0.3, chunk=40)
    _, once = prefill_peak(tiny_causal_lm, mode, [LONG_PROMPT], ratio=0.3, chunk=0)
    assert torch.equal(short, once)


@pytest.mark.parametrize("mode", BUDGETED)
def test_positions_after_eviction_multilayer(tiny_causal_lm, mode: str) -> None:
    """Any depth, per-head kept sets: the next tokens' logits equal those of a plain DynamicCache holding
    exactly the stored keys/values, with the new tokens at their logical positions (two tokens at once, as
    when the line break rides along with the last 上联 character). Without merged slots: a plain cache holds
    exactly what is kept (the merged slots' own equivalence is in test_kvcache_merge)."""
    unmerged = {"merge": False} if "merge" in option_names(mode) else {}
    with make_mode(mode, ratio=0.4, **unmerged).new_session(tiny_causal_lm, pool=PrefixPool()) as session:
        greedy(session, LONG_PROMPT, 6)
        logical = session.cache.get_seq_length()
        stored = session.cache.stored_length
        assert logical == len(LONG_PROMPT) + 6 and stored < logical
        assert all(layer.get_mask_sizes(2) == (stored + 2, logical - stored) for layer in session.cache.layers)
        cache = DynamicCache()
        for i, layer in enumerate(session.cache.layers):
            cache.update(*stored_kv(layer), i)
        logits = session.forward(torch.tensor([[17, 18]]))
    with torch.no_grad():
        manual = tiny_causal_lm(torch.tensor([[17, 18]]), position_ids=torch.tensor([[logical, logical + 1]]),
                                cache=cache).logits
    assert torch.allclose(logits, manual, atol=1e-5, rtol=0)


# ---- batches with left padding ----

def greedy_batch(session, prompts: list[list[int]], steps: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    logits = session.forward(ids, attention_mask=mask)[:, -1]
    tokens: list[list[int]] = [[] for _ in prompts]
    outs = [logits]
    for _ in range(steps):
        nxt = logits.argmax(-1)
        for row, t in zip(tokens, nxt.tolist(), strict=True):
            row.append(t)
        logits = session.forward(nxt[:, None])[:, -1]
        outs.append(logits)
    return tokens, outs


@pytest.mark.parametrize("mode", list(MODES))
def test_left_padded_batch_equals_each_sequence_alone(tiny_causal_lm, mode: str) -> None:
    """Per-row budgets, per-row gathers, padding and filler masked: each row behaves as if it ran alone
    (up to float blocking of different shapes: tight allclose, identical tokens)."""
    prompts = [PROMPT, [1, 9, 33, 4, 27]]
    options = {"ratio": 0.4} if mode in BUDGETED else {}
    with make_mode(mode, **options).new_session(tiny_causal_lm, pool=PrefixPool()) as session:
        tokens, logits = greedy_batch(session, prompts, 8)
        rows = session.stats_per_row()
    for row, prompt in enumerate(prompts):
        with make_mode(mode, **options).new_session(tiny_causal_lm, pool=PrefixPool()) as alone:
            alone_tokens, alone_logits = greedy(alone, prompt, 8)
            assert rows[row].stored_tokens == alone.stats().stored_tokens
            assert rows[row].logical_length == alone.stats().logical_length
        assert tokens[row] == alone_tokens
        atol = 1e-4 if mode in ("int8", "int4", "combo") else 1e-5  # quantized: rounding of near-ties
        for a, b in zip(logits, alone_logits, strict=True):
            assert torch.allclose(a[row], b[0], atol=atol, rtol=0), (a[row] - b[0]).abs().max()


@pytest.mark.parametrize("mode, options, atol", [
    ("int8", {}, 1e-3), ("int4", {}, 2e-2), ("int8", {"residual": 2, "symmetric": False}, 1e-3),
    ("int4", {"key_axis": "channel", "key_group": 4, "residual": 1}, 2e-2),
])
def test_quantized_logits_stay_close_to_full(tiny_causal_lm, mode: str, options: dict, atol: float) -> None:
    """Teacher-forced on full's greedy tokens, the quantized caches' logits stay near full's."""
    ref_tokens, ref_logits = reference(tiny_causal_lm, PROMPT, 10)
    with make_mode(mode, **options).new_session(tiny_causal_lm) as session:
        outs = [session.forward(torch.tensor([PROMPT]))[:, -1]]
        outs += [session.forward(torch.tensor([[t]]))[:, -1] for t in ref_tokens]
        st = session.stats()
        held = [t for layer in session.cache.layers for t in layer.store.tensors()]
        assert st.kv_bytes == sum(t.numel() * t.element_size() for t in held) < st.full_equivalent_bytes
    for a, b in zip(outs, ref_logits, strict=True):
        assert torch.allclose(a, b, atol=atol, rtol=0), (a - b).abs().max()


@pytest.mark.parametrize("mode, options", [(m, {"ratio": 0.4} if m in BUDGETED else {}) for m in MODES]
                         + [("int8", {"residual": 2, "symmetric": False})])
def test_rows_join_a_running_batch_of_their_mode_at_their_own_step_and_leave_it(tiny_causal_lm, mode: str,
                                                                                 options: dict) -> None:
    _join_and_leave(tiny_causal_lm, mode, options, [LONG_PROMPT[:37], [1, 9, 33, 4, 27], PROMPT])


@pytest.mark.parametrize("mode", [m for m in MODES if make_mode(m).compose().sharing is not None])
def test_pool_rows_join_keeping_the_shorter_prefix_they_share(tiny_causal_lm, mode: str) -> None:
    """Pool modes, rows whose prompts share their first blocks: the batch keeps the shorter prefix (the blocks all
    rows have, attended once), the longer's blocks beyond it become its own slots; each row as alone."""
    _join_and_leave(tiny_causal_lm, mode, {}, [LONG_PROMPT[:37], LONG_PROMPT[:21], LONG_PROMPT[:19]])


def _join_and_leave(tiny_causal_lm, mode: str, options: dict, prompts: list[list[int]]) -> None:
    """Continuous batching's cache half (`ModeSession.join` / `drop`), every mode: a 3-steps-old row with a long
    prompt and a freshly prefilled, left-padded pair decode on in one batch, each at its own position (quantized
    groups, retention scores and merged slots, pool prefixes of other lengths: the longer's blocks become owned
    slots); the old row leaves and the padding it made the pair carry is trimmed. Every row's tokens are what it
    writes alone, its logits what it computes alone (float rounding aside), at every step; the pool's references
    go back to zero."""
    alone = []
    for p in prompts:
        with make_mode(mode, **options).new_session(tiny_causal_lm, pool=PrefixPool()) as session:
            alone.append(greedy(session, p, 8))
    pool = PrefixPool()
    old = make_mode(mode, **options).new_session(tiny_causal_lm, pool=pool)
    new = make_mode(mode, **options).new_session(tiny_causal_lm, pool=pool)
    assert old.joinable and not old.can_join(new)  # nothing prefilled yet
    last = old.forward(torch.tensor([prompts[0]]))[:, -1]
    for _ in range(3):
        last = old.forward(last.argmax(-1, keepdim=True))[:, -1]
    width = max(len(p) for p in prompts[1:])
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts[1:]])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts[1:]])
    first = new.forward(ids, attention_mask=mask)[:, -1]
    assert old.can_join(new)
    prefix = old.cache.prefix_len
    old.join(new)
    if old.sharing is not None:  # the long prompt's blocks beyond the pair's prefix are the old row's own slots now
        assert prefix > new.cache.prefix_len == old.cache.prefix_len
    assert old.batch == 3 and len({len(row.valid) for row in old.rows}) == 1  # one owned width, left-padded
    last = torch.cat([last, first])  # each row's next-token distribution
    steps = [3, 0, 0]  # each row's step
    atol = 1e-4 if mode in ("int8", "int4", "combo") else 1e-5  # quantized: rounding of near-ties
    for step in range(4):
        tokens = last.argmax(-1)
        last = old.forward(tokens[:, None])[:, -1]
        for i, r in enumerate([0, 1, 2] if step < 2 else [1, 2]):
            steps[r] += 1
            assert int(tokens[i]) == alone[r][0][steps[r] - 1], (mode, step, r)
            assert torch.allclose(last[i], alone[r][1][steps[r]][0], atol=atol, rtol=0), (mode, step, r)
        if step == 1:  # the old row leaves, and the pair's padding with it
            before = len(old.rows[1].valid)
            old.drop([1, 2])
            last = last[1:]
            assert old.batch == 2 and len(old.rows[0].valid) <= before
            assert any(row.valid[0] for row in old.rows)  # no column is padding in every row kept
    old.close()
    new.close()
    assert pool.total_refs() == 0


def test_full_and_compressed_sessions_do_not_join_nor_per_channel_keys(tiny_causal_lm) -> None:
    """A join needs one mode and one cache format: a full cache never takes compressed rows, and int4 with keys
    quantized per channel (groups of tokens: no row join) stays a batch of its own."""
    def prefilled(mode: str, **options):
        session = make_mode(mode, **options).new_session(tiny_causal_lm)
        session.forward(torch.tensor([PROMPT]))
        return session

    full, int8 = prefilled("full"), prefilled("int8")
    assert not full.can_join(int8) and not int8.can_join(full)
    with pytest.raises(ValueError):
        full.join(int8)
    channel = [prefilled("int4", key_axis="channel", key_group=4) for _ in range(2)]
    assert not channel[0].can_join(channel[1])
    assert prefilled("int8").can_join(int8)


def test_a_sliding_window_cache_does_not_join() -> None:
    """A model with sliding-window layers (transformers' DynamicSlidingWindowLayer keeps its own width and
    counters): its full cache is not joinable, so the engine runs its waves side by side."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(vocab_size=TINY_VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         use_sliding_window=True, sliding_window=4, max_window_layers=0)
    session = make_mode("full").new_session(Qwen2ForCausalLM(config).eval())
    assert session.cache.sliding and not session.joinable
