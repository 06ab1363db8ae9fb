"""Quality harness: rule pass rate, keyword coverage, diversity, held-out NLL, and every KV-cache mode
against `full` on the same greedy decode.

    python -m couplet.evaluate --keywords assets/dev_keywords.txt --json /tmp/eval.json
    python -m couplet.evaluate --keywords assets/dev_keywords.txt --modes all --sweep --plot /tmp/sweep.html
    python -m couplet.evaluate --keywords FILE --pairs heldout.tsv     # adds nll_per_char, pairs_n

Ratios are against `full` at the same dtype; the dtype (bfloat16 by default, as on a GPU) is recorded.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from couplet.events import CoupletResult
from couplet.generate import CoupletRequest, decode, generate, prepare
from couplet.kvcache import MODES, PrefixPool
from couplet.model import LoadedModel, load_model
from couplet.options import parse_settings
from couplet.text import CoupletInputError

# The budget knob each compressing mode is swept over for the quality-versus-compression plot.
BUDGET_SWEEPS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "window": ("ratio", (0.3, 0.4, 0.5, 0.6, 0.75, 1.0)),
    "selective": ("ratio", (0.3, 0.4, 0.5, 0.6, 0.75, 1.0)),
    "combo": ("ratio", (0.3, 0.4, 0.5, 0.6, 0.75)),
    "int8": ("residual", (0, 1, 2, 4)),
    "int4": ("residual", (0, 1, 2, 4)),
}


@dataclass
class EvalConfig:
    keywords: str
    json: str | None = None
    pairs: str | None = None
    modes: list[str] = field(default_factory=lambda: ["full"])
    settings: list[str] = field(default_factory=list)
    length: int = 7
    seeds: int = 3
    temperature: float = 0.8
    top_p: float = 0.9
    dtype: str = "bfloat16"
    device: str | None = None
    model: str | None = None
    sweep: bool = False
    plot: str | None = None
    limit: int | None = None


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [s for s in (line.strip() for line in f) if s and not s.startswith("#")]


def followed_nll(lm: LoadedModel, request: CoupletRequest, mode: str, pool: PrefixPool, upper: str, lower: str,
                 options: dict[str, Any]) -> float:
    """Mean NLL per character of (upper, lower) teacher-forced through `mode`'s cache."""
    logps = [p.logprob for p in decode(lm, prepare(lm, request), mode, pool, follow=(upper, lower), **options)
             if p.logprob is not None]
    return -sum(logps) / len(logps)


def base_report(lm: LoadedModel, cfg: EvalConfig, phrases: list[str], pool: PrefixPool) -> tuple[dict, dict]:
    """Greedy and sampled couplets under `full`: the foundation issue's figures."""
    greedy: dict[str, CoupletResult] = {}
    errors: dict[str, str] = {}
    seconds: list[float] = []
    distinct = 0
    for phrase in phrases:
        try:
            t0 = time.perf_counter()
            greedy[phrase] = generate(lm, CoupletRequest(phrase, cfg.length), "full", pool)
            seconds.append(time.perf_counter() - t0)
        except CoupletInputError as e:
            errors[phrase] = str(e)
            continue
        outs = {(r.upper, r.lower) for r in (
            generate(lm, CoupletRequest(phrase, cfg.length, temperature=cfg.temperature, top_p=cfg.top_p, seed=s),
                     "full", pool) for s in range(cfg.seeds))}
        distinct += len(outs) >= 2
    results = list(greedy.values())
    wanted = sum(len(set(r.keywords)) for r in results)
    covered = sum(len(set(r.keywords)) - len(r.checks["keywords"]["missing"]) for r in results)
    report = {
        "n": len(results),
        "rule_pass_rate": _mean(r.checks["passed"] for r in results),
        "keyword_coverage": covered / wanted if wanted else 0.0,
        "distinct_rate": distinct / len(results) if results else 0.0,
        "seconds_per_couplet": _mean(seconds),
        "parallelism": _mean(r.checks["parallelism"]["score"] for r in results),
        "samples": [r.to_json(with_steps=False) for r in results],
    }
    if errors:
        report["errors"] = errors
    return report, greedy


def mode_report(lm: LoadedModel, cfg: EvalConfig, mode: str, options: dict[str, Any], full: dict[str, CoupletResult],
                full_nll: dict[str, float], pool: PrefixPool) -> dict[str, Any]:
    """One mode against `full` on the same phrases: bytes, identical rate, NLL delta, rules, time."""
    peaks, identical, deltas, passed, par, seconds = [], [], [], [], [], []
    for phrase, ref in full.items():
        request = CoupletRequest(phrase, cfg.length)
        t0 = time.perf_counter()
        r = generate(lm, request, mode, pool, **options)
        seconds.append(time.perf_counter() - t0)
        peaks.append(r.peak_bytes)
        identical.append((r.upper, r.lower) == (ref.upper, ref.lower))
        passed.append(r.checks["passed"])
        par.append(r.checks["parallelism"]["score"])
        deltas.append(followed_nll(lm, request, mode, pool, ref.upper, ref.lower, options) - full_nll[phrase])
    full_peak = statistics.fmean(f.peak_bytes for f in full.values())
    return {
        "options": options,
        "kv_peak_bytes": statistics.fmean(peaks),
        "kv_ratio": statistics.fmean(peaks) / full_peak,
        "identical_rate": _mean(identical),
        "nll_delta": statistics.fmean(deltas),
        "rule_pass_rate": _mean(passed),
        "parallelism": _mean(par),
        "seconds_per_couplet": _mean(seconds),
    }


def _mean(values) -> float:
    values = [float(v) for v in values]
    return statistics.fmean(values) if values else 0.0


def sweep_plot(sweeps: dict[str, list[dict]], path: str) -> None:
    """Quality (identical rate) versus compression (KV ratio), one line per mode, as Plotly HTML."""
    import plotly.graph_objects as go

    fig = go.Figure()
    for mode, points in sweeps.items():
        fig.add_trace(go.Scatter(
            x=[p["kv_ratio"] for p in points], y=[p["identical_rate"] for p in points], mode="lines+markers",
            name=mode, text=[f"{p['knob']}={p['value']}" for p in points],
            hovertemplate="%{text}<br>KV ratio %{x:.2f}<br>identical %{y:.0%}"))
    fig.update_layout(template="none", title="Quality vs. compression (greedy, same phrases)",
                      xaxis_title="KV bytes / full", yaxis_title="identical to full", yaxis_tickformat=".0%")
    fig.write_html(path, include_plotlyjs=True)


def main(cfg: EvalConfig) -> dict[str, Any]:
    modes = list(MODES) if cfg.modes == ["all"] else cfg.modes
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        raise ValueError(f"unknown mode {unknown[0]!r}; choose from {', '.join(MODES)} or all")
    settings = parse_settings(cfg.settings, MODES)
    lm = load_model(cfg.model, cfg.device, cfg.dtype)
    phrases = read_lines(cfg.keywords)[: cfg.limit]
    pool = PrefixPool()
    report, full = base_report(lm, cfg, phrases, pool)
    report = {"dtype": cfg.dtype, "device": lm.device, "model": lm.source, **report}
    if cfg.pairs:
        from couplet.data import read_pairs
        from couplet.scoring import lower_line_nll

        pairs = [(p.upper, p.lower) for p in read_pairs(cfg.pairs)]
        report["nll_per_char"] = statistics.fmean(lower_line_nll(lm.model, lm.tokenizer, pairs))
        report["pairs_n"] = len(pairs)
    compared = [m for m in modes if m != "full"]
    if compared or cfg.sweep:
        full_nll = {p: followed_nll(lm, CoupletRequest(p, cfg.length), "full", pool, r.upper, r.lower, {})
                    for p, r in full.items()}
        report["modes"] = {"full": mode_report(lm, cfg, "full", {}, full, full_nll, pool)}
        for mode in compared:
            report["modes"][mode] = mode_report(lm, cfg, mode, settings.get(mode, {}), full, full_nll, pool)
            print(f"{mode}: {json.dumps(report['modes'][mode])}", file=sys.stderr)
        if cfg.sweep:
            sweeps: dict[str, list[dict]] = {}
            for mode, (knob, values) in BUDGET_SWEEPS.items():
                if mode not in modes:
                    continue
                sweeps[mode] = []
                for value in values:
                    opts = {**settings.get(mode, {}), knob: value}
                    point = mode_report(lm, cfg, mode, opts, full, full_nll, pool)
                    sweeps[mode].append({"knob": knob, "value": value, **point})
                    print(f"sweep {mode} {knob}={value}: ratio {point['kv_ratio']:.3f} "
                          f"identical {point['identical_rate']:.3f} parallelism {point['parallelism']:.3f}",
                          file=sys.stderr)
            report["sweeps"] = sweeps
            if cfg.plot:
                sweep_plot(sweeps, cfg.plot)
    return report


def parse_args(argv: list[str] | None = None) -> EvalConfig:
    p = argparse.ArgumentParser(prog="python -m couplet.evaluate", description=__doc__.split("\n")[0])
    p.add_argument("--keywords", required=True, help="one keyword phrase per line")
    p.add_argument("--json", default=None, help="write the report here (also printed to stdout)")
    p.add_argument("--pairs", default=None, help="TSV with upper/lower columns: adds nll_per_char")
    p.add_argument("--modes", default="full", help=f"comma-separated among {','.join(MODES)}, or all")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="MODE.FIELD=VALUE")
    p.add_argument("--length", type=int, choices=(5, 7), default=7)
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-p", type=float, default=0.9)
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--device", default=None)
    p.add_argument("--model", default=None)
    p.add_argument("--sweep", action="store_true", help="sweep each mode's budget (slow)")
    p.add_argument("--plot", default=None, help="HTML file for the quality-versus-compression plot")
    p.add_argument("--limit", type=int, default=None, help="first N phrases only")
    args = vars(p.parse_args(argv))
    args["modes"] = [m.strip() for m in args["modes"].split(",") if m.strip()]
    return EvalConfig(**args)


if __name__ == "__main__":
    try:
        cfg = parse_args()
        result = main(cfg)
    except (ValueError, FileNotFoundError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    text = json.dumps(result, ensure_ascii=False, indent=1)
    if cfg.json:
        with open(cfg.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)
