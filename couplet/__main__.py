"""Command line: `python -m couplet 龙马精神 [--length 5|7] [--seed N] [--temperature T] [--top-p P]
[--acrostic] [--mode NAME ...] [--set MODE.FIELD=VALUE ...] [--json]`, or 对下联:
`python -m couplet --upper 春风送暖千家福` (a 5- or 7-character 上联; the 下联 and a 横批 are written).
`--backend vllm [--vllm-url URL]` writes it on a vLLM server instead (mode `vllm`; `--mode` adds in-process ones).
`--best-of N` writes N drafts in one batch per mode and shows the best by 对仗 and likelihood (`serving.best_of`).

Bad input exits with status 2 and one line on stderr, never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass, field

from couplet.events import CoupletResult
from couplet.kvcache import MODES, PrefixPool, make_mode, parse_settings
from couplet.models.hub import ModelUnavailable, add_model_args
from couplet.serving.backends import DEFAULT_VLLM_URL, BackendConfig, BackendError, add_backend_args
from couplet.writing.text import CoupletInputError, normalize_keywords, normalize_upper

MARK = {True: "✓", False: "✗"}


@dataclass
class CliConfig:
    keywords: str | None = None
    upper: str | None = None
    length: int = 7
    seed: int = 0
    temperature: float = 0.0
    top_p: float = 1.0
    acrostic: bool = False
    modes: list[str] | None = None  # None: full (local), or the server's alone (vllm)
    settings: list[str] = field(default_factory=list)
    json: bool = False
    model: str | None = None
    device: str | None = None
    dtype: str | None = None
    weights: str | None = None
    backend: str = "local"
    vllm_url: str = DEFAULT_VLLM_URL
    best_of: int = 1


def format_text(result: CoupletResult, show_mode: bool) -> str:
    c = result.checks
    kv = f"KV 峰值 {result.peak_bytes / 1024:.1f} KB（完整缓存 {result.full_equivalent_bytes / 1024:.1f} KB）"
    if result.mode not in MODES:  # a server's gauge: every request it held, not this one's
        kv = f"服务端 KV 峰值（全引擎合计）{result.peak_bytes / 1024:.1f} KB"
    head = f"【{result.mode}】{kv}\n" if show_mode else ""
    lines = [
        f"横批：{result.hengpi}",
        f"上联：{result.upper}",
        f"下联：{result.lower}",
        *([f"参考古联：{'；'.join('，'.join(p) for p in result.exemplars)}"] if result.exemplars else []),
        f"检查：字数{MARK[c['length']['ok']]} 平仄{MARK[c['tones']['ok']]} 关键词{MARK[c['keywords']['ok']]} "
        f"同位不重{MARK[c['same_position']['ok']]} 对仗 {c['parallelism']['score']:.2f}",
        *[f"提示：{n}" for n in result.notes],
        *[f"未通过：{m}" for m in c["failures"]],
    ]
    return head + "\n".join(lines)


def main(cfg: CliConfig) -> int:
    from couplet.models.loading import load_model
    from couplet.serving.best_of import BestOf, best_of
    from couplet.serving.generate import CoupletRequest, generate  # heavy imports after argument checks

    settings = parse_settings(cfg.settings)
    BackendConfig(cfg.backend, cfg.vllm_url)  # a bad URL: one line, before the model loads
    local = cfg.modes if cfg.modes is not None else ([] if cfg.backend == "vllm" else ["full"])
    for m in local:  # an unknown mode, option or value: one line before the model loads
        make_mode(m, **settings.get(m, {}))
    drafts = BestOf(n=cfg.best_of)
    # the text too: a refusal costs no model load (its vocabulary only adds notes, after it loads)
    normalize_upper(cfg.upper) if cfg.upper is not None else normalize_keywords(cfg.keywords or "")
    if cfg.best_of > 1 and cfg.backend == "vllm":
        raise ValueError("--best-of runs in-process modes only, not on a vLLM server")
    request = CoupletRequest(cfg.keywords or "", cfg.length, cfg.acrostic, cfg.temperature, cfg.top_p, cfg.seed,
                             upper=cfg.upper or "", task="couplet" if cfg.upper is None else "duixia")
    lm = load_model(cfg.model, cfg.device, cfg.dtype, cfg.weights)
    results = []
    if cfg.backend == "vllm":  # the same prepared request, written on the server (`couplet.serving.backends`)
        from couplet.kvcache import KVGeometry
        from couplet.serving.generate import prepare
        from couplet.vllm_backend.client import VllmClient
        from couplet.vllm_backend.client import generate as remote_generate

        client = VllmClient(cfg.vllm_url, KVGeometry.of(lm.model))
        results.append(remote_generate(client, lm, prepare(lm, request)))
    pool = PrefixPool()
    results += [generate(lm, request, m, pool, **settings.get(m, {})) if drafts.n == 1 else
                best_of(lm, request, drafts, m, pool, **settings.get(m, {})) for m in local]
    if cfg.json:
        payload = [r.to_json() for r in results]
        print(json.dumps(payload[0] if len(payload) == 1 else payload, ensure_ascii=False))
    else:
        print("\n\n".join(format_text(r, len(results) > 1) for r in results))
    return 0


def parse_args(argv: list[str] | None = None) -> CliConfig:
    p = argparse.ArgumentParser(prog="python -m couplet", description="写一副春联 (write a Spring Festival couplet)")
    p.add_argument("keywords", nargs="?", default=None, help="1-8 个汉字关键词，如 龙马精神")
    p.add_argument("--upper", default=None, help="对下联：给出 5 或 7 字上联，如 春风送暖千家福")
    p.add_argument("--length", type=int, choices=(5, 7), default=7, help="每联字数 (default 7)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--acrostic", action="store_true", help="藏头: keywords alternate as the heads of the two lines")
    p.add_argument("--mode", dest="modes", action="append", metavar="NAME",
                   help=f"KV-cache mode, repeatable: {', '.join(MODES)} (default full)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="MODE.FIELD=VALUE",
                   help="a mode's budget, e.g. selective.ratio=0.3 (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON object (a list with several --mode)")
    p.add_argument("--best-of", type=int, default=1, metavar="N",
                   help="write N drafts in one batch and keep the best by 对仗 and likelihood (default 1)")
    add_model_args(p)
    add_backend_args(p)
    args = vars(p.parse_args(argv))
    if args["keywords"] is None and args["upper"] is None:
        p.error("give keywords (e.g. 龙马精神) or --upper 上联")
    if args["keywords"] is not None and args["upper"] is not None:
        p.error("give keywords or --upper, not both")
    return CliConfig(**args)


def run(argv: list[str] | None = None) -> int:
    try:
        return main(parse_args(argv))
    except (CoupletInputError, ValueError, FileNotFoundError, OSError, ModelUnavailable, BackendError) as e:
        print(f"错误 error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(run())
