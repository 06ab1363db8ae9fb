"""`python -m couplet.bench serve` end to end on the tiny checkpoint: a Zipf burst through the engine, the
figures it promises, and a pool released at the end."""

from __future__ import annotations

import json

from couplet.serve_bench import ServeConfig, main, parse_args, phrases, workload


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
                      "--budgets", "8", "--max-batch", "2", "--json", str(out_json),
                      "--plot", str(tmp_path / "serve.html")])
    out = main(cfg)
    assert json.loads(out_json.read_text(encoding="utf-8"))["modes"].keys() == {"full", "shared", "int4"}
    for mode, r in out["modes"].items():
        for key in ("throughput_tok_s", "throughput_ratio", "admitted_concurrency", "resident_kv_peak_bytes",
                    "kv_per_request_bytes", "prefix_hit_rate", "prefill_tokens_ratio", "ttft_p50_ms", "ttft_p99_ms",
                    "tpot_p50_ms", "identical_rate"):
            assert r[key] >= 0, (mode, key)
        assert r["visitors"] == 6 and r["pool_refs_after"] == 0
    assert out["modes"]["shared"]["identical_rate"] == 1.0  # lossless
    # waves of 2: later waves find the house prefix in the pool (rows of one wave prefill together, cold)
    assert out["modes"]["shared"]["prefill_tokens_ratio"] < 0.7 < out["modes"]["full"]["prefill_tokens_ratio"]
    assert out["modes"]["int4"]["kv_per_request_bytes"] < 0.5 * out["modes"]["full"]["kv_per_request_bytes"]
    assert "| `int4` |" in capsys.readouterr().out and (tmp_path / "serve.html").exists()
