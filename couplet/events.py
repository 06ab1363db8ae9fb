"""Plain dataclasses that flow back up from generation: per-step records and finished couplets.

The UI, the CLI's JSON, the benchmark and the evaluation harness all consume these; nothing here
knows about tensors or Gradio.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class KVStats:
    """What one request's cache holds right now.

    `kv_bytes` is the sum of the real tensors' storage the request owns (keys, values, scales, zero
    points, residual buffers); `shared_bytes` is its share of pooled prefix blocks (pool bytes divided
    by the number of requests referencing them); `full_equivalent_bytes` is what the uncompressed cache
    would hold at the same dtype for the same logical length.
    """

    logical_length: int
    stored_tokens: int
    kv_bytes: int
    shared_bytes: int
    full_equivalent_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.kv_bytes + self.shared_bytes


@dataclass(frozen=True)
class StepRecord:
    """One decoding step of one mode (step 0 is the prefill)."""

    mode: str
    step: int
    token: str  # the character chosen at this step ("" for the prefill, "|" for the line break)
    logical_length: int
    stored_tokens: int
    kv_bytes: int
    shared_bytes: int
    full_equivalent_bytes: int
    device_allocated: int | None  # torch.cuda.memory_allocated(); None on CPU (no made-up VRAM)
    device_peak: int | None  # torch.cuda.max_memory_allocated(); None on CPU
    seconds: float  # wall time of this step
    computed_tokens: int = 0  # tokens this step's forward computed (the prefill: the prompt less pool hits)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def peak_owned_bytes(steps: Iterable[StepRecord]) -> int:
    """The most KV a request held on its own over its steps (its share of pooled prefix blocks left out)."""
    return max((s.kv_bytes for s in steps), default=0)


@dataclass
class CoupletResult:
    """A finished couplet for one mode, with its checks and per-step accounting."""

    keywords: str
    upper: str
    lower: str
    hengpi: str
    mode: str
    checks: dict[str, Any]
    steps: list[StepRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    exemplars: list[list[str]] = field(default_factory=list)  # [上联, 下联] pairs the prompt showed (参考古联)
    # best-of-N (`couplet.serving.best_of`): every draft with its scores, the chosen one first; empty otherwise
    candidates: list[dict[str, Any]] = field(default_factory=list)
    # log p of each character the model chose, under its own distribution (what best-of-N ranks by; not in JSON)
    logprobs: list[float] = field(default_factory=list)

    @property
    def peak_bytes(self) -> int:
        return max((s.kv_bytes + s.shared_bytes for s in self.steps), default=0)

    @property
    def peak_owned_bytes(self) -> int:
        """The most KV this request held on its own (its share of pooled prefix blocks left out)."""
        return peak_owned_bytes(self.steps)

    @property
    def peak_shared_bytes(self) -> int:
        """The most pooled prefix bytes it referenced (stored once for every request that shares them)."""
        return max((s.shared_bytes for s in self.steps), default=0)

    @property
    def full_equivalent_bytes(self) -> int:
        return max((s.full_equivalent_bytes for s in self.steps), default=0)

    def to_json(self, with_steps: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "keywords": self.keywords, "upper": self.upper, "lower": self.lower, "hengpi": self.hengpi,
            "mode": self.mode, "checks": self.checks, "notes": self.notes,
            "kv": {"peak_bytes": self.peak_bytes, "full_equivalent_bytes": self.full_equivalent_bytes},
            "seconds": round(self.seconds, 4), "exemplars": self.exemplars,
        }
        if self.candidates:
            out["candidates"] = self.candidates
        if with_steps:
            out["steps"] = [s.to_json() for s in self.steps]
        return out
