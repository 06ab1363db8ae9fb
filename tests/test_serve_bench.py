"""`python -m couplet.bench serve` end to end on the tiny checkpoint: a Zipf burst through the engine, the
figures it promises, and a pool released at the end."""

from __future__ import annotations

import json

import pytest

from couplet.bench.serve import ServeConfig, main, parse_args, phrases, workload


def test_the_workload_is_zipf_over_enough_phrases() -> None:
    assert len(phrases()) >= 200
    typed, arrivals = workload(ServeConfig(visitors=2000, rate=50.0))
    counts = sorted((typed.count(p) for p in set(typed)), reverse=True)
    assert counts[0] > 10 * counts[len(counts) // 2]  # a few phrases are typed far more than the typical one
    assert arrivals == sorted(arrivals) and 20 < arrivals[-1] < 60  # ~2000 / 50 per second
    assert workload(ServeConfig(visitors=5))[1] == [0.0] * 5  # rate 0: a burst


def test_serve_reports_every_figure_per_mode(tiny_checkpoint, tmp_path, capsys) -> None:
    out_json = tmp_path / "serve.json"
    cfg = parse_args(["--visitors", "6", "--modes", "full,shared,int4", "--model", str(tiny_checkpoint),
                      "--budgets", "8,12", "--max-batch", "2", "--json", str(out_json),
                      "--plot", str(tmp_path / "serve.html")])
    out = main(cfg)
    assert json.loads(out_json.read_text(encoding="utf-8"))["modes"].keys() == {"full", "shared", "int4"}
    for mode, r in out["modes"].items():
        for key in ("throughput_tok_s", "throughput_ratio", "admitted_concurrency", "resident_kv_peak_bytes",
                    "kv_per_request_bytes", "prefix_hit_rate", "prefill_tokens_ratio", "ttft_p50_ms", "ttft_p99_ms",
                    "tpot_p50_ms", "identical_rate"):
            assert r[key] >= 0, (mode, key)
        assert r["visitors"] == 6 and r["pool_refs_after"] == 0
        # the couplets are all written before the last 横批 is chosen (the finisher works beside the worker)
        assert r["generation_tok_s"] >= r["throughput_tok_s"] > 0 and r["generation_ratio"] > 0
    assert out["modes"]["shared"]["identical_rate"] == 1.0  # lossless
    # waves of 2: later waves find the house prefix in the pool (rows of one wave prefill together, cold)
    assert out["modes"]["shared"]["prefill_tokens_ratio"] < 0.7 < out["modes"]["full"]["prefill_tokens_ratio"]
    assert out["modes"]["int4"]["kv_per_request_bytes"] < 0.5 * out["modes"]["full"]["kv_per_request_bytes"]
    # the prompt's resident KV after the prefill against unshared: all of it for `full` (padding aside), its
    # owned rest and its share of the pool for `shared`, a fraction of the bytes for `int4`
    full, shared, int4 = (out["modes"][m]["prompt_kv_ratio"] for m in ("full", "shared", "int4"))
    assert full >= 0.999 and shared < 0.9 * full and int4 < 0.4 * full
    # the memory in use against the same tokens unshared, sampled while they run: all of it for `full` (its
    # padding on top), less for `shared` (a pool block counted once, however many reference it) and `int4`
    full, shared, int4 = (out["modes"][m]["in_use_kv_ratio"] for m in ("full", "shared", "int4"))
    assert full >= 1.0 and shared < 0.9 and int4 < 0.4, (full, shared, int4)
    # the same figure by how many visitors typed the keywords: every visitor lands in one bucket
    for mode, r in out["modes"].items():
        buckets = r["prompt_kv_by_popularity"]
        assert sum(b["visitors"] for b in buckets.values()) == 6, mode
        weighted = sum(b["visitors"] * b["prompt_kv_ratio"] for b in buckets.values()) / 6
        assert abs(weighted - r["prompt_kv_ratio"]) < 1e-9, mode
    assert "| `int4` |" in capsys.readouterr().out
    assert [run["budget_mb"] for run in out["runs"]] == [8.0, 12.0]  # the sweep: every mode at every budget
    assert all(run["modes"].keys() == out["modes"].keys() for run in out["runs"])
    assert (tmp_path / "serve.html").stat().st_size > 100_000  # plotly.js inlined: opens offline
    assert (tmp_path / "serve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"  # kaleido (test extras), Chromium


def test_every_mode_is_measured_from_the_same_state(tiny_checkpoint) -> None:
    """The 横批 is cached per couplet; a mode measured after `full` must not find its couplets' 横批 already
    chosen (it looked up to ~15% faster): each mode's run computes them again."""
    from couplet.bench.serve import run_mode
    from couplet.models.loading import load_model
    from couplet.serving.generate import CoupletRequest, prepare
    from couplet.writing import hengpi

    lm = load_model(str(tiny_checkpoint), "cpu", "float32")
    cfg = parse_args(["--visitors", "4", "--max-batch", "2"])
    typed, arrivals = workload(cfg)
    preps = {p: prepare(lm, CoupletRequest(p)) for p in set(typed)}
    _, full = run_mode(lm, "full", 8.0, cfg, typed, arrivals, preps)
    assert hengpi._choose.cache_info().currsize == len(set(full.values()))  # full's 横批 are remembered
    _, shared = run_mode(lm, "shared", 8.0, cfg, typed, arrivals, preps)
    assert shared == full  # lossless: the same couplets, so the same 横批 to choose
    info = hengpi._choose.cache_info()  # since the shared run began: every couplet computed, none found
    assert info.misses == len(set(shared.values())) and info.hits == len(typed) - info.misses


def test_prompt_kv_is_split_by_how_many_visitors_typed_the_keywords() -> None:
    from couplet.bench.serve import prompt_kv_by_popularity

    typed = ["吉祥如意"] * 70 + ["平安"] * 5 + ["耕读传家", "耕读传家"]
    ratios = [0.03] * 70 + [0.1] * 5 + [0.4]  # the last visitor got no result: left out
    assert prompt_kv_by_popularity(typed, list(zip(typed[:-1], ratios, strict=True))) == {
        "1-3": {"visitors": 1, "prompt_kv_ratio": pytest.approx(0.4)},
        "4-15": {"visitors": 5, "prompt_kv_ratio": pytest.approx(0.1)},
        "64+": {"visitors": 70, "prompt_kv_ratio": pytest.approx(0.03)}}
