"""Where `shared`'s KV memory goes on the serving benchmark's workload: the issue's "resident prompt KV against
unshared", taken apart.

    python scripts/shared_memory.py                     # 1000 visitors, a burst, the default budget
    python scripts/shared_memory.py --mode full --visitors 300   # the check: all of it own, about 100%

It runs the benchmark's workload through the engine in one mode and, every 10 ms, looks at the waves past
their prefill (as `Engine.stats()` counts them for the *in use* column). Against the same visitors' tokens in
unshared `full` caches it splits what they hold into:

- the house prefix's pool blocks (`<bos>` and the 14 house couplets: the part every visitor shares),
- the other pool blocks they reference (a cache-aware wave's exemplars and request, held once for its rows),
- their own prompt slots (what no one else's prompt has: a rare visitor's exemplars and request, a partial
  last block, the padding of a mixed wave),
- their own decode slots (the characters written so far, padding included).

Summed over the samples (time-weighted), and at the sample with the most tokens in flight: the prompt's
three parts against the same prompts unshared, the decode slots and the total against all tokens unshared.
Nothing else holds KV between steps: a wave's decoded copy of its common prefix (cascade attention) lives for
one layer's attention only. A measurement script, not a test: it reads the engine's internals under its lock.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from anywhere

import torch  # noqa: E402

from couplet.bench.serve import ServeConfig, default_budget, workload  # noqa: E402
from couplet.kvcache import make_mode  # noqa: E402
from couplet.kvcache.base import PlainStorage  # noqa: E402
from couplet.models.loading import load_model  # noqa: E402
from couplet.serving.engine import Engine, EngineConfig  # noqa: E402
from couplet.serving.generate import CoupletRequest, prepare  # noqa: E402
from couplet.writing import hengpi  # noqa: E402
from couplet.writing.prompt import HOUSE_COUPLETS  # noqa: E402

PARTS = ("house blocks", "other pool blocks", "own prompt slots", "own decode slots")


def sample(engine: Engine, house_blocks: int) -> tuple[float, ...] | None:
    """(house, other pool, own prompt, own decode, unshared prompt, unshared all) bytes of the waves past their
    prefill, or None."""
    token = engine.geometry.token_bytes
    with engine._lock:
        started = [w for w in engine._waves if w.started]
        house: dict[int, int] = {}  # id(block) -> bytes: each block once, however many rows reference it
        other: dict[int, int] = {}
        own_prompt = own_decode = prompts = unshared = 0.0
        for w in started:
            sharing = w.decoding.session.sharing
            for row in (sharing.blocks if sharing is not None else []):
                for j, block in enumerate(row):
                    (house if j < house_blocks else other)[id(block)] = block.nbytes
            for t in w.tickets:
                written = t.full_bytes // token - len(t.prep.prompt)  # characters (and line break) so far
                decode = written * token  # full precision, nothing evicted: one token's bytes a slot
                own_decode += decode
                own_prompt += t.kv_bytes - decode
                prompts += len(t.prep.prompt) * token
                unshared += t.full_bytes
    if not unshared:
        return None
    return sum(house.values()), sum(other.values()), own_prompt, own_decode, prompts, unshared


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", default="shared")
    p.add_argument("--visitors", type=int, default=1000)
    p.add_argument("--threads", type=int, default=1)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    cfg = ServeConfig(visitors=a.visitors)
    lm = load_model(None, None, None, None)
    typed, _ = workload(cfg)
    preps = {kw: prepare(lm, CoupletRequest(kw)) for kw in set(typed)}
    parts = make_mode(a.mode).compose()
    if not isinstance(parts.storage, PlainStorage) or parts.retention is not None:
        print(f"错误 error: {a.mode} quantizes or evicts; this split counts full-precision slots (full, shared)",
              file=sys.stderr)
        return 2
    sharing = parts.sharing
    block = sharing.block_size if sharing is not None else 1
    house_blocks = lm.family.shared_prefix(HOUSE_COUPLETS) // block
    hengpi.clear_cache()
    engine = Engine(lm, EngineConfig(kv_budget_mb=default_budget(lm, cfg), pool_mb=cfg.pool_mb,
                                     max_waiting=cfg.visitors))
    samples: list[tuple[float, ...]] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            if (s := sample(engine, house_blocks)) is not None:
                samples.append(s)
            time.sleep(0.01)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    tickets = [engine.submit(CoupletRequest(kw), a.mode, prep=preps[kw]) for kw in typed]
    for t in tickets:
        list(t)
    stop.set()
    watcher.join()
    engine.close()
    total = [sum(s[i] for s in samples) for i in range(6)]
    peak = max(samples, key=lambda s: s[5])  # the most tokens in flight: the moment memory is scarcest
    print(f"{a.mode}, {a.visitors} visitors, {len(samples)} samples; KV in use against unshared, by part "
          "(time-weighted; the prompt's parts against the prompts unshared, the rest against all tokens):")
    print("| part | time-weighted | at the peak |\n| --- | ---: | ---: |")
    for i, name in enumerate(PARTS):
        base = 4 if i < 3 else 5
        print(f"| {name} | {total[i] / total[base]:.1%} | {peak[i] / peak[base]:.1%} |")
    print(f"| **prompt (the first three, against the prompts)** | **{sum(total[:3]) / total[4]:.1%}** | "
          f"**{sum(peak[:3]) / peak[4]:.1%}** |")
    print(f"| all (against every token) | {sum(total[:4]) / total[5]:.1%} | {sum(peak[:4]) / peak[5]:.1%} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
