"""Model families: how a checkpoint is prompted — what precedes the 上联, what separates the two lines, and
which special tokens pad and stand for unknown characters. The family is decided by the checkpoint (its
tokenizer and config), never by the visitor. The decode loop, the constraints and every KV-cache mode are
the same for all: they see token ids, one character per step.

- `couplet` — this project's format (the embedded model, anything trained with `couplet.training.pairs`):
  `<bos> [house prefix + exemplars] <Ln> keywords <sep>` → 上联 `<mid>` 下联. The long shared prompt is what
  the prefix pool and the engine exist for.
- `gpt2-couplet` — GPT-2 couplet models with a BERT vocabulary (the layout of uer/gpt2-chinese-couplet:
  `GPT2LMHeadModel`, `BertTokenizer`, `[CLS]` + 上联 + `-` → 下联). 对下联 is its native task; keywords are
  placed by constrained decoding of the 上联 after `[CLS]`. It was trained on single couplets, so it gets no
  house prefix or exemplars: `shared` and `combo`'s pool then have nothing to share (a one-token prompt never
  fills a block) — they run, with exact accounting, and save nothing.

- `chat` — chat/instruct decoder models with a chat template (Qwen2.5-Instruct and the like): the rules and the
  house couplets as the system message (the shared prefix), the exemplars and the request as the user's,
  then `上联：`; `\n下联：` between the lines. Byte-level BPE vocabularies are decoded to find the Han
  characters that are one token (`LoadedModel.vocab`).

- `t5-couplet` — T5 couplet models (`对联：` + 上联 → 下联): 对下联 only; the modes compress the decoder's
  self-attention; modes that evict (T5's relative position bias counts the keys held) or share a prefix
  (the decoder's prompt is one start token) are refused with the reason.

- `palm` — ModelScope's PALM 2.0, the source article's model (`couplet.models.palm`: ModelScope's classes,
  driven by this
  loop): the encoder reads the keywords (or, for 对下联, the 上联); the decoder writes from `[CLS]` the 上联, `，`
  and the 下联 (or the 下联 alone). Its positions are absolute sinusoids added before the projections, so every
  mode that evicts works on its decoder cache; prefix sharing is refused (the decoder's prompt is one token).

Other encoder–decoders (BART, mBART) are not wired in yet: `detect` refuses them clearly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedTokenizerBase

from couplet.models.tokenizer import LENGTH_TAGS, MID, SEP, FormatIds, prompt_ids
from couplet.writing.exemplars import load_store
from couplet.writing.prompt import DEFAULT_PROMPT, Context, HouseCouplet, PromptConfig, build_context, house_ids
from couplet.writing.text import is_han

EMPTY_CONTEXT = Context((), ())
ENCODER_DECODERS = ("bart", "mbart")  # encoder–decoders other than T5 and PALM: not wired in


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
    byte_level: bool = False  # a byte-level BPE vocabulary: token text is decoded (`LoadedModel.vocab`)
    encoder_decoder: bool = False  # the input goes to an encoder; the decoder writes the lines (T5, PALM)

    def context(self, query: str, length: int, cfg: PromptConfig = DEFAULT_PROMPT) -> Context:
        return build_context(self.tokenizer, query, length, cfg) if self.uses_context else EMPTY_CONTEXT

    def prompt(self, keywords: str, length: int, context: Context, upper: str = "") -> tuple[list[int], list[int]]:
        """(the ids the 上联 continues, the positions of the keyword tokens among them); `upper`: 对下联's
        given 上联 (the loop writes it after the prompt in every family; a chat model is also told it)."""
        raise NotImplementedError

    def shared_prefix(self, house: Sequence[HouseCouplet]) -> int:
        """Prompt tokens every request with this house prefix shares."""
        return 0

    def mode_refusal(self, mode: str) -> str | None:
        """Why this family cannot run `mode` (Chinese, for the CLI and the page), or None."""
        return None

    def task_refusal(self, task: str) -> str | None:
        """Why this family cannot do `task` ("couplet" from keywords, "duixia"), or None."""
        return None


@dataclass(frozen=True)
class CoupletFamily(Family):
    def prompt(self, keywords: str, length: int, context: Context, upper: str = "") -> tuple[list[int], list[int]]:
        ids = prompt_ids(self.tokenizer, keywords, length, context.ids)
        start = len(context.ids) + 2  # after <bos>, the context and <Ln>
        return ids, list(range(start, start + len(keywords)))

    def shared_prefix(self, house: Sequence[HouseCouplet]) -> int:
        return 1 + len(house_ids(self.tokenizer, house)) if house else 0  # <bos> + the house


@dataclass(frozen=True)
class Gpt2CoupletFamily(Family):
    cls: int = 0

    def prompt(self, keywords: str, length: int, context: Context, upper: str = "") -> tuple[list[int], list[int]]:
        return [self.cls], []  # the keywords are placed in the lines by the constraints, not prompted


NUMERALS = {5: "五", 7: "七"}
SYSTEM_RULES = ("你是春联作者。春联上下联字数相同（五言或七言），上联末字仄声、下联末字平声，上下联同位不用同一字，"
                "词性相对、平仄相对；内容吉祥喜庆，不用哀伤、否定、不吉之字，不照抄古人成句。"
                "回答格式：上联：……\n下联：……")


@dataclass(frozen=True)
class ChatFamily(Family):
    """Chat/instruct decoder models (Qwen2.5-Instruct and the like), prompted through their own chat template:
    a system message with the rules and the house couplets (the same for every visitor: the long shared
    prefix), a user message with the exemplars and the request, then the assistant's `上联：`. The lines
    are written one single-token character at a time under the same constraints, and `\n下联：` is fed
    between them, so the reply is well-formed by construction (`parse_reply` reads free-form ones)."""

    def context(self, query: str, length: int, cfg: PromptConfig = DEFAULT_PROMPT) -> Context:
        """The same house couplets and retrieved exemplars as the couplet format, rendered as text (`ids`
        stay empty: the chat template lays them out)."""
        exemplars = tuple(load_store().retrieve(query, length, cfg.k)) if cfg.k else ()
        return Context(exemplars, (), cfg.couplets if cfg.house else ())

    def _messages(self, keywords: str, length: int, context: Context, upper: str = "") -> list[dict[str, str]]:
        house = "\n".join(f"上联：{h.upper}\n下联：{h.lower}\n横批：{h.hengpi}" for h in context.house)
        system = SYSTEM_RULES + (f"\n\n本店春联：\n{house}" if house else "")
        refs = "\n".join(f"{u}，{lo}" for u, lo in context.exemplars)
        ask = (f"请为上联「{upper}」对下联。" if upper
               else f"请以「{keywords}」为关键词，写一副{NUMERALS[length]}言春联，关键词嵌在两联开头。")
        user = (f"参考古联（可借意，不可照抄）：\n{refs}\n\n" if refs else "") + ask
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def _encode(self, messages: list[dict[str, str]], generation: bool) -> list[int]:
        out: Any = self.tokenizer.apply_chat_template(messages, add_generation_prompt=generation, tokenize=True)
        if hasattr(out, "keys"):  # a BatchEncoding (transformers 5 returns one by default)
            out = out["input_ids"]
        return [int(i) for i in out]

    def prompt(self, keywords: str, length: int, context: Context, upper: str = "") -> tuple[list[int], list[int]]:
        ids = self._encode(self._messages(keywords, length, context, upper), True)
        return ids + self.tokenizer.encode("上联：", add_special_tokens=False), []

    def shared_prefix(self, house: Sequence[HouseCouplet]) -> int:
        """The system message's tokens, when the template renders it as a prefix of every prompt."""
        if not house:
            return 0
        context = Context((), (), tuple(house))
        system = self._encode(self._messages("", 7, context)[:1], False)
        full = self._encode(self._messages("春", 7, context), True)
        return len(system) if full[: len(system)] == system else 0


@dataclass(frozen=True)
class Seq2SeqCoupletFamily(Family):
    """Encoder–decoders. T5 couplet models (shibing624/t5-chinese-couplet: `AutoModelForSeq2SeqLM`, input
    `对联：` + 上联): the encoder reads the 上联, the decoder writes the 下联 from its start token. PALM
    (`palm_family`) also writes both lines from keywords. The modes compress the decoder's self-attention
    cache (inside transformers' `EncoderDecoderCache`); the cross-attention keys and values are computed once
    from the encoder, kept at the model's precision and never evicted."""

    start: int = 0  # decoder_start_token_id
    prefix: str = "对联："
    absolute_positions: bool = False  # positions added before the projections (PALM): eviction is safe

    def prompt(self, keywords: str, length: int, context: Context, upper: str = "") -> tuple[list[int], list[int]]:
        return [self.start], []

    def encoder_ids(self, text: str) -> list[int]:
        """What the encoder reads: the 上联 (对下联), or the keywords where the family writes both lines."""
        return list(self.tokenizer(self.prefix + text)["input_ids"])

    def mode_refusal(self, mode: str) -> str | None:
        from couplet.kvcache import make_mode

        parts = make_mode(mode).compose()
        if parts.retention is not None and not self.absolute_positions:
            return (f"{self.label_zh}不支持「{mode}」：T5 的相对位置偏置按缓存里的键数计算，逐出之后位置就对不上了；"
                    "请用不逐出的模式（full、int8、int4）。")
        if parts.retention is not None and parts.retention.prefill_only:
            return (f"{self.label_zh}不支持「{mode}」：它只压缩提示，而解码器的提示只有一个起始符，没有可压缩的"
                    "（输入在编码器里）；逐字压缩请用 window 或 selective。")
        if parts.sharing is not None:
            return (f"{self.label_zh}不支持「{mode}」：解码器的提示只有一个起始符，没有可以跨访客共享的前缀；"
                    "而且解码器的键值还取决于编码器读到的输入，两位访客即使前缀相同，键值也不同。")
        return None

    def task_refusal(self, task: str) -> str | None:
        if task != "duixia" and not self.line_break:
            return f"{self.label_zh}只会对下联：请在「对下联」里给出 5 或 7 字的上联。"
        return None


PALM_LABEL = "PALM 2.0（ModelScope）"


def palm_family(tokenizer: PreTrainedTokenizerBase, start: int) -> Seq2SeqCoupletFamily:
    """ModelScope's PALM (`couplet.models.palm`): a BERT encoder reads the keywords or the 上联, no task prefix; the
    decoder writes from `start` ([CLS]), with `，` between the lines when it writes both. Every mode but prefix
    sharing runs on its decoder's cache (absolute positions: eviction is safe)."""
    vocab = tokenizer.get_vocab()
    pad, unk = _pad_unk(tokenizer, fallback=0)
    brk = (vocab["，"],) if "，" in vocab else ()  # without it: 对下联 only (task_refusal)
    return Seq2SeqCoupletFamily("palm", PALM_LABEL, tokenizer, pad, unk, brk, False, False, True, start=start,
                                prefix="", absolute_positions=True)


def parse_reply(text: str) -> tuple[str, str, str]:
    """(上联, 下联, 横批) from a free-form reply ("上联：…\n下联：…\n横批：…", any colon, spaces, punctuation);
    横批 may be "". Raises ValueError for a reply without both lines."""
    import re

    found = {}
    for key in ("上联", "下联", "横批"):
        m = re.search(key + r"\s*[：:]\s*([\u3400-\u9fff]+)", text)
        if m:
            found[key] = m.group(1)
    if "上联" not in found or "下联" not in found:
        raise ValueError(f"malformed reply (no 上联/下联): {text[:80]!r}")
    return found["上联"], found["下联"], found.get("横批", "")


class UnsupportedFamily(ValueError):
    """A checkpoint whose prompt format this project does not speak (yet)."""


def detect(tokenizer: PreTrainedTokenizerBase, model_type: str, decoder_start: int = 0) -> Family:
    """The family of a checkpoint, from its tokenizer and `config.model_type` (`decoder_start`: an
    encoder–decoder's `decoder_start_token_id`)."""
    vocab = tokenizer.get_vocab()
    if all(t in vocab for t in (SEP, MID, *LENGTH_TAGS.values())):
        f = FormatIds.of(tokenizer)
        return CoupletFamily("couplet", "本项目春联格式", tokenizer, f.pad, f.unk, (f.mid,), True)
    if model_type == "gpt2" and all(t in vocab for t in ("[CLS]", "[UNK]", "-")):
        pad = vocab.get("[PAD]", vocab["[UNK]"])
        return Gpt2CoupletFamily("gpt2-couplet", "GPT-2 对联模型（[CLS] 上联 - 下联）", tokenizer, pad, vocab["[UNK]"],
                                 (vocab["-"],), False, cls=vocab["[CLS]"])
    if model_type == "palm":
        return palm_family(tokenizer, decoder_start)
    # a hub tokenizer's own pad and unknown ids; byte-level BPE when no Han character is a token as it is
    byte_level = not any(len(t) == 1 and is_han(t) for t in vocab)
    if model_type in ("t5", "mt5"):
        pad, unk = _pad_unk(tokenizer, fallback=0)
        return Seq2SeqCoupletFamily("t5-couplet", "T5 对联模型", tokenizer, pad, unk, (), False, byte_level, True,
                                    start=decoder_start)
    if getattr(tokenizer, "chat_template", None) and model_type not in ENCODER_DECODERS:
        pad, unk = _pad_unk(tokenizer, fallback=tokenizer.eos_token_id)
        return ChatFamily("chat", "对话模型（chat template）", tokenizer, pad, unk,
                          tuple(tokenizer.encode("\n下联：", add_special_tokens=False)), True, byte_level)
    raise UnsupportedFamily(
        f"模型族「{model_type}」暂不支持：本项目能用本项目春联格式、GPT-2 对联模型（BERT 词表）、带对话模板的模型、T5 "
        f"对联模型和 PALM 2.0。 (model family {model_type!r} is not wired in yet: supported are this project's couplet "
        "format, GPT-2 couplet models with a BERT vocabulary, models with a chat template, T5 couplet models and "
        "ModelScope's PALM 2.0)")


def _pad_unk(tokenizer: PreTrainedTokenizerBase, fallback: int) -> tuple[int, int]:
    """The tokenizer's pad id (else `fallback`) and its unknown-token id (else the pad id)."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else fallback
    return pad, tokenizer.unk_token_id if tokenizer.unk_token_id is not None else pad
