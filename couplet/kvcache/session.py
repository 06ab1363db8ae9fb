"""`ModeSession`: one request (or one left-padded batch of requests) decoding under one mode.

The generation loop calls `forward` for the prefill and then once per new token. A forward reads as a
story: logical positions → attention mask → the model (recording attention when retention scores by it) →
publish the prompt's blocks to the prefix pool (first forward of `shared`/`combo`, `pool_protocol.py`) → evict
(`retention.py`). The session keeps what the model must not get wrong after compression:
- logical positions: each row's next position is the number of real tokens it has seen, passed as
  explicit `position_ids` (rotary and learned absolute positions alike), whatever is stored;
- the 2-D attention mask, one flag per stored slot (see `layer.py`), so padding, filler and the columns
  evicted are masked by transformers' own mask builder;
- per row, once (`RowState`): tokens seen, the prompt length, which owned slots hold a real token, the
  positions to protect and the expected length. A token is evicted only after attention used it.

Zero device->host syncs per step when no attention mask is passed (batch 1); with a mask, one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch

from couplet.events import KVStats
from couplet.kvcache.attention import Recording, recording
from couplet.kvcache.base import lookahead_tokens, prefill_chunk
from couplet.kvcache.dense import FullCache
from couplet.kvcache.layer import CompressedCache
from couplet.kvcache.pool_protocol import Flags, Sharing
from couplet.kvcache.prefill import bounded_prefill
from couplet.kvcache.retention import Retention, RowState, evict


class ModeSession:
    """Per-request cache state under one mode. See the package docstring for the contract."""

    def __init__(self, mode: str, model: Any, cache: CompressedCache | FullCache, *,
                 retention: Retention | None = None, sharing: Sharing | None = None) -> None:
        self.mode, self.model, self.cache = mode, model, cache
        self.retention, self.sharing = retention, sharing
        self.device = next(model.parameters()).device
        self.rows: list[RowState] = []
        self.steps = 0
        self._pending: list[RowState] = []  # protect()/expect() before the first forward
        self._closed = False
        # An encoder–decoder model (T5): the encoder's outputs and mask, and the cross-attention cache. The
        # mode compresses the decoder's self-attention only; the cross-attention keys and values are
        # computed once from the encoder, kept at full precision and never evicted.
        self.encoder: tuple[Any, torch.Tensor | None] | None = None
        self.cross: Any = None

    @property
    def batch(self) -> int:
        return len(self.rows)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                logits_to_keep: int = 0) -> torch.Tensor:
        """Feed (batch, q) token ids; return the logits (batch, q', vocab) of this forward.

        `logits_to_keep` k > 0: only the last k positions' logits (transformers' own argument of its causal
        LMs; an encoder–decoder's decoder ignores it). Generation needs only the last one, and a prefill's
        full (batch, prompt, vocab) logits are the largest activation of the forward: ~93 MB in bf16 for a
        wave of 16 prompts of 415 tokens — more than the wave's whole KV cache.

        `attention_mask` (batch, q) — or HF-style (batch, past + q), whose last q columns are used — marks
        real tokens (1) and left padding (0); None means all real. q' == q, except on the first call of
        `shared` and `combo` (a prompt's whole blocks always come from the pool, computed there first on a
        miss): only the positions actually computed are returned, right-aligned, so `logits[:, -1]` is always
        each row's next-token distribution.
        """
        if self._closed:
            raise RuntimeError("session is closed")
        b, q = input_ids.shape
        first = self.steps == 0
        if first:
            if self._pending and len(self._pending) != b:
                raise ValueError(f"protect()/expect() got {len(self._pending)} rows, the batch has {b}")
            self.rows = self._pending or [RowState() for _ in range(b)]
            if isinstance(self.cache, CompressedCache):  # a lone row has nothing to share: the plain SDPA path
                self.cache.meta.cascade = b > 1  # a batch attends its rows' common prefix once
        elif b != self.batch:
            raise ValueError(f"batch size changed from {self.batch} to {b} within a session")
        retention = self.retention if self.retention is not None and (first or not self.retention.prefill_only) \
            else None  # SnapKV-like policies act on the prompt only
        chunk = prefill_chunk(retention, self.sharing is not None) if first else 0
        if chunk and q > chunk:
            assert retention is not None
            logits = bounded_prefill(self, input_ids, attention_mask, logits_to_keep, retention, chunk)
        else:
            logits = self._feed(input_ids, attention_mask, logits_to_keep, first, retention)
            if retention is not None:
                ahead = self._look_ahead(retention, logits) if first else None
                evict(retention, self._compressed, self.rows, self.cache.prefix_len, ahead)
        self.steps += 1
        return logits

    def _feed(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, logits_to_keep: int, first: bool,
              retention: Retention | None, prompt: bool | None = None, prompt_end: bool = True) -> torch.Tensor:
        """One forward through the model: positions, mask, recording, and the pool's blocks; no eviction.
        `first`: the session's first forward; `prompt` (default: `first`): it feeds prompt tokens, and
        `prompt_end`: the prompt's last (a bounded prefill feeds it in several)."""
        prompt = first if prompt is None else prompt
        b, q = input_ids.shape
        flags = self._new_flags(attention_mask, b, q)
        if first and self.sharing is not None:
            input_ids, flags = self.sharing.attach(self, input_ids, flags)
            q = input_ids.shape[1]
        positions = self._positions(flags, q)  # per row, per new token; -1 = padding
        pos = torch.tensor(positions, dtype=torch.int32, device=self.device)
        valid_t = None if flags is None else torch.tensor(flags, dtype=torch.bool, device=self.device)
        self.cache.begin(pos, valid_t)
        mask = self._mask_2d(flags, q)
        # the prompt's own attention is not recorded when pseudo decode queries will score it (`_look_ahead`)
        real = [sum(f) for f in flags] if flags is not None else [q] * b  # real tokens per row
        whole = [row.seen + n for row, n in zip(self.rows, real, strict=True)]  # the prompt so far, with these
        scored = None if prompt and prompt_end and self._looks_ahead(retention, whole) else retention
        with recording(self._recording(scored, positions, valid_t)):
            if self.encoder is None:
                out = self.model(input_ids=input_ids.to(self.device), attention_mask=mask,
                                 position_ids=pos.clamp(min=0).long(), cache=self.cache, use_cache=True,
                                 logits_to_keep=logits_to_keep)
            else:  # the decoder's own positions come from the cache (relative bias in T5)
                from transformers.cache_utils import DynamicCache, EncoderDecoderCache

                if self.cross is None:
                    self.cross = DynamicCache()
                enc, enc_mask = self.encoder
                out = self.model(encoder_outputs=enc, attention_mask=enc_mask,
                                 decoder_input_ids=input_ids.to(self.device), decoder_attention_mask=mask,
                                 cache=EncoderDecoderCache(self.cache, self.cross), use_cache=True)
        self.cache.flush()
        for row, new in zip(self.rows, flags or [[True] * q] * b, strict=True):
            row.fed = sum(new)
            row.seen += row.fed
            row.valid.extend(new)
            if prompt:
                row.prompt = row.seen
        if first and self.sharing is not None:
            self.sharing.publish(self, positions)
        return out.logits

    def _looks_ahead(self, retention: Retention | None, prompt: Sequence[int]) -> bool:
        """Whether pseudo decode queries score this prompt (`_look_ahead`) — `prompt` real tokens per row: the
        policy looks ahead and some row is over its budget. Asked before the prefill (whether to record the
        prompt's own attention) and after it (whether to look ahead), with the same answer."""
        if retention is None or not lookahead_tokens(retention, self.sharing is not None):
            return False
        return any(retention.budget(n, row.expected) < n for n, row in zip(prompt, self.rows, strict=True))

    def _look_ahead(self, retention: Retention, logits: torch.Tensor) -> torch.Tensor | None:
        """The prompt's scores for its eviction, from `retention.lookahead` pseudo decode queries (LAQ, Lookahead
        Q-Cache, Wang et al. 2025, arXiv:2505.20334): before anything is evicted, feed each row its greedy next
        token (the raw model's argmax, no constraints) that many times with the whole prompt cached, record the
        attention those queries pay, then drop the pseudo tokens again. The prompt's own queries read the
        instructions and the exemplars; what the couplet's queries will read is better told by queries that are
        already writing it. Returns (layers, batch, kv_heads, slots) mean attention per pseudo query, aligned
        with the slots kept, or None when nothing of the prompt would be evicted (then it costs nothing).

        Memory: the whole prompt is held for `lookahead` more forwards, plus that many tokens — the prefill's own
        transient, a little longer (the peak a request keeps afterwards is unchanged). The prefill itself records
        no attention (`_feed`): the pseudo queries' sums become the prompt's scores, which later steps build on.
        Recording every prompt query's attention (q x q per head, outside SDPA) was most of `selective`'s prefill
        cost. The merge (`merge_evicted`) still weighs by the prompt's last query."""
        cache = self._compressed
        n, meta = retention.lookahead, cache.meta
        if not self._looks_ahead(retention, [r.seen for r in self.rows]) or meta.score is None \
                or cache.compressed[0].store.residual_len:
            return None  # no lookahead, or within budget: nothing to choose yet
        owned = len(self.rows[0].valid)
        decay, last = meta.decay, [(layer.last_query, layer.last_logits) for layer in cache.compressed]
        rows = [(r.seen, r.fed) for r in self.rows]
        meta.decay = 1.0  # the pseudo queries' attention, summed (the prompt's last forward recorded none: `_feed`)
        meta.score.zero_()  # a bounded prefill's earlier chunks recorded theirs: the pseudo queries alone decide
        ids = logits[:, -1:].argmax(-1)  # (batch, 1)
        for _ in range(n):
            ids = self._feed(ids, None, 1, False, retention)[:, -1:].argmax(-1)
        ahead = meta.score[..., :owned] / n
        index = torch.arange(owned, device=ahead.device).expand(*ahead.shape)  # drop the pseudo tokens' slots
        cache.evict(index, keep_residual=False)
        meta.columns -= n
        meta.decay = decay  # the pseudo queries' sums stay the prompt's scores, which later steps build on
        for layer, (query, logits_) in zip(cache.compressed, last, strict=True):
            layer.last_query, layer.last_logits = query, logits_
        for row, (seen, fed) in zip(self.rows, rows, strict=True):
            row.seen, row.fed = seen, fed
            del row.valid[owned:]
        return ahead

    def protect(self, positions: Sequence[Iterable[int]]) -> None:
        """Logical positions to keep, one iterable per batch row (retention modes; others ignore it).
        In force from the next eviction until the next call (`protect([[]])` clears)."""
        for row, p in zip(self._rows_for("protect", len(positions)), positions, strict=True):
            row.protected = sorted({int(x) for x in p})

    def expect(self, lengths: Sequence[int | None]) -> None:
        """Each row's whole logical length at the end of the request (prompt + everything to be fed).
        Retention modes then cap the cache at `ratio` of it instead of shrinking from the first step."""
        for row, n in zip(self._rows_for("expect", len(lengths)), lengths, strict=True):
            row.expected = n

    @property
    def joinable(self) -> bool:
        """Whether another session's rows can join this one's batch (`join`): a decoder-only model's cache, plain
        (no sliding layers) or compressed — whichever of the second's stores can follow (`can_join`)."""
        if self.encoder is not None or self._closed:
            return False
        return isinstance(self.cache, CompressedCache) or not self.cache.sliding

    def can_join(self, other: ModeSession) -> bool:
        """Whether `other`'s rows can join this batch now: both joinable and past their prefill, of one mode, with
        caches that append (a compressed one: stores of one format, quantized residuals of one length)."""
        if not (self.joinable and other.joinable and self.steps and other.steps and self.mode == other.mode):
            return False
        if isinstance(self.cache, FullCache) or isinstance(other.cache, FullCache):
            return isinstance(self.cache, FullCache) and isinstance(other.cache, FullCache)
        if self.sharing is not None and other.sharing is not None:
            return self.sharing.can_join(self, other)
        return self.cache.can_append(other.cache)

    def join(self, other: ModeSession) -> None:
        """Append `other`'s rows to this batch (continuous batching), both sessions past their prefill (`can_join`);
        `other` is spent. The narrower owned slots are left-padded to the wider's, the padding masked like a
        prefill's; each row's slots, positions, scores and merged slots are its own, so it decodes on as alone.
        With a prefix pool, the batch keeps the shorter prefix: the other rows hold the blocks beyond it as their
        own slots (`Sharing.join`), as a wave's rows do after the common prefix."""
        if not self.can_join(other):
            raise ValueError("these sessions cannot join (mode, cache format, or prefill not done)")
        if isinstance(self.cache, FullCache):
            assert isinstance(other.cache, FullCache)
            width = self.cache.append_rows(other.cache)
            other.cache.release()  # its rows live on in this batch: no second copy until the spent wave is gone
        else:
            assert isinstance(other.cache, CompressedCache)
            if self.sharing is not None and other.sharing is not None:
                self.sharing.join(self, other)
            width = self.cache.append_rows(other.cache, (self.batch, other.batch))
            self.cache.meta.cascade = True  # a batch of several rows attends its common prefix once
        for row in self.rows + other.rows:
            row.valid[:0] = [False] * (width - len(row.valid))
        self.rows += other.rows
        other.rows, other._closed = [], True

    def drop(self, keep: Sequence[int]) -> None:
        """Keep only these rows (the others finished), and trim the columns that are padding in every row kept
        (a joined batch's left padding does not outlive the rows that needed it); a pool's references of the
        rows that leave are released."""
        if not self.joinable:
            raise ValueError("rows leave a session whose rows can join only")
        rows = [self.rows[i] for i in keep]
        trim = min((row.valid.index(True) if True in row.valid else len(row.valid) for row in rows), default=0)
        index = torch.tensor(list(keep), dtype=torch.long, device=self.device)
        if isinstance(self.cache, FullCache):
            self.cache.keep_rows(index, trim)
        else:
            if self.cache.compressed[0].store.residual_len:  # the residual's slots are real: never trimmed
                trim = min(trim, len(rows[0].valid) - self.cache.compressed[0].store.residual_len)
            self.cache.keep_rows(index, trim)
            if self.sharing is not None:
                self.sharing.keep_rows(list(keep))
        for row in rows:
            del row.valid[:trim]
        self.rows = rows

    def set_encoder(self, outputs: Any, attention_mask: torch.Tensor | None) -> None:
        """Before the first forward of an encoder–decoder model: what its decoder attends to."""
        self.encoder = (outputs, attention_mask)

    def stats(self) -> KVStats:
        """Totals over the session's rows (for batch 1: the request). `kv_bytes` counts every tensor held,
        padding and filler slots included; `shared_bytes` is this session's share of its pool blocks."""
        kv = self.cache.kv_nbytes() if self.batch else 0  # walks every layer's tensors: once per call
        rows = self._row_stats(kv)
        return KVStats(logical_length=sum(r.logical_length for r in rows),
                       stored_tokens=sum(r.stored_tokens for r in rows), kv_bytes=kv,
                       shared_bytes=sum(r.shared_bytes for r in rows),
                       full_equivalent_bytes=sum(r.full_equivalent_bytes for r in rows))

    def stats_per_row(self) -> list[KVStats]:
        """One `KVStats` per batch row; a row's `kv_bytes` is its slice of the batched tensors (total / batch)."""
        return self._row_stats(self.cache.kv_nbytes() if self.batch else 0)

    def close(self) -> None:
        """Release pool references (idempotent). Also done by `with` and, as a last resort, by GC."""
        if self.sharing is not None:
            self.sharing.release()
        self._closed = True

    def __enter__(self) -> ModeSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ---- internals ----
    @property
    def _compressed(self) -> CompressedCache:
        assert isinstance(self.cache, CompressedCache), "retention and sharing need a CompressedCache"
        return self.cache

    def _rows_for(self, call: str, n: int) -> list[RowState]:
        """The rows a protect()/expect() call addresses: before the first forward, rows to come."""
        rows = self.rows or self._pending or [RowState() for _ in range(n)]
        if len(rows) != n:
            what = "length" if call == "expect" else "iterable"
            raise ValueError(f"{call}() needs one {what} per batch row ({len(rows)}), got {n}")
        if not self.rows:
            self._pending = rows
        return rows

    def _row_stats(self, kv_total: int) -> list[KVStats]:
        if not self.batch:
            return [KVStats(0, 0, 0, 0, 0)]
        kv, tok, prefix = kv_total // self.batch, self.cache.token_bytes(), self.cache.prefix_len
        return [KVStats(logical_length=row.seen, stored_tokens=prefix + sum(row.valid), kv_bytes=kv,
                        shared_bytes=self.sharing.shared_bytes(r) if self.sharing else 0,
                        full_equivalent_bytes=tok * row.seen) for r, row in enumerate(self.rows)]

    def _new_flags(self, attention_mask: torch.Tensor | None, b: int, q: int) -> Flags:
        if attention_mask is None:
            return None
        if attention_mask.shape[0] != b or attention_mask.shape[-1] < q:
            raise ValueError(f"attention_mask {tuple(attention_mask.shape)} does not cover input ({b}, {q})")
        flags = attention_mask[:, -q:].bool().tolist()
        return None if all(all(row) for row in flags) else flags

    def _positions(self, flags: Flags, q: int) -> list[list[int]]:
        out = []
        for r, row in enumerate(self.rows):
            p, line = row.seen, []
            for real in flags[r] if flags is not None else [True] * q:
                line.append(p if real else -1)
                p += real
            out.append(line)
        return out

    def _recording(self, retention: Retention | None, positions: list[list[int]],
                   valid: torch.Tensor | None) -> Recording | None:
        """What the attention function needs: the layers (a batch attends its rows' common prefix once, see
        `CompressedLayer.cascading`) and, when the retention scores by attention, which queries' attention to
        record — with `observe`, only each row's last `observe` real queries."""
        if not isinstance(self.cache, CompressedCache):
            return None
        scores = retention is not None and retention.uses_attention
        n = retention.observe if retention is not None else None
        observe = None
        if scores and n is not None and any(len(p) > n for p in positions):
            last = [max(p, default=-1) + 1 - n for p in positions]
            flags = [[x >= 0 and x >= lo for x in p] for p, lo in zip(positions, last, strict=True)]
            valid = torch.tensor(flags, dtype=torch.bool, device=self.device)
            if not any(any(row[:-n]) for row in flags):  # all within the last n columns (left padding)
                observe = n
        return Recording(self.cache.compressed, valid, scores, observe)

    def _mask_2d(self, flags: Flags, q: int) -> torch.Tensor | None:
        """(batch, logical + q) mask: zeros for columns no longer stored, then one flag per stored slot (prefix,
        owned), then the new tokens; None when every slot and new token is real."""
        # Everything real: no mask at all. transformers then builds the causal mask from get_mask_sizes(),
        # which is right after eviction too (every stored slot is in the past of every new query).
        if flags is None and all(all(row.valid) for row in self.rows):
            return None
        logical, stored, prefix = self.cache.get_seq_length(), self.cache.stored_length, self.cache.prefix_len
        rows = [[False] * (logical - stored) + [True] * prefix + row.valid + (flags[r] if flags else [True] * q)
                for r, row in enumerate(self.rows)]
        return torch.tensor(rows, dtype=torch.long, device=self.device)
