"""Model families: how a checkpoint is prompted — what precedes the 上联, what separates the two lines, and
which special tokens pad and stand for unknown characters. The family is decided by the checkpoint (its
tokenizer and config), never by the visitor. The decode loop, the constraints and every KV-cache mode are
the same for all: they see token ids, one character per step.

- `couplet` — this project's format (the embedded model, anything trained with `couplet.train`):
  `<bos> [house prefix + exemplars] <Ln> keywords <sep>` → 上联 `<mid>` 下联. The long shared prompt is what
  the prefix pool and the engine exist for.
- `gpt2-couplet` — GPT-2 couplet models with a BERT vocabulary (the layout of uer/gpt2-chinese-couplet:
  `GPT2LMHeadModel`, `BertTokenizer`, `[CLS]` + 上联 + `-` → 下联). 对下联 is its native task; keywords are
  placed by constrained decoding of the 上联 after `[CLS]`. It was trained on single couplets, so it gets no
  house prefix or exemplars: `shared` and `combo`'s pool then have nothing to share (a one-token prompt never
  fills a block) — they run, with exact accounting, and save nothing.

Chat/instruct models, T5 and PALM are not wired in yet: `detect` refuses them with a clear message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from transformers import PreTrainedTokenizerBase

from couplet.prompt import DEFAULT_PROMPT, Context, HouseCouplet, PromptConfig, build_context, house_ids
from couplet.tokenizer import LENGTH_TAGS, MID, SEP, FormatIds, prompt_ids

EMPTY_CONTEXT = Context((), ())


@dataclass(frozen=True)
class Family:
    """What the decode loop needs from a model family."""

    name: str
    label_zh: str
    tokenizer: PreTrainedTokenizerBase
    pad: int
    unk: int
    line_break: tuple[int, ...]  # fed with the last 上联 character
    uses_context: bool  # house prefix and exemplars in the prompt

    def context(self, query: str, length: int, cfg: PromptConfig = DEFAULT_PROMPT) -> Context:
        return build_context(self.tokenizer, query, length, cfg) if self.uses_context else EMPTY_CONTEXT

    def prompt(self, keywords: str, length: int, context: Context) -> tuple[list[int], list[int]]:
        """(the ids the 上联 continues, the positions of the keyword tokens among them)."""
        raise NotImplementedError

    def shared_prefix(self, house: Sequence[HouseCouplet]) -> int:
        """Prompt tokens every request with this house prefix shares."""
        return 0


@dataclass(frozen=True)
class CoupletFamily(Family):
    def prompt(self, keywords: str, length: int, context: Context) -> tuple[list[int], list[int]]:
        ids = prompt_ids(self.tokenizer, keywords, length, context.ids)
        start = len(context.ids) + 2  # after <bos>, the context and <Ln>
        return ids, list(range(start, start + len(keywords)))

    def shared_prefix(self, house: Sequence[HouseCouplet]) -> int:
        return 1 + len(house_ids(self.tokenizer, house)) if house else 0  # <bos> + the house


@dataclass(frozen=True)
class Gpt2CoupletFamily(Family):
    cls: int = 0

    def prompt(self, keywords: str, length: int, context: Context) -> tuple[list[int], list[int]]:
        return [self.cls], []  # the keywords are placed in the lines by the constraints, not prompted


class UnsupportedFamily(ValueError):
    """A checkpoint whose prompt format this project does not speak (yet)."""


def detect(tokenizer: PreTrainedTokenizerBase, model_type: str) -> Family:
    """The family of a checkpoint, from its tokenizer and `config.model_type`."""
    vocab = tokenizer.get_vocab()
    if all(t in vocab for t in (SEP, MID, *LENGTH_TAGS.values())):
        f = FormatIds.of(tokenizer)
        return CoupletFamily("couplet", "本项目春联格式", tokenizer, f.pad, f.unk, (f.mid,), True)
    if model_type == "gpt2" and all(t in vocab for t in ("[CLS]", "[UNK]", "-")):
        pad = vocab.get("[PAD]", vocab["[UNK]"])
        return Gpt2CoupletFamily("gpt2-couplet", "GPT-2 对联模型（[CLS] 上联 - 下联）", tokenizer, pad, vocab["[UNK]"],
                                 (vocab["-"],), False, cls=vocab["[CLS]"])
    kind = "chat/instruct" if getattr(tokenizer, "chat_template", None) else model_type
    raise UnsupportedFamily(
        f"模型族「{kind}」暂不支持：本项目目前能用本项目春联格式的模型和 GPT-2 对联模型（BERT 词表）。 "
        f"(model family {kind!r} is not wired in yet: supported are this project's couplet format and GPT-2 "
        "couplet models with a BERT vocabulary)")
