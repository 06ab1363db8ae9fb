"""The evaluation harness end to end on the tiny checkpoint: the documented keys, sane values."""

import json
import statistics

import pytest

from couplet.bench.quality import EvalConfig, main, parse_args
from couplet.kvcache import MODE_INFO, MODES, PrefixPool
from couplet.page.share import DEFAULT_TEMPERATURE
from couplet.serving.best_of import BestOf, best_of
from couplet.serving.generate import CoupletRequest


@pytest.fixture()
def keyword_file(tmp_path):
    path = tmp_path / "keywords.txt"
    path.write_text("# comment\n龙马\n春风\n\nabc\n福\n", encoding="utf-8")
    return path


def test_base_report_has_the_documented_keys(tiny_checkpoint, keyword_file, tmp_path):
    pairs = tmp_path / "pairs.tsv"
    pairs.write_text("upper\tlower\n春风明月山水花\t秋雨青云江河鸟\n", encoding="utf-8")
    report = main(EvalConfig(str(keyword_file), model=str(tiny_checkpoint), dtype="float32", pairs=str(pairs),
                             seeds=2))
    assert report["n"] == 3 and set(report["errors"]) == {"abc"}
    for key in ("rule_pass_rate", "keyword_coverage", "distinct_rate"):
        assert 0.0 <= report[key] <= 1.0
    assert report["rule_pass_rate"] == 1.0 and report["keyword_coverage"] == 1.0
    assert report["seconds_per_couplet"] > 0 and report["pairs_n"] == 1 and report["nll_per_char"] > 0
    assert [s["keywords"] for s in report["samples"]] == ["龙马", "春风", "福"]
    # 龙马 → 龙 / 马 at the heads of the lines: position 0 is no rhythm position, so no clash, but it is no
    # pair the model wrote, and the written 对仗 leaves it out
    assert report["keyword_clash_rate"] == 0.0 and 0.0 <= report["parallelism_written"] <= 1.0
    assert {"upper", "lower", "hengpi", "checks"} <= set(report["samples"][0])
    sampled = report["sampled"]  # the same figures over the sampled couplets, a seed at a time
    assert sampled["phrases"] == 3 and sampled["seeds"] == 2 and sampled["temperature"] == DEFAULT_TEMPERATURE
    assert sampled["rule_pass_rate"] == 1.0 and 0.0 <= sampled["parallelism"] <= 1.0
    assert 0.5 <= sampled["distinct_per_phrase"] <= 1.0 and "template_repeat" in sampled
    json.dumps(report, ensure_ascii=False)


def test_modes_report_against_full(tiny_checkpoint, keyword_file, tmp_path):
    cfg = parse_args(["--keywords", str(keyword_file), "--modes", "all", "--model", str(tiny_checkpoint),
                      "--seeds", "1", "--dtype", "bfloat16", "--floor-dtype", "float32"])
    report = main(cfg)
    assert report["dtype"] == "bfloat16" and set(report["modes"]) == set(MODES)
    floor = report["floor"]  # full at float32 against full at bfloat16: twice the bytes, rounding's flips
    assert floor["dtype"] == "float32" and floor["kv_ratio"] == pytest.approx(2.0)
    assert (floor["identical_rate"] == 1.0) == (floor["flips"] == 0) and 0.0 <= floor["step_agreement"] <= 1.0
    full = report["modes"]["full"]
    assert full["kv_ratio"] == 1.0 and full["identical_rate"] == 1.0 and full["nll_delta"] == 0.0
    assert full["step_agreement"] == 1.0 and full["flips"] == 0 and full["flips_near_tie"] is None
    for name, m in report["modes"].items():
        assert {"kv_peak_bytes", "kv_ratio", "identical_rate", "nll_delta", "rule_pass_rate", "parallelism",
                "seconds_per_couplet"} <= set(m), name
        assert m["rule_pass_rate"] == 1.0
        assert 0.0 <= m["step_agreement"] <= 1.0
        # a couplet differs from full's exactly when, following full's, the cache would pick otherwise somewhere
        assert (m["identical_rate"] == 1.0) == (m["flips"] == 0), name
        # (the registry's byte targets are for the embedded model's geometry; this tiny one has head_dim 16)
        paired = m["paired"]  # each figure against full's on the same phrases, with its p-value
        assert paired["n"] == report["n"] and 0.0 <= paired["figures"]["parallelism"]["p"] <= 1.0
        if MODE_INFO[name].lossless:
            assert m["identical_rate"] == 1.0 and m["kv_ratio"] == 1.0 and m["step_agreement"] == 1.0, name
            assert paired["significant"] == [] and all(f["p"] == 1.0 for f in paired["figures"].values())
        else:
            assert m["kv_ratio"] < 0.6, name


def test_unknown_mode_is_refused(tiny_checkpoint, keyword_file):
    with pytest.raises(ValueError, match="unknown mode"):
        main(EvalConfig(str(keyword_file), modes=["nope"], model=str(tiny_checkpoint)))


def test_sweep_writes_a_quality_versus_compression_plot(tiny_checkpoint, keyword_file, tmp_path,
                                                        monkeypatch):
    from dataclasses import replace

    # the sweep's values come from the registry; two of them keep the test short
    monkeypatch.setitem(MODE_INFO, "window", replace(MODE_INFO["window"], sweep=(0.5, 1.0)))
    plot = tmp_path / "sweep.html"
    report = main(EvalConfig(str(keyword_file), modes=["full", "window"], model=str(tiny_checkpoint),
                             dtype="float32", seeds=1, sweep=True, plot=str(plot)))
    points = report["sweeps"]["window"]
    assert [p["value"] for p in points] == [0.5, 1.0]
    assert points[1]["identical_rate"] == 1.0 and points[1]["kv_ratio"] == pytest.approx(1.0)
    assert points[0]["kv_ratio"] < points[1]["kv_ratio"]
    html = plot.read_text(encoding="utf-8")
    assert "Quality vs. compression" in html and "window" in html


def test_following_a_couplet_reports_the_greedy_decisions(tiny_checkpoint):
    """Teacher-forced along full's couplet, `full` picks every free character it followed; a cache that evicts
    most of the prompt picks otherwise somewhere exactly when its own greedy couplet differs from full's."""
    from couplet.bench.agreement import follow
    from couplet.kvcache import PrefixPool
    from couplet.models.loading import load_model
    from couplet.serving.generate import CoupletRequest, generate

    lm = load_model(str(tiny_checkpoint), dtype="float32", device="cpu")
    cfg = EvalConfig("unused", dtype="float32")
    differ = 0
    for phrase in ("龙马", "春风", "福", "明月", "山水"):
        request, pool = CoupletRequest(phrase, 7), PrefixPool()
        ref = generate(lm, request, "full", pool, cfg.prompt, cfg.voice)
        own = follow(lm, cfg, request, "full", pool, ref.upper, ref.lower, {})
        assert own.agrees and all(own.agrees) and all(m >= 0 for m in own.margins)
        assert len(own.agrees) == len([c for c in ref.upper + ref.lower if c not in phrase])  # keywords are given
        lossy = generate(lm, request, "window", pool, cfg.prompt, cfg.voice, ratio=0.1)
        forced = follow(lm, cfg, request, "window", pool, ref.upper, ref.lower, {"ratio": 0.1})
        same = (lossy.upper, lossy.lower) == (ref.upper, ref.lower)
        assert same == all(forced.agrees), phrase
        differ += not same
    assert differ  # the check above was exercised both ways


def test_a_greedy_decision_breaks_exact_ties_as_sampling_does():
    """bf16 logits tie exactly and often; the teacher-forced pick must be the one greedy decoding takes."""
    import torch

    from couplet.serving.generate import CoupletRequest, greedy_decision, sample

    logits = torch.tensor([0.0, 2.5, 1.0, 2.5, -1.0])
    allowed = torch.tensor([True, True, True, True, False])
    pick, margin = greedy_decision(torch.where(allowed, logits, float("-inf")))
    assert pick == sample(logits, allowed, CoupletRequest("春", 7, temperature=0.0), step=1) == 1
    assert margin == 0.0
    alone = torch.tensor([True, False, False, False, False])
    assert greedy_decision(torch.where(alone, logits, float("-inf"))) == (0, float("inf"))


def test_best_of_reports_each_phrase_best_draft_and_is_full_only(tiny_checkpoint, keyword_file):
    cfg = parse_args(["--keywords", str(keyword_file), "--model", str(tiny_checkpoint), "--seeds", "0",
                      "--dtype", "float32", "--best-of", "3"])
    report = main(cfg)
    assert report["best_of"]["n"] == 3 and report["n"] == 3 and report["rule_pass_rate"] == 1.0
    for sample in report["samples"]:
        drafts = sample["candidates"]
        assert len(drafts) == 3 and (sample["upper"], sample["lower"]) == (drafts[0]["upper"], drafts[0]["lower"])
        assert drafts[0]["score"] == max(d["score"] for d in drafts if d["score"] is not None)
    with pytest.raises(ValueError, match="full cache alone"):
        main(EvalConfig(str(keyword_file), modes=["full", "int8"], model=str(tiny_checkpoint), best_of=2))


def test_best_of_samples_each_couplet_as_the_page_does(tiny_checkpoint, tiny_lm, keyword_file):
    """With a temperature, the sampled couplets are the best of the drafts too (the page's 择优: the drafts sample
    at the request's own temperature): the report's sampled figures are `best_of`'s own at each seed."""
    cfg = parse_args(["--keywords", str(keyword_file), "--model", str(tiny_checkpoint), "--seeds", "2",
                      "--temperature", "0.6", "--dtype", "float32", "--best-of", "3"])
    sampled = main(cfg)["sampled"]
    per_seed = [[best_of(tiny_lm, CoupletRequest(p, cfg.length, temperature=0.6, top_p=0.9, seed=s), BestOf(n=3),
                         "full", PrefixPool(), cfg.prompt, cfg.voice) for p in ("龙马", "春风", "福")] for s in (0, 1)]
    assert sampled["parallelism"] == pytest.approx(
        statistics.fmean(statistics.fmean(r.checks["parallelism"]["score"] for r in rs) for rs in per_seed))
    assert all(len(r.candidates) == 3 for rs in per_seed for r in rs)
