"""`ModeSession`: one request (or one left-padded batch of requests) decoding under one mode.

The generation loop calls `forward` for the prefill and then once per new token. The session owns what
the model must not get wrong after compression:
- logical positions: each row's next position is the number of real tokens it has seen, passed as
  explicit `position_ids` (rotary and learned absolute positions alike), whatever is stored;
- the 2-D attention mask, one flag per stored slot (see `layer.py`), so padding, filler and the columns
  evicted are masked by transformers' own mask builder;
- the prefix pool (first forward of `shared`/`combo`): matched blocks are referenced instead of recomputed,
  new full blocks are published and referenced. With a lossy codec (`combo`'s int4/int8 blocks) a missing
  block is first computed on its own against the blocks before it as the pool holds them, then published,
  and the rest of the prompt runs against the pooled prefix: on a miss, a partial or a full hit alike, so
  results do not depend on the pool's state (bit for bit; see `_complete_chain`);
- attention recording and eviction after each forward (a token is evicted only after attention used it).

Zero device->host syncs per step when no attention mask is passed (batch 1); with a mask, one.
"""

from __future__ import annotations

import itertools
import weakref
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from couplet.events import KVStats
from couplet.kvcache.attention import Recording, recording
from couplet.kvcache.layer import CompressedCache, CompressedLayer, FullCache
from couplet.kvcache.pool import Block, PrefixPool, chain_keys
from couplet.kvcache.retention import Retention, keep_counts, plan
from couplet.kvcache.storage import BlockCodec, PlainStore


@dataclass
class Sharing:
    """How a session uses the prefix pool: blocks of `block_size` tokens in `codec`'s format."""

    pool: PrefixPool
    block_size: int
    codec: BlockCodec
    namespace: str


_MODEL_IDS = itertools.count()


def model_namespace(model: Any, codec: BlockCodec, block_size: int) -> str:
    """Pool namespace: this model instance (a process-unique id stamped on it), dtype, device, format."""
    uid = getattr(model, "_couplet_kv_uid", None)
    if uid is None:
        uid = f"{type(model).__name__}-{next(_MODEL_IDS)}"
        model._couplet_kv_uid = uid
    p = next(model.parameters())
    return f"{uid}|{p.dtype}|{p.device}|{codec.name}|bs{block_size}"


class ModeSession:
    """Per-request cache state under one mode. See the package docstring for the contract."""

    def __init__(self, mode: str, model: Any, cache: CompressedCache | FullCache, *,
                 retention: Retention | None = None, sharing: Sharing | None = None) -> None:
        self.mode, self.model, self.cache = mode, model, cache
        self.retention, self.sharing = retention, sharing
        self.records = isinstance(cache, CompressedCache) and cache.meta.wants_scores
        self.device = next(model.parameters()).device
        self.batch = 0
        self.steps = 0
        self.seen: list[int] = []  # real tokens per row (the next logical position)
        self.prompt_len: list[int] = []  # real tokens per row in the first forward (the prompt)
        self.valid: list[list[bool]] = []  # per row, per owned slot: holds a real token
        self.blocks: list[list[Block]] = []  # per row, the pool blocks referenced, in chain order
        self.protected: list[list[int]] = []
        self.expected: list[int | None] = []  # per row, the final logical length if the caller said
        self._prompts: list[list[int]] = []  # shared/combo: each row's real prompt tokens
        self._keys: list[list[bytes]] = []  # and the chain keys of its full blocks
        self._loaded_pos: list[list[int]] = []  # and the positions of pool blocks it holds as owned slots
        self._head: torch.Tensor | None = None  # retention: (batch,) forced-position bound, see `_evict`
        self._closed = False
        self._finalizer: weakref.finalize | None = None

    # ---- public API ----
    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Feed (batch, q) token ids; return the logits (batch, q', vocab) of this forward.

        `attention_mask` (batch, q) — or HF-style (batch, past + q), whose last q columns are used — marks
        real tokens (1) and left padding (0); None means all real. q' == q, except on the first call of
        `shared` when the pool already holds part of the prompt, and of `combo` always (its prompt's whole
        blocks always come from the pool): only the positions actually computed are returned, right-aligned,
        so `logits[:, -1]` is always each row's next-token distribution.
        """
        if self._closed:
            raise RuntimeError("session is closed")
        b, q = input_ids.shape
        if not self.batch:
            self.batch = b
            self.seen, self.valid = [0] * b, [[] for _ in range(b)]
            self.blocks = [[] for _ in range(b)]
            if len(self.protected) != b:  # protect() may come before the first forward
                if self.protected:
                    raise ValueError(f"protect() got {len(self.protected)} rows, the batch has {b}")
                self.protected = [[] for _ in range(b)]
        elif b != self.batch:
            raise ValueError(f"batch size changed from {self.batch} to {b} within a session")
        flags = self._new_flags(attention_mask, b, q)
        first = self.steps == 0
        if first and self.sharing is not None:
            input_ids, flags = self._attach_prefix(input_ids, flags)
            q = input_ids.shape[1]
        positions = []
        for row in range(b):
            p, out = self.seen[row], []
            for real in flags[row] if flags is not None else [True] * q:
                out.append(p if real else -1)
                p += real
            positions.append(out)
        pos = torch.tensor(positions, dtype=torch.int32, device=self.device)  # (batch, q), -1 = padding
        valid_t = None if flags is None else torch.tensor(flags, dtype=torch.bool, device=self.device)
        self.cache.begin(pos, valid_t)
        if first and self.sharing is not None:
            for layer in self._layers:
                layer.keep_fresh = True
        rec = Recording(self.cache.layers, valid_t) if self.records else None
        with recording(rec):
            out = self.model(input_ids=input_ids.to(self.device), attention_mask=self._mask_2d(flags, q),
                             position_ids=pos.clamp(min=0).long(), cache=self.cache, use_cache=True)
        self.cache.flush()
        for row in range(b):
            new = flags[row] if flags is not None else [True] * q
            self.seen[row] += sum(new)
            self.valid[row].extend(new)
        if first:
            self.prompt_len = list(self.seen)
        if first and self.sharing is not None:
            self._publish_prefix(positions)
        if self.retention is not None:
            self._evict()
        self.steps += 1
        return out.logits

    def protect(self, positions: Sequence[Iterable[int]]) -> None:
        """Logical positions to keep, one iterable per batch row (selective/combo; others ignore it).
        In force from the next eviction until the next call (`protect([[]])` clears)."""
        if self.batch and len(positions) != self.batch:
            raise ValueError(f"protect() needs one iterable per batch row ({self.batch}), got {len(positions)}")
        self.protected = [sorted({int(p) for p in row}) for row in positions]

    def expect(self, lengths: Sequence[int | None]) -> None:
        """Each row's whole logical length at the end of the request (prompt + everything to be fed).
        Retention modes then cap the cache at `ratio` of it instead of shrinking from the first step."""
        if self.batch and len(lengths) != self.batch:
            raise ValueError(f"expect() needs one length per batch row ({self.batch}), got {len(lengths)}")
        self.expected = list(lengths)

    def stats(self) -> KVStats:
        """Totals over the session's rows (for batch 1: the request). `kv_bytes` counts every tensor held,
        padding and filler slots included; `shared_bytes` is this session's share of its pool blocks."""
        kv = self.cache.kv_nbytes() if self.batch else 0  # walks every layer's tensors: once per call
        rows = self._row_stats(kv)
        return KVStats(
            logical_length=sum(r.logical_length for r in rows),
            stored_tokens=sum(r.stored_tokens for r in rows),
            kv_bytes=kv,
            shared_bytes=sum(r.shared_bytes for r in rows),
            full_equivalent_bytes=sum(r.full_equivalent_bytes for r in rows),
        )

    def stats_per_row(self) -> list[KVStats]:
        """One `KVStats` per batch row; a row's `kv_bytes` is its slice of the batched tensors (total / batch)."""
        return self._row_stats(self.cache.kv_nbytes() if self.batch else 0)

    def _row_stats(self, kv_total: int) -> list[KVStats]:
        if not self.batch:
            return [KVStats(0, 0, 0, 0, 0)]
        kv, tok = kv_total // self.batch, self.cache.token_bytes()
        prefix = self._prefix_len()
        return [KVStats(logical_length=self.seen[r], stored_tokens=prefix + sum(self.valid[r]), kv_bytes=kv,
                        shared_bytes=round(sum(blk.nbytes / blk.refs for blk in self.blocks[r] if blk.refs)),
                        full_equivalent_bytes=tok * self.seen[r]) for r in range(self.batch)]

    def breakdown(self) -> dict[str, int]:
        """Bytes by kind: `kv` (keys, values, scales, zero points, residual), `meta` (slot positions and
        scores, bookkeeping outside `kv_bytes`), `shared` (this session's pool share), `pool` (whole pool)."""
        return {"kv": self.cache.kv_nbytes() if self.batch else 0, "meta": self.cache.meta_nbytes(),
                "shared": self.stats().shared_bytes, "pool": self.sharing.pool.nbytes if self.sharing else 0}

    def close(self) -> None:
        """Release pool references (idempotent). Also done by `with` and, as a last resort, by GC."""
        if self._finalizer is not None:
            self._finalizer()
        self._closed = True

    def __enter__(self) -> ModeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ----
    @property
    def _layers(self) -> list[CompressedLayer]:
        """The compressed layers (sharing and retention only exist with a CompressedCache)."""
        assert isinstance(self.cache, CompressedCache)
        return self.cache.compressed

    def _prefix_len(self) -> int:
        return self.cache.compressed[0].prefix_len if isinstance(self.cache, CompressedCache) else 0

    def _new_flags(self, attention_mask: torch.Tensor | None, b: int, q: int) -> list[list[bool]] | None:
        if attention_mask is None:
            return None
        if attention_mask.shape[0] != b or attention_mask.shape[-1] < q:
            raise ValueError(f"attention_mask {tuple(attention_mask.shape)} does not cover input ({b}, {q})")
        flags = attention_mask[:, -q:].bool().tolist()
        return None if all(all(row) for row in flags) else flags

    def _mask_2d(self, flags: list[list[bool]] | None, q: int) -> torch.Tensor | None:
        """(batch, logical + q) mask: zeros for columns no longer stored, then one flag per stored slot (prefix,
        owned), then the new tokens; None when every slot and new token is real."""
        # Everything real: no mask at all. transformers then builds the causal mask from get_mask_sizes(),
        # which is right after eviction too (every stored slot is in the past of every new query).
        if flags is None and all(all(v) for v in self.valid):
            return None
        logical, stored = self.cache.get_seq_length(), self.cache.stored_length
        prefix = self._prefix_len()
        rows = [[False] * (logical - stored) + [True] * prefix + self.valid[r] + (flags[r] if flags else [True] * q)
                for r in range(self.batch)]
        return torch.tensor(rows, dtype=torch.long, device=self.device)

    def _attach_prefix(self, input_ids: torch.Tensor,
                       flags: list[list[bool]] | None) -> tuple[torch.Tensor, list[list[bool]] | None]:
        """Reference the longest prefix of whole blocks every row finds in the pool; feed only the rest.

        Lossy codec: first complete each row's chain of blocks in the pool (`_complete_chain`), so that every
        row's whole blocks come from the pool whatever it held, and the rows whose chain goes beyond the common
        prefix hold those blocks as private slots (`_load_private`): each row computes only its last, partial
        (or last whole) block, exactly as on a warm pool."""
        assert self.sharing is not None
        sh, b = self.sharing, self.batch
        ids = input_ids.tolist()
        real = flags if flags is not None else [[True] * len(row) for row in ids]
        self._prompts = [[t for t, keep in zip(ids[r], real[r], strict=True) if keep] for r in range(b)]
        self._keys = [chain_keys(sh.namespace, p, sh.block_size) for p in self._prompts]
        self._loaded_pos = [[] for _ in range(b)]
        self._arm_finalizer()  # from here on, self.blocks' rows are released whatever happens
        # Leave at least one token to compute: its logits are the first next-token distribution.
        attach = [(len(prompt) - 1) // sh.block_size for prompt in self._prompts]
        chains: list[list[tuple]] = []  # lossy: per row, every whole block's payload (pooled or private)
        for r in range(b):
            self.blocks[r].extend(sh.pool.acquire_prefix(self._keys[r][: attach[r]]))
            if not sh.codec.lossless:
                chains.append(self._complete_chain(r))
        common = min(min(len(blocks), n) for blocks, n in zip(self.blocks, attach, strict=True))
        extra = [chain[common:n] for chain, n in zip(chains, attach, strict=True)] if chains else []
        for row in self.blocks:
            sh.pool.release(row[common:])
            del row[common:]  # in place: the finalizer holds these lists
        m = common * sh.block_size
        if m:
            self._set_prefix(m)
            for layer in self._layers:
                layer.cumulative_length = m
        self.seen = [m] * b
        if any(extra):
            self._load_private(extra, m)
        elif m == 0:
            return input_ids, flags
        rest = [p[n:] for p, n in zip(self._prompts, self.seen, strict=True)]
        width = max(len(r) for r in rest)
        new_ids = torch.tensor([[0] * (width - len(r)) + r for r in rest], dtype=input_ids.dtype)
        new_flags = [[False] * (width - len(r)) + [True] * len(r) for r in rest]
        return new_ids, (None if all(all(f) for f in new_flags) else new_flags)

    def _complete_chain(self, r: int) -> list[tuple]:
        """Lossy codec: make sure row `r`'s every whole prompt block is in the pool, computing the missing ones
        canonically (`_compute_block`), and return the payloads of all of them in chain order. Blocks the pool
        holds or takes are referenced in `self.blocks[r]`; once the pool refuses one (byte budget), it and the
        blocks after it stay private to the request (same payloads, just not shared).

        Why: with a lossy codec a block's keys/values depend on whether the tokens before it were attended at
        full precision (computed in the same forward) or dequantized (taken from the pool). Computing every
        block one at a time against its predecessors as the pool stores them makes the pool's content, and
        then each request's results, independent of what the pool held before — cold, warm, or a partial match
        (a single extra forward over all the missing blocks would not: the pool's blocks would then depend on
        where the last hit ended). Costs one forward of `block_size` tokens per block computed (misses only)."""
        assert self.sharing is not None
        sh, bs = self.sharing, self.sharing.block_size
        keys, prompt = self._keys[r], self._prompts[r]
        chain = [blk.payload for blk in self.blocks[r]]
        pooled = True  # the chain is still unbroken in the pool
        for j in range(len(chain), len(keys)):
            block = sh.pool.reference(keys[j]) if pooled else None
            if block is None:
                tokens = prompt[j * bs:(j + 1) * bs]
                payload = self._compute_block(tokens, chain)
                if pooled:
                    tensors = [t for p in payload for t in sh.codec.tensors(p)]
                    block = sh.pool.insert(keys[j], keys[j - 1] if j else b"", tuple(tokens), payload, tensors)
                    pooled = block is not None
            if block is not None:
                self.blocks[r].append(block)
                payload = block.payload  # another request may have inserted it first: the same values
            chain.append(payload)
        return chain

    def _compute_block(self, tokens: list[int], chain: list[tuple]) -> tuple:
        """One block's payload (per layer): `tokens` fed alone (batch 1) at logical positions len(chain) *
        block_size onwards, attending to the blocks before it decoded from `chain` — exactly the forward a
        request computes after a pool hit on those blocks, so both give the same bits."""
        assert self.sharing is not None
        sh = self.sharing
        start = len(chain) * sh.block_size
        scratch = CompressedCache(len(self._layers), PlainStore, track_positions=False)
        for i, layer in enumerate(scratch.compressed):
            if chain:
                layer.set_prefix([[payload[i] for payload in chain]], sh.codec, start)
            layer.cumulative_length = start
            layer.keep_fresh = True
        pos = torch.arange(start, start + len(tokens), dtype=torch.int32, device=self.device)[None]
        scratch.begin(pos, None)
        decoder = getattr(self.model, "base_model", self.model)  # the keys/values only: no LM head
        with recording(None):
            decoder(input_ids=torch.tensor([tokens], device=self.device), attention_mask=None,
                    position_ids=pos.long(), cache=scratch, use_cache=True)
        fresh = [layer.fresh for layer in scratch.compressed]
        return tuple(sh.codec.encode(kv[0][0], kv[1][0]) for kv in fresh if kv is not None)

    def _load_private(self, extra: list[list[tuple]], m: int) -> None:
        """Rows whose whole blocks go beyond the common prefix `m` hold them as owned slots, in the store's own
        format (nothing re-quantized), right-aligned after filler; positions m, m + 1, ... per row."""
        assert self.sharing is not None and isinstance(self.cache, CompressedCache)
        sh, n_layers = self.sharing, len(self._layers)
        counts = [len(e) * sh.block_size for e in extra]
        width = max(counts)
        self._loaded_pos = [[-1] * (width - c) + list(range(m, m + c)) for c in counts]
        rows = [sh.codec.batch([[payload[i] for payload in e] for e in extra], width) for i in range(n_layers)]
        heads = sh.codec.tensors(next(e for e in extra if e)[0][0])[0].shape[-3]  # (…, kv_heads, tokens, ·)
        self.cache.load(rows, torch.tensor(self._loaded_pos, dtype=torch.int32, device=self.device), heads)
        self.valid = [[False] * (width - c) + [True] * c for c in counts]
        self.seen = [m + c for c in counts]

    def _set_prefix(self, m: int) -> None:
        assert self.sharing is not None
        for i, layer in enumerate(self._layers):
            layer.set_prefix([[blk.payload[i] for blk in row] for row in self.blocks], self.sharing.codec, m)

    def _publish_prefix(self, positions: list[list[int]]) -> None:
        """Reference the blocks every row has in the pool — lossless codec: inserting this prompt's new full
        blocks from the prefill's raw keys/values; lossy: only blocks `_complete_chain` put there, so the pool
        never holds a block computed any other way —, drop those tokens from the owned slots, and seal the rest
        of the prompt."""
        assert self.sharing is not None
        sh, b, layers = self.sharing, self.batch, self._layers
        m = self._prefix_len()
        fresh = [layer.fresh for layer in layers]  # each (batch, kv_heads, q, head_dim) keys, values
        got = []
        for r in range(b):
            slot_of = {p: s for s, p in enumerate(positions[r]) if p >= 0}  # logical position -> fresh slot
            for i in range(len(self.blocks[r]), len(self._keys[r])):
                if not sh.codec.lossless:
                    block = sh.pool.reference(self._keys[r][i])
                else:
                    start = slot_of[i * sh.block_size]
                    end = start + sh.block_size
                    payload = tuple(sh.codec.encode(k[r, :, start:end], v[r, :, start:end])
                                    for k, v in (kv for kv in fresh if kv is not None))
                    tensors = [t for p in payload for t in sh.codec.tensors(p)]
                    parent = self._keys[r][i - 1] if i else b""
                    tokens = tuple(self._prompts[r][i * sh.block_size:(i + 1) * sh.block_size])
                    block = sh.pool.insert(self._keys[r][i], parent, tokens, payload, tensors)
                if block is None:
                    break
                self.blocks[r].append(block)
            got.append(len(self.blocks[r]))
        for layer in layers:
            layer.fresh = None
            layer.keep_fresh = False
        common = min(got)
        for r in range(b):
            sh.pool.release(self.blocks[r][common:])
            del self.blocks[r][common:]
        m2 = common * sh.block_size
        if m2 != m:
            heads = next(kv for kv in fresh if kv is not None)[0].shape[1]
            self._relayout([self._loaded_pos[r] + positions[r] for r in range(b)], m2, heads)
        for layer in layers:  # the prompt is kept in the pool's format wherever it lives (residual: generation)
            layer.store.seal()

    def _relayout(self, positions: list[list[int]], m2: int, heads: int) -> None:
        """Owned slots become [filler, tokens at positions >= m2 in order] per row; [0, m2) is now the prefix.
        `positions`: per row, the logical position of every owned slot now (-1: padding, filler).
        (Slot order is free: every stored slot precedes every new query, and the mask is per slot.)"""
        b, layers = self.batch, self._layers
        keep = [[s for s, p in enumerate(positions[r]) if p >= m2] for r in range(b)]
        width = max(len(k) for k in keep)
        index = torch.tensor([[0] * (width - len(k)) + k for k in keep], dtype=torch.long, device=self.device)
        filler = torch.tensor([[True] * (width - len(k)) + [False] * len(k) for k in keep], dtype=torch.bool,
                              device=self.device)
        assert isinstance(self.cache, CompressedCache)
        self.cache.evict(index[None, :, None, :].expand(len(layers), b, heads, width), filler, tail_pinned=False)
        self.valid = [[False] * (width - len(k)) + [True] * len(k) for k in keep]
        self._set_prefix(m2)

    def _arm_finalizer(self) -> None:
        if self._finalizer is None and self.sharing is not None:
            self._finalizer = weakref.finalize(self, _release_all, self.sharing.pool, self.blocks)

    def _evict(self) -> None:
        """Shrink every row to its budget, the same way in every layer (equal physical lengths)."""
        assert self.retention is not None
        layers = self._layers
        tail = layers[0].store.n_tail
        owned = len(self.valid[0])
        cand_valid = [sum(v[: owned - tail]) for v in self.valid]
        tail_valid = [sum(v[owned - tail:]) for v in self.valid]
        keep = keep_counts(self.retention, self.seen, self.prompt_len, self._prefix_len(), cand_valid, tail_valid,
                           self.expected or None)
        if all(k >= cv for k, cv in zip(keep, cand_valid, strict=True)):
            return
        seen = torch.tensor(self.seen, device=self.device)
        r = self.retention
        if self._head is None:  # positions below it are forced: fixed once the prompt is known
            self._head = torch.tensor([max(r.sinks, p if r.keep_prompt else 0) for p in self.prompt_len],
                                      device=self.device)
        head = self._head
        prot = None
        if any(self.protected):
            width = max(len(p) for p in self.protected)
            prot = torch.tensor([p + [-2] * (width - len(p)) for p in self.protected], device=self.device)
        assert isinstance(self.cache, CompressedCache)
        meta = self.cache.meta
        assert meta.pos is not None
        index, filler = plan(meta.pos, meta.score, tail, r, keep, seen, head, prot)
        self.cache.evict(index, filler, tail_pinned=True)
        width = max(keep)
        self.valid = [[True] * k + [False] * (width - k) + v[owned - tail:]
                      for k, v in zip(keep, self.valid, strict=True)]


def _release_all(pool: PrefixPool, blocks: list[list[Block]]) -> None:
    for row in blocks:
        pool.release(row)
        row.clear()
