"""The report of a serving run (`couplet.bench.serve`): its Markdown tables, and the chart of throughput and
concurrency against the budget."""

from __future__ import annotations

import sys
from pathlib import Path

from couplet.serving.tickets import MB


def markdown(out: dict) -> str:
    lines = []
    for run in out["runs"]:
        lines += [f"\n### budget {run['budget_mb']} MB, {out['config']['visitors']} visitors, {out['device']}, "
                  f"{out['dtype']}\n",
                  "| mode | tok/s | vs full | couplets only: tok/s, vs full | concurrency mean / peak | KV / request |"
                  " prompt KV | in use vs unshared | resident peak | prefix hits |"
                  " prefill computed | TTFT p50 / p99 ms | TPOT p50 / p99 ms | E2E p99 ms | identical |"
                  " forwards / step | decode forwards / step |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
                  " ---: | ---: | ---: |"]
        own = []
        for mode, r in run["modes"].items():
            if "unmeasured" in r:
                lines.append(f"| `{mode}` | not measured: {r['unmeasured']} |" + " |" * 15)
                continue
            if r.get("vllm_bench_serve"):
                own.append((mode, r["vllm_bench_serve"]))
            prompt_kv = f"{r['prompt_kv_ratio']:.0%}" if "prompt_kv_ratio" in r else "—"  # a server: not seen
            in_use = f"{r['in_use_kv_ratio']:.1%}" if r.get("in_use_kv_ratio") is not None else "—"
            generation = f"{r['generation_tok_s']:.0f}, {r['generation_ratio']:.2f}×" if "generation_ratio" in r \
                else "—"  # a server's rows: no 横批 chosen, their tok/s is already the couplets' own
            lines.append(
                f"| `{mode}` | {r['throughput_tok_s']:.0f} | {r['throughput_ratio']:.2f}× | {generation} | "
                f"{r['admitted_concurrency']:.1f} / {r['admitted_concurrency_peak']} | "
                f"{r['kv_per_request_bytes'] / 1024:.0f} KB | {prompt_kv} | {in_use} | "
                f"{r['resident_kv_peak_bytes'] / MB:.1f} MB | "
                f"{r['prefix_hit_rate']:.0%} | {r['prefill_tokens_ratio']:.0%} | "
                f"{r['ttft_p50_ms']:.0f} / {r['ttft_p99_ms']:.0f} | {r['tpot_p50_ms']:.1f} / {r['tpot_p99_ms']:.1f} | "
                f"{r['e2e_p99_ms']:.0f} | {r['identical_rate']:.0%} | {r.get('forwards_per_step', float('nan')):.2f} | "
                f"{r.get('decode_forwards_per_step', float('nan')):.2f} |")
        popular = [(m, r["prompt_kv_by_popularity"]) for m, r in run["modes"].items()
                   if r.get("prompt_kv_by_popularity") and r.get("prefix_hit_rate")]  # the pool modes
        if popular:
            buckets = list(dict.fromkeys(b for _, by in popular for b in by))
            lines += ["\nPrompt KV by how many visitors typed the same keywords (visitors in each bucket):\n",
                      "| mode | " + " | ".join(buckets) + " |", "| --- |" + " ---: |" * len(buckets)]
            for mode, by in popular:
                cells = (f"{by[b]['prompt_kv_ratio']:.1%} ({by[b]['visitors']})" if b in by else "—" for b in buckets)
                lines.append(f"| `{mode}` | " + " | ".join(cells) + " |")
        if own:
            lines += ["\nvLLM's own `bench serve` on the same prompts (rules off, same output length):\n",
                      "| server | req/s | output tok/s | TTFT p50 / p99 ms | TPOT p50 / p99 ms |",
                      "| --- | ---: | ---: | ---: | ---: |"]
            for mode, b in own:
                lines.append(f"| `{mode}` | not run: {b['error']} |  |  |  |" if "error" in b else
                             f"| `{mode}` | {b.get('request_throughput', 0):.1f} | "
                             f"{b.get('output_throughput', 0):.0f} | "
                             f"{b.get('p50_ttft_ms', 0):.0f} / {b.get('p99_ttft_ms', 0):.0f} | "
                             f"{b.get('p50_tpot_ms', 0):.1f} / {b.get('p99_tpot_ms', 0):.1f} |")
    return "\n".join(lines)


def plot(out: dict, path: str) -> None:
    """Throughput and admitted concurrency against the budget, one line per mode (`charts.sweep_figure`, English:
    the PNG is drawn without the page's fonts): HTML, and a PNG where kaleido is installed."""
    from couplet.page.charts import SWEEP_TEXT_EN, sweep_figure

    title = f"{out['config']['visitors']} visitors, {out['device']} {out['dtype']}, {out['date']}"
    fig = sweep_figure(out, text=SWEEP_TEXT_EN, title=title)
    fig.write_html(path, include_plotlyjs=True)
    try:  # a PNG too where kaleido is installed
        fig.write_image(str(Path(path).with_suffix(".png")), width=1100, height=460)
    except Exception as e:  # noqa: BLE001 - optional output; say why it is missing
        print(f"no PNG ({type(e).__name__}: {e}); the HTML is written", file=sys.stderr)
