"""Teacher-forced likelihoods: the held-out NLL of a lower line given its upper line, and batch scoring.

Used by training (validation), `couplet.bench.quality` (`nll_per_char`, `nll_delta`) and the 横批 chooser.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from couplet.models.tokenizer import FORMATS, FormatIds, couplet_ids, upper_start

CONTEXTS = ("retrieved", "random", "none")


@torch.no_grad()
def sequence_logprobs(model: PreTrainedModel, seqs: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """log p(token_t | tokens_<t) for every position t >= 1 of right-padded sequences.

    Returns (batch, max_len - 1) float32; entries past a sequence's end are meaningless (mask them).
    """
    width = max(len(s) for s in seqs)
    device = model.device
    inputs = torch.full((len(seqs), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros((len(seqs), width), dtype=torch.long, device=device)
    for row, s in enumerate(seqs):
        inputs[row, : len(s)] = torch.tensor(list(s), device=device)
        mask[row, : len(s)] = 1
    logits = model(input_ids=inputs, attention_mask=mask).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1)  # (batch, width-1, vocab)
    return logp.gather(-1, inputs[:, 1:, None]).squeeze(-1)


def lower_line_nll(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerBase,
    pairs: Sequence[tuple[str, str]],
    keywords: str = "",
    batch_size: int = 256,
    contexts: Sequence[Sequence[int]] | None = None,
) -> list[float]:
    """Per pair, the mean negative log-likelihood (nats per character) of `lower` given `upper`.

    The prompt is `<bos> context <Ln> keywords <sep> upper <mid>` (`contexts[i]` for pair i, none by
    default); only the lower line's characters are scored (not <eos>), so the figure is per character
    of 下联 as the foundation issue defines it.
    """
    f = FormatIds.of(tok)
    out: list[float] = []
    for start in range(0, len(pairs), batch_size):
        chunk = pairs[start : start + batch_size]
        ctxs = contexts[start : start + batch_size] if contexts is not None else [()] * len(chunk)
        seqs, spans = [], []
        for (upper, lower), ctx in zip(chunk, ctxs, strict=True):
            seqs.append(couplet_ids(tok, keywords, upper, lower, ctx))
            lower_start = upper_start(keywords, len(ctx)) + len(upper) + 1  # past <mid>
            spans.append((lower_start, lower_start + len(lower)))
        logp = sequence_logprobs(model, seqs, f.pad)
        for row, (a, b) in enumerate(spans):
            # logp[:, t-1] scores token t
            out.append(-logp[row, a - 1 : b - 1].mean().item())
    return out


def context_nll(model: PreTrainedModel, tok: PreTrainedTokenizerBase, pairs: Sequence[tuple[str, str]],
                how: str, seed: int = 0, batch_size: int = 32) -> float:
    """Mean NLL per character of 下联 given 上联 after a context (`CONTEXTS`):

    - `retrieved`: the house prefix and the exemplars retrieved by the 上联 (as 对下联 prompts), never the
      pair itself;
    - `random`: the house prefix and as many random exemplars of the same line length (same total length);
    - `none`: no context at all (the one-couplet format).
    """
    from couplet.writing.exemplars import DEFAULT_K, load_store  # the store is only needed here
    from couplet.writing.prompt import exemplar_ids, house_ids

    if how not in CONTEXTS:
        raise ValueError(f"unknown context {how!r}; choose from {CONTEXTS}")
    store = load_store()
    contexts: list[list[int]] = []
    for i, (upper, lower) in enumerate(pairs):
        if how == "none":
            contexts.append([])
            continue
        ex = store.retrieve(upper, len(upper), DEFAULT_K, exclude=(upper, lower)) if how == "retrieved" \
            else store.random(len(upper), DEFAULT_K, seed * 100_003 + i)
        contexts.append(house_ids(tok) + exemplar_ids(tok, ex))
    return sum(lower_line_nll(model, tok, pairs, batch_size=batch_size, contexts=contexts)) / len(pairs)


def joint_nll(model: PreTrainedModel, tok: PreTrainedTokenizerBase, pairs: Sequence[tuple[str, str]],
              fmt: str = "lines", batch_size: int = 256) -> float:
    """Mean NLL per character of the whole couplet, both lines, without keywords: -log p(上联, 下联) / 2n.

    Both training formats factor the same joint probability (in a different order), so this is the figure
    that compares them at equal compute; `<mid>` and `<eos>` are left out (the interleaved format has no
    `<mid>`)."""
    if fmt not in FORMATS:
        raise ValueError(f"unknown format {fmt!r}; choose from {tuple(FORMATS)}")
    f, build = FormatIds.of(tok), FORMATS[fmt]
    first = upper_start("")  # the first character; logp[:, t-1] scores token t
    total, chars = 0.0, 0
    for start in range(0, len(pairs), batch_size):
        seqs = [build(tok, "", u, lo) for u, lo in pairs[start : start + batch_size]]
        logp = sequence_logprobs(model, seqs, f.pad)
        for row, seq in enumerate(seqs):
            for t in range(first, len(seq) - 1):  # up to, not including, <eos>
                if seq[t] != f.mid:
                    total -= logp[row, t - 1].item()
                    chars += 1
    return total / chars
