"""What a visitor gets: the page's request (its default temperature, top-p 0.9) on a keyword list, a seed at a time, as
one draft and with 择优 (best of 4), both under `shared` (lossless; the pool keeps the house prefix, as on the page).

    python scripts/best_of_page.py assets/outside_keywords.txt [--seeds 1 2] [--json DIR]
    python scripts/best_of_page.py assets/dev_keywords.txt --seeds 1 --drafts 1 --model DIR --json OUT
        # one draft only, another checkpoint (two models' page couplets for a blind read)

`--json DIR` also writes each seed's couplets as DIR/one_seed{S}.json and DIR/best_seed{S}.json, in the shape of
`python -m couplet.evaluate --json`'s samples, for `scripts/blind_read.py`.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from couplet.bench.figures import voice_flags
from couplet.bench.quality import read_lines
from couplet.kvcache import PrefixPool
from couplet.models.loading import load_model
from couplet.page.share import DEFAULT_TEMPERATURE
from couplet.serving.best_of import BestOf, best_of
from couplet.serving.generate import CoupletRequest, generate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("keywords")
    p.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    p.add_argument("--json", type=Path, default=None, help="a folder for each run's couplets")
    p.add_argument("--drafts", type=int, nargs="+", default=[1, 4], choices=[1, 4],
                   help="one draft, 择优 (best of 4), or both (the default)")
    p.add_argument("--model", default=None, help="a checkpoint folder (default: the embedded model)")
    a = p.parse_args()
    lm = load_model(a.model, "cpu", "float32")
    phrases = read_lines(a.keywords)
    print("| seed | couplet | rules | 对仗 | template repeat | gloom | negation |")
    print("| ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for seed in a.seeds:
        for label, drafts in [(label, n) for label, n in (("one draft", 1), ("择优, best of 4", 4)) if n in a.drafts]:
            pool = PrefixPool()
            results = []
            for kw in phrases:
                request = CoupletRequest(kw, 7, temperature=DEFAULT_TEMPERATURE, top_p=0.9, seed=seed)
                results.append(generate(lm, request, "shared", pool) if drafts == 1 else
                               best_of(lm, request, BestOf(drafts), "shared", pool))
            if a.json is not None:
                a.json.mkdir(parents=True, exist_ok=True)
                samples = [r.to_json(with_steps=False) for r in results]
                path = a.json / f"{'one' if drafts == 1 else 'best'}_seed{seed}.json"
                path.write_text(json.dumps({"samples": samples}, ensure_ascii=False, indent=1), encoding="utf-8")
            flags = voice_flags(results)
            figures = [statistics.fmean(r.checks["passed"] for r in results),
                       statistics.fmean(r.checks["parallelism"]["score"] for r in results),
                       *(statistics.fmean(flags[k]) for k in ("template_repeat", "gloom_rate", "negation_rate"))]
            print(f"| {seed} | {label} | " + " | ".join(f"{v:.3f}" for v in figures) + " |", flush=True)


if __name__ == "__main__":
    main()
