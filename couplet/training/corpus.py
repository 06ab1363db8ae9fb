"""Reading the couplet corpus, the held-out split, and keyword conditioning for training.

The corpus is read by path (never copied into the project). The held-out split is a pure function of
each pair's text, so every command agrees on it without storing it.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import lzma
import random
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

KINDS = ("lvshi_mid", "lvshi_edge", "other")


@dataclass(frozen=True)
class Pair:
    upper: str
    lower: str
    kind: str


def read_pairs(path: str | Path) -> Iterator[Pair]:
    """Rows of the tab-separated corpus (`upper lower era kind`, header line); `.xz` read with lzma."""
    opener = lzma.open if str(path).endswith(".xz") else open
    with opener(path, "rt", encoding="utf-8") as f:  # type: ignore[operator]
        header = f.readline().rstrip("\n").split("\t")
        col = {name: i for i, name in enumerate(header)}
        for line in f:
            cells = line.rstrip("\n").split("\t")
            kind = cells[col["kind"]] if "kind" in col else "lvshi_mid"
            yield Pair(cells[col["upper"]], cells[col["lower"]], kind)


def is_heldout(pair: Pair, percent: int = 1) -> bool:
    """`percent`% of `lvshi_mid` pairs, chosen by a hash of their text, are never trained on."""
    if pair.kind != "lvshi_mid":
        return False
    digest = hashlib.md5((pair.upper + pair.lower).encode()).digest()
    return digest[0] * 256 + digest[1] < 65536 * percent // 100


def sample_keywords(pair: Pair, rng: random.Random) -> str:
    """1-4 characters of the pair, in order, or none: the conditioning the model learns to honour.

    Half the time they are the heads of the two lines (how generation places keywords, 嵌字 at the
    heads), otherwise any characters of the pair in reading order; 10% of pairs get no keywords so the
    model can also continue a bare prompt (used for the held-out NLL).
    """
    r = rng.random()
    if r < 0.10:
        return ""
    if r < 0.55:
        k = rng.choice((1, 1, 2))
        return pair.upper[:k] + pair.lower[:k]
    text = pair.upper + pair.lower
    n = rng.randint(1, 4)
    picks = sorted(rng.sample(range(len(text)), n))
    return "".join(text[i] for i in picks)


def make_batch(seqs: list[list[int]], pad_id: int, sep_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (batch, max_len) inputs and labels; labels are -100 up to and including <sep>."""
    width = max(len(s) for s in seqs)
    inputs = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    labels = torch.full((len(seqs), width), -100, dtype=torch.long)
    for row, s in enumerate(seqs):
        inputs[row, : len(s)] = torch.tensor(s)
        start = s.index(sep_id) + 1
        labels[row, start : len(s)] = torch.tensor(s[start:])
    return inputs, labels


def write_heldout(data: str, out: str, limit: int | None = None) -> int:
    """Write the held-out `lvshi_mid` pairs as a `upper lower` TSV (outside the repository)."""
    count = 0
    with open(out, "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f, delimiter="\t", lineterminator="\n")
        w.writerow(["upper", "lower"])
        for pair in read_pairs(data):
            if is_heldout(pair):
                w.writerow([pair.upper, pair.lower])
                count += 1
                if limit and count >= limit:
                    break
    return count


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m couplet.training.corpus",
                                description="Write the held-out lvshi_mid split.")
    p.add_argument("--data", required=True, help="couplets_train.tsv.xz")
    p.add_argument("--out", required=True, help="TSV to write (keep it outside the repository)")
    p.add_argument("--limit", type=int, default=None)
    a = p.parse_args(argv)
    n = write_heldout(a.data, a.out, a.limit)
    print(f"wrote {n} held-out pairs to {a.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
