"""The couplet rules for an engine that is not ours: one request's constraints as JSON (`RowSpec`), and the
per-request logits function (`RowRules`) that applies them from the tokens written so far.

The in-process loop (`couplet.serving.generate.Decoding`) knows at every step which line and position it writes. A
serving engine only hands a logits processor the request's output ids, so `RowRules` recovers (line, position)
from them — 上联 characters, the line break, 下联 characters — and then does what the local loop does: a
keyword (or given) character is forced, the line break is forced, every other position gets the same
allowed-character mask and voice bias (`couplet.writing.constraints.LineConstraints`: length, end tones, no repeats,
taboo, no copied run of 4, the 对仗 bonus). Greedy decoding through `RowRules` is the local `full` couplet,
token for token (tests/test_serving.py runs it on the embedded model).

Only torch and the light rule modules are imported: this runs inside the vLLM server's own environment
(`couplet.vllm_backend.logits`), where the weights live and ours are not loaded.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from couplet.writing.constraints import LineConstraints
from couplet.writing.lexicon import VoiceConfig
from couplet.writing.placement import Placement
from couplet.writing.tones import LEVEL, OBLIQUE
from couplet.writing.vocab import CharVocab

SPEC_KEY = "couplet"  # the key of the spec in a request's `vllm_xargs` (vLLM: SamplingParams.extra_args)


@dataclass(frozen=True)
class RowSpec:
    """What the rules need to know about one request; JSON on the wire."""

    length: int
    upper: dict[int, str]  # characters fixed at positions of the 上联 (keywords)
    lower: dict[int, str]
    line_break: tuple[int, ...]  # token ids between the lines (forced)
    lower_end: str = LEVEL
    given_upper: str = ""  # 对下联: the 上联 is already in the prompt (with the line break); only the 下联 is written
    byte_level: bool = False  # how the server builds its character table (`CharVocab.of`)
    borrowed: tuple[str, ...] = ()  # lines the prompt showed: no run of 4 may be copied from them
    echo: tuple[str, ...] = ()  # this request's exemplar lines: their words get the echo bonus
    voice: dict[str, Any] = field(default_factory=dict)  # VoiceConfig fields

    @property
    def new_tokens(self) -> int:
        """How many tokens the engine is asked for (`max_tokens`): exactly the lines and the break."""
        return self.length if self.given_upper else 2 * self.length + len(self.line_break)

    def to_json(self) -> str:
        return json.dumps(asdict(self), ensure_ascii=False, separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> RowSpec:
        """Raises ValueError for anything malformed (vLLM turns it into an HTTP 400)."""
        try:
            raw = json.loads(text)
            spec = cls(int(raw["length"]), {int(k): str(v) for k, v in raw["upper"].items()},
                       {int(k): str(v) for k, v in raw["lower"].items()}, tuple(int(t) for t in raw["line_break"]),
                       str(raw.get("lower_end", LEVEL)), str(raw.get("given_upper", "")),
                       bool(raw.get("byte_level", False)), tuple(map(str, raw.get("borrowed", ()))),
                       tuple(map(str, raw.get("echo", ()))), dict(raw.get("voice", {})))
            VoiceConfig(**spec.voice)
        except (ValueError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"malformed couplet spec: {type(e).__name__}: {e}") from None
        problems = [f"fixed {c!r} at {i}" for i, c in [*spec.upper.items(), *spec.lower.items()]
                    if not 0 <= i < spec.length or len(c) != 1]
        if not 1 <= spec.length <= 16:
            problems.append(f"length {spec.length}")
        if spec.given_upper and len(spec.given_upper) != spec.length:
            problems.append(f"given 上联 {spec.given_upper!r}")
        if not spec.line_break and not spec.given_upper:
            problems.append("no line break")
        if spec.lower_end not in (LEVEL, OBLIQUE):
            problems.append(f"end tone {spec.lower_end!r}")
        if problems:
            raise ValueError(f"malformed couplet spec: {'; '.join(problems)}")
        return spec

    def unknown_to(self, chars: CharVocab) -> list[str]:
        """What this spec names that the server's vocabulary lacks (fixed characters, line-break ids)."""
        fixed = [*self.upper.values(), *self.lower.values()]
        return ([f"character {c!r}" for c in fixed if c not in chars.vocab]
                + [f"token id {t}" for t in self.line_break if not 0 <= t < len(chars.id_to_char)])

    def split(self, output_ids: list[int], id_to_char: list[str]) -> tuple[list[str], int, int]:
        """The engine's output so far → (the two lines, the line being written, break tokens seen). Every
        token that is not a break is a character of the current line (the rules allow nothing else)."""
        lines = [self.given_upper, ""]
        line = 1 if self.given_upper else 0
        breaks = 0
        for t in output_ids:
            if line == 0 and len(lines[0]) == self.length:
                breaks += 1  # a line-break token
                if breaks == len(self.line_break):
                    line = 1
            else:
                lines[line] += id_to_char[t] if 0 <= t < len(id_to_char) else ""
        return lines, line, breaks


class RowRules:
    """`rules(output_ids, logits) -> logits` for one request: vLLM's per-request logits-processor signature.

    `logits` is the (vocab,) row for the next token; the returned row has every disallowed token at -inf (a
    forced token: everything else) and the voice bias added, on the row's device and dtype."""

    def __init__(self, chars: CharVocab, spec: RowSpec) -> None:
        self.chars, self.spec = chars, spec
        self.constraints = LineConstraints(chars, Placement(spec.upper, spec.lower), spec.length,
                                           VoiceConfig(**spec.voice), spec.borrowed, spec.lower_end, spec.echo)

    def where(self, output_ids: list[int]) -> tuple[int, int, list[str], int | None]:
        """(line, position, the lines so far, the token forced next or None) after `output_ids`."""
        spec = self.spec
        lines, line, breaks = spec.split(output_ids, self.chars.id_to_char)
        if line == 0 and len(lines[0]) == spec.length:  # the 上联 is complete: the next token is the break
            return 0, spec.length, lines, spec.line_break[breaks]
        pos = len(lines[line])
        if pos >= spec.length:  # past the end (the engine was asked for more tokens): nothing may follow
            return line, pos, lines, None
        fixed = self.constraints.fixed(line, pos)
        return line, pos, lines, None if fixed is None else self.chars.vocab[fixed]

    def __call__(self, output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
        line, pos, lines, forced = self.where(output_ids)
        if forced is not None:
            out = torch.full_like(logits, float("-inf"))
            out[forced] = 0.0
            return out
        if pos >= self.spec.length:
            return logits
        allowed = self.constraints.allowed(line, pos, lines)
        bias = self.constraints.bias_at(line, pos, lines)
        size = min(logits.shape[-1], allowed.shape[-1])  # an engine may pad the logits past the table, or trim
        out = torch.full_like(logits, float("-inf"))
        row = logits[:size].float()
        if bias is not None:
            row = row + bias[:size].to(row.device)
        out[:size] = row.masked_fill(~allowed[:size].to(row.device), float("-inf")).to(logits.dtype)
        return out


def spec_for(prep, family) -> RowSpec:
    """The spec of a prepared request (`couplet.serving.generate.Prepared`) for a model family
    (`couplet.models.families`)."""
    context = prep.context
    return RowSpec(prep.length, dict(prep.placement.upper) if not prep.duixia else {}, dict(prep.placement.lower),
                   tuple(family.line_break), prep.lower_end, prep.keywords.text if prep.duixia else "",
                   family.byte_level, tuple(context.borrowed),
                   tuple(line for pair in context.exemplars for line in pair), asdict(prep.voice))
