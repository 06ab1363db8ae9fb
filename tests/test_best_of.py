"""Best-of-N on the real embedded model: the drafts are what each would be alone, the likelihood is the model's
own, the best by the documented score is the one shown, and bad input is refused in one line."""

import json
import time
from dataclasses import replace

import pytest

from couplet.__main__ import run
from couplet.kvcache import PrefixPool
from couplet.serving.best_of import BestOf, best_of, draft_requests, draft_score
from couplet.serving.generate import CoupletRequest, decode, generate, prepare
from couplet.writing.rules import check_couplet


def test_best_of_one_is_the_couplet_generate_writes(embedded_lm):
    request = CoupletRequest("龙马精神")
    alone, drafted = generate(embedded_lm, request), best_of(embedded_lm, request, BestOf(n=1))
    assert (drafted.upper, drafted.lower, drafted.hengpi) == (alone.upper, alone.lower, alone.hengpi)
    assert len(drafted.candidates) == 1 and drafted.notes == alone.notes  # no 择优 note for one draft


@pytest.mark.parametrize("keywords", ["人工智能"])
def test_the_best_draft_by_its_score_is_shown_and_each_draft_is_what_it_writes_alone(embedded_lm, keywords):
    request, best = CoupletRequest(keywords), BestOf(n=4)
    result = best_of(embedded_lm, request, best)
    drafts = sorted(result.candidates, key=lambda d: d["draft"])
    assert [d["draft"] for d in drafts] == [0, 1, 2, 3]
    for d, draft_request in zip(drafts, draft_requests(request, best), strict=True):
        alone = generate(embedded_lm, draft_request)  # a row's couplet does not depend on its batch
        assert (d["upper"], d["lower"]) == (alone.upper, alone.lower)
    assert len({(d["upper"], d["lower"]) for d in drafts}) >= 2  # sampled drafts differ
    chosen = result.candidates[0]
    assert chosen["score"] == max(d["score"] for d in drafts if d["score"] is not None)
    assert (result.upper, result.lower) == (chosen["upper"], chosen["lower"]) and result.checks["passed"]
    assert result.checks["parallelism"]["score"] == chosen["parallelism"]
    assert chosen["score"] == pytest.approx(chosen["parallelism"] + best.weight * chosen["mean_logprob"], abs=1e-3)
    assert f"从 4 副草稿中择优（第 {chosen['draft'] + 1} 副）" in result.notes[-1]
    assert json.loads(json.dumps(result.to_json(with_steps=False)))["candidates"] == result.candidates


def test_the_likelihood_is_the_model_own_at_each_free_choice(embedded_lm):
    """The reranker's log-probabilities, taken while decoding, are the teacher-forced ones of the same couplet
    (no voice bias, no constraint mask) at the characters the model chose (keywords aside)."""
    from couplet.serving.generate import Decoding

    prep = prepare(embedded_lm, CoupletRequest("五福临门"))
    run_ = Decoding(embedded_lm, [prep], "full")
    run_.prefill()
    while not run_.done:
        run_.step()
    run_.close()
    upper, lower = run_.lines[0]
    followed = list(decode(embedded_lm, prep, "full", follow=(upper, lower)))[1:]
    free = [p.logprob for p in followed if p.decision is not None]
    assert len(free) == len(run_.chosen_logprobs[0]) == 14 - len("五福临门")
    assert run_.chosen_logprobs[0] == pytest.approx(free, abs=1e-4)
    assert all(lp < 0 for lp in free)


def test_a_draft_that_breaks_a_rule_ranks_last():
    good = check_couplet("天增岁月人增寿", "春满乾坤福满门")
    bad = check_couplet("天增岁月人增寿", "春满乾坤福满")
    assert good["passed"] and not bad["passed"]
    assert draft_score(bad, [-0.1], 0.2) == float("-inf") < draft_score(good, [-9.0], 0.2)
    assert draft_score(good, [-2.0, -4.0], 0.5) == pytest.approx(good["parallelism"]["score"] - 1.5)


def test_drafts_share_the_prompt_in_the_prefix_pool_and_write_what_full_writes(embedded_lm):
    pool = PrefixPool()
    request, best = CoupletRequest("吉祥如意", length=5), BestOf(n=3)
    shared, full = best_of(embedded_lm, request, best, "shared", pool), best_of(embedded_lm, request, best)
    assert [(d["upper"], d["lower"]) for d in shared.candidates] == [(d["upper"], d["lower"]) for d in full.candidates]
    assert shared.peak_shared_bytes > 0 and shared.peak_owned_bytes < full.peak_bytes
    assert pool.total_refs() == 0


@pytest.mark.parametrize(("asked", "drafts"), [(0.0, 0.8), (0.45, 0.8), (1.2, 1.2)])
def test_drafts_sample_at_least_as_hot_as_best_of_asks(asked, drafts):
    """Draft 0 is the request as asked; the others sample at BestOf's temperature, or the request's if hotter
    (at the page's 0.45 the drafts came back to the same stock runs), each with its own seed."""
    request = CoupletRequest("龙马精神", temperature=asked, top_p=0.9 if asked else 1.0, seed=3)
    first, *rest = draft_requests(request, BestOf(n=4))
    assert first == request
    assert [(r.temperature, r.top_p) for r in rest] == [(drafts, 0.9)] * 3
    assert len({r.seed for r in rest}) == 3
    other_seed = draft_requests(replace(request, seed=4), BestOf(n=4))[1:]
    assert (other_seed == rest) is (asked == 0.0)  # greedy ignores the seed: its drafts too


@pytest.mark.parametrize("n", [0, 17])
def test_best_of_refuses_a_bad_n(n):
    with pytest.raises(ValueError, match="best-of n"):
        BestOf(n=n)


def test_cli_best_of(capsys):
    assert run(["春风", "--best-of", "3", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert len(data["candidates"]) == 3 and data["checks"]["passed"]
    assert (data["upper"], data["lower"]) == (data["candidates"][0]["upper"], data["candidates"][0]["lower"])
    assert run(["春风", "--best-of", "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("错误") and "best-of n" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("mode", ["full", "shared"])
def test_the_engine_streams_draft_zero_then_settles_on_the_best_draft(embedded_lm, mode, monkeypatch):
    """Through the engine (the page's path): the mode's stream is draft 0's as it is written, its last Progress
    the best draft — the same drafts, choice and 横批 as `best_of` in-process — and everything is released after.
    Only draft 0 (finished while the others decode) and the chosen draft get a 横批."""
    import couplet.serving.generate as generate_module
    from couplet.serving.engine import Engine, EngineConfig

    best = BestOf(n=4)
    for seed in range(5, 25):  # a request whose best draft is a sampled one: its 横批 is chosen after the ranking
        request = CoupletRequest("人工智能", temperature=0.6, top_p=0.9, seed=seed)
        alone = best_of(embedded_lm, request, best, mode, PrefixPool())
        if alone.candidates[0]["draft"] != 0:
            break
    first = generate(embedded_lm, request, mode, PrefixPool())  # draft 0: the request itself
    chosen_for = []  # the couplets a 横批 is chosen for, through the engine (a spy around the real function)
    choose = generate_module.choose_hengpi
    monkeypatch.setattr(generate_module, "choose_hengpi",
                        lambda lm, upper, lower, *a: chosen_for.append(upper + lower) or choose(lm, upper, lower, *a))
    with Engine(embedded_lm, EngineConfig(kv_budget_mb=64, pool_mb=8)) as engine:
        rounds = list(engine.stream(request, [mode], best=best))
        deadline = time.time() + 30
        while engine.stats().in_flight and time.time() < deadline:
            time.sleep(0.01)
        st = engine.stats()
        assert st.in_flight == 0 and st.pool_refs == 0 and st.reserved_bytes == 0
    streamed = [r.latest[mode] for r in rounds[:-1]]
    assert streamed[-1].upper == first.upper and first.lower.startswith(streamed[-1].lower)
    result = rounds[-1].results[mode]
    # drafts 1.. join draft 0's running batch (padded, so their log p may differ in the 4th decimal)
    assert [(d["upper"], d["lower"]) for d in result.candidates] == [(d["upper"], d["lower"]) for d in alone.candidates]
    assert [d["score"] for d in result.candidates] == pytest.approx([d["score"] for d in alone.candidates], abs=1e-3)
    assert (rounds[-1].latest[mode].upper, rounds[-1].latest[mode].lower) == (result.upper, result.lower)
    assert (result.upper, result.lower) == (alone.upper, alone.lower) and result.checks["passed"]
    assert result.notes[-1] == alone.notes[-1]
    assert result.hengpi == alone.hengpi and result.checks == alone.checks
    assert result.candidates[0]["draft"] != 0
    assert chosen_for == [first.upper + first.lower, result.upper + result.lower]
