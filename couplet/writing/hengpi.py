"""Choosing the 横批: scored by the model as a continuation of the couplet it tops.

The embedded model is trained to write a 横批 after the couplet (`… 下联 <sep> 横批 <eos>`, on the project's
own 春联, `couplet.writing.folk`). A candidate h is scored by

    log p(h | couplet) − mean over reference couplets c' of log p(h | c')

how much better this couplet predicts h than 春联 in general do (pointwise mutual information against the
house couplets, `couplet.writing.prompt`). The second term is a per-phrase constant, computed once per model: a
phrase every couplet predicts (春暖花开) wins no more often than its fit earns. A checkpoint folder may carry it
precomputed (`hengpi_prior.json`, used only when its key matches the weights, dtype and candidates).

Cost. The couplet is fed once as a short prefix, `<bos> <Ln> <sep> 上联 <mid> 下联 <sep>` (~20 tokens, no
exemplars: the 横批 fits the couplet, not the prompt), and its KV is repeated over a batch of the
shortlisted candidates, 5 tokens each (4 characters and `<eos>`). With 12 candidates that is ~80 tokens per
couplet against the couplet's ~400-token prompt and its decode. The wave's own cache is not reused: under an
evicting or quantized mode it holds a different couplet context per mode, and the 横批 of one couplet must
not depend on the mode that wrote it.

Candidates: the curated phrases (`couplet.writing.phrases`) and the 横批 of the project's own 春联, minus the
visitor's keywords in any order, minus any phrase already in a line (a 横批 that repeats the door's words
adds nothing), and minus a phrase naming a zodiac animal that no line names. A shortlist is taken first:
the phrases whose mean input embedding is closest to the couplet's, plus those sharing a character with it.
Results are cached per couplet.
"""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path

import torch

from couplet.models.loading import LoadedModel
from couplet.models.tokenizer import char_ids
from couplet.writing.calendar import ZODIAC
from couplet.writing.folk import load_folk
from couplet.writing.phrases import HENGPI_PHRASES
from couplet.writing.prompt import HOUSE_COUPLETS

SHORTLIST = 12
PRIOR_FILE = "hengpi_prior.json"  # beside a checkpoint's weights: the per-phrase prior, keyed (`prior_key`)
ANIMALS = set(ZODIAC) | {"犬"}  # 犬 is 狗 in the folk couplets (玉犬贺新春)


def _animals(text: str) -> set[str]:
    return {"狗" if c == "犬" else c for c in text if c in ANIMALS}


@lru_cache(maxsize=1)
def phrases() -> tuple[str, ...]:
    """Every candidate 横批: the curated phrases, then the project's own 春联's (4 characters each)."""
    return tuple(dict.fromkeys([*HENGPI_PHRASES, *(c.hengpi for c in load_folk() if len(c.hengpi) == 4)]))


def _prefix(lm: LoadedModel, upper: str, lower: str) -> list[int]:
    """`<bos> <Ln> <sep> upper <mid> lower <sep>`: what a 横批 continues."""
    f = lm.ids
    return [f.bos, f.length[len(upper)], f.sep, *char_ids(lm.tokenizer, upper), f.mid,
            *char_ids(lm.tokenizer, lower), f.sep]


@torch.inference_mode()
def continuation_logprobs(lm: LoadedModel, couplets: list[tuple[str, str]], candidates: list[str]) -> torch.Tensor:
    """log p(`h <eos>` | couplet) for every couplet × candidate: (len(couplets), len(candidates)).

    One forward over the couplets' prefixes (equal length per call: callers group by line length), then
    one over the candidates, each couplet's KV repeated once per candidate."""
    model, f = lm.model, lm.ids
    prefix = torch.tensor([_prefix(lm, u, lo) for u, lo in couplets], device=model.device)  # (n, p)
    out = model(input_ids=prefix, use_cache=True)
    first = torch.log_softmax(out.logits[:, -1].float(), -1)  # (n, vocab): predicts each candidate's 1st token
    cache = out.cache
    k = len(candidates)
    cache.batch_repeat_interleave(k)  # row i*k + j: couplet i, candidate j
    cand = torch.tensor([[*char_ids(lm.tokenizer, h), f.eos] for h in candidates], device=model.device)  # (k, 5)
    ids = cand.repeat(len(couplets), 1)  # (n*k, 5)
    logits = model(input_ids=ids, cache=cache).logits.float()
    logp = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1).sum(-1)  # (n*k,)
    head = first.repeat_interleave(k, 0).gather(-1, ids[:, :1]).squeeze(-1)
    return (head + logp).view(len(couplets), k)


def compute_prior(lm: LoadedModel, candidates: Sequence[str] | None = None) -> dict[str, float]:
    """Mean log p(h | c') over the house couplets, per phrase: what any 春联 predicts of h (each phrase's value
    is its own: scoring a subset gives the same numbers)."""
    candidates = list(phrases() if candidates is None else candidates)
    means = [continuation_logprobs(lm, refs, candidates).mean(0) for n in (5, 7)
             if (refs := [(h.upper, h.lower) for h in HOUSE_COUPLETS if len(h.upper) == n])]
    return dict(zip(candidates, torch.stack(means).mean(0).tolist(), strict=True))


def prior_key(lm: LoadedModel) -> str | None:
    """What the prior depends on — the weights' bytes, their dtype, quantization and device type, the candidates and
    the house couplets — as one hash; None for a checkpoint that is not a local folder with model.safetensors."""
    weights = Path(lm.source) / "model.safetensors"
    if not weights.is_file():
        return None
    h = hashlib.sha256(weights.read_bytes())
    h.update(f"{lm.dtype}|{lm.weights}|{torch.device(lm.device).type}|".encode())
    h.update("\n".join(phrases()).encode())
    h.update("\n".join(f"{c.upper}{c.lower}" for c in HOUSE_COUPLETS).encode())
    return h.hexdigest()


def save_prior(lm: LoadedModel) -> Path:
    """Write the prior beside the checkpoint's weights (`python -m couplet.writing.hengpi --save-prior [MODEL]`)."""
    key = prior_key(lm)
    if key is None:
        raise ValueError(f"{lm.source} is not a local checkpoint folder with model.safetensors")
    path = Path(lm.source) / PRIOR_FILE
    path.write_text(json.dumps({"key": key, "prior": compute_prior(lm)}, ensure_ascii=False, indent=0) + "\n",
                    encoding="utf-8")
    return path


@lru_cache(maxsize=4)
def _prior(lm: LoadedModel) -> dict[str, float]:
    """The prior saved beside the checkpoint when its key is this model's (the embedded model ships one: computing
    it is ~1,500 phrases × 7 couplets, 7.5 s on two CPU cores, which every new process paid before its first
    横批), else computed."""
    path = Path(lm.source) / PRIOR_FILE
    if path.is_file() and (key := prior_key(lm)) is not None:
        saved = json.loads(path.read_text(encoding="utf-8"))
        if saved.get("key") == key:
            return saved["prior"]
    return compute_prior(lm)


def _mean_embedding(lm: LoadedModel, texts: list[str]) -> torch.Tensor:
    """(len(texts), hidden) mean input embedding of each text's characters, unit-normalised."""
    embeddings: torch.nn.Embedding = lm.model.get_input_embeddings()  # type: ignore[assignment]
    table = embeddings.weight.detach()  # gathered first, then float32: not a float32 copy of the whole table
    rows = [table[torch.tensor(lm.char_ids(t), device=table.device)].float().mean(0) for t in texts]
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1)


@lru_cache(maxsize=4)
def _phrase_embeddings(lm: LoadedModel) -> torch.Tensor:
    return _mean_embedding(lm, list(phrases()))


def allowed(phrase: str, upper: str, lower: str, keywords: str = "") -> bool:
    """Not the visitor's keywords in any order (虎跃龙腾 → 龙腾虎跃 repeats the door's first four characters as
    surely as 虎跃龙腾 would), not words the couplet already says, and no zodiac animal the couplet does not name:
    狗年吉祥 over a couplet for any year would be wrong in eleven years of twelve."""
    animals = _animals(phrase)
    return (sorted(phrase) != sorted(keywords) and phrase not in upper and phrase not in lower
            and (not animals or bool(animals & _animals(upper + lower))))


def shortlist(lm: LoadedModel, upper: str, lower: str, keywords: str = "", k: int = SHORTLIST) -> list[str]:
    """The k allowed phrases worth scoring with the model: near by mean embedding, or sharing characters."""
    table = phrases()
    similarity = _phrase_embeddings(lm) @ _mean_embedding(lm, [upper + lower])[0]
    shared = torch.tensor([len(set(h) & set(upper + lower)) for h in table], dtype=similarity.dtype,
                          device=similarity.device)
    order = (similarity + 0.25 * shared).argsort(descending=True).tolist()
    return [table[i] for i in order if allowed(table[i], upper, lower, keywords)][:k]


@lru_cache(maxsize=512)
def _choose(lm: LoadedModel, upper: str, lower: str, keywords: str) -> str:
    candidates = shortlist(lm, upper, lower, keywords)
    prior = _prior(lm)
    scores = continuation_logprobs(lm, [(upper, lower)], candidates)[0]
    pmi = scores - torch.tensor([prior[h] for h in candidates])
    return candidates[int(pmi.argmax())]


def clear_cache() -> None:
    """Forget the phrases chosen so far (a benchmark starts every mode from the same state)."""
    _choose.cache_clear()


def choose_hengpi(lm: LoadedModel, upper: str, lower: str, keywords: str = "") -> str:
    """The candidate that best fits the couplet, by the model's pointwise mutual information. Another
    family (its prompt format has no 横批 slot to continue): the shortlist's best, by the model's own input
    embeddings and the characters shared."""
    if lm.family.name != "couplet":
        return shortlist(lm, upper, lower, keywords, 1)[0]
    return _choose(lm, upper, lower, keywords)


if __name__ == "__main__":
    from couplet.models.loading import load_model

    parser = argparse.ArgumentParser(description="Precompute the 横批 prior beside a local checkpoint's weights.")
    parser.add_argument("--save-prior", action="store_true", required=True)
    parser.add_argument("model", nargs="?", default=None, help="a checkpoint folder (default: the embedded model)")
    args = parser.parse_args()
    print(save_prior(load_model(args.model, "cpu", "float32")))
