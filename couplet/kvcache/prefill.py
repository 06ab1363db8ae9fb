"""The bounded prefill of a retention mode: a long prompt fed in chunks, evicted to its budget after each.

Split from `session.py` (the session's one-forward path and its state stay there); this is the prefill's other
path, taken when `base.prefill_chunk` says the policy streams its prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from couplet.kvcache.retention import Retention, evict

if TYPE_CHECKING:
    from couplet.kvcache.session import ModeSession


def bounded_prefill(session: ModeSession, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                    logits_to_keep: int, retention: Retention, chunk: int) -> torch.Tensor:
    """The bounded prefill (`base.prefill_chunk`): each row's prompt fed in pieces, the row evicted to its budget
    after each, so it never holds more than its budget plus one chunk (StreamingLLM's and H2O's streaming
    prefill): its first forward takes its budget plus a chunk (no more than it holds later, in fewer forwards:
    ~7 instead of 13 for a 415-token prompt at 32), the later ones `chunk` tokens each. The chunks' own queries
    score what the early evictions keep (attention recorded as in a decode step); the last chunk's eviction
    is scored as a whole prompt's is, by the pseudo decode queries when the policy looks ahead (`_look_ahead`).
    Later chunks attend only to what earlier ones kept, so the prompt's keys and values differ from a one-shot
    prefill's: the quality cost is measured in docs/results/kv-modes.md.

    Chunks are cut per row, from the row's first real token, so a row of a batch is cut where it would be
    alone (its couplet is the one it writes alone): a shorter prompt has fewer chunks and starts later, with
    forwards of padding only (masked) before, and every row's last chunk is fed in the last forward,
    left-padded, so that `logits[:, -1]` is each row's next-token distribution. Returns those logits."""
    q = input_ids.shape[1]
    flags = [[True] * q] * len(session.rows) if attention_mask is None else attention_mask[:, -q:].bool().tolist()
    prompts = [[t for t, real in zip(row, f, strict=True) if real] for row, f in zip(input_ids.tolist(), flags,
                                                                                    strict=True)]
    # Each row's cuts: its first forward fills the bound — what one eviction keeps plus a chunk — and the rest
    # go a chunk at a time. The row holds no more than with 32-token chunks from the start, in fewer forwards.
    cuts = []
    for p, row in zip(prompts, session.rows, strict=True):
        first = retention.budget(len(p), row.expected) + chunk
        cuts.append([0, *range(min(first, len(p)), len(p), chunk), len(p)])
    n_chunks = [len(c) - 1 for c in cuts]
    total = max(n_chunks)
    pad = int(input_ids[0, 0])  # any id: padding is masked
    fed = [0] * len(session.rows)
    logits = input_ids.new_empty(0)
    for j in range(total):
        pieces = [p[c[k]:c[k + 1]] if (k := j - total + n) >= 0 else []
                  for p, c, n in zip(prompts, cuts, n_chunks, strict=True)]
        width = max(len(piece) for piece in pieces)
        ids = torch.tensor([[pad] * (width - len(piece)) + piece for piece in pieces], device=input_ids.device)
        mask = torch.tensor([[0] * (width - len(piece)) + [1] * len(piece) for piece in pieces],
                            device=input_ids.device)
        last = j == total - 1
        logits = session._feed(ids, mask, logits_to_keep if last else 1, j == 0, retention, prompt=True,
                            prompt_end=last)
        fed = [n + row.fed for n, row in zip(fed, session.rows, strict=True)]
        ahead = session._look_ahead(retention, logits) if last else None
        evict(retention, session._compressed, session.rows, session.cache.prefix_len, ahead)
    for row, n in zip(session.rows, fed, strict=True):
        row.fed = n  # the whole prompt was this forward's (what the step record counts as computed)
    return logits
