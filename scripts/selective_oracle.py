"""How far `selective` is from an eviction that knows the future: its identical rate against `full` when its
scores are replaced by the attention `full`'s own decode queries pay (an oracle), at the prompt's eviction,
at the later ones, or both.

    PYTHONPATH=. python scripts/selective_oracle.py --ratio 0.5 --prompt oracle --steps oracle   # the bound
    PYTHONPATH=. python scripts/selective_oracle.py --ratio 0.5 --prompt first-8                 # full's first 8
    PYTHONPATH=. python scripts/selective_oracle.py --ratio 0.5 --lookahead 8                    # the real policy

Per phrase: `full` writes its couplet (greedy, float32); transformers' eager attention over the prompt plus
that couplet gives every decode query's attention, per layer, averaged over each KV head's query heads (GQA);
then `selective` runs with the chosen scores. Scores: `own` (what the policy records; `--lookahead` as the
policy's knob), `oracle` (all of `full`'s decode queries), `ahead` (only those still to come at each eviction),
`first-N` (`full`'s first N decode queries). The policy's score is replaced by patching the class for this
process: the hook is the experiment itself, there is no knob for it. A benchmark that prints figures.
"""

from __future__ import annotations

import argparse
import time

import torch
from transformers import AutoModelForCausalLM

from couplet.bench.quality import read_lines
from couplet.kvcache import PrefixPool
from couplet.kvcache.retention import ScoreView
from couplet.kvcache.selective import SelectivePolicy
from couplet.models.loading import load_model
from couplet.serving.generate import CoupletRequest, generate


def oracle_scores(attention: torch.Tensor, prompt: int, kind: str, seen: int) -> torch.Tensor:
    """attention (layers, kv_heads, decode queries, T) -> (layers, kv_heads, T) mean attention per query."""
    if kind == "oracle":
        rows = attention
    elif kind == "ahead":
        rows = attention[:, :, max(seen - prompt, 0):]
    elif kind.startswith("first-"):
        rows = attention[:, :, : int(kind[len("first-"):])]
    else:
        raise ValueError(f"unknown score {kind!r}")
    return rows.sum(2) / max(rows.shape[2], 1)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--keywords", default="assets/dev_keywords.txt")
    p.add_argument("--ratio", type=float, default=0.5)
    p.add_argument("--prompt", default="own", help="own, oracle, ahead or first-N: the prompt's eviction")
    p.add_argument("--steps", default="own", help="own, oracle or ahead: the evictions while decoding")
    p.add_argument("--lookahead", type=int, default=0, help="the policy's own knob (with --prompt own)")
    p.add_argument("--no-merge", action="store_true")
    p.add_argument("--limit", type=int, default=None)
    args = p.parse_args()
    torch.set_num_threads(2)
    lm = load_model(None, None, "float32", None)
    eager = AutoModelForCausalLM.from_pretrained(lm.source, attn_implementation="eager", dtype=torch.float32).eval()
    fed: list[list[int]] = []  # every forward's token ids, in order: the prompt, then each decode step's token
    lm.model.register_forward_pre_hook(lambda m, a, kw: fed.append(kw["input_ids"][0].tolist()), with_kwargs=True)
    state: dict[str, torch.Tensor | int] = {}
    own = SelectivePolicy.score

    def score(self: SelectivePolicy, view: ScoreView) -> torch.Tensor:
        seen = int(view.seen.flatten()[0])
        kind = args.prompt if seen == state["prompt"] else args.steps
        if kind == "own":
            return own(self, view)
        s = oracle_scores(state["attention"], state["prompt"], kind, seen)  # type: ignore[arg-type]
        return s[:, None].gather(3, view.pos.long().clamp(0, s.shape[-1] - 1))

    SelectivePolicy.score = score  # type: ignore[method-assign]
    phrases = read_lines(args.keywords)[: args.limit]
    pool, same, t0 = PrefixPool(), 0, time.time()
    for phrase in phrases:
        request = CoupletRequest(phrase, 7)
        fed.clear()
        ref = generate(lm, request, "full", pool)
        seq, prompt = [t for ids in fed for t in ids], len(fed[0])
        with torch.no_grad():
            att = torch.stack(eager(input_ids=torch.tensor([seq]), output_attentions=True).attentions)[:, 0]
        layers, heads, total, _ = att.shape  # (layers, q_heads, T, T)
        kv_heads = lm.model.config.num_key_value_heads
        state["attention"] = att[:, :, prompt:].reshape(layers, kv_heads, heads // kv_heads, total - prompt,
                                                        total).mean(2)
        state["prompt"] = prompt
        r = generate(lm, request, "selective", pool, ratio=args.ratio, merge=not args.no_merge,
                     lookahead=args.lookahead)
        same += (r.upper, r.lower) == (ref.upper, ref.lower)
    print(f"ratio {args.ratio}, prompt {args.prompt}, steps {args.steps}, lookahead {args.lookahead}, merge "
          f"{not args.no_merge}: identical to full {same}/{len(phrases)} = {same / len(phrases):.1%} "
          f"({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
