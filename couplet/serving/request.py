"""A visitor's request (`CoupletRequest`: keywords or a 上联, length, 藏头, sampling) and its preparation for
the decoding loop (`prepare` → `Prepared`: normalised text, the keywords' placement, the prompt laid out with
its exemplars)."""

from __future__ import annotations

from dataclasses import dataclass

from couplet.models.loading import LoadedModel
from couplet.writing.lexicon import DEFAULT_VOICE, VoiceConfig
from couplet.writing.placement import Placement, place_keywords
from couplet.writing.prompt import DEFAULT_PROMPT, Context, PromptConfig
from couplet.writing.text import CoupletInputError, Keywords, normalize_keywords, normalize_upper
from couplet.writing.tones import LEVEL, OBLIQUE, tone_class

LENGTHS = (5, 7)
TASKS = ("couplet", "duixia")  # keywords → a couplet; a 上联 → its 下联 (对下联)


@dataclass(frozen=True)
class CoupletRequest:
    """What a visitor asks for: keywords, or (对下联, `task="duixia"`) a given 上联. `temperature == 0` means
    greedy. For 对下联, `keywords` and `acrostic` are ignored and the line length is the 上联's.
    """

    keywords: str
    length: int = 7
    acrostic: bool = False
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    upper: str = ""
    task: str = "couplet"

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {TASKS}, got {self.task!r}")
        if self.length not in LENGTHS:
            raise ValueError(f"length must be one of {LENGTHS}, got {self.length}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"temperature must be in [0, 2], got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


@dataclass(frozen=True)
class Prepared:
    """A request after normalisation: keywords (or the given 上联), placement, context and prompt ids."""

    request: CoupletRequest
    keywords: Keywords  # the keywords; for 对下联 the 上联 itself (its normalisation notes)
    placement: Placement
    context: Context
    prompt: list[int]
    length: int
    voice: VoiceConfig
    lower_end: str = LEVEL  # the 下联's end tone: 平, or 仄 against a given 上联 that ends on 平
    notes: tuple[str, ...] = ()
    keyword_positions: tuple[int, ...] = ()  # where the keyword tokens sit in the prompt (retention protects them)
    hengpi: bool = True  # choose a 横批 when written; a best-of draft's waits until it is chosen (`best_of.drafted`)

    @property
    def duixia(self) -> bool:
        return self.request.task == "duixia"

    @property
    def keyword_text(self) -> str:
        return "" if self.duixia else self.keywords.text


def prepare(lm: LoadedModel, request: CoupletRequest, prompt: PromptConfig = DEFAULT_PROMPT,
            voice: VoiceConfig = DEFAULT_VOICE) -> Prepared:
    """Normalise the input (raises CoupletInputError for bad input) and lay out the prompt."""
    if (refusal := lm.family.task_refusal(request.task)) is not None:
        raise CoupletInputError(refusal)
    if request.task == "duixia":
        given = normalize_upper(request.upper, lm.vocab)
        length, notes, lower_end = len(given.text), list(given.notes), LEVEL
        if tone_class(given.text[-1]) == LEVEL:
            lower_end = OBLIQUE
            notes.append(f"上联末字「{given.text[-1]}」为平声；春联惯例上联仄声收尾、下联平声收尾，"
                         "此联或宜作下联。已按平仄相对，以仄声字收尾对出下联。")
        placement = Placement(dict(enumerate(given.text)), {})
        context = lm.family.context(given.text, length, prompt)
        ids, _ = lm.family.prompt("", length, context, upper=given.text)
        return Prepared(request, given, placement, context, ids, length, voice, lower_end, tuple(notes))
    kw = normalize_keywords(request.keywords, lm.vocab)
    placement = place_keywords(kw.text, request.length, "acrostic" if request.acrostic else "heads")
    context = lm.family.context(kw.text, request.length, prompt)
    ids, keyword_positions = lm.family.prompt(kw.text, request.length, context)
    notes = [*kw.notes, *(["藏头只有一个字：藏在上联句首，下联句首由模型自由对出。"]
                          if request.acrostic and len(kw.text) == 1 else [])]
    return Prepared(request, kw, placement, context, ids, request.length, voice, LEVEL, tuple(notes),
                    tuple(keyword_positions))
