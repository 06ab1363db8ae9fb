"""`python -m couplet.bench serve`: the Spring Festival peak — many visitors through the engine, one mode at
a time, at the same KV budget; what compression buys in concurrency and throughput.

    python -m couplet.bench serve --visitors 1000                  # burst, every mode, default budget
    python -m couplet.bench serve --visitors 200 --rate 20 --modes full,combo --json out.json --plot out.html
    python -m couplet.bench serve --budgets 4,8,16 --visitors 200   # a sweep over budgets (MB)
    python -m couplet.bench serve --backend vllm --budgets 4 --visitors 200   # vLLM bf16/fp8 beside
                                                     # full, int8, int4, combo at the same bytes (couplet.bench.vllm)

Workload: `--visitors` requests whose keyword phrases follow a Zipf law (s = `--zipf`, 1.1) over the dev
list, the 横批 phrases and their halves (`phrases()`): many type the popular ones, few the rare ones.
They arrive at once
(`--rate 0`) or as a Poisson process of `--rate` per second. Greedy, 7-character lines.

Per mode, in vLLM `bench serve`'s vocabulary: requests/s and output tokens/s (characters written), admitted
concurrency (mean over the run, sampled every 10 ms, and peak), resident KV peak (what the caches hold, pool
included), KV per request (a request's own peak plus its pool share), prompt KV (right after its prefill, the
prompt's owned slots plus its share of the pool blocks, against the same prompt unshared at full precision:
the issue's "resident prompt KV against unshared", per visitor), KV in use against unshared (the same question
asked of memory rather than of visitors: every 10 ms, what the admitted caches and the pool blocks they use
hold against their tokens in unshared `full` caches, decode tokens included, summed over the run), prefix-pool
hit rate (blocks), prefill
tokens computed against unshared, TTFT / TPOT / end-to-end latency at p50/p90/p99 (TTFT: arrival to the
first character), and the identical rate against `full` on the same phrases. The default budget holds
8 `full` requests at once (plus the pool), so memory is the bottleneck, as on a busy GPU.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from couplet.bench.latency import latency_row
from couplet.bench.serve_report import markdown, plot
from couplet.kvcache import MODES, make_mode, parse_modes
from couplet.models.hub import add_model_args
from couplet.models.loading import LoadedModel, load_model
from couplet.serving.backends import add_backend_args
from couplet.serving.engine import MB, Engine, EngineConfig, Ticket
from couplet.serving.generate import CoupletRequest, Prepared, prepare
from couplet.writing import hengpi
from couplet.writing.phrases import HENGPI_PHRASES

DEV_KEYWORDS = Path(__file__).resolve().parents[2] / "assets" / "dev_keywords.txt"


@dataclass
class ServeConfig:
    modes: list[str] = field(default_factory=lambda: list(MODES))
    visitors: int = 1000
    rate: float = 0.0  # arrivals per second (Poisson); 0 = all at once
    zipf: float = 1.1
    budgets: list[float] | None = None  # MB; None = room for 8 `full` requests (+ the pool)
    pool_mb: float = 4.0
    max_batch: int = EngineConfig.max_batch  # the engine's defaults, one source
    min_wave: int | None = EngineConfig.min_wave  # a new wave waits for this many rows while others run
    prefix_wave: int = EngineConfig.prefix_wave  # this many waiting with one prompt: a cache-aware wave of their own
    continuous: bool = EngineConfig.continuous  # plain-cache modes join running batches (continuous batching)
    prefill_chunk: int = EngineConfig.prefill_chunk  # plain-cache prefills fed this many columns per forward
    seed: int = 0
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    weights: str | None = None
    threads: int | None = None
    json: str | None = None
    plot: str | None = None
    backend: str = "local"  # vllm: vLLM servers too (`couplet.bench.vllm`)
    vllm_url: str | None = None  # vllm: this server as it runs (else one per KV dtype is started per budget)
    vllm_bench: bool = True  # vllm: also vLLM's own `bench serve` on the same prompts
    vllm_kv: list[str] = field(default_factory=lambda: ["bf16", "fp8"])  # vllm: one server per KV dtype

    def __post_init__(self) -> None:
        if self.visitors < 1 or self.rate < 0 or self.zipf <= 0:
            raise ValueError("visitors must be >= 1, rate >= 0 and zipf > 0")


def phrases() -> list[str]:
    """What visitors type: the dev list, the 横批 phrases, and their two-character halves (春风, 平安 …)."""
    dev = [s.strip() for s in DEV_KEYWORDS.read_text(encoding="utf-8").splitlines() if s.strip()]
    halves = [h for p in HENGPI_PHRASES for h in (p[:2], p[2:])]
    return list(dict.fromkeys([*dev, *HENGPI_PHRASES, *halves]))


def workload(cfg: ServeConfig) -> tuple[list[str], list[float]]:
    """The phrases the visitors type (Zipf over `phrases()`) and their arrival times in seconds."""
    rng = random.Random(cfg.seed)
    pool = phrases()
    weights = [1 / (rank + 1) ** cfg.zipf for rank in range(len(pool))]
    typed = rng.choices(pool, weights, k=cfg.visitors)
    t, arrivals = 0.0, []
    for _ in typed:
        arrivals.append(t)
        t += rng.expovariate(cfg.rate) if cfg.rate else 0.0
    return typed, arrivals


# How many of the visitors typed the same keywords: rare phrases' exemplars are theirs alone, popular ones'
# are shared by a cache-aware wave; the buckets say where the resident prompt KV goes (docs/results/serving.md).
POPULARITY_BUCKETS = ((1, 3), (4, 15), (16, 63), (64, None))


def prompt_kv_by_popularity(typed: list[str], prompt_kv: list[tuple[str, float]]) -> dict[str, dict]:
    """`prompt_kv` ((keywords, ratio) per finished visitor) averaged per bucket of how many of the visitors
    (`typed`) typed the same keywords: {"1-3": {"visitors": n, "prompt_kv_ratio": x}, ..., "64+": ...}; empty
    buckets left out."""
    counts = Counter(typed)
    finished = [(counts[p], ratio) for p, ratio in prompt_kv]
    out = {}
    for low, high in POPULARITY_BUCKETS:
        inside = [r for c, r in finished if c >= low and (high is None or c <= high)]
        if inside:
            out[f"{low}-{high}" if high else f"{low}+"] = {"visitors": len(inside),
                                                           "prompt_kv_ratio": statistics.fmean(inside)}
    return out


def run_mode(lm: LoadedModel, mode: str, budget_mb: float, cfg: ServeConfig, typed: list[str],
             arrivals: list[float], preps: dict[str, Prepared]) -> tuple[dict, dict[str, tuple[str, str]]]:
    # Every mode starts from the same state: a fresh engine and pool, and no 横批 remembered. The 横批 is
    # cached per couplet (`hengpi._choose`), and its scoring is a share of a run's time: kept, a mode measured
    # after `full` found its couplets' 横批 already chosen (95-100% are `full`'s couplets) and looked faster.
    hengpi.clear_cache()
    engine = Engine(lm, EngineConfig(kv_budget_mb=budget_mb, pool_mb=cfg.pool_mb, max_batch=cfg.max_batch,
                                     min_wave=cfg.min_wave, prefix_wave=cfg.prefix_wave, continuous=cfg.continuous,
                                     prefill_chunk=cfg.prefill_chunk,
                                     max_waiting=cfg.visitors))
    samples: list[tuple[int, int, int, int]] = []  # every 10 ms: (in flight, resident bytes, in use, unshared)
    stop = threading.Event()

    def monitor() -> None:
        while not stop.is_set():
            st = engine.stats()
            samples.append((st.in_flight, st.kv_bytes + st.pool_bytes, st.in_use_bytes, st.full_bytes))
            time.sleep(0.01)

    cuda = lm.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    watcher = threading.Thread(target=monitor, daemon=True)
    watcher.start()
    tickets: list[Ticket] = []
    t0 = time.perf_counter()
    for phrase, at in zip(typed, arrivals, strict=True):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)
        tickets.append(engine.submit(CoupletRequest(phrase), mode, prep=preps[phrase]))
        tickets[-1].submitted = t0 + at  # latency counts from the scheduled arrival
    results = [list(t)[-1].result for t in tickets]
    end = time.perf_counter()
    stop.set()
    watcher.join()
    stats = engine.stats()
    pool = engine.pool
    engine.close()
    makespan = end - t0
    chars = sum(len(r.upper) + len(r.lower) for r in results if r)
    ttft = [(t.first_token - t.submitted) * 1e3 for t in tickets if t.first_token]
    e2e = [(t.finished - t.submitted) * 1e3 for t in tickets if t.finished]
    # TPOT over the couplet's own characters (first to last written); the 横批 chosen after is in E2E only
    tpot = [(t.decoded - t.first_token) * 1e3 / 13 for t in tickets if t.decoded and t.first_token]
    written = max((t.decoded for t in tickets if t.decoded), default=end) - t0  # the last couplet written
    per_request = [max(s.kv_bytes + s.shared_bytes for s in r.steps) for r in results if r]
    # the prompt's KV right after the prefill (its owned slots, padding included, and its share of the pool
    # blocks it references) against the same prompt unshared at full precision: what sharing leaves resident
    token_bytes = engine.geometry.token_bytes
    prompt_kv = [(p, (r.steps[0].kv_bytes + r.steps[0].shared_bytes) / (len(preps[p].prompt) * token_bytes))
                 for p, r in zip(typed, results, strict=True) if r]
    computed = sum(r.steps[0].computed_tokens for r in results if r)
    prompt_tokens = sum(len(preps[p].prompt) for p in typed)
    looked_up = pool.hits + pool.misses
    couplets = {p: (r.upper, r.lower) for p, r in zip(typed, results, strict=True) if r}
    in_use, unshared = sum(s[2] for s in samples), sum(s[3] for s in samples)
    row = {
        "budget_mb": budget_mb, "visitors": len(tickets), "seconds": makespan,
        "requests_per_s": len(tickets) / makespan, "throughput_tok_s": chars / makespan,
        # the couplets alone, up to the last one written (the engine's worker; the 横批 is chosen beside it)
        "generation_tok_s": chars / written,
        "admitted_concurrency": statistics.fmean(s[0] for s in samples) if samples else 0.0,
        "admitted_concurrency_peak": stats.peak_in_flight,
        "resident_kv_peak_bytes": max((s[1] for s in samples), default=0),
        # what the admitted visitors' caches and the pool blocks they use hold, against the same tokens in
        # unshared `full` caches, summed over the samples: the memory in use at any moment, time-weighted
        # (the pool's unreferenced blocks are cache, evictable on demand: not counted, as vLLM's usage gauge)
        "in_use_kv_ratio": in_use / unshared if unshared else None,  # None: no sample saw a request decoding
        "kv_per_request_bytes": statistics.fmean(per_request),
        "prompt_kv_ratio": statistics.fmean(ratio for _, ratio in prompt_kv),
        "prompt_kv_by_popularity": prompt_kv_by_popularity(typed, prompt_kv),
        "prefix_hit_rate": pool.hits / looked_up if looked_up else 0.0,
        "prefill_tokens_ratio": computed / prompt_tokens,
        **latency_row(ttft, tpot, e2e),
        "pool_refs_after": stats.pool_refs,
        # waves advanced per worker round: forwards per decode step (a GPU's cost at this size: docs/results/gpu.md)
        "forwards_per_step": stats.forwards / stats.rounds if stats.rounds else 0.0,
        # decode steps alone: the forwards a step of the running batches costs (prefills aside)
        "decode_forwards_per_step": stats.steps / stats.step_rounds if stats.step_rounds else 0.0,
        # real device memory above the weights (KV caches, activations, allocator slack); None on CPU
        "device_peak_bytes": torch.cuda.max_memory_allocated() - base if cuda else None,
    }
    return row, couplets


def compare(row: dict, couplets: dict[str, tuple[str, str]], reference: dict[str, tuple[str, str]],
            full: dict) -> None:
    """The row's identical rate against `full`'s couplets (on the phrases both wrote) and throughput ratio."""
    same = [couplets[p] == reference[p] for p in couplets if p in reference]
    row["identical_rate"] = statistics.fmean(same) if same else float("nan")
    row["throughput_ratio"] = row["throughput_tok_s"] / full["throughput_tok_s"] if full["throughput_tok_s"] else 0.0
    if "generation_tok_s" in row and full.get("generation_tok_s"):
        row["generation_ratio"] = row["generation_tok_s"] / full["generation_tok_s"]


def engine_overhead(lm: LoadedModel, reps: int = 2) -> dict:
    """Batch-1 latency of one `full` couplet through the engine against a direct `generate` call, paired per
    phrase (alternating, so load drift hits both alike): the median of the ratios."""
    from couplet.serving.generate import generate

    words = phrases()[:8]
    for w in words:  # unmeasured: each phrase's 横批 chosen once (cached), so neither side of a pair pays it
        generate(lm, CoupletRequest(w), "full")
    ratios = []
    with Engine(lm, EngineConfig(kv_budget_mb=64, pool_mb=4)) as engine:
        for _ in range(reps):
            for w in words:
                t0 = time.perf_counter()
                generate(lm, CoupletRequest(w), "full")
                t1 = time.perf_counter()
                engine.generate(CoupletRequest(w), "full")
                ratios.append((time.perf_counter() - t1) / (t1 - t0))
    return {"engine_over_direct_p50": statistics.median(ratios), "pairs": len(ratios)}


def default_budget(lm: LoadedModel, cfg: ServeConfig) -> float:
    """Room for 8 `full` requests of the longest prompt among the first 40 phrases (415 tokens for the
    embedded model), plus the pool's budget (MB)."""
    from couplet.kvcache import KVGeometry

    longest = max(len(prepare(lm, CoupletRequest(p)).prompt) for p in phrases()[:40])
    prefill, decode = make_mode("full").compose().owned_peak_bytes(longest, longest + 14, KVGeometry.of(lm.model))
    return round(8 * max(prefill, decode) / MB + cfg.pool_mb, 2)


def main(cfg: ServeConfig) -> dict:
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    lm = load_model(cfg.model, cfg.device, cfg.dtype, cfg.weights)
    typed, arrivals = workload(cfg)
    preps = {p: prepare(lm, CoupletRequest(p)) for p in set(typed)}  # once: every mode sends the same prompts
    budgets = cfg.budgets or [default_budget(lm, cfg)]
    if cfg.backend == "vllm" and cfg.modes == list(MODES):  # the comparison set unless --modes says
        cfg.modes = ["full", "int8", "int4", "combo"]
    modes = ["full", *(m for m in cfg.modes if m != "full")]  # full first: the reference of every ratio
    out: dict = {"device": lm.device, "dtype": str(next(lm.model.parameters()).dtype).removeprefix("torch."),
                 "model": lm.source, "config": {k: v for k, v in asdict(cfg).items() if k not in ("json", "plot")},
                 "distinct_phrases": len(set(typed)), "date": time.strftime("%Y-%m-%d"),
                 "command": "python -m couplet.bench serve " + " ".join(sys.argv[2:]), "runs": []}
    # Warm-up, not measured: a process's first forwards pay one-off costs (the allocator, oneDNN/MKL primitive
    # caches, lazy imports; the CUDA context and kernels on a GPU) that would otherwise fall on `full`, measured
    # first, the reference of every ratio.
    warm = min(len(typed), 32)  # 32 visitors, whatever --max-batch: every code path, a few batch shapes
    for mode in modes:
        run_mode(lm, mode, budgets[0], cfg, typed[:warm], [0.0] * warm, preps)
    for budget in budgets:
        rows: dict[str, dict] = {}
        reference: dict[str, tuple[str, str]] = {}
        for mode in modes:
            row, couplets = run_mode(lm, mode, budget, cfg, typed, arrivals, preps)
            if mode == "full":
                reference = couplets
            compare(row, couplets, reference, rows.get("full", row))
            rows[mode] = row
            shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}
            print(f"budget {budget} MB, {mode}: {json.dumps(shown)}", file=sys.stderr, flush=True)
        if cfg.backend == "vllm":
            from couplet.bench.vllm import run_backend

            for name, row in run_backend(lm, cfg, budget, typed, arrivals, preps).items():
                if "unmeasured" not in row:
                    couplets = row.pop("couplets")
                    row["budget_mb"] = row["kv_capacity_bytes"] / MB if cfg.vllm_url else budget
                    compare(row, couplets, reference, rows["full"])
                    print(f"budget {budget} MB, {name}: {json.dumps(row, default=str)}", file=sys.stderr, flush=True)
                rows[name] = row
        out["runs"].append({"budget_mb": budget, "modes": rows})
        out["modes"] = out["runs"][0]["modes"]
        if cfg.json:  # after every budget: a run stopped part-way (a time limit) keeps what it measured
            Path(cfg.json).write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    out["engine_overhead"] = engine_overhead(lm) if cfg.backend == "local" else None
    print(markdown(out))
    if out["engine_overhead"]:
        print(f"\nengine overhead, batch 1: {out['engine_overhead']['engine_over_direct_p50']:.2f}x a direct call "
              f"(median of {out['engine_overhead']['pairs']} paired runs)")
    if cfg.json:
        Path(cfg.json).write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    if cfg.plot:
        plot(out, cfg.plot)
    return out


def parse_args(argv: list[str]) -> ServeConfig:
    p = argparse.ArgumentParser(prog="python -m couplet.bench serve", description=__doc__.split("\n")[0])
    p.add_argument("--modes", default="all", help=f"comma-separated among {','.join(MODES)}, or all")
    p.add_argument("--visitors", type=int, default=1000)
    p.add_argument("--rate", type=float, default=0.0, help="Poisson arrivals per second (0: a burst)")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--budgets", type=lambda t: [float(x) for x in t.split(",")], default=None,
                   help="KV budgets in MB, comma-separated (default: 8 full requests + the pool)")
    p.add_argument("--pool-mb", type=float, default=4.0)
    p.add_argument("--max-batch", type=int, default=ServeConfig.max_batch)
    p.add_argument("--min-wave", type=int, default=None,
                   help="while waves run, start a new one only with this many rows (or every waiting request); "
                        "default half of --max-batch, 1 admits whatever fits")
    p.add_argument("--prefix-wave", type=int, default=ServeConfig.prefix_wave,
                   help="a pool mode's requests waiting with one prompt, at least this many, form a cache-aware "
                        "wave of their own (0: arrival order only)")
    p.add_argument("--continuous", action=argparse.BooleanOptionalAction, default=ServeConfig.continuous,
                   help="continuous batching for the plain-cache mode (full): prefilled rows join the running "
                        "batch and leave when written (admission keeps the --min-wave rule)")
    p.add_argument("--prefill-chunk", type=int, default=ServeConfig.prefill_chunk,
                   help="chunked prefill for the plain-cache mode: prompt columns per forward (0: all at once)")
    p.add_argument("--seed", type=int, default=0)
    add_model_args(p)
    add_backend_args(p)
    p.add_argument("--vllm-kv", type=lambda t: t.split(","), default=["bf16", "fp8"],
                   help="with --backend vllm: servers' KV dtypes, comma-separated among bf16, fp8, f32")
    p.add_argument("--vllm-bench", action=argparse.BooleanOptionalAction, default=True,
                   help="with --backend vllm: also run vLLM's own bench serve on the same prompts")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", default=None)
    p.add_argument("--plot", default=None, help="HTML (and PNG where kaleido is installed)")
    args = vars(p.parse_args(argv))
    if unknown := [k for k in args["vllm_kv"] if k not in ("bf16", "fp8", "f32")]:
        p.error(f"--vllm-kv: unknown {', '.join(unknown)}; choose among bf16, fp8, f32")
    if args["backend"] == "local" or not any(a.startswith("--vllm-url") for a in argv):
        args["vllm_url"] = None  # the benchmark starts its servers per budget unless told of one
    elif len(args["budgets"] or [0]) > 1:
        p.error("--vllm-url measures that server at its own KV budget: give one --budgets value (the in-process "
                "modes' budget) or leave the URL out to start servers per budget")
    try:
        args["modes"] = parse_modes(args["modes"])
    except ValueError as e:
        p.error(str(e))
    return ServeConfig(**args)
