"""Choosing the 横批 from the curated phrases by the model's own likelihood given the couplet.

Score of a phrase h = log p(couplet | keywords = h) − log p(couplet | no keywords): how much better
the model explains the couplet when told h was its theme (pointwise mutual information). The model was
trained to write couplets from keywords, so a phrase whose meaning and characters the couplet echoes
scores high. To keep this to one small batched forward, a shortlist is taken first: the phrases whose
mean input embedding is closest to the couplet's, plus any phrase sharing a character with it.
Results are cached per couplet.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from couplet.model import LoadedModel
from couplet.phrases import HENGPI_PHRASES
from couplet.scoring import sequence_logprobs
from couplet.tokenizer import couplet_ids, upper_start


def _couplet_logprob(lm: LoadedModel, themes: list[str], upper: str, lower: str) -> torch.Tensor:
    """Sum of log p(couplet tokens | `<bos> <Ln> theme <sep>`) for each theme; (len(themes),)."""
    seqs = [couplet_ids(lm.tokenizer, theme, upper, lower) for theme in themes]
    body = len(upper) + len(lower) + 2  # both lines, <mid> and <eos>
    logp = sequence_logprobs(lm.model, seqs, lm.ids.pad)
    # logp[:, t-1] scores token t; sum over the couplet body of each row
    return torch.stack([logp[row, upper_start(t) - 1 : upper_start(t) - 1 + body].sum()
                        for row, t in enumerate(themes)])


SHORTLIST = 24


def _mean_embedding(lm: LoadedModel, texts: list[str]) -> torch.Tensor:
    """(len(texts), hidden) mean input embedding of each text's characters, unit-normalised."""
    embeddings: torch.nn.Embedding = lm.model.get_input_embeddings()  # type: ignore[assignment]
    table = embeddings.weight.detach()  # gathered first, then float32: not a float32 copy of the whole table
    rows = [table[torch.tensor(lm.char_ids(t), device=table.device)].float().mean(0) for t in texts]
    return torch.nn.functional.normalize(torch.stack(rows), dim=-1)


@lru_cache(maxsize=4)
def _phrase_embeddings(lm: LoadedModel) -> torch.Tensor:
    return _mean_embedding(lm, list(HENGPI_PHRASES))


def shortlist(lm: LoadedModel, upper: str, lower: str, k: int = SHORTLIST) -> list[str]:
    """The k phrases worth scoring with the model: near by mean embedding, or sharing characters."""
    similarity = _phrase_embeddings(lm) @ _mean_embedding(lm, [upper + lower])[0]
    shared = torch.tensor([len(set(h) & set(upper + lower)) for h in HENGPI_PHRASES], dtype=similarity.dtype,
                          device=similarity.device)
    best = (similarity + 0.25 * shared).topk(min(k, len(HENGPI_PHRASES))).indices.tolist()
    return [HENGPI_PHRASES[i] for i in best]


@lru_cache(maxsize=512)
def _choose(lm: LoadedModel, upper: str, lower: str) -> str:
    with torch.inference_mode():
        candidates = shortlist(lm, upper, lower)
        scores = _couplet_logprob(lm, ["", *candidates], upper, lower)
    return candidates[int((scores[1:] - scores[0]).argmax())]


def clear_cache() -> None:
    """Forget the phrases chosen so far (a benchmark starts every mode from the same state)."""
    _choose.cache_clear()


def choose_hengpi(lm: LoadedModel, upper: str, lower: str) -> str:
    """The curated phrase that best fits the couplet, by the model's pointwise mutual information. Another
    family (no keyword slot in its prompt to score a theme with): the shortlist's best, by the model's own
    input embeddings and the characters shared."""
    if lm.family.name != "couplet":
        return shortlist(lm, upper, lower, 1)[0]
    return _choose(lm, upper, lower)
