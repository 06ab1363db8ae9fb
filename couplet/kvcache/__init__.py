"""KV-cache compression modes, implemented as transformers cache layers, with exact byte accounting.

    from couplet.kvcache import MODES, make_mode, PrefixPool, ModeSession, install_attention
    policy = make_mode("selective", ratio=0.5)   # a dataclass; invalid names/knobs raise ValueError
    install_attention(model)                     # optional: every new_session does it (idempotent)
    with policy.new_session(model, pool=None) as session:   # shared/combo: pool=None -> default_pool()
        logits = session.forward(input_ids)      # (batch, q) -> (batch, q, vocab); prefill, then 1 token/step
        session.protect([[2, 3, 9]])             # per row, logical positions to keep (selective/combo);
                                                 # couplet_protection(...) computes them for a couplet
        logits = session.forward(next_ids)       # (batch, 1)
        stats = session.stats()                  # couplet.events.KVStats
    policy.describe()  # "selective: ratio=0.5, sinks=0, recent=4, floor=4, decay=0.0, keep_prompt=False"

Modes (see `MODES`, `MODE_INFO`): full, window, selective, int8, int4, shared, combo. Storage (`storage.py`,
`quant.py`, `pool.py`) is apart from selection (`retention.py`); each mode is a small policy file.

Contract of `ModeSession.forward(input_ids, attention_mask=None)`:
- input_ids (batch, q) int; attention_mask None, (batch, q) or (batch, past + q) with 0 for LEFT padding.
- returns the logits (batch, q, vocab) of this forward (`shared` prefill on a pool hit, `combo` prefill
  always: only the positions computed, right-aligned — `logits[:, -1]` is always the next-token distribution).
- a lossy pool (`combo`) gives the same bits whatever it holds: missing prompt blocks are computed one by
  one against the pooled blocks before them, then the rest of the prompt runs as on a hit.
- positions are logical (tokens seen per row), whatever was evicted; eviction runs after the forward.
`stats()` -> KVStats(logical_length, stored_tokens, kv_bytes, shared_bytes, full_equivalent_bytes) summed
over the batch; `stats_per_row()` one per row; `breakdown()` adds bookkeeping and pool bytes.
"""

from couplet.kvcache.attention import ATTENTION_NAME, install_attention
from couplet.kvcache.base import Policy
from couplet.kvcache.combo import ComboPolicy
from couplet.kvcache.full import FullPolicy
from couplet.kvcache.pool import PrefixPool, default_pool
from couplet.kvcache.quantized import Int4Policy, Int8Policy, QuantizedPolicy
from couplet.kvcache.registry import MODE_INFO, MODES, ModeInfo, make_mode, option_names
from couplet.kvcache.selective import SelectivePolicy, couplet_protection
from couplet.kvcache.session import ModeSession
from couplet.kvcache.shared import SharedPolicy
from couplet.kvcache.window import WindowPolicy

__all__ = [
    "ATTENTION_NAME", "MODES", "MODE_INFO", "ComboPolicy", "FullPolicy", "Int4Policy", "Int8Policy", "ModeInfo",
    "ModeSession", "Policy", "PrefixPool", "QuantizedPolicy", "SelectivePolicy", "SharedPolicy", "WindowPolicy",
    "couplet_protection", "default_pool", "install_attention", "make_mode", "option_names",
]
