"""Per-mode options from the command line: `--set selective.ratio=0.3` (repeatable), shared by the CLI,
the evaluation harness and the benchmarks."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from typing import Any

from couplet.kvcache.registry import MODES, parse_modes


def parse_value(text: str) -> Any:
    """`0.3` → 0.3, `4` → 4, `true` → True, anything else stays a string."""
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_settings(items: Iterable[str]) -> dict[str, dict[str, Any]]:
    """`["selective.ratio=0.3"]` → `{"selective": {"ratio": 0.3}}`; raises ValueError with the fix."""
    out: dict[str, dict[str, Any]] = {}
    for item in items:
        key, sep, value = item.partition("=")
        mode, dot, field = key.partition(".")
        if not sep or not dot or not field:
            raise ValueError(f"--set expects MODE.FIELD=VALUE (e.g. selective.ratio=0.3), got {item!r}")
        try:
            parse_modes([mode], allow_all=False)
        except ValueError:
            raise ValueError(f"--set names unknown mode {mode!r}; modes: {', '.join(MODES)}") from None
        out.setdefault(mode, {})[field] = parse_value(value)
    return out
