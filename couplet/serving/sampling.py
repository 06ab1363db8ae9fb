"""Choosing a character from the logits: greedy, or temperature / top-p with Gumbel noise seeded by (seed,
step) alone, so every mode sees the same noise and a difference between modes is the cache's doing."""

from __future__ import annotations

import torch

from couplet.serving.request import CoupletRequest


def step_noise(seed: int, step: int, vocab_size: int) -> torch.Tensor:
    """Gumbel noise that depends only on (seed, step): identical across modes and devices."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    uniform = torch.rand(vocab_size, generator=gen).clamp_(1e-10, 1 - 1e-10)
    return -torch.log(-torch.log(uniform))


def decision_scores(logits: torch.Tensor, allowed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """What a character is chosen by: (vocab,) logits plus the voice `bias`, -inf outside `allowed` (bool)."""
    scores = logits.float().cpu()
    if bias is not None:
        scores = scores + bias
    return scores.masked_fill(~allowed, float("-inf"))


def greedy_decision(scores: torch.Tensor) -> tuple[int, float]:
    """The greedy pick among `decision_scores` — argmax, as `sample` takes it: of exactly tied scores (common in
    bf16) the first, where topk's order is unspecified — and its margin over the runner-up (0 for a tie, inf
    when it is the only allowed one)."""
    top = scores.topk(2).values
    return int(scores.argmax()), float(top[0] - top[1])


def sample(logits: torch.Tensor, allowed: torch.Tensor, request: CoupletRequest, step: int,
           bias: torch.Tensor | None = None) -> int:
    """Pick one token id from (vocab,) logits plus the voice `bias`, restricted to `allowed` (bool, vocab)."""
    scores = decision_scores(logits, allowed, bias)
    if request.temperature == 0.0:
        return int(scores.argmax())
    scores = scores / request.temperature
    if request.top_p < 1.0:
        probs = torch.softmax(scores, dim=-1)
        sorted_p, order = probs.sort(descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least the best token)
        drop = sorted_p.cumsum(0) - sorted_p >= request.top_p
        scores[order[drop]] = float("-inf")
    return int((scores + step_noise(request.seed, step, scores.numel())).argmax())
