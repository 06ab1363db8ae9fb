"""Latency of the page as a visitor gets it: launch the app on 127.0.0.1, then through gradio_client time,
per request, the first update with a character on the gate and the last update (every selected mode done).

    python scripts/bench_app.py                  # 5 runs per keyword set, the page's defaults
    python scripts/bench_app.py --reps 2 --keywords 龙马精神 春风 --modes full int4 --temperature 0
    python scripts/bench_app.py --best           # 择优 ticked: each mode writes the page's drafts, the best shown

A benchmark, not a test: it prints a table (median and p90 per keyword set and over all runs) and a one-line
summary against the page's targets (first character <= 0.8 s, the whole couplet in every selected mode
<= 3 s on CPU, medians). By default it asks what the page asks: its default modes and temperature, and a
new seed for every run, as 每次换一副 draws one per click. Each keyword set is run once unmeasured first
(the prefix pool and caches warm up as on a live Space).
"""

from __future__ import annotations

import argparse
import math
import os
import re
import statistics
import sys
import time
import unicodedata
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from couplet.kvcache import MODES, parse_modes  # noqa: E402
from couplet.page.share import DEFAULT_MODES, DEFAULT_TEMPERATURE  # noqa: E402
from couplet.writing.calendar import DEFAULT_YEAR  # noqa: E402

UPPER = re.compile(r'<div class="door door-right">.*?<p class="couplet-line"[^>]*>(.*?)</p>', re.S)


@dataclass
class BenchConfig:
    reps: int = 5
    keywords: list[str] = field(default_factory=lambda: ["龙马精神", "吉祥如意", "春风", "国泰民安"])
    modes: list[str] = field(default_factory=lambda: list(DEFAULT_MODES))
    length: int = 7
    temperature: float = DEFAULT_TEMPERATURE
    best: bool = False  # the page's 择优 box
    first_char_target_s: float = 0.8
    total_target_s: float = 3.0

    def __post_init__(self) -> None:
        if self.reps < 1:
            raise ValueError(f"reps must be at least 1, got {self.reps}")
        parse_modes(self.modes, allow_all=False)


@dataclass
class Run:
    first_char_s: float
    total_s: float
    updates: int


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), linear between closest ranks."""
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def pad(text: str, width: int) -> str:
    """`text` left-aligned in `width` terminal columns (a Han character takes two)."""
    used = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in text)
    return text + " " * max(0, width - used)


def launch() -> tuple[object, str]:
    """The app as `python app.py` serves it (same queue, same launch options), on a free local port."""
    import app

    demo = app.serve(port=0)
    app.warmed.wait(120)  # its start-up couplet written first, as before any real visitor
    return demo, demo.local_url


def one_request(client, cfg: BenchConfig, keywords: str, seed: int) -> Run:
    t0 = time.perf_counter()
    job = client.submit(keywords, cfg.length, False, cfg.temperature, seed, DEFAULT_YEAR, cfg.modes, cfg.best,
                        api_name="/couplet")
    first = None
    updates = 0
    for update in job:
        updates += 1
        if first is None:
            m = UPPER.search(update[0])
            if m and re.sub(r"<[^>]+>", "", m.group(1)).strip():
                first = time.perf_counter() - t0
    total = time.perf_counter() - t0
    results = job.outputs()[-1][5]
    if len(results) != len(cfg.modes) or first is None:
        raise RuntimeError(f"{keywords}: no couplet came back (first={first}, results={len(results)})")
    return Run(first, total, updates)


def main(cfg: BenchConfig) -> dict[str, list[Run]]:
    import torch
    from gradio_client import Client

    load = os.getloadavg()
    demo, url = launch()
    try:
        client = Client(url, verbose=False)
        runs: dict[str, list[Run]] = {}
        seeds = iter(range(1, 10**6))  # a new seed per request, as the page draws one per click
        for kw in cfg.keywords:
            one_request(client, cfg, kw, next(seeds))  # warm-up, not measured
            runs[kw] = [one_request(client, cfg, kw, next(seeds)) for _ in range(cfg.reps)]
    finally:
        demo.close()  # type: ignore[attr-defined]

    everything = [r for rs in runs.values() for r in rs]
    decoding = f"temperature {cfg.temperature:g}, a new seed per run" if cfg.temperature else "greedy"
    decoding += ", 择优 (best of the page's drafts)" if cfg.best else ""
    print(f"\n{len(cfg.modes)} modes ({', '.join(cfg.modes)}), {cfg.length}-character lines, {cfg.reps} runs each, "
          f"{decoding}; torch threads {torch.get_num_threads()}, {os.cpu_count()} CPUs, "
          f"load average before start {load[0]:.2f}\n")
    head = f"{'keywords':<10}{'first char median':>18}{'p90':>8}{'complete median':>18}{'p90':>8}{'updates':>9}"
    print(head)
    print("-" * len(head))
    for name, rs in [*runs.items(), ("all", everything)]:
        first, total = [r.first_char_s for r in rs], [r.total_s for r in rs]
        print(f"{pad(name, 10)}{statistics.median(first):>16.3f} s{percentile(first, 90):>6.3f} s"
              f"{statistics.median(total):>16.3f} s{percentile(total, 90):>6.3f} s{rs[-1].updates:>9}")
    first, total = [r.first_char_s for r in everything], [r.total_s for r in everything]
    f_med, t_med = statistics.median(first), statistics.median(total)
    verdict = "meets" if f_med <= cfg.first_char_target_s and t_med <= cfg.total_target_s else "misses"
    print(f"\nsummary: first character {f_med:.3f} s median / {percentile(first, 90):.3f} s p90 "
          f"(target {cfg.first_char_target_s} s), all {len(cfg.modes)} modes {t_med:.3f} s median / "
          f"{percentile(total, 90):.3f} s p90 (target {cfg.total_target_s} s) over {len(everything)} runs: "
          f"{verdict} the targets (medians)")
    return runs


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    defaults = BenchConfig()
    parser.add_argument("--reps", type=int, default=defaults.reps, help="measured runs per keyword set")
    parser.add_argument("--keywords", nargs="+", default=defaults.keywords, help="keyword sets")
    parser.add_argument("--modes", nargs="+", default=defaults.modes, choices=list(MODES), help="modes to select")
    parser.add_argument("--length", type=int, default=defaults.length, choices=(5, 7), help="characters per line")
    parser.add_argument("--temperature", type=float, default=defaults.temperature, help="0: greedy")
    parser.add_argument("--best", action="store_true", help="tick 择优: the best of the page's drafts per mode")
    main(BenchConfig(**vars(parser.parse_args())))
