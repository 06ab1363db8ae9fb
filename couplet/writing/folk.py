"""The project's own 春联, with their 横批: traditional folk couplets (public domain) and new ones on modern
themes, written out for the project (`assets/folk/README.md` says how the set was made and checked).

They serve three ways: as training targets (`couplet.training.context`: the voice of real 春联, and the 横批
as a continuation of the couplet, `… 下联 <sep> 横批 <eos>`), as exemplars (`couplet.writing.exemplars` adds them
to the store), and as lines the page must never borrow (`folk_lines`: the decoding constraints and the
copy figure treat them like the prompt's own lines, since a model trained on them could recite them).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

FOLK = Path(__file__).resolve().parents[2] / "assets" / "folk" / "folk.tsv"
# The second round (assets/folk/README.md): training data only. Exemplars, 横批 candidates and the banned lines
# come from `FOLK` alone: among a keyword query's exemplars the round's stock phrases came back in the couplets,
# its 横批 crowded the candidates, and banning its lines banned the voice's common runs (the shipped model shares a
# run of 4 with one not much more often than a model never trained on them: docs/results/quality.md, stage 6).
FOLK_ROUND2 = FOLK.with_name("round2.tsv")


@dataclass(frozen=True)
class FolkCouplet:
    upper: str
    lower: str
    hengpi: str
    theme: str


def load_folk(path: str | Path = FOLK) -> tuple[FolkCouplet, ...]:
    """The set's rows (`upper lower hengpi theme`, header line); empty when the file is absent."""
    return _load_folk(Path(path).resolve())  # one cache entry per file, however its path is spelled


@lru_cache(maxsize=4)
def _load_folk(path: Path) -> tuple[FolkCouplet, ...]:
    if not path.exists():
        return ()
    with path.open(encoding="utf-8", newline="") as f:
        return tuple(FolkCouplet(r["upper"], r["lower"], r["hengpi"], r["theme"])
                     for r in csv.DictReader(f, delimiter="\t"))


@lru_cache(maxsize=1)
def folk_lines() -> tuple[str, ...]:
    """Every line of the set: a couplet on the page may not share a run of 4 characters with one."""
    return tuple(line for c in load_folk() for line in (c.upper, c.lower))
