"""Every mode's greedy couplets and bytes per step on the dev list, as a golden file for refactors.

    PYTHONPATH=. python scripts/golden_modes.py --write tests/golden/modes.json   # before a refactor
    PYTHONPATH=. python scripts/golden_modes.py --check tests/golden/modes.json   # after: what differs
    PYTHONPATH=. python scripts/golden_modes.py --check tests/golden/modes.json --modes full --dtype bfloat16
        # the rounding floor: how many float32 couplets a bf16 run writes alike (couplets only; bytes halve)

Each mode runs at its registry defaults, float32 on CPU (`--device cuda`: the CPU golden file checked on a
GPU), on a fresh prefix pool (so `shared` and `combo` see the same pool states in the same order every run).
Per phrase it records the couplet, the 横批 and, per step, stored tokens, kv bytes, shared bytes and tokens
computed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from couplet.kvcache import MODES, PrefixPool
from couplet.models.loading import load_model
from couplet.serving.generate import CoupletRequest, generate
from couplet.writing.text import CoupletInputError


def run(phrases: list[str], modes: list[str], length: int, device: str = "cpu", dtype: str = "float32") -> dict:
    lm = load_model(dtype=dtype, device=device)
    out: dict = {"length": length, "modes": {}}
    for mode in modes:
        pool = PrefixPool()
        rows = {}
        t0 = time.perf_counter()
        for phrase in phrases:
            try:
                r = generate(lm, CoupletRequest(phrase, length), mode, pool)
            except CoupletInputError:
                continue
            rows[phrase] = {"couplet": [r.upper, r.lower, r.hengpi],
                            "steps": [[s.stored_tokens, s.kv_bytes, s.shared_bytes, s.computed_tokens]
                                      for s in r.steps]}
        out["modes"][mode] = rows
        print(f"{mode}: {len(rows)} phrases in {time.perf_counter() - t0:.0f}s", file=sys.stderr, flush=True)
    return out


def compare(golden: dict, now: dict, couplets_only: bool = False) -> list[str]:
    """Human-readable differences; empty when identical. `couplets_only`: steps (bytes) are not compared."""
    diffs = []
    for mode, rows in golden["modes"].items():
        if mode not in now["modes"]:
            diffs.append(f"{mode}: missing")
            continue
        for phrase, want in rows.items():
            got = now["modes"][mode].get(phrase)
            if got is None:
                diffs.append(f"{mode} {phrase}: missing")
            elif got["couplet"] != want["couplet"]:
                diffs.append(f"{mode} {phrase}: {want['couplet']} -> {got['couplet']}")
            elif not couplets_only and got["steps"] != want["steps"]:
                first = next(i for i, (a, b) in enumerate(zip(want["steps"], got["steps"], strict=True)) if a != b) \
                    if len(got["steps"]) == len(want["steps"]) else -1
                diffs.append(f"{mode} {phrase}: steps differ (first at step {first})")
    return diffs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keywords", default="assets/dev_keywords.txt")
    p.add_argument("--modes", default=None, help="comma-separated (default: every mode in the golden file/registry)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--length", type=int, default=7)
    p.add_argument("--device", default="cpu", help="cuda: the CPU golden file against a GPU run (float32 both)")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"],
                   help="with --check: another dtype against the float32 file, couplets only")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--write")
    g.add_argument("--check")
    args = p.parse_args()
    if args.write and args.dtype != "float32":
        p.error("the golden file is float32; --dtype is for --check")
    phrases = [s.strip() for s in Path(args.keywords).read_text(encoding="utf-8").splitlines() if s.strip()]
    phrases = phrases[: args.limit]
    if args.write:
        modes = args.modes.split(",") if args.modes else list(MODES)
        data = run(phrases, modes, args.length, args.device)
        Path(args.write).parent.mkdir(parents=True, exist_ok=True)
        Path(args.write).write_text(json.dumps(data, ensure_ascii=False, separators=(",", ":")) + "\n",
                                    encoding="utf-8")
        return 0
    golden = json.loads(Path(args.check).read_text(encoding="utf-8"))
    modes = args.modes.split(",") if args.modes else list(golden["modes"])
    golden["modes"] = {m: {k: v for k, v in golden["modes"][m].items() if k in phrases} for m in modes}
    couplets_only = args.dtype != "float32"
    diffs = compare(golden, run(phrases, modes, golden["length"], args.device, args.dtype), couplets_only)
    total = sum(len(r) for r in golden["modes"].values())
    what = f"couplet ({args.dtype} against float32)" if couplets_only else "couplet and bytes per step"
    print(f"{total - len({d.split(':')[0] for d in diffs})} of {total} (mode, phrase) identical in {what}; "
          f"{len(diffs)} differ")
    for d in diffs[:40]:
        print("  " + d)
    return 1 if diffs else 0


if __name__ == "__main__":
    raise SystemExit(main())
