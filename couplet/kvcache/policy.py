"""A mode's configuration (`Policy`: a dataclass of knobs with a `compose()`) and the one factory that builds
the session for any composition (`build_session`). Above `base` (the parts) and `session` (the runtime), so
that neither imports the other's consumer."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, ClassVar

from couplet.kvcache.attention import install_attention
from couplet.kvcache.base import Composition
from couplet.kvcache.dense import FullCache
from couplet.kvcache.layer import CompressedCache, attention_layers
from couplet.kvcache.pool import PrefixPool
from couplet.kvcache.session import ModeSession


class Policy:
    """A mode's configuration. Subclasses are `@dataclass`es with a `name` and a `compose()`."""

    name: ClassVar[str]

    def compose(self) -> Composition:
        raise NotImplementedError

    def describe(self) -> str:
        """One-line summary of the knobs, for logs: `selective: ratio=0.5, sinks=0, recent=4, floor=4, …`."""
        knobs = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))  # type: ignore[arg-type]
        return f"{self.name}: {knobs}" if knobs else f"{self.name}: no knobs"

    def new_session(self, model: Any, pool: PrefixPool | None = None) -> ModeSession:
        return build_session(self.name, self.compose(), model, pool)


def build_session(name: str, parts: Composition, model: Any, pool: PrefixPool | None = None) -> ModeSession:
    """The session for any composition. Plain storage with nothing else is transformers' DynamicCache itself
    (the baseline every other mode is measured against); anything else is a `CompressedCache`."""
    install_attention(model)
    retention = parts.retention
    if parts.plain:
        return ModeSession(name, model, FullCache(config=model.config))
    cache = CompressedCache(attention_layers(model), parts.storage.make_store,
                            wants_scores=retention is not None and retention.uses_attention,
                            track_positions=retention is not None,
                            score_decay=1.0 if retention is None else retention.score_decay)
    sharing = None if parts.sharing is None else parts.sharing.sharing(model, pool, parts.storage.codec())
    if retention is not None and retention.merge:
        if sharing is not None:  # cascade attention over pool blocks has no merged slot
            raise ValueError("merge cannot be combined with a prefix pool")
        config = model.config.get_text_config()
        cache.merged_slots = config.num_attention_heads // cache.geometry.kv_heads  # one per query head
        for layer in cache.compressed:
            layer.merging = True
    return ModeSession(name, model, cache, retention=retention, sharing=sharing)
