"""Quality harness: rule pass rate, keyword coverage, diversity, held-out NLL, and every KV-cache mode
against `full` on the same greedy decode.

    python -m couplet.evaluate --keywords assets/dev_keywords.txt --json /tmp/eval.json
    python -m couplet.evaluate --keywords assets/dev_keywords.txt --modes all --sweep --plot /tmp/sweep.html
    python -m couplet.evaluate --keywords FILE --modes full,window,selective,snapkv --sweep --sweep-values 0.5,0.75
    python -m couplet.evaluate --keywords FILE --modes full,int8 --dtype float32 --floor-dtype bfloat16
    python -m couplet.evaluate --keywords FILE --pairs heldout.tsv     # adds the NLLs and the 对下联 figures
    python -m couplet.evaluate --keywords FILE --pairs heldout.tsv --steer   # does the house prefix steer?
    python -m couplet.evaluate --keywords FILE --somber 0 --auspicious 0 --no-taboo-ban   # the voice off

The voice figures (`negation_rate`, `taboo_rate`, `gloom_rate`, `copy_rate`, `template_repeat`) are
shares of the greedy couplets, counted on the characters the model chose (keywords aside); the lists are
in `couplet.writing.lexicon`, reported under `lexicon`.

Ratios are against `full` at the same dtype; the dtype (bfloat16 by default, as on a GPU) is recorded.
Besides whole-couplet identity, each mode reports `step_agreement`: teacher-forced along `full`'s couplet,
the share of free choices at which its cache would pick `full`'s character (one early flip no longer
counts every later one), and of the choices it flips, how many `full` made by a near tie (< 0.1 nats).
`--floor-dtype` measures the same for rounding alone.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from couplet.bench.agreement import Followed, agreement_report, follow
from couplet.bench.figures import mean, sampled_report, voice_report, writing_report
from couplet.bench.paired import paired_report
from couplet.events import CoupletResult
from couplet.kvcache import MODE_INFO, MODES, PrefixPool, parse_modes, parse_settings
from couplet.models.hub import ModelUnavailable, add_model_args
from couplet.models.loading import LoadedModel, load_model
from couplet.page.share import DEFAULT_TEMPERATURE
from couplet.serving.best_of import BestOf, best_of
from couplet.serving.generate import CoupletRequest, generate
from couplet.writing.lexicon import DEFAULT_VOICE, PLAIN_VOICE, VoiceConfig, lexicon_report
from couplet.writing.prompt import DEFAULT_PROMPT, HOUSE_COUPLETS, HouseCouplet, PromptConfig
from couplet.writing.rules import parallelism
from couplet.writing.text import CoupletInputError


@dataclass
class EvalConfig:
    keywords: str
    json: str | None = None
    pairs: str | None = None
    modes: list[str] = field(default_factory=lambda: ["full"])
    settings: list[str] = field(default_factory=list)
    length: int = 7
    seeds: int = 3
    temperature: float = DEFAULT_TEMPERATURE  # the sampled figures: the page's draw (it was 0.8 until 2026-12-07)
    top_p: float = 0.9
    dtype: str = "bfloat16"
    device: str | None = None
    model: str | None = None
    weights: str | None = None
    sweep: bool = False
    sweep_values: list[float] | None = None  # ratios instead of the registry's, for the modes swept by ratio
    plot: str | None = None
    limit: int | None = None
    voice: VoiceConfig = DEFAULT_VOICE
    prompt: PromptConfig = DEFAULT_PROMPT
    steer: bool = False
    duixia: int = 500  # held-out 上联 for the 对下联 figures (with --pairs)
    floor_dtype: str | None = None  # also `full` at this dtype against `full` at `dtype`: the rounding floor
    best_of: int = 1  # the couplet of each phrase is the best of this many drafts (`couplet.serving.best_of`)


def read_lines(path: str) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [s for s in (line.strip() for line in f) if s and not s.startswith("#")]


def context_report(lm: LoadedModel, pairs: list[tuple[str, str]]) -> dict[str, float]:
    """Held-out NLL of 下联 given 上联 with retrieved exemplars, random ones, and no context."""
    from couplet.models.scoring import CONTEXTS, context_nll

    return {f"nll_{'with' if how == 'retrieved' else how}_context".replace("none", "without"):
            context_nll(lm.model, lm.tokenizer, pairs, how) for how in CONTEXTS}


def duixia_report(lm: LoadedModel, cfg: EvalConfig, pairs: list[tuple[str, str]], pool: PrefixPool) -> dict[str, Any]:
    """对下联 on held-out 上联: rule pass rate, parallelism (and the real 下联's own on the same 上联), the voice
    figures, a few samples."""
    results, refused = [], 0
    for u, _ in pairs:
        try:
            results.append(generate(lm, CoupletRequest("", upper=u, task="duixia"), "full", pool, cfg.prompt,
                                    cfg.voice))
        except CoupletInputError:  # e.g. a character outside the Han blocks we accept: refused, as for a visitor
            refused += 1
    return {"n": len(results), "refused": refused, "rule_pass_rate": mean(r.checks["passed"] for r in results),
            "parallelism": mean(r.checks["parallelism"]["score"] for r in results),
            "reference_parallelism": mean(parallelism(u, lo)["score"] for u, lo in pairs),
            "upper_ends_level": mean(r.checks["tones"]["upper_last"] == "平" for r in results),
            **voice_report(results),
            "failures": [f"{r.upper}/{r.lower}: {r.checks['failures']}"
                         for r in results if not r.checks["passed"]][:10],
            "samples": [f"{r.upper}，{r.lower}。（{r.hengpi}）" for r in results[:12]]}


def sharing_report(lm: LoadedModel, cfg: EvalConfig, phrases: list[str], n: int = 20) -> dict[str, Any]:
    """`shared` prefill cost of a second visitor: for consecutive phrases (A, B) on a fresh pool, the share of
    B's prompt tokens B computes after A (other keywords), and after A again (the same keywords)."""
    other: list[float] = []
    same: list[float] = []
    for a, b in zip(phrases[:n], phrases[1 : n + 1], strict=False):
        for second, out in ((b, other), (a, same)):
            pool = PrefixPool()
            generate(lm, CoupletRequest(a, cfg.length), "shared", pool, cfg.prompt, cfg.voice)
            step0 = generate(lm, CoupletRequest(second, cfg.length), "shared", pool, cfg.prompt, cfg.voice).steps[0]
            out.append(step0.computed_tokens / step0.logical_length)
    return {"pairs": len(other), "other_keywords_computed": mean(other), "other_keywords_max": max(other),
            "same_keywords_computed": mean(same), "same_keywords_max": max(same)}


def steer_report(lm: LoadedModel, cfg: EvalConfig, phrases: list[str], pairs: list[tuple[str, str]],
                 pool: PrefixPool) -> dict[str, Any]:
    """The festive house prefix against a prefix of random corpus couplets of the same shape (same count and
    lengths, 4-character keywords), voice biases off: does the prefix alone move the voice?"""
    import random

    rng = random.Random(7)
    by_len = {n: [p for p in pairs if len(p[0]) == n] for n in (5, 7)}
    random_house = tuple(HouseCouplet(*rng.choice(by_len[len(h.upper)]), hengpi="".join(rng.sample(
        rng.choice(by_len[7])[0], 4))) for h in HOUSE_COUPLETS)
    out: dict[str, Any] = {"voice": "off (no taboo ban, no penalty, no bonus)"}
    for name, house in (("festive_house", HOUSE_COUPLETS), ("random_corpus", random_house)):
        prompt = PromptConfig(house=True, k=cfg.prompt.k, couplets=house)
        results = [generate(lm, CoupletRequest(p, cfg.length), "full", pool, prompt, PLAIN_VOICE) for p in phrases]
        out[name] = voice_report(results)
    return out


def write(lm: LoadedModel, request: CoupletRequest, cfg: EvalConfig, pool: PrefixPool) -> CoupletResult:
    """One phrase's couplet under `full`, as the harness is asked to write it: one draft, or the best of
    `cfg.best_of` (greedy or sampled alike; `best_of.draft_requests` says how the drafts sample, as on the page)."""
    if cfg.best_of == 1:
        return generate(lm, request, "full", pool, cfg.prompt, cfg.voice)
    return best_of(lm, request, BestOf(n=cfg.best_of), "full", pool, cfg.prompt, cfg.voice)


def base_report(lm: LoadedModel, cfg: EvalConfig, phrases: list[str], pool: PrefixPool) -> tuple[dict, dict]:
    """Greedy and sampled couplets under `full`: the foundation issue's figures."""
    greedy: dict[str, CoupletResult] = {}
    errors: dict[str, str] = {}
    seconds: list[float] = []
    sampled: list[list[CoupletResult]] = []  # per phrase, its couplet under each seed at cfg.temperature
    distinct = 0
    for phrase in phrases:
        try:
            t0 = time.perf_counter()
            greedy[phrase] = write(lm, CoupletRequest(phrase, cfg.length), cfg, pool)
            seconds.append(time.perf_counter() - t0)
        except CoupletInputError as e:
            errors[phrase] = str(e)
            continue
        drawn = [write(lm, CoupletRequest(phrase, cfg.length, temperature=cfg.temperature, top_p=cfg.top_p, seed=s),
                       cfg, pool) for s in range(cfg.seeds)]
        sampled.append(drawn)
        distinct += len({(r.upper, r.lower) for r in drawn}) >= 2
    results = list(greedy.values())
    wanted = sum(len(set(r.keywords)) for r in results)
    covered = sum(len(set(r.keywords)) - len(r.checks["keywords"]["missing"]) for r in results)
    report = {
        "n": len(results),
        "keyword_coverage": covered / wanted if wanted else 0.0,
        "distinct_rate": distinct / len(results) if results else 0.0,
        "seconds_per_couplet": mean(seconds),
        **writing_report(results),
        "samples": [r.to_json(with_steps=False) for r in results],
    }
    if sampled and cfg.seeds:  # the same figures on the sampled couplets (a visitor who clicks again), per seed
        report["sampled"] = {"temperature": cfg.temperature, "top_p": cfg.top_p, **sampled_report(sampled)}
    if errors:
        report["errors"] = errors
    return report, greedy


def mode_report(lm: LoadedModel, cfg: EvalConfig, mode: str, options: dict[str, Any], full: dict[str, CoupletResult],
                full_followed: dict[str, Followed], pool: PrefixPool) -> dict[str, Any]:
    """One mode against `full` on the same phrases: bytes, identical rate, NLL delta, step agreement, rules,
    time, and paired tests of each quality figure against full's."""
    peaks, identical, deltas, passed, par, seconds = [], [], [], [], [], []
    written: list[CoupletResult] = []  # this mode's couplet per phrase, in `full`'s order
    followed: list[tuple[Followed, Followed]] = []  # (this mode's, full's) per phrase
    for phrase, ref in full.items():
        request = CoupletRequest(phrase, cfg.length)
        t0 = time.perf_counter()
        r = generate(lm, request, mode, pool, cfg.prompt, cfg.voice, **options)
        seconds.append(time.perf_counter() - t0)
        written.append(r)
        peaks.append(r.peak_bytes)
        identical.append((r.upper, r.lower) == (ref.upper, ref.lower))
        passed.append(r.checks["passed"])
        par.append(r.checks["parallelism"]["score"])
        mine = follow(lm, cfg, request, mode, pool, ref.upper, ref.lower, options)
        followed.append((mine, full_followed[phrase]))
        deltas.append(mine.nll - full_followed[phrase].nll)
    full_peak = statistics.fmean(f.peak_bytes for f in full.values())
    return {
        "options": options,
        "kv_peak_bytes": statistics.fmean(peaks),
        "kv_ratio": statistics.fmean(peaks) / full_peak,
        "identical_rate": mean(identical),
        "nll_delta": statistics.fmean(deltas),
        **agreement_report(followed),
        "rule_pass_rate": mean(passed),
        "parallelism": mean(par),
        "seconds_per_couplet": mean(seconds),
        # against full on the same phrases: each figure's p-value (couplet.bench.paired)
        "paired": paired_report(written, list(full.values()), deltas),
    }


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
    modes = parse_modes(cfg.modes)
    settings = parse_settings(cfg.settings)
    BestOf(n=cfg.best_of)  # a bad n: one line, before the model loads
    if cfg.best_of > 1 and (modes != ["full"] or cfg.sweep or cfg.floor_dtype):
        raise ValueError("--best-of is measured on the full cache alone (the modes compare one greedy couplet)")
    lm = load_model(cfg.model, cfg.device, cfg.dtype, cfg.weights)
    phrases = read_lines(cfg.keywords)[: cfg.limit]
    pool = PrefixPool()
    report, full = base_report(lm, cfg, phrases, pool)
    report = {"dtype": cfg.dtype, "device": lm.device, "model": lm.source, **report}
    report["lexicon"] = lexicon_report()
    report["voice"] = cfg.voice.__dict__
    report["prompt"] = {"house": cfg.prompt.house, "k": cfg.prompt.k}
    report["best_of"] = BestOf(n=cfg.best_of).__dict__
    if cfg.pairs:
        from couplet.training.corpus import read_pairs

        pairs = [(p.upper, p.lower) for p in read_pairs(cfg.pairs)]
        report.update(context_report(lm, pairs))
        report["nll_per_char"] = report["nll_without_context"]
        report["pairs_n"] = len(pairs)
        print(f"nll: {json.dumps({k: v for k, v in report.items() if k.startswith('nll')})}", file=sys.stderr)
        if cfg.duixia:
            report["duixia"] = duixia_report(lm, cfg, pairs[: cfg.duixia], pool)
            print(f"duixia: rule pass {report['duixia']['rule_pass_rate']:.3f}", file=sys.stderr)
        if cfg.steer:
            report["steer"] = steer_report(lm, cfg, phrases, pairs, pool)
    if "shared" in modes:
        report["sharing"] = sharing_report(lm, cfg, list(full))  # the phrases that are valid input
        print(f"sharing: {json.dumps(report['sharing'])}", file=sys.stderr)
    compared = [m for m in modes if m != "full"]
    if compared or cfg.sweep or cfg.floor_dtype:
        full_followed = {p: follow(lm, cfg, CoupletRequest(p, cfg.length), "full", pool, r.upper, r.lower, {})
                         for p, r in full.items()}
        report["modes"] = {"full": mode_report(lm, cfg, "full", {}, full, full_followed, pool)}
        for mode in compared:
            report["modes"][mode] = mode_report(lm, cfg, mode, settings.get(mode, {}), full, full_followed, pool)
            print(f"{mode}: {json.dumps(report['modes'][mode])}", file=sys.stderr)
        if cfg.floor_dtype:  # what rounding alone changes: the yardstick for a lossy mode's figures
            other = load_model(cfg.model, cfg.device, cfg.floor_dtype, cfg.weights)
            report["floor"] = {"dtype": cfg.floor_dtype,
                               **mode_report(other, cfg, "full", {}, full, full_followed, PrefixPool())}
            print(f"floor: {json.dumps(report['floor'])}", file=sys.stderr)
        if cfg.sweep:
            sweeps: dict[str, list[dict]] = {}
            for mode in modes:
                knob, values = MODE_INFO[mode].knob, MODE_INFO[mode].sweep
                if knob == "ratio" and cfg.sweep_values:
                    values = tuple(cfg.sweep_values)
                if knob is None:
                    continue
                sweeps[mode] = []
                for value in values:
                    opts = {**settings.get(mode, {}), knob: value}
                    point = mode_report(lm, cfg, mode, opts, full, full_followed, pool)
                    sweeps[mode].append({"knob": knob, "value": value, **point})
                    print(f"sweep {mode} {knob}={value}: ratio {point['kv_ratio']:.3f} "
                          f"identical {point['identical_rate']:.3f} step agreement {point['step_agreement']:.3f} "
                          f"parallelism {point['parallelism']:.3f}",
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
    p.add_argument("--temperature", type=float, default=DEFAULT_TEMPERATURE,
                   help="the sampled couplets' temperature (default: the page's)")
    p.add_argument("--top-p", type=float, default=0.9)
    add_model_args(p, dtype_default="bfloat16")
    p.add_argument("--sweep", action="store_true", help="sweep each mode's budget (slow)")
    p.add_argument("--sweep-values", type=lambda t: [float(x) for x in t.split(",")], default=None,
                   metavar="V,V,…", help="ratios for the modes swept by ratio, instead of the registry's")
    p.add_argument("--plot", default=None, help="HTML file for the quality-versus-compression plot")
    p.add_argument("--limit", type=int, default=None, help="first N phrases only")
    p.add_argument("--somber", type=float, default=DEFAULT_VOICE.somber, help="logit penalty, negation/melancholy")
    p.add_argument("--auspicious", type=float, default=DEFAULT_VOICE.auspicious, help="logit bonus, auspicious")
    p.add_argument("--pair-class", type=float, default=DEFAULT_VOICE.pair_class,
                   help="logit bonus in the 下联: the 上联 character's semantic class")
    p.add_argument("--pair-tone", type=float, default=DEFAULT_VOICE.pair_tone,
                   help="logit bonus in the 下联: the contrasting tone at a rhythm position")
    p.add_argument("--echo", type=float, default=DEFAULT_VOICE.echo,
                   help="logit bonus: characters of the request's own exemplars")
    p.add_argument("--no-taboo-ban", dest="ban_taboo", action="store_false")
    p.add_argument("--no-house", dest="house", action="store_false", help="no house prefix in the prompt")
    p.add_argument("-k", dest="k", type=int, default=DEFAULT_PROMPT.k, help="exemplars in the prompt (0: none)")
    p.add_argument("--steer", action="store_true", help="festive house prefix vs random corpus couplets (--pairs)")
    p.add_argument("--duixia", type=int, default=500, help="held-out 上联 for 对下联 (with --pairs; 0: skip)")
    p.add_argument("--best-of", type=int, default=1, metavar="N",
                   help="each couplet, greedy and sampled, is the best of N drafts by 对仗 and likelihood "
                        "(full cache only)")
    p.add_argument("--floor-dtype", choices=("float32", "bfloat16", "float16"), default=None,
                   help="also run full at this dtype against full at --dtype (the rounding floor)")
    args = vars(p.parse_args(argv))
    args["modes"] = [m.strip() for m in args["modes"].split(",") if m.strip()]  # checked by parse_modes in main
    args["voice"] = VoiceConfig(args.pop("ban_taboo"), args.pop("somber"), args.pop("auspicious"),
                                args.pop("pair_class"), args.pop("pair_tone"), args.pop("echo"))
    args["prompt"] = PromptConfig(args.pop("house"), args.pop("k"))
    return EvalConfig(**args)


def cli(argv: list[str] | None = None) -> None:
    """`python -m couplet.evaluate ...` (and `python -m couplet.bench.quality`): the report, printed and saved."""
    try:
        cfg = parse_args(argv)
        result = main(cfg)
    except (ValueError, FileNotFoundError, OSError, ModelUnavailable) as e:
        print(f"错误 error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    text = json.dumps(result, ensure_ascii=False, indent=1)
    if cfg.json:
        with open(cfg.json, "w", encoding="utf-8") as f:
            f.write(text + "\n")
    print(text)


if __name__ == "__main__":
    cli()
