"""KV-cache compression modes, built inside transformers' cache API, with exact byte accounting.

    from couplet.kvcache import MODE_INFO, make_mode, parse_modes, PrefixPool
    policy = make_mode("selective", ratio=0.5)   # a dataclass; invalid names/knobs raise ValueError
    with policy.new_session(model, pool=None) as session:   # shared/combo: pool=None -> default_pool()
        session.expect([total])                  # optional: each row's whole length (fixed retention cap)
        logits = session.forward(input_ids)      # (batch, q) -> (batch, q, vocab); prefill, then 1 token/step
        session.protect([[2, 3, 9]])             # per row, logical positions to keep (retention modes)
        logits = session.forward(next_ids)       # (batch, 1)
        stats = session.stats()                  # couplet.events.KVStats
    policy.describe()  # "selective: ratio=0.5, sinks=0, recent=8, floor=4, decay=0.5, keep_prompt=False"

A mode is a `Policy` (`policy.py`) composed of parts (`base.py`): a storage format (`storage.py`,
`quant_store.py`, `codec.py`: full precision, int8, int4) × a retention policy (`retention.py`; `window.py`,
`selective.py`, `snapkv.py`: knobs and one `score`) × a sharing policy (`shared.py`; the pool protocol in
`pool_protocol.py`, the pool in `pool.py`). One factory, `build_session` (`policy.py`), makes the session
(`session.py`) for any composition; `combo` is one. `options.py` parses `--set MODE.FIELD=VALUE` for the CLI
and the benchmarks. The modes and everything known about them (label, colour, budget knob and sweep, byte
target): `registry.py`.

Contract of `ModeSession.forward(input_ids, attention_mask=None)`:
- input_ids (batch, q) int; attention_mask None, (batch, q) or (batch, past + q) with 0 for LEFT padding.
- returns the logits (batch, q, vocab) of this forward (`shared` prefill on a pool hit, `combo` prefill
  always: only the positions computed, right-aligned; a bounded prefill, `window` and `selective` by default:
  its last chunk's — `logits[:, -1]` is always the next-token distribution).
- a bounded prefill feeds the prompt `chunk` tokens per forward and evicts after each (`base.prefill_chunk`).
- a lossy pool (`combo`) gives the same bits whatever it holds: missing prompt blocks are computed one by
  one against the pooled blocks before them, then the rest of the prompt runs as on a hit.
- positions are logical (tokens seen per row), whatever was evicted; eviction runs after each forward.
`stats()` -> KVStats(logical_length, stored_tokens, kv_bytes, shared_bytes, full_equivalent_bytes) summed
over the batch; `stats_per_row()` one per row.
"""

from couplet.kvcache.attention import ATTENTION_NAME, install_attention, recording_sdpa_attention
from couplet.kvcache.base import Composition
from couplet.kvcache.layer import KVGeometry
from couplet.kvcache.options import parse_settings
from couplet.kvcache.policy import Policy, build_session
from couplet.kvcache.pool import Block, Lease, PrefixPool, chain_keys, default_pool
from couplet.kvcache.pool_protocol import model_namespace
from couplet.kvcache.registry import MODE_INFO, MODES, ModeInfo, make_mode, option_names, parse_modes
from couplet.kvcache.retention import Retention, ScoreView
from couplet.kvcache.session import ModeSession

__all__ = [
    "ATTENTION_NAME", "MODES", "MODE_INFO", "Block", "Composition", "KVGeometry", "Lease", "ModeInfo", "ModeSession",
    "Policy", "PrefixPool", "Retention", "ScoreView", "build_session", "chain_keys", "default_pool",
    "install_attention", "make_mode", "model_namespace", "option_names", "parse_modes", "parse_settings",
    "recording_sdpa_attention",
]
