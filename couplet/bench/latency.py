"""Latency percentiles of a serving run, the same for the in-process engine (`serve`) and vLLM (`vllm`)."""

from __future__ import annotations

import math


def pct(values: list[float], q: float) -> float:
    """The q-th percentile by the nearest-rank method; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def latency_row(ttft: list[float], tpot: list[float], e2e: list[float]) -> dict[str, float]:
    """p50/p90/p99 of time to first token, time per output token and end to end, in ms, as the rows name them."""
    return {f"{name}_p{q}_ms": pct(values, q)
            for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e)) for q in (50, 90, 99)}
