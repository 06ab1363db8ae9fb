"""What the 横批 costs against the couplet it tops, per couplet, on this machine.

    PYTHONPATH=. python scripts/hengpi_cost.py [MODEL_DIR] [--n 40]

Times `generate()` (which chooses the 横批 at its end) and the 横批 alone on the first N dev phrases, each with
the 横批 cache cleared, after one warm-up couplet (the PMI prior and the allocator's first-touch cost).
"""

from __future__ import annotations

import argparse
import time

from couplet.models.loading import load_model
from couplet.serving.generate import CoupletRequest, generate
from couplet.writing import hengpi


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("model", nargs="?", default=None, help="checkpoint directory (default: the embedded model)")
    p.add_argument("--n", type=int, default=40)
    a = p.parse_args()
    lm = load_model(a.model, dtype="float32")
    with open("assets/dev_keywords.txt", encoding="utf-8") as f:
        phrases = [line.strip() for line in f if line.strip()][: a.n]
    generate(lm, CoupletRequest("春风", 7))
    whole = alone = 0.0
    for phrase in phrases:
        hengpi.clear_cache()
        t = time.perf_counter()
        r = generate(lm, CoupletRequest(phrase, 7))
        whole += time.perf_counter() - t
        hengpi.clear_cache()
        t = time.perf_counter()
        hengpi.choose_hengpi(lm, r.upper, r.lower, r.keywords)
        alone += time.perf_counter() - t
    n = len(phrases)
    print(f"{n} couplets: whole {whole / n * 1000:.0f} ms each, 横批 {alone / n * 1000:.0f} ms each, "
          f"横批 / (couplet without it) = {alone / (whole - alone):.3f}")


if __name__ == "__main__":
    main()
