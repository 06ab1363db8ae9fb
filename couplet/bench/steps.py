"""Per-step decode cost and KV bytes of every mode against `full`, measured in one run as ratios.

    python -m couplet.bench --modes all --reps 10
    python -m couplet.bench --model /tmp/palm-base-shape   # any checkpoint (`--model` as in the CLI)
    python -m couplet.bench serve --visitors 1000     # many visitors through the engine: see couplet.bench.serve

Modes are interleaved phrase by phrase (full, window, …, full, window, …) so machine noise hits them alike;
the step time is the wall time of one decode step as the generation loop sees it (forward, constraints,
sampling, eviction, accounting), the prefill excluded. `vs full` is paired: per round (one phrase, every
mode back to back) the mode's median step over `full`'s in the same round, then the median over rounds —
on a shared machine the load drifts between rounds, and a ratio of pooled medians would carry that drift.
This is a benchmark that prints figures, not a test.
"""

from __future__ import annotations

import argparse
import statistics
from dataclasses import dataclass, field

import torch

from couplet.kvcache import MODES, PrefixPool, parse_modes, parse_settings
from couplet.models.hub import add_model_args
from couplet.models.loading import load_model
from couplet.serving.generate import CoupletRequest, generate

PHRASES = ["龙马精神", "吉祥如意", "春风", "明月", "五福临门", "梅花", "平安", "国泰民安"]


@dataclass
class BenchConfig:
    modes: list[str] = field(default_factory=lambda: list(MODES))
    reps: int = 5
    dtype: str = "float32"
    device: str | None = None
    threads: int | None = None
    settings: list[str] = field(default_factory=list)
    model: str | None = None  # None: $COUPLET_MODEL or the embedded
    weights: str | None = None


def main(cfg: BenchConfig) -> dict[str, dict[str, float]]:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    settings = parse_settings(cfg.settings)
    lm = load_model(cfg.model, cfg.device, cfg.dtype, cfg.weights)
    for m in [m for m in cfg.modes if lm.family.mode_refusal(m)]:  # what this family cannot run, and why
        print(f"skipped {m}: {lm.family.mode_refusal(m)}")
        cfg.modes = [x for x in cfg.modes if x != m]
    pool = PrefixPool()
    step_s: dict[str, list[float]] = {m: [] for m in cfg.modes}
    paired: dict[str, list[float]] = {m: [] for m in cfg.modes}  # per round: median step / full's median step
    peaks: dict[str, list[int]] = {m: [] for m in cfg.modes}
    for m in cfg.modes:  # warm-up: allocator, kernels, the 横批 cache
        generate(lm, CoupletRequest(PHRASES[0]), m, pool, **settings.get(m, {}))
    for _ in range(cfg.reps):
        for phrase in PHRASES:
            round_s = {}
            for m in cfg.modes:
                r = generate(lm, CoupletRequest(phrase), m, pool, **settings.get(m, {}))
                round_s[m] = [s.seconds for s in r.steps[1:]]
                step_s[m] += round_s[m]
                peaks[m].append(r.peak_bytes)
            if "full" in round_s:
                for m in cfg.modes:
                    paired[m].append(statistics.median(round_s[m]) / statistics.median(round_s["full"]))
    base_peak = statistics.fmean(peaks["full"]) if "full" in peaks else None
    out = {}
    print(f"model {lm.source} ({lm.family.name}), device {lm.device}, dtype {cfg.dtype}, "
          f"threads {torch.get_num_threads()}, {cfg.reps} reps x {len(PHRASES)} phrases")
    print(f"{'mode':<10}{'step ms (median)':>18}{'vs full':>10}{'peak KV bytes':>16}{'vs full':>10}")
    for m in cfg.modes:
        step = statistics.median(step_s[m])
        peak = statistics.fmean(peaks[m])
        out[m] = {"step_ms": step * 1e3, "step_ratio": statistics.median(paired[m]) if paired[m] else float("nan"),
                  "peak_bytes": peak, "peak_ratio": peak / base_peak if base_peak else float("nan")}
        print(f"{m:<10}{step * 1e3:>18.2f}{out[m]['step_ratio']:>9.2f}x{peak:>16.0f}{out[m]['peak_ratio']:>9.2f}x")
    return out


def parse_args(argv: list[str] | None = None) -> BenchConfig:
    p = argparse.ArgumentParser(prog="python -m couplet.bench", description=__doc__.split("\n")[0])
    p.add_argument("--modes", default="all", help=f"comma-separated among {','.join(MODES)}, or all")
    p.add_argument("--reps", type=int, default=5)
    add_model_args(p, dtype_default="float32")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="MODE.FIELD=VALUE")
    a = p.parse_args(argv)
    try:
        modes = parse_modes(a.modes)
    except ValueError as e:
        p.error(str(e))
    return BenchConfig(modes, a.reps, a.dtype, a.device, a.threads, a.settings, a.model, a.weights)
