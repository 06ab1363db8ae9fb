"""A blind read: the same phrases' couplets from two evaluation reports, side by side in a shuffled order.

    python scripts/blind_read.py before.json after.json [--n 30] [--seed 0]

Each report is `python -m couplet.evaluate --json`'s. Prints a Markdown table whose columns A and B hide which
report wrote which couplet (a coin per row), then the key. Read the table first; open the key after.
"""

from __future__ import annotations

import argparse
import json
import random
import sys


def couplets(path: str) -> dict[str, str]:
    with open(path, encoding="utf-8") as f:
        samples = json.load(f)["samples"]
    return {s["keywords"]: f"{s['upper']} / {s['lower']}（{s['hengpi']}）" for s in samples}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("first")
    p.add_argument("second")
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    one, two = couplets(a.first), couplets(a.second)
    phrases = sorted(set(one) & set(two))
    if not phrases:
        print("error: the two reports share no phrase", file=sys.stderr)
        return 2
    rng = random.Random(a.seed)
    rng.shuffle(phrases)
    key = []
    print("| # | keywords | A | B |\n|---|---|---|---|")
    for i, phrase in enumerate(phrases[: a.n], 1):
        flip = rng.random() < 0.5
        left, right = (two[phrase], one[phrase]) if flip else (one[phrase], two[phrase])
        print(f"| {i} | {phrase} | {left} | {right} |")
        key.append(f"{i}:{'B' if flip else 'A'}")
    print(f"\nkey (which column is {a.first}): " + " ".join(key))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
