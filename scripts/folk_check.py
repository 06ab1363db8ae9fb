"""Check drafted 春联 before they join the project's own set (`assets/folk/folk.tsv`), and merge the ones that pass.

    python scripts/folk_check.py drafts.tsv [more.tsv ...]              # every row that fails, and why; a summary
    python scripts/folk_check.py drafts.tsv --keep kept.tsv              # also write the rows that pass
    python scripts/folk_check.py drafts.tsv --keep kept.tsv --avoid ../shared/data/chunlian_dev.tsv \
        --avoid-phrases assets/dev_keywords.txt assets/outside_keywords.txt

Drafts are `upper lower hengpi theme`, tab-separated, with or without the header line. A row passes the checks
`assets/folk/README.md` lists, the ones `tests/test_folk_hengpi.py` keeps holding for the shipped set: the hard
rules of `couplet.writing.rules`; no taboo, negation or gloomy word (`couplet.writing.lexicon`); every character
in the embedded model's vocabulary; a 4-character 横批 that is not words of a line; not a couplet of the house
prefix; no line already in the set (or earlier in the drafts); no 横批 more than `--hengpi-cap` times in the set
and the drafts together.

`--avoid FILE` (a TSV whose first two columns are lines, such as the real 春联 the project measures on) drops
every draft that shares a run of 4 characters with one of its lines, so that a model trained on the kept rows
has not seen the measured couplets or their phrases. Only counts are printed for it, never its lines: the
writers of the drafts do not read that file. `--avoid-phrases FILE…` (one phrase per line, as the evaluation's
keyword lists) drops every draft whose lines open on a listed phrase's halves (龙马… / 精神…, the page's
placement), so that the lists' figures stay measured on phrases the model was not trained to write.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import Counter
from pathlib import Path

from couplet.bench.figures import runs
from couplet.writing.exemplars import vocabulary_of
from couplet.writing.folk import FOLK, FolkCouplet, load_folk
from couplet.writing.lexicon import has_negation, has_taboo, is_gloomy
from couplet.writing.prompt import HOUSE_COUPLETS
from couplet.writing.rules import check_couplet


def read_rows(path: Path) -> list[FolkCouplet]:
    rows = []
    with path.open(encoding="utf-8", newline="") as f:
        for fields in csv.reader(f, delimiter="\t"):
            fields = [x.strip() for x in fields]
            if not fields or not any(fields) or fields[0] == "upper" or fields[0].startswith("#"):
                continue
            fields += [""] * (4 - len(fields))
            rows.append(FolkCouplet(*fields[:4]))
    return rows


def avoided_runs(path: Path) -> set[str]:
    out: set[str] = set()
    with path.open(encoding="utf-8", newline="") as f:
        for fields in csv.reader(f, delimiter="\t"):
            for line in fields[:2]:
                out |= runs(line.strip())
    return out


def problems(c: FolkCouplet, vocab: set[str], house: set[str]) -> list[str]:
    """Why one row cannot join the set (empty: it can, as far as the row alone says)."""
    out = []
    if not c.theme:
        out.append("no theme")
    checks = check_couplet(c.upper, c.lower, c.hengpi)
    out += [f"{name}: {v['message']}" for name, v in checks.items()
            if isinstance(v, dict) and v.get("ok") is False and name != "keywords"]
    if not checks["passed"] and not out:
        out.append("breaks a hard rule")
    if len(c.hengpi) != 4:
        out.append(f"横批 has {len(c.hengpi)} characters")
    elif c.hengpi in c.upper + c.lower:
        out.append("横批 is words of a line")
    text = c.upper + c.lower + c.hengpi
    for name, hit in (("taboo", has_taboo(text)), ("negation", has_negation(text)), ("gloom", is_gloomy(text))):
        if hit:
            out.append(f"{name} character or word")
    outside = sorted({ch for ch in text if ch not in vocab})
    if outside:
        out.append("outside the vocabulary: " + "".join(outside))
    if c.upper in house or c.lower in house:
        out.append("a couplet of the house prefix")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("drafts", nargs="+", type=Path)
    p.add_argument("--set", type=Path, default=FOLK, help="the set the drafts join (default: assets/folk/folk.tsv)")
    p.add_argument("--keep", type=Path, help="write the rows that pass here (header line, the set's format)")
    p.add_argument("--avoid", type=Path, help="drop drafts sharing a run of 4 characters with this file's lines")
    p.add_argument("--avoid-phrases", nargs="+", type=Path, default=[],
                   help="drop drafts whose lines open on these phrases' halves (one phrase per line)")
    p.add_argument("--hengpi-cap", type=int, default=4)
    p.add_argument("--quiet", action="store_true", help="the summary only")
    args = p.parse_args(argv)
    for path in [*args.drafts, *([args.avoid] if args.avoid else []), *args.avoid_phrases]:
        if not path.exists():
            print(f"folk_check: no such file: {path}", file=sys.stderr)
            return 2

    vocab = vocabulary_of()
    house = {line for h in HOUSE_COUPLETS for line in (h.upper, h.lower)}
    shipped = load_folk(args.set)
    seen_lines = {line for c in shipped for line in (c.upper, c.lower)}
    hengpi_count = Counter(c.hengpi for c in shipped)
    avoid = avoided_runs(args.avoid) if args.avoid else set()
    phrases = {line.strip() for path in args.avoid_phrases for line in path.read_text(encoding="utf-8").splitlines()}

    reasons: Counter[str] = Counter()
    kept: list[FolkCouplet] = []
    total = 0
    for path in args.drafts:
        for n, c in enumerate(read_rows(path), 1):
            total += 1
            why = problems(c, vocab, house)
            if not why and (c.upper in seen_lines or c.lower in seen_lines):
                why = ["duplicate: a line already in the set or earlier in the drafts"]
            if not why and hengpi_count[c.hengpi] >= args.hengpi_cap:
                why = [f"横批 over the cap: {c.hengpi} is already {hengpi_count[c.hengpi]} times in the set"]
            if not why and avoid and (runs(c.upper) | runs(c.lower)) & avoid:
                why = ["avoided: shares a run of 4 characters with a line of the --avoid file"]
            if not why and any(c.upper[:k] + c.lower[:k] in phrases for k in (1, 2)):
                why = ["avoided phrase: the lines open on a listed phrase's halves"]
            if why:
                reasons[why[0].split(":")[0]] += 1
                if not args.quiet:
                    print(f"{path.name}:{n}\t{c.upper} / {c.lower} / {c.hengpi}\t" + "; ".join(why))
                continue
            kept.append(c)
            seen_lines |= {c.upper, c.lower}
            hengpi_count[c.hengpi] += 1

    print(f"{total} drafts, {len(kept)} pass, {total - len(kept)} dropped" +
          ("".join(f"\n  {k}: {v}" for k, v in reasons.most_common())))
    if args.keep:
        with args.keep.open("w", encoding="utf-8", newline="") as f:
            w = csv.writer(f, delimiter="\t", lineterminator="\n")
            w.writerow(["upper", "lower", "hengpi", "theme"])
            w.writerows((c.upper, c.lower, c.hengpi, c.theme) for c in kept)
    return 0


if __name__ == "__main__":
    sys.exit(main())
