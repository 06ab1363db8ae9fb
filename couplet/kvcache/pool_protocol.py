"""The prefix-pool protocol of a session, in two calls: `attach` (the first forward's prompt: reference the
blocks the pool holds, feed only the rest) and `publish` (after that forward: reference the prompt's whole
blocks in the pool). As vLLM's automatic prefix caching and SGLang's RadixAttention: blocks of `block_size`
tokens keyed by a hash chain (`pool.py`), immutable, reference-counted.

Every block the pool holds is computed one way, whatever the codec: against the blocks before it as the pool
stores them (`_complete_chains`), then published; the rest of the prompt then runs against the pooled prefix —
on a miss, a partial or a full hit alike. So results do not depend on the pool's state, up to float rounding
(~1e-7 and the same greedy tokens: a run of blocks computed in one forward, or a wave's rows computed in one
batched forward, sum in another order than a block computed alone; bit for bit where the same forward computed
them). A lossy codec (`combo`'s int8/int4 blocks) needs this: a block's keys/values would otherwise depend on
whether the tokens before it were attended at full precision (the same forward) or dequantized (from the
pool). It computes a run of missing blocks in one forward all the same: each block's queries attend to the
run's earlier blocks encoded and decoded as the pool will store them, and to their own block at full precision
(`attention.with_requantized_run`), which is what computing the block alone after the earlier ones were pooled
gives. A lossless codec (`shared`) gains too: a wave's rows compute each distinct missing block once, where a
prefill of whole prompts would compute the house prefix once per row.
"""

from __future__ import annotations

import itertools
import weakref
from typing import TYPE_CHECKING, Any

import torch

from couplet.kvcache.attention import Recording, recording
from couplet.kvcache.blocks import BlockCodec
from couplet.kvcache.layer import CompressedCache
from couplet.kvcache.pool import Block, PrefixPool, chain_keys
from couplet.kvcache.storage import PlainStore

if TYPE_CHECKING:
    from couplet.kvcache.session import ModeSession

_MODEL_IDS = itertools.count()
# A lossy pool computes at most this many missing blocks of a chain per forward: its scratch holds them at full
# precision until they are encoded, and what a request reserves counts them (`Composition.owned_peak_bytes`),
# as vLLM's chunked prefill bounds a step's activations.
LOSSY_RUN_BLOCKS = 8
Flags = list[list[bool]] | None  # per row, per new token: real (True) or left padding; None = all real


def model_namespace(model: Any, codec: BlockCodec, block_size: int) -> str:
    """Pool namespace: this model instance (a process-unique id stamped on it), dtype, device, format."""
    uid = getattr(model, "_couplet_kv_uid", None)
    if uid is None:
        uid = f"{type(model).__name__}-{next(_MODEL_IDS)}"
        model._couplet_kv_uid = uid
    p = next(model.parameters())
    return f"{uid}|{p.dtype}|{p.device}|{codec.name}|bs{block_size}"


class Sharing:
    """One session's use of the prefix pool: blocks of `block_size` tokens in `codec`'s format."""

    def __init__(self, pool: PrefixPool, block_size: int, codec: BlockCodec, namespace: str) -> None:
        self.pool, self.block_size, self.codec, self.namespace = pool, block_size, codec, namespace
        self.blocks: list[list[Block]] = []  # per row, the pool blocks referenced, in chain order
        self._prompts: list[list[int]] = []  # per row, the real prompt tokens
        self._keys: list[list[bytes]] = []  # and the chain keys of its whole blocks
        self._loaded: list[list[int]] = []  # and the positions of pool blocks it holds as owned slots
        self._finalizer: weakref.finalize | None = None

    def shared_bytes(self, row: int) -> int:
        """This row's share of the pool blocks it references."""
        return round(sum(blk.nbytes / blk.refs for blk in self.blocks[row] if blk.refs)) if self.blocks else 0

    def referenced(self) -> list[Block]:
        """The distinct pool blocks its rows reference (rows of one prompt reference the same ones)."""
        return list({id(b): b for row in self.blocks for b in row}.values())

    # ---- the two calls ----
    def attach(self, s: ModeSession, input_ids: torch.Tensor, flags: Flags) -> tuple[torch.Tensor, Flags]:
        """Reference the longest prefix of whole blocks every row finds in the pool; return what is left to feed.

        First complete each row's chain of blocks in the pool, so that every row's whole blocks come from the
        pool whatever it held; rows whose chain goes beyond the common prefix hold those blocks as private slots
        (`_load_private`): each row computes only its last, partial (or last whole) block, exactly as on a warm
        pool."""
        b, bs = s.batch, self.block_size
        ids = input_ids.tolist()
        real = flags if flags is not None else [[True] * len(row) for row in ids]
        self._prompts = [[t for t, keep in zip(ids[r], real[r], strict=True) if keep] for r in range(b)]
        self._keys = [chain_keys(self.namespace, p, bs) for p in self._prompts]
        self._loaded = [[] for _ in range(b)]
        self.blocks = [[] for _ in range(b)]
        self._finalizer = weakref.finalize(s, _release_all, self.pool, self.blocks)  # released whatever happens
        # Leave at least one token to compute: its logits are the first next-token distribution.
        attach = [(len(prompt) - 1) // bs for prompt in self._prompts]
        for r in range(b):
            self.blocks[r].extend(self.pool.acquire_prefix(self._keys[r][: attach[r]]))
        chains = self._complete_chains(s)  # per row, every whole block's payload (pooled or private)
        common = min(min(len(blocks), n) for blocks, n in zip(self.blocks, attach, strict=True))
        extra = [chain[common:n] for chain, n in zip(chains, attach, strict=True)]
        self._keep_common(common)
        m = common * bs
        if m:
            self._set_prefix(self._cache(s), m)
            self._cache(s).meta.columns = m
        for row in s.rows:
            row.seen = m
        if any(extra):
            self._load_private(s, extra, m)
        elif m == 0:
            return input_ids, flags
        rest = [p[row.seen:] for p, row in zip(self._prompts, s.rows, strict=True)]
        width = max(len(r) for r in rest)
        new_ids = torch.tensor([[0] * (width - len(r)) + r for r in rest], dtype=input_ids.dtype)
        new_flags = [[False] * (width - len(r)) + [True] * len(r) for r in rest]
        return new_ids, (None if all(all(f) for f in new_flags) else new_flags)

    def publish(self, s: ModeSession, positions: list[list[int]]) -> None:
        """After the first forward: reference the blocks every row has in the pool (only blocks
        `_complete_chains` put there: the pool never holds a block computed any other way), drop those tokens
        from the owned slots, and seal the rest of the prompt (the prompt is kept in the pool's format wherever
        it lives)."""
        cache, bs = self._cache(s), self.block_size
        got = []
        for r in range(s.batch):
            for j in range(len(self.blocks[r]), len(self._keys[r])):
                block = self.pool.reference(self._keys[r][j])
                if block is None:
                    break
                self.blocks[r].append(block)
            got.append(len(self.blocks[r]))
        common = min(got)
        self._keep_common(common)
        if common * bs != cache.prefix_len:
            self._relayout(s, [self._loaded[r] + positions[r] for r in range(s.batch)], common * bs)
        for layer in cache.compressed:
            layer.store.seal()

    def release(self) -> None:
        """Drop every reference (idempotent); also done, as a last resort, when the session is collected."""
        if self._finalizer is not None:
            self._finalizer()

    # ---- a running batch's rows (`ModeSession.join`, `drop`) ----
    def can_join(self, s: ModeSession, other: ModeSession) -> bool:
        """Whether `other`'s rows (with their own `Sharing` of the same pool and format) can join `s`'s batch."""
        theirs = other.sharing
        return (theirs is not None and theirs.pool is self.pool and theirs.namespace == self.namespace
                and self._cache(s).can_append(self._cache(other), prefix=False))

    def join(self, s: ModeSession, other: ModeSession) -> None:
        """Before `s`'s cache takes `other`'s rows: both batches keep the shorter prefix of the two, the rows of the
        longer holding the blocks beyond it as their own slots, in the store's format (nothing re-quantized: the
        same keys and values, so the same attention), and their references to those blocks released — the state
        a wave's rows are in after the blocks they do not all share (`attach`). Then `other`'s references become
        `s`'s (its own finalizer is left nothing to release)."""
        theirs = other.sharing
        assert theirs is not None
        m = min(self._cache(s).prefix_len, self._cache(other).prefix_len)
        for sharing, session in ((self, s), (theirs, other)):
            sharing._demote(session, m)
        self.blocks.extend(theirs.blocks)  # in place: this session's finalizer holds this list
        theirs.blocks.clear()
        self._prompts += theirs._prompts
        self._keys += theirs._keys
        self._loaded += theirs._loaded

    def keep_rows(self, keep: list[int]) -> None:
        """Only these rows stay (`ModeSession.drop`): the others' references are released."""
        kept = set(keep)
        for r, row in enumerate(self.blocks):
            if r not in kept:
                self.pool.release(row)
        self.blocks[:] = [self.blocks[r] for r in keep]  # in place: the finalizer holds this list
        self._prompts = [self._prompts[r] for r in keep]
        self._keys = [self._keys[r] for r in keep]
        self._loaded = [self._loaded[r] for r in keep]

    def _demote(self, s: ModeSession, m: int) -> None:
        """The batch's prefix shortened to `m` tokens (whole blocks): every row's blocks beyond it become its own
        slots (before those it holds, at their logical positions), and their references are released."""
        cache, bs = self._cache(s), self.block_size
        n = cache.prefix_len - m
        if n <= 0:
            return
        extra = [row[m // bs:] for row in self.blocks]
        cache.prepend([self.codec.batch([[blk.payload[i] for blk in row] for row in extra], n)
                       for i in range(len(cache.compressed))],
                      torch.arange(m, m + n, dtype=torch.int32, device=s.device).expand(s.batch, n))
        for row in s.rows:
            row.valid[:0] = [True] * n
        self._loaded = [list(range(m, m + n)) + loaded for loaded in self._loaded]
        self._keep_common(m // bs)
        self._set_prefix(cache, m)

    # ---- internals ----
    @staticmethod
    def _cache(s: ModeSession) -> CompressedCache:
        assert isinstance(s.cache, CompressedCache), "sharing needs a CompressedCache"
        return s.cache

    def _insert(self, r: int, j: int, payload: tuple) -> Block | None:
        tensors = [t for p in payload for t in self.codec.tensors(p)]
        return self.pool.insert(self._keys[r][j], payload, tensors)

    def _keep_common(self, common: int) -> None:
        """Every row references the same number of blocks (one prefix length for the batch)."""
        for row in self.blocks:
            self.pool.release(row[common:])
            del row[common:]  # in place: the finalizer holds these lists

    def _complete_chains(self, s: ModeSession) -> list[list[tuple]]:
        """Make sure every row's every whole prompt block is in the pool, computing the missing ones
        (`_compute_blocks`), and return each row's payloads of all of them in chain order. Once the pool
        refuses one of a row's blocks (byte budget), it and the blocks after it stay private to the request
        (same payloads).

        The rows advance together from the shallowest missing block: at depth j every row still short of its
        chain either finds block j in the pool or needs it computed. Rows needing the same key have the same
        prefix, hence the same payload: each distinct key is computed once, and all of them in one batched
        forward, each with the run of blocks its rows have in common from there (up to where they diverge; for
        a lossy codec at most LOSSY_RUN_BLOCKS, whose later blocks attend to the earlier ones as the pool
        stores them: `_compute_blocks`). A cold wave costs a few forwards of many tokens, not one small forward
        per depth: on a cold burst, block-by-block completion was most of the time of the wave (`shared`), and
        `combo`'s prefill of a prompt with cold exemplars took 114 ms alone, 45 ms in runs of 8 (one thread)."""
        bs = self.block_size
        chains = [[blk.payload for blk in row] for row in self.blocks]
        pooled = [True] * len(chains)  # per row: its chain is still unbroken in the pool
        while todo := [r for r, chain in enumerate(chains) if len(chain) < len(self._keys[r])]:
            j = min(len(chains[r]) for r in todo)
            need: dict[bytes, list[int]] = {}  # key → the rows whose block j it is and the pool lacks
            for r in (r for r in todo if len(chains[r]) == j):
                block = self.pool.reference(self._keys[r][j]) if pooled[r] else None
                if block is not None:
                    self.blocks[r].append(block)
                    chains[r].append(block.payload)
                else:
                    need.setdefault(self._keys[r][j], []).append(r)
            if not need:
                continue
            runs = [self._common_run(rows, j) for rows in need.values()]  # blocks j .. j + run - 1 per key
            firsts = [rows[0] for rows in need.values()]
            payloads = self._compute_blocks(
                s, [self._prompts[r][j * bs:(j + n) * bs] for r, n in zip(firsts, runs, strict=True)],
                [chains[r] for r in firsts])
            for rows, run in zip(need.values(), payloads, strict=True):
                s.rows[rows[0]].pooled_computed += len(run) * bs  # computed once, for the first row needing it
                for r in rows:
                    for i, payload in enumerate(run):
                        block = self._insert(r, j + i, payload) if pooled[r] else None
                        pooled[r] = block is not None
                        if block is not None:
                            self.blocks[r].append(block)
                            # another row of this wave, or a session on another thread, inserted it first:
                            # its values, equal to ours up to rounding (a lossy run's later blocks attended to
                            # ours: the same up to rounding as after a pool hit)
                            payload = block.payload
                        chains[r].append(payload)
        return chains

    def _common_run(self, rows: list[int], j: int) -> int:
        """How many blocks from depth j the `rows` (the same key at j) compute together: as long as they still
        have the same key (the same prefix)."""
        end = min(len(self._keys[r]) for r in rows)
        if not self.codec.lossless:
            end = min(end, j + LOSSY_RUN_BLOCKS)
        n = 1
        while j + n < end and len({self._keys[r][j + n] for r in rows}) == 1:
            n += 1
        return n

    def _compute_blocks(self, s: ModeSession, tokens: list[list[int]], chains: list[list[tuple]]) -> list[list[tuple]]:
        """Runs of whole blocks, one per row of one batched forward: row i's `tokens[i]` (a multiple of
        `block_size`) at logical positions len(chains[i]) * block_size onwards (every chain has the same
        length), attending to the blocks before it decoded from `chains[i]` — exactly the forward a request
        computes after a pool hit on those blocks (a lossy codec's run: each block's, as if computed alone after
        the run's earlier blocks were pooled). Returns per row its blocks' payloads (each per layer).
        Shorter rows are right-padded: causal attention keeps the padding out of every real token's keys and
        values, and its own are dropped."""
        bs, start = self.block_size, len(chains[0]) * self.block_size
        width = max(len(t) for t in tokens)
        scratch = CompressedCache(self._cache(s).geometry, PlainStore, track_positions=False)
        if start:
            for i, layer in enumerate(scratch.compressed):
                layer.set_prefix([[payload[i] for payload in chain] for chain in chains], self.codec, start)
        scratch.meta.columns = start
        pos = torch.arange(start, start + width, dtype=torch.int32, device=s.device)
        pos = pos[None].expand(len(tokens), -1).contiguous()
        scratch.begin(pos, None)
        lossy_run = not self.codec.lossless and width > bs
        for layer in scratch.compressed:  # later blocks of the run attend to earlier ones as the pool stores them
            layer.requantized_run = (self.codec, bs) if lossy_run else None
        decoder = getattr(s.model, "base_model", s.model)  # the keys/values only: no LM head
        ids = [t + t[-1:] * (width - len(t)) for t in tokens]
        with recording(Recording(list(scratch.compressed), None, scores=False) if lossy_run else None):
            decoder(input_ids=torch.tensor(ids, device=s.device), attention_mask=None,
                    position_ids=pos.long(), cache=scratch, use_cache=True)
        if lossy_run and any(layer.requantized_run is not None for layer in scratch.compressed):
            raise RuntimeError("a layer's attention did not take the requantized run (not couplet_kv_sdpa?): its "
                               "blocks would be computed against full-precision keys")
        own = [kv for kv in (layer.store.kv() for layer in scratch.compressed) if kv is not None]
        return [[tuple(self.codec.encode(k[r, :, a:a + bs], v[r, :, a:a + bs]) for k, v in own)
                 for a in range(0, len(t), bs)] for r, t in enumerate(tokens)]

    def _load_private(self, s: ModeSession, extra: list[list[tuple]], m: int) -> None:
        """Rows whose whole blocks go beyond the common prefix `m` hold them as owned slots, in the store's own
        format (nothing re-quantized), right-aligned after filler; positions m, m + 1, ... per row."""
        cache, bs = self._cache(s), self.block_size
        counts = [len(e) * bs for e in extra]
        width = max(counts)
        self._loaded = [[-1] * (width - c) + list(range(m, m + c)) for c in counts]
        rows = [self.codec.batch([[payload[i] for payload in e] for e in extra], width)
                for i in range(len(cache.compressed))]
        cache.load(rows, torch.tensor(self._loaded, dtype=torch.int32, device=s.device))
        for row, c in zip(s.rows, counts, strict=True):
            row.valid = [False] * (width - c) + [True] * c
            row.seen = m + c

    def _set_prefix(self, cache: CompressedCache, m: int) -> None:
        for i, layer in enumerate(cache.compressed):
            layer.set_prefix([[blk.payload[i] for blk in row] for row in self.blocks], self.codec, m)

    def _relayout(self, s: ModeSession, positions: list[list[int]], m2: int) -> None:
        """Owned slots become [filler, tokens at positions >= m2 in order] per row; [0, m2) is now the prefix.
        `positions`: per row, the logical position of every owned slot now (-1: padding, filler).
        (Slot order is free: every stored slot precedes every new query, and the mask is per slot.)"""
        cache = self._cache(s)
        keep = [[i for i, p in enumerate(positions[r]) if p >= m2] for r in range(s.batch)]
        width = max(len(k) for k in keep)
        index = torch.tensor([[0] * (width - len(k)) + k for k in keep], dtype=torch.long, device=s.device)
        layers, heads = cache.geometry.layers, cache.geometry.kv_heads
        cache.evict(index[None, :, None, :].expand(layers, s.batch, heads, width), keep_residual=False)
        for row, k in zip(s.rows, keep, strict=True):
            row.valid = [False] * (width - len(k)) + [True] * len(k)
        self._set_prefix(cache, m2)


def _release_all(pool: PrefixPool, blocks: list[list[Block]]) -> None:
    for row in blocks:
        pool.release(row)
        row.clear()
