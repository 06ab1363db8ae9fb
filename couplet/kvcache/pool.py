"""A process-wide pool of immutable prompt KV blocks shared by all requests (vLLM automatic prefix caching).

A block holds `block_size` tokens of one sequence, for every layer, in a codec's format (full precision
for `shared`, quantized for `combo`). Its key is a hash chain: key_i = H(key_{i-1} || token ids of block i),
with key_{-1} = H(namespace), where the namespace names the model instance, dtype, device, codec and block
size — so a block key identifies the whole prefix up to and including that block, and blocks of different
formats never mix. Blocks are reference-counted by the requests using them; only unreferenced blocks are
evicted, least recently used first, to stay within `max_bytes`. A block is never mutated after insertion.
Thread-safe (one lock), since a serving engine may run requests on several threads.

A serving engine that admits a wave counting on its prompt's blocks being pooled takes a `Lease` first, as
vLLM's scheduler allocates a request's KV blocks when it admits it: the blocks present are referenced at
once, and room is set aside for the missing ones, which no other insertion can then take. The wave's own
insertions fill that room, and the lease pins those blocks too, until the engine ends it. A pin keeps a
block from eviction like a reference, but is no request: it takes no share of the block's bytes.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from couplet.kvcache.storage import storage_bytes


@dataclass(eq=False)
class Block:
    """One immutable block: `payload[layer]` is the codec's tuple for that layer, (kv_heads, block_size, ·)."""

    key: bytes
    payload: tuple[tuple, ...] = field(repr=False)
    nbytes: int
    refs: int = 0  # the requests using it (a request's share is nbytes / refs)
    pins: int = 0  # the leases holding it (`PrefixPool.lease`): kept from eviction, but no share of it


@dataclass(eq=False)
class Lease:
    """Blocks held for an admitted wave (`PrefixPool.lease`): those present, pinned; the missing ones' keys,
    with room set aside until they are inserted (then pinned too)."""

    blocks: list[Block] = field(default_factory=list)
    pending: set[bytes] = field(default_factory=set)


def chain_keys(namespace: str, tokens: Sequence[int], block_size: int) -> list[bytes]:
    """Keys of the full blocks of `tokens` (a trailing partial block has no key)."""
    parent = root_key(namespace)
    keys = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        ids = array("q", [int(t) for t in tokens[start:start + block_size]]).tobytes()
        parent = hashlib.blake2b(parent + ids, digest_size=16).digest()
        keys.append(parent)
    return keys


def root_key(namespace: str) -> bytes:
    return hashlib.blake2b(namespace.encode(), digest_size=16).digest()


class PrefixPool:
    """Ref-counted, LRU-evicted, byte-budgeted store of prompt KV blocks.

    `nbytes` is the real storage of every block held (each counted once, whoever uses it); a request's
    share of a block is `block.nbytes / block.refs`.
    """

    def __init__(self, max_bytes: int = 64 * 2**20) -> None:
        if max_bytes < 0:
            raise ValueError(f"max_bytes must be >= 0, got {max_bytes}")
        self.max_bytes = max_bytes
        self._blocks: dict[bytes, Block] = {}
        self._free: OrderedDict[bytes, None] = OrderedDict()  # unreferenced, least recently used first
        self._lock = threading.RLock()
        self._pending: dict[bytes, tuple[int, list[Lease]]] = {}  # leased room: key -> (bytes, its leases)
        self.leased = 0  # bytes set aside for the pending keys (inside max_bytes, not in nbytes)
        self.nbytes = 0
        self.hits = self.misses = self.evictions = self.rejected = 0

    def __len__(self) -> int:
        return len(self._blocks)

    def __contains__(self, key: bytes) -> bool:
        return key in self._blocks

    def total_refs(self) -> int:
        """References and lease pins still held: zero when no request is in flight."""
        with self._lock:
            return sum(b.refs + b.pins for b in self._blocks.values())

    def acquire_prefix(self, keys: Sequence[bytes]) -> list[Block]:
        """Reference the longest run of `keys` present from the start (a cache hit), atomically."""
        with self._lock:
            out = []
            for key in keys:
                block = self._blocks.get(key)
                if block is None:
                    break
                out.append(block)
            for block in out:
                self._ref(block)
            self.hits += len(out)
            self.misses += len(keys) - len(out)
            return out

    def reference(self, key: bytes) -> Block | None:
        """Reference one block by key if the pool holds it (no hit/miss counted: a lookup, not a prefix match)."""
        with self._lock:
            block = self._blocks.get(key)
            if block is not None:
                self._ref(block)
            return block

    def insert(self, key: bytes, payload: tuple[tuple, ...], tensors: list[torch.Tensor]) -> Block | None:
        """Add a block (or find the one already there) and reference it; None if the budget has no room
        even after evicting every unreferenced block (the caller then keeps its rows private). A leased key
        takes the room set aside for it, and its leases pin it."""
        with self._lock:
            block = self._blocks.get(key)
            if block is None:
                room, leases = self._pending.pop(key, (0, []))
                self.leased -= room
                for lease in leases:
                    lease.pending.discard(key)
                size = storage_bytes(tensors)
                if not self._make_room(size):  # a lease's room is only short if `block_bytes` was
                    self.rejected += 1
                    return None
                block = Block(key, payload, size)
                self._blocks[key] = block
                self.nbytes += size
                for lease in leases:
                    lease.blocks.append(block)
                    block.pins += 1
            self._ref(block)
            return block

    def lease(self, keys: Sequence[bytes], block_bytes: int) -> Lease | None:
        """Pin the blocks of `keys` the pool holds and set `block_bytes` aside for each missing one, if
        the budget allows it beside every referenced block and every lease; else None (nothing taken). Once
        granted, inserting those keys cannot be refused for room (`block_bytes` at least their real size)."""
        with self._lock:
            present = [self._blocks[k] for k in keys if k in self._blocks]
            missing = {k for k in keys if k not in self._blocks}
            new = [k for k in missing if k not in self._pending]
            held = sum(b.nbytes for b in self._blocks.values() if b.refs or b.pins) + \
                sum(b.nbytes for b in present if not (b.refs or b.pins))
            if held + self.leased + len(new) * block_bytes > self.max_bytes:
                return None
            lease = Lease(present, missing)
            for block in present:
                block.pins += 1
                self._free.pop(block.key, None)
            for k in missing:
                room, leases = self._pending.get(k, (block_bytes, []))
                self._pending[k] = (room, [*leases, lease])
            self.leased += len(new) * block_bytes
            return lease

    def end_lease(self, lease: Lease) -> None:
        """Drop the lease's pins and whatever room it still sets aside (idempotent)."""
        with self._lock:
            blocks, lease.blocks = lease.blocks, []
            for block in reversed(blocks):  # deepest first, as `release`
                block.pins -= 1
                self._unpinned(block)
            for k in lease.pending:
                room, leases = self._pending.get(k, (0, []))
                leases = [x for x in leases if x is not lease]
                if leases:
                    self._pending[k] = (room, leases)
                elif k in self._pending:
                    del self._pending[k]
                    self.leased -= room
            lease.pending = set()

    def release(self, blocks: Sequence[Block]) -> None:
        """Drop one reference from each block. Deepest blocks are released first so that they sit older in
        the LRU order than their parents: a chain is then evicted leaf first, never leaving orphans."""
        with self._lock:
            for block in reversed(blocks):
                if block.refs <= 0:
                    raise RuntimeError("prefix block released more often than acquired")
                block.refs -= 1
                self._unpinned(block)

    def clear(self) -> None:
        """Drop every unreferenced block."""
        with self._lock:
            while self._free:
                self._evict_one()

    def _unpinned(self, block: Block) -> None:
        """A block no request and no lease holds joins the LRU order, newest."""
        if block.refs == 0 and block.pins == 0:
            self._free[block.key] = None
            self._free.move_to_end(block.key)

    def _ref(self, block: Block) -> None:
        block.refs += 1
        self._free.pop(block.key, None)

    def _make_room(self, size: int) -> bool:
        """Evict unreferenced blocks until `size` more fits beside the blocks held and the room leased."""
        while self.nbytes + self.leased + size > self.max_bytes and self._free:
            self._evict_one()
        return self.nbytes + self.leased + size <= self.max_bytes

    def _evict_one(self) -> None:
        key, _ = self._free.popitem(last=False)
        block = self._blocks.pop(key)
        assert block.refs == 0 and block.pins == 0, "only unreferenced blocks are evicted"
        self.nbytes -= block.nbytes
        self.evictions += 1



_DEFAULT_POOL: PrefixPool | None = None
_DEFAULT_LOCK = threading.Lock()


def default_pool() -> PrefixPool:
    """The process-wide pool `shared`/`combo` sessions use when none is passed (64 MiB budget)."""
    global _DEFAULT_POOL
    with _DEFAULT_LOCK:
        if _DEFAULT_POOL is None:
            _DEFAULT_POOL = PrefixPool()
        return _DEFAULT_POOL
