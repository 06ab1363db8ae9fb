"""The base of every mode policy: a small dataclass whose fields are its knobs, validated at construction."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, ClassVar

from couplet.kvcache.pool import PrefixPool
from couplet.kvcache.session import ModeSession


class Policy:
    """A compression mode's configuration. Subclasses are `@dataclass`es; `new_session` builds the cache."""

    name: ClassVar[str]

    def describe(self) -> str:
        """One-line summary of the knobs, for logs: `selective: ratio=0.5, sinks=0, recent=4, floor=4, …`."""
        knobs = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self))  # type: ignore[arg-type]
        return f"{self.name}: {knobs}" if knobs else f"{self.name}: no knobs"

    def new_session(self, model: Any, pool: PrefixPool | None = None) -> ModeSession:
        raise NotImplementedError


def check_int(name: str, value: object, low: int, high: int | None = None) -> None:
    """Raise ValueError unless `value` is an int in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int) or value < low or (high is not None and value > high):
        span = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {span}, got {value!r}")


def check_number(name: str, value: object, low: float, high: float) -> None:
    """Raise ValueError unless `value` is a number (int or float, not bool) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise ValueError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}")


def check_ratio(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 1.0:
        raise ValueError(f"ratio must be a number in (0, 1] (the share of tokens kept; 1.0 keeps all), got {value!r}")


def check_choice(name: str, value: object, valid: tuple) -> None:
    if value not in valid:
        raise ValueError(f"{name} must be one of {', '.join(map(repr, valid))}; got {value!r}")
