"""Constrained decoding on the tiny random model: whatever the weights, the output is well-formed."""

import pytest
import torch

from couplet.kvcache import MODE_INFO, MODES
from couplet.serving.generate import CoupletRequest, generate, prepare, stream_modes
from couplet.writing.text import CoupletInputError
from couplet.writing.tones import LEVEL, OBLIQUE, tone_class

KEYWORD_SETS = ["龙马精神", "福", "春风", "吉祥如意", "山水花鸟云", "明月"]


@pytest.mark.parametrize("keywords", KEYWORD_SETS)
@pytest.mark.parametrize("length", [5, 7])
def test_output_is_well_formed(tiny_lm, keywords, length):
    r = generate(tiny_lm, CoupletRequest(keywords, length=length))
    assert len(r.upper) == len(r.lower) == length
    assert tone_class(r.upper[-1]) == OBLIQUE and tone_class(r.lower[-1]) == LEVEL
    assert all(c in r.upper + r.lower for c in keywords)
    assert all(a != b for a, b in zip(r.upper, r.lower, strict=True))
    assert len(set(r.upper)) == length and len(set(r.lower)) == length
    assert r.checks["passed"], r.checks["failures"]
    assert len(r.hengpi) == 4
    # one record for the prefill and one per character
    assert [s.step for s in r.steps] == list(range(2 * length + 1))


def test_keywords_open_the_lines(tiny_lm):
    r = generate(tiny_lm, CoupletRequest("龙马精神"))
    assert r.upper.startswith("龙马") and r.lower.startswith("精神")
    r = generate(tiny_lm, CoupletRequest("龙马精神", acrostic=True))
    assert r.upper.startswith("龙精") and r.lower.startswith("马神")


def test_greedy_is_deterministic_and_sampling_follows_the_seed(tiny_lm):
    a = generate(tiny_lm, CoupletRequest("春"))
    b = generate(tiny_lm, CoupletRequest("春"))
    assert (a.upper, a.lower) == (b.upper, b.lower)
    s1 = generate(tiny_lm, CoupletRequest("春", temperature=1.0, seed=1))
    s1_again = generate(tiny_lm, CoupletRequest("春", temperature=1.0, seed=1))
    others = {(generate(tiny_lm, CoupletRequest("春", temperature=1.0, seed=s)).upper) for s in range(2, 6)}
    assert (s1.upper, s1.lower) == (s1_again.upper, s1_again.lower)
    assert len(others | {s1.upper}) > 1


def test_acrostic_with_one_keyword_says_where_it_went(tiny_lm):
    prep = prepare(tiny_lm, CoupletRequest("春", acrostic=True))
    assert prep.placement.upper == {0: "春"} and prep.placement.lower == {}
    assert any("藏头只有一个字" in n for n in prep.notes)
    assert not any("藏头" in n for n in prepare(tiny_lm, CoupletRequest("春风", acrostic=True)).notes)


def test_unknown_keyword_character_is_kept_and_reported(tiny_lm):
    r = generate(tiny_lm, CoupletRequest("犇春"))
    assert r.upper.startswith("犇") and r.lower.startswith("春")
    assert any("犇" in n for n in r.notes)


@pytest.mark.parametrize("raw", ["", "abc", "<b>!</b>", "一二三四五六七八九"])
def test_bad_keywords_raise_a_clear_error(tiny_lm, raw):
    with pytest.raises(CoupletInputError):
        generate(tiny_lm, CoupletRequest(raw))


def test_invalid_request_fields_fail_at_construction():
    with pytest.raises(ValueError, match="length"):
        CoupletRequest("春", length=6)
    with pytest.raises(ValueError, match="temperature"):
        CoupletRequest("春", temperature=-1)
    with pytest.raises(ValueError, match="top_p"):
        CoupletRequest("春", top_p=0)


def test_modes_advance_in_lockstep_on_the_same_seed(tiny_lm):
    modes = list(MODES)
    rounds = list(stream_modes(tiny_lm, CoupletRequest("春风", temperature=0.7, seed=5), modes))
    length = 7
    assert len(rounds) == 2 * length + 1  # the prefill, then one round per character
    for i, state in enumerate(rounds):
        assert set(state.latest) == set(state.records) == set(modes)
        for m in modes:
            records, p = state.records[m], state.latest[m]
            assert [r.step for r in records] == list(range(i + 1))  # each step exactly once, in order
            assert records[-1] is p.record and p.record.mode == m
            assert "".join(r.token for r in records) == p.upper + p.lower  # the records spell the text so far
            for before, r in zip(records, records[1:], strict=False):  # a forward adds what it computed (<mid> too)
                assert r.logical_length - before.logical_length == r.computed_tokens == \
                    (0 if r.step == 2 * length else 2 if r.step == length else 1)
            if MODE_INFO[m].lossless:  # lossless modes write full's couplet, step by step
                assert (p.upper, p.lower) == (state.latest["full"].upper, state.latest["full"].lower)
        assert state.done == (i == len(rounds) - 1) and (state.results == {}) == (i < len(rounds) - 1)
    final = rounds[-1]
    for m, r in final.results.items():
        assert r.steps == final.records[m] and len(r.upper) == len(r.lower) == length
        # its own decoding time: every step's, plus choosing the 横批 — not the other modes' time in between
        assert sum(s.seconds for s in r.steps) <= r.seconds < sum(
            sum(s.seconds for s in rr.steps) for rr in final.results.values()) + 5
    assert final.results["full"].peak_bytes == final.results["full"].full_equivalent_bytes


def test_a_half_read_stream_leaves_autograd_as_it_was(tiny_lm):
    # a generator suspended inside `torch.inference_mode()` leaks it into its caller's thread; this once
    # broke a training run started later in the same process (its loss had no grad_fn)
    stream = stream_modes(tiny_lm, CoupletRequest("龙马精神", length=5), ["full", "int8"])
    next(stream)
    next(stream)
    assert not torch.is_inference_mode_enabled()
    assert torch.is_grad_enabled()
    w = torch.ones(2, requires_grad=True)
    assert (w * 2).sum().grad_fn is not None


@pytest.mark.parametrize("chunk", [7, 100])
def test_a_chunked_prefill_writes_what_the_whole_prefill_writes(tiny_lm, chunk):
    """`Decoding.prefill(chunk)`: a plain cache's left-padded prompts fed a few columns per call (the first chunk
    holds padding at 7) give the same couplets and count the same prompt tokens; other modes take it whole."""
    from couplet.serving.generate import Decoding, prepare

    preps = [prepare(tiny_lm, CoupletRequest(p)) for p in ("龙马精神", "春风", "五福临门")]
    runs = {}
    for size in (None, chunk):
        run, calls = Decoding(tiny_lm, preps, "full"), 1
        while (first := run.prefill(size)) is None:
            calls += 1
        while not run.done:
            last = run.step()
        runs[size] = (calls, [f.record.computed_tokens for f in first], [(p.upper, p.lower) for p in last])
    width = max(len(p.prompt) for p in preps)
    assert runs[None][0] == 1 and runs[chunk][0] == -(-width // chunk)
    assert runs[chunk][1:] == runs[None][1:] and runs[None][1] == [len(p.prompt) for p in preps]
    assert Decoding(tiny_lm, preps[:1], "int8").prefill(chunk) is not None  # a compressed store: all at once
