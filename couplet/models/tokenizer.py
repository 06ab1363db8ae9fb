"""Character-level tokenizer and the prompt format the embedded model is trained on.

The tokenizer is a `tokenizers` WordLevel model with a split-every-character pre-tokenizer, wrapped in
transformers' `PreTrainedTokenizerFast`, so it saves and loads through `AutoTokenizer` like any hub one.

Every couplet in a sequence is one *entry* (one token per character)::

    <L7> 龙 精 <sep> 龙 马 … 客 <mid> 精 神 … 仙 <eos>
    │    └ keywords (0-8) ┘ └── upper (上联) ──┘      └── lower (下联) ─┘
    └ length tag: <L5> or <L7>

A sequence is `<bos>`, then the context (entries: the house prefix, whose keywords are each couplet's
横批, and the exemplars, with none), then the request: `<Ln> keywords <sep>`, which the model continues
with the 上联, `<mid>`, the 下联 and `<eos>` — or, where the training couplet has one, `<sep>` and its 横批
before the `<eos>` (`couplet.writing.prompt` lays the context out). Without context it is
the original one-couplet format. Training puts loss on the body of every non-house entry.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache

from tokenizers import Regex, Tokenizer, models, pre_tokenizers
from transformers import PreTrainedTokenizerBase, PreTrainedTokenizerFast

PAD, UNK, BOS, EOS, SEP, MID = "<pad>", "<unk>", "<bos>", "<eos>", "<sep>", "<mid>"
LENGTH_TAGS = {5: "<L5>", 7: "<L7>"}
SPECIAL_TOKENS = [PAD, UNK, BOS, EOS, SEP, MID, *LENGTH_TAGS.values()]


def build_tokenizer(char_counts: Counter[str], vocab_size: int,
                    must_include: Iterable[str] = ()) -> PreTrainedTokenizerFast:
    """Most frequent characters up to `vocab_size` (specials included), plus `must_include`."""
    chars = [c for c, _ in char_counts.most_common(vocab_size - len(SPECIAL_TOKENS))]
    seen = set(chars)
    chars += sorted({c for c in "".join(must_include) if c not in seen})
    vocab = {tok: i for i, tok in enumerate([*SPECIAL_TOKENS, *chars])}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    # Special tokens are matched before pre-tokenization; everything else becomes one token per character.
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"\s+|."), behavior="isolated")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=BOS, eos_token=EOS, unk_token=UNK, pad_token=PAD, sep_token=SEP,
        additional_special_tokens=[MID, *LENGTH_TAGS.values()],
        padding_side="left",
        model_max_length=512,
    )
    return tok


@dataclass(frozen=True)
class FormatIds:
    """Ids of the format's special tokens, looked up once per tokenizer."""

    pad: int
    unk: int
    bos: int
    eos: int
    sep: int
    mid: int
    length: dict[int, int]

    @classmethod
    def of(cls, tok: PreTrainedTokenizerBase) -> FormatIds:
        v = _vocab(tok)
        return cls(pad=v[PAD], unk=v[UNK], bos=v[BOS], eos=v[EOS], sep=v[SEP], mid=v[MID],
                   length={n: v[t] for n, t in LENGTH_TAGS.items()})


@lru_cache(maxsize=8)
def _vocab(tok: PreTrainedTokenizerBase) -> dict[str, int]:
    """`get_vocab()` rebuilds a dict on every call (~1 ms for 7k entries): once per tokenizer is enough."""
    return tok.get_vocab()


def char_ids(tok: PreTrainedTokenizerBase, text: str) -> list[int]:
    """One id per character; unknown characters map to <unk> (callers report them)."""
    vocab = _vocab(tok)
    unk = vocab.get(UNK, tok.unk_token_id or 0)  # another family's tokenizer names its own unknown token
    return [vocab.get(c, unk) for c in text]


def entry_ids(tok: PreTrainedTokenizerBase, keywords: str, upper: str, lower: str, hengpi: str = "") -> list[int]:
    """One context entry: `<Ln> keywords <sep> upper <mid> lower <eos>`; with a 横批,
    `… lower <sep> hengpi <eos>` (the 横批 continues the couplet: `couplet.writing.hengpi` scores it there)."""
    f = FormatIds.of(tok)
    tail = [f.sep, *char_ids(tok, hengpi)] if hengpi else []
    return [f.length[len(upper)], *char_ids(tok, keywords), f.sep, *char_ids(tok, upper), f.mid,
            *char_ids(tok, lower), *tail, f.eos]


def prompt_ids(tok: PreTrainedTokenizerBase, keywords: str, length: int, context: Sequence[int] = ()) -> list[int]:
    """`<bos> context <Ln> keywords <sep>`: what the model continues with the 上联."""
    f = FormatIds.of(tok)
    return [f.bos, *context, f.length[length], *char_ids(tok, keywords), f.sep]


def upper_start(keywords: str, context_len: int = 0) -> int:
    """Index of the first 上联 token in `couplet_ids`: after `<bos> context <Ln> keywords <sep>`."""
    return context_len + len(keywords) + 3


def couplet_ids(tok: PreTrainedTokenizerBase, keywords: str, upper: str, lower: str,
                context: Sequence[int] = ()) -> list[int]:
    """The whole sequence for one pair, after an optional context."""
    f = FormatIds.of(tok)
    return [*prompt_ids(tok, keywords, len(upper), context), *char_ids(tok, upper), f.mid,
            *char_ids(tok, lower), f.eos]


def interleaved_ids(tok: PreTrainedTokenizerBase, keywords: str, upper: str, lower: str) -> list[int]:
    """The format ablation's sequence: `<bos> <Ln> keywords <sep> 上₁ 下₁ 上₂ 下₂ … <eos>`, each 下联 character
    right after its counterpart (`couplet.training.pairs --format interleaved`; the page writes `couplet_ids`)."""
    f = FormatIds.of(tok)
    woven = [c for u, lo in zip(upper, lower, strict=True) for c in (u, lo)]
    return [*prompt_ids(tok, keywords, len(upper)), *char_ids(tok, "".join(woven)), f.eos]


# each training format's sequence builder, (tok, keywords, upper, lower) -> ids: after `<bos> <Ln> keywords <sep>`,
# `lines` puts the 上联, `<mid>`, then the 下联 (what the page writes); `interleaved` alternates them
FORMATS: dict[str, Callable[[PreTrainedTokenizerBase, str, str, str], list[int]]] = {
    "lines": couplet_ids, "interleaved": interleaved_ids}
