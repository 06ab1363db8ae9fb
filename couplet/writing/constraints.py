"""Constrained decoding: which characters may stand at a given position of a couplet, and the voice bias.

Every step, the allowed set is: single Han characters of the vocabulary, minus characters already in
the current line (no repeats inside a line), minus every 上联 character while 下联 is written (the
lines do not share characters, which also rules out the same character at the same position), minus
taboo characters (`couplet.writing.lexicon`), minus any character that would complete a run of 4 characters
copied from a borrowed line (the house prefix and the exemplars the prompt showed), and at the last
position only the line's end tone: oblique (仄) for 上联, level (平) for 下联 — or, for a given 上联 that
ends on a level tone (对下联), the contrasting oblique one. Keyword characters (and a given 上联) are
fixed by the placement and bypass all of this. `bias_at` adds the soft voice: a penalty on negation and
melancholy, a bonus for auspicious characters, and in the 下联 a bonus for 对仗 against the 上联 (the same
semantic class at the same position, the contrasting tone at a rhythm position).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from functools import lru_cache

import torch

from couplet.writing.folk import folk_lines
from couplet.writing.lexicon import AUSPICIOUS, DEFAULT_VOICE, SOMBER, TABOO, VoiceConfig
from couplet.writing.placement import Placement
from couplet.writing.rules import CLASS_OF, SEMANTIC_CLASSES, rhythm_positions
from couplet.writing.tones import LEVEL, OBLIQUE, tone_class
from couplet.writing.vocab import CharVocab

COPY_RUN = 4  # a run of this many characters from a borrowed line is a copy


@lru_cache(maxsize=4)
def _masks(lm: CharVocab) -> dict[str, torch.Tensor]:
    """Boolean (vocab,) masks: Han characters, Han characters of each tone class, taboo characters."""
    size = len(lm.id_to_char)
    han = torch.zeros(size, dtype=torch.bool)
    han[lm.han_ids] = True
    level = torch.zeros(size, dtype=torch.bool)
    oblique = torch.zeros(size, dtype=torch.bool)
    for i in lm.han_ids.tolist():
        tone = tone_class(lm.id_to_char[i])
        level[i] = tone == LEVEL
        oblique[i] = tone == OBLIQUE
    taboo = torch.zeros(size, dtype=torch.bool)
    taboo[[lm.vocab[c] for c in TABOO if c in lm.vocab]] = True
    masks = {"han": han, LEVEL: level, OBLIQUE: oblique, "taboo": taboo}
    for name, chars in SEMANTIC_CLASSES.items():  # one mask per 词类, for the 对仗 bias
        masks[name] = torch.zeros(size, dtype=torch.bool)
        masks[name][[lm.vocab[c] for c in chars if c in lm.vocab]] = True
    return masks


@lru_cache(maxsize=16)
def voice_bias(lm: CharVocab, voice: VoiceConfig) -> torch.Tensor | None:
    """(vocab,) float32 added to the logits, or None when the voice adds nothing."""
    if voice.somber == 0 and voice.auspicious == 0:
        return None
    bias = torch.zeros(len(lm.id_to_char))
    bias[[lm.vocab[c] for c in SOMBER if c in lm.vocab]] = voice.somber
    bias[[lm.vocab[c] for c in AUSPICIOUS if c in lm.vocab]] = voice.auspicious
    return bias


def copy_runs(borrowed: Iterable[str], run: int = COPY_RUN) -> dict[str, set[str]]:
    """{the first run-1 characters of a borrowed run: the characters that would complete it}."""
    nxt: dict[str, set[str]] = defaultdict(set)
    for line in borrowed:
        for i in range(len(line) - run + 1):
            nxt[line[i : i + run - 1]].add(line[i + run - 1])
    return dict(nxt)


class LineConstraints:
    """The allowed-character mask for (line, position), given what has been written so far."""

    def __init__(self, lm: CharVocab, placement: Placement, length: int, voice: VoiceConfig = DEFAULT_VOICE,
                 borrowed: Iterable[str] = (), lower_end: str = LEVEL, echo_from: Iterable[str] = ()):
        self.lm = lm
        self.placement = placement
        self.length = length
        self.masks = _masks(lm)
        self.voice = voice
        self.bias = voice_bias(lm, voice)
        echo = {c for line in echo_from for c in line} - set(placement.upper.values()) - set(placement.lower.values())
        if voice.echo and echo:  # this request's own exemplars: words that differ from phrase to phrase
            bias = self._bias_copy()
            bias[[lm.vocab[c] for c in echo if c in lm.vocab]] += voice.echo
            self.bias = bias
        self.copies = copy_runs([*borrowed, *folk_lines()])  # the prompt's lines, and the set trained on
        self.ends = (OBLIQUE, lower_end)

    def _bias_copy(self) -> torch.Tensor:
        """A copy of the request's bias to add to (zeros when the voice adds nothing)."""
        return self.bias.clone() if self.bias is not None else torch.zeros(len(self.lm.id_to_char))

    def bias_at(self, line: int, pos: int, lines: list[str]) -> torch.Tensor | None:
        """The voice bias, plus the 对仗 bias while the 下联 is written: a bonus for the 上联 character's
        semantic class at this position, and for the contrasting tone at a rhythm position (the last one
        is a hard rule already)."""
        voice = self.voice
        if line == 0 or (voice.pair_class == 0 and voice.pair_tone == 0) or pos >= len(lines[0]):
            return self.bias
        bias = self._bias_copy()
        mirror = lines[0][pos]
        if voice.pair_class and (cls := CLASS_OF.get(mirror)):
            bias[self.masks[cls]] += voice.pair_class
        if voice.pair_tone and pos in rhythm_positions(self.length)[:-1] and (tone := tone_class(mirror)):
            bias[self.masks[OBLIQUE if tone == LEVEL else LEVEL]] += voice.pair_tone
        return bias

    def fixed(self, line: int, pos: int) -> str | None:
        """A keyword (or given 上联) character fixed at this position, if any."""
        return self.placement.fixed(line).get(pos)

    def allowed(self, line: int, pos: int, lines: list[str]) -> torch.Tensor:
        allowed = self.masks["han"].clone()
        if pos == self.length - 1:
            allowed &= self.masks[self.ends[line]]
        if self.voice.ban_taboo:
            allowed &= ~self.masks["taboo"]
        banned = set(lines[line])
        if line == 1:
            banned |= set(lines[0])
        # keyword characters have their own fixed places; they never appear a second time
        banned |= set(self.placement.upper.values()) | set(self.placement.lower.values())
        if pos >= COPY_RUN - 1:
            banned |= self.copies.get(lines[line][pos - COPY_RUN + 1 : pos], set())
        vocab = self.lm.vocab
        ids = [vocab[c] for c in banned if c in vocab]
        if ids:
            allowed[ids] = False
        if not allowed.any():  # cannot happen with a real vocabulary; never leave the sampler empty-handed
            return self.masks["han"].clone()
        return allowed
